"""Clear errors before anything connects: a malformed endpoint and a secret
key file that others may read are refused with ValueError naming the value
(or the file, its mode and the fix)."""

import os
import subprocess

import pytest

import fleet
from fleet import control
from conftest import BIN


@pytest.mark.parametrize("endpoint, says", [
    ("garbage", "no scheme"),
    ("tcp://127.0.0.1:99999", "port '99999' is out of range (1..65535)"),
    ("tcp://127.0.0.1:0", "port '0' is out of range"),
    ("tcp://127.0.0.1", "no port"),
    ("tcp://:5555", "no host"),
    ("tcp://*:5555", "* is not a host to connect to"),
    ("tcp://::1:5555", "goes in brackets"),
    ("tcp://[nope]:5555", "not an IPv6 address"),
    ("inproc://broker", "inproc:// reaches only"),
    ("udp://127.0.0.1:5555", "unsupported scheme 'udp://'"),
    ("", "empty"),
])
def test_a_malformed_endpoint_is_a_value_error_naming_it(endpoint, says):
    with pytest.raises(ValueError) as e:
        fleet.Client(endpoint)
    assert says in str(e.value)
    assert repr(endpoint) in str(e.value)
    with pytest.raises(ValueError):
        control.call(endpoint, "stats", timeout=0.1)


def test_a_well_formed_endpoint_is_accepted():
    for endpoint in ("tcp://127.0.0.1:1", "tcp://[::1]:65535", "tcp://broker-1.example:5555",
                     "ipc:///tmp/fleet-test.sock"):
        fleet.Client(endpoint).close()


def test_a_secret_key_others_may_read_is_refused_with_the_fix(tmp_path):
    for name in ("broker", "me"):
        subprocess.run([os.path.join(BIN, "fleet-ctl"), "keygen", str(tmp_path / name)],
                       check=True, capture_output=True)
    key = str(tmp_path / "me.key")
    curve = {"server_key": str(tmp_path / "broker.pub"), "key": key}
    os.chmod(key, 0o644)
    with pytest.raises(ValueError) as e:
        fleet.Client("tcp://127.0.0.1:1", curve=curve)
    assert "secret key file %s has mode 0644" % key in str(e.value)
    assert "chmod 600 %s" % key in str(e.value)
    os.chmod(key, 0o600)
    fleet.Client("tcp://127.0.0.1:1", curve=curve).close()
