"""Fixtures: real fleet-broker, fleet-worker and fleet-autoscaler processes on
127.0.0.1 with ephemeral ports (the programs come from FLEET_BIN_DIR, by
default the build/bin of this checkout)."""

import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("FLEET_BIN_DIR", ROOT / "build" / "bin"))
HERE = pathlib.Path(__file__).resolve().parent
# The Python that runs these tests (the venv with fleet installed) also runs
# the handlers the workers start.
PYTHON = sys.executable
# Heartbeats of the tests where workers run whole calls (scikit-learn fits,
# 40 MB fetches): a broker declares a worker dead after 3 missed beats, and
# a 2-core machine running other tests beside these (or the sanitizers'
# builds) can stall longer than 3 x 200 ms; a worker wrongly declared dead
# loses its batch to a retry and its handler fetches its objects again.
HEARTBEAT_MS = 1000


def wait_for(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, argv, log, env=None):
        self.argv = argv
        self.log = log
        self.out = open(log, "wb")
        self.p = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.out.close()
        return self.p.returncode

    def text(self):
        try:
            return pathlib.Path(self.log).read_text(errors="replace")
        except OSError:
            return ""


class Fleet:
    """Starts programs in a temporary directory and stops them all after."""

    def __init__(self, tmp):
        self.tmp = pathlib.Path(tmp)
        self.procs = []
        self.frontend = self.backend = self.control = None
        self.env = dict(os.environ)
        # Handlers started by workers import fleet and the tests' helpers.
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE)] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else []))

    def start(self, name, argv):
        p = Proc([str(a) for a in argv], self.tmp / (name + ".log"), env=self.env)
        self.procs.append(p)
        return p

    def broker(self, *extra, ports=None):
        ready = self.tmp / "broker.ready"
        if ready.exists():
            ready.unlink()
        if ports is None:
            eps = ["tcp://127.0.0.1:*"] * 3
        else:
            eps = ["tcp://127.0.0.1:%d" % p for p in ports]
        b = self.start("broker", [BIN / "fleet-broker", "--frontend", eps[0], "--backend", eps[1],
                                  "--control", eps[2], "--metrics", "127.0.0.1:0",
                                  "--ready-file", ready, *extra])
        wait_for(lambda: ready.exists() and "control=" in ready.read_text() or not b.alive(),
                 what="the broker's ready file")
        assert b.alive(), b.text()
        kv = dict(line.split("=", 1) for line in ready.read_text().split())
        self.frontend, self.backend, self.control = kv["frontend"], kv["backend"], kv["control"]
        self.metrics = kv["metrics"]
        self.broker_proc = b
        return b

    def worker(self, wid, *args):
        return self.start("worker-" + wid, [BIN / "fleet-worker", "--broker", self.backend,
                                            "--id", wid, *args])

    def calls_autoscaler(self, max_workers, heartbeat_ms=HEARTBEAT_MS):
        """fleet-autoscaler at --min 0 whose process launcher starts workers
        running `python -m fleet.calls`, scaling at once: no cooldown or
        stabilization, 1 s idle, 100 ms poll. The workers heartbeat every
        heartbeat_ms: give the broker the same."""
        worker_args = ("--broker %s --handler process --exec '%s -m fleet.calls' "
                       "--heartbeat-ms %d" % (self.backend, PYTHON, heartbeat_ms))
        return self.start("autoscaler", [
            BIN / "fleet-autoscaler", "--control", self.control,
            "--metrics-source", self.metrics, "--launcher", "process",
            "--worker-args", worker_args, "--min", "0", "--max", str(max_workers),
            "--idle-seconds", "1", "--cooldown-seconds", "0", "--stabilization-seconds", "0",
            "--poll-ms", "100", "--metrics", "127.0.0.1:0"])

    def handler_worker(self, wid, handler_cmd, *args):
        """A fleet-worker running `python -m ...` as its persistent handler."""
        cmd = " ".join([shlex.quote(PYTHON)] + handler_cmd)
        return self.worker(wid, "--handler", "process", "--exec", cmd, *args)

    def workers(self):
        from fleet import control
        return control.workers(self.control)

    def wait_workers(self, n, timeout=30):
        return wait_for(lambda: len([w for w in self.workers() if w["state"] != "retiring"]) == n,
                        timeout, "%d registered workers" % n)

    def stop_all(self):
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def fleet_env(tmp_path):
    if not (BIN / "fleet-broker").exists():
        pytest.fail("no fleet-broker in %s: build first (make build) or set FLEET_BIN_DIR" % BIN)
    f = Fleet(tmp_path)
    yield f
    f.stop_all()
