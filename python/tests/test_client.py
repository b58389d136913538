"""fleet.Client and fleet.serve against a real fleet-broker and fleet-worker."""

import concurrent.futures
import time
import subprocess
import threading

import pytest

import fleet
from conftest import BIN, free_port, wait_for


def test_submit_and_map_return_every_result_in_order(fleet_env):
    fleet_env.broker()
    fleet_env.worker("w1", "--handler", "echo", "--concurrency", "2")
    with fleet.Client(fleet_env.frontend) as c:
        assert c.submit(b"hello").result(20) == b"hello"
        payloads = [b"p%d" % i for i in range(2000)]
        assert list(c.map(payloads)) == payloads
        unordered = list(c.map(payloads, ordered=False, window=64))
        assert sorted(unordered) == sorted(payloads)
        assert c.stats["submitted"] == 1 + 2 * len(payloads)


def test_a_failing_function_fails_its_batch_with_type_message_and_traceback(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", ["-m", "fleet.handler", "helpers:work"])
    with fleet.Client(fleet_env.frontend, timeout=30) as c:
        pid = c.submit(b"pid").result()
        f = c.submit(b"fail:no such thing")
        with pytest.raises(fleet.BatchFailed) as info:
            f.result()
        e = info.value
        assert e.reason == "failed"
        assert e.error.startswith("ValueError: no such thing")
        assert "Traceback (most recent call last)" in e.error
        assert "helpers.py" in e.error and "in work" in e.error
        assert e.attempts == 1
        # The process survived: the next batch runs in the same handler.
        assert c.submit(b"pid").result() == pid
        assert c.submit(b"abc").result() == b"ABC"


def test_serve_with_a_depth_runs_thousands_of_batches(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", ["-m", "fleet.handler", "helpers:work", "--depth", "8"],
                             "--concurrency", "2", "--prefetch", "32")
    with fleet.Client(fleet_env.frontend, timeout=60) as c:
        payloads = [b"x%d" % i for i in range(5000)]
        assert list(c.map(payloads)) == [p.upper() for p in payloads]


def test_queue_full_is_waited_out_and_sent_again_never_dropped(fleet_env):
    fleet_env.broker("--max-queue", "5")
    with fleet.Client(fleet_env.frontend, retry_seconds=0.05) as c:
        futures = [c.submit(b"b%d" % i) for i in range(60)]
        wait_for(lambda: c.stats["queue_full"] > 0, what="a queue_full rejection")
        fleet_env.worker("w1", "--handler", "echo")
        assert [f.result(30) for f in futures] == [b"b%d" % i for i in range(60)]
        assert c.stats["queue_full"] > 0


def test_disk_full_is_waited_out_and_sent_again_never_dropped(fleet_env, tmp_path):
    # A durable broker on a 2 MiB file system refuses new batches with
    # disk_full once it is full, and accepts again as a worker drains it.
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "fleet-py-disk",
                              str(disk)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a 2 MiB tmpfs here (needs root)")
    try:
        fleet_env.broker("--data-dir", str(disk / "data"), "--journal-segment-mb", "1")
        payloads = [b"%d:" % i + b"x" * 10000 for i in range(300)]
        with fleet.Client(fleet_env.frontend, retry_seconds=0.05) as c:
            futures = [c.submit(p) for p in payloads]
            wait_for(lambda: c.stats["disk_full"] > 0, what="a disk_full rejection")
            fleet_env.worker("w1", "--handler", "echo")
            assert [f.result(60) for f in futures] == payloads
    finally:
        fleet_env.stop_all()
        subprocess.run(["umount", "-l", str(disk)])


def test_a_batch_without_result_in_time_fails_with_timeout(fleet_env):
    fleet_env.broker()
    with fleet.Client(fleet_env.frontend) as c:
        f = c.submit(b"nobody runs this", timeout=0.3)
        with pytest.raises(fleet.BatchTimeout) as info:
            f.result(10)
        assert info.value.reason == "timeout"
        assert isinstance(info.value, concurrent.futures.TimeoutError)


def test_rejected_batches_keep_the_brokers_reason(fleet_env):
    fleet_env.broker("--max-batch-bytes", "1000")
    with fleet.Client(fleet_env.frontend) as c:
        with pytest.raises(fleet.BatchFailed) as info:
            c.submit(b"x" * 2000).result(10)
        assert info.value.reason == "rejected"
        assert info.value.error.startswith("too_large")
        with pytest.raises(ValueError):
            c.submit(b"x" * (c.max_payload_bytes + 1))


def test_a_batch_of_the_largest_size_after_a_large_one_fits_the_brokers_frame_limit(fleet_env):
    # The broker's --max-message-bytes is --max-batch-bytes + 68 KiB: a
    # 16 MiB batch must not share a SUBMIT with 7 MiB of others.
    fleet_env.broker()
    fleet_env.worker("w1", "--handler", "echo", "--concurrency", "2")
    with fleet.Client(fleet_env.frontend, timeout=60) as c:
        payloads = [b"a" * (7 << 20), b"b" * (16 << 20), b"c" * 10]
        assert list(c.map(payloads)) == payloads
        # No SUBMIT drew ERROR too_large (the client would re-send alone).
        assert c.stats["errors"] == 0


def test_batches_survive_a_broker_restart(fleet_env):
    from fleet import control
    ports = [free_port() for _ in range(3)]
    broker = fleet_env.broker(ports=ports)
    # resend_seconds far away: only the re-submit on reconnect can save them.
    with fleet.Client(fleet_env.frontend, resend_seconds=1000) as c:
        futures = [c.submit(b"r%d" % i) for i in range(20)]
        wait_for(lambda: control.stats(fleet_env.control)[1].get("submitted") == 20,
                 what="the broker to hold the 20 batches")
        # An in-memory broker forgets everything; the client sends the
        # batches again once its new connection's handshake completes.
        broker.stop()
        fleet_env.broker(ports=ports)
        fleet_env.worker("w1", "--handler", "echo")
        assert [f.result(30) for f in futures] == [b"r%d" % i for i in range(20)]
        assert c.stats["reconnects"] >= 1


def test_close_waits_for_batches_still_out(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", ["-m", "fleet.handler", "helpers:work"])
    c = fleet.Client(fleet_env.frontend)
    f = c.submit(b"sleep:300")
    c.close()
    assert f.result(0) == b"slept"
    with pytest.raises(fleet.ClientClosed):
        c.submit(b"late")


def test_close_without_wait_fails_what_is_left(fleet_env):
    fleet_env.broker()
    c = fleet.Client(fleet_env.frontend)
    f = c.submit(b"never")
    c.close(wait=False)
    with pytest.raises(fleet.BatchFailed) as info:
        f.result(0)
    assert info.value.reason == "closed"


def test_curve_client_gets_in_and_a_stranger_is_told_authentication_failed(fleet_env, tmp_path):
    for k in ("broker", "producer", "worker", "stranger"):
        subprocess.run([str(BIN / "fleet-ctl"), "keygen", str(tmp_path / k)], check=True,
                       capture_output=True)
    keys = {k: str(tmp_path / k) for k in ("broker", "producer", "worker", "stranger")}
    fleet_env.broker("--curve-secret-key", keys["broker"] + ".key",
                     "--curve-producers", keys["producer"] + ".pub",
                     "--curve-workers", keys["worker"] + ".pub",
                     "--curve-control", keys["worker"] + ".pub")
    fleet_env.worker("w1", "--handler", "echo", "--curve-server-key", keys["broker"] + ".pub",
                     "--curve-key", keys["worker"] + ".key")
    curve = {"server_key": keys["broker"] + ".pub", "key": keys["producer"] + ".key"}
    with fleet.Client(fleet_env.frontend, curve=curve) as c:
        assert c.submit(b"secret").result(20) == b"secret"
    bad = {"server_key": keys["broker"] + ".pub", "key": keys["stranger"] + ".key"}
    with fleet.Client(fleet_env.frontend, curve=bad) as c:
        with pytest.raises(fleet.BatchFailed) as info:
            c.submit(b"let me in").result(20)
        assert info.value.reason == "auth"
        assert "authentication failed" in info.value.error
    # Plain TCP to the CURVE broker: the same, saying what is missing.
    with fleet.Client(fleet_env.frontend) as c:
        with pytest.raises(fleet.BatchFailed) as info:
            c.submit(b"plain").result(20)
        assert info.value.reason == "auth"
        # The client reads the mismatch, or the broker hangs up first.
        assert "requires CURVE" in info.value.error or "require CURVE" in info.value.error
    with pytest.raises(ValueError, match="no secret key"):
        fleet.Client(fleet_env.frontend, curve={"server_key": keys["broker"] + ".pub",
                                               "key": keys["producer"] + ".pub"})


def test_a_module_that_prints_while_it_loads_still_works_as_a_handler(fleet_env):
    fleet_env.broker()
    w = fleet_env.handler_worker("w1", ["-m", "fleet.handler", "noisy_helpers:work"])
    with fleet.Client(fleet_env.frontend, timeout=30) as c:
        assert c.submit(b"abc").result() == b"cba"
    assert "protocol error" not in w.text()
    assert "hello from noisy_helpers" in w.text()   # logged from stderr instead


def test_bad_arguments_are_refused_and_the_client_goes_on(fleet_env):
    fleet_env.broker()
    fleet_env.worker("w1", "--handler", "echo")
    with fleet.Client(fleet_env.frontend) as c:
        with pytest.raises(TypeError):
            c.submit(5)
        for bad in ("\udcff", "q" * 300, b"q"):
            with pytest.raises(ValueError):
                c.submit(b"x", queue=bad)
        with pytest.raises(ValueError):
            c.submit(b"x", batch_id="")
        assert c.submit(bytearray(b"still fine")).result(20) == b"still fine"


def test_serve_gives_back_ids_that_are_not_utf8_and_names_the_running_batch(fleet_env):
    """Another producer may pick any bytes as an id; the handler answers with
    exactly those bytes (docs/handler-protocol.md: ids are bytes)."""
    import msgpack
    import zmq
    fleet_env.broker()
    fleet_env.handler_worker("w1", ["-m", "fleet.handler", "helpers:whoami"])
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(fleet_env.frontend)
    bad_id = b"id-\xff\xfe"
    raw = msgpack.Packer(use_bin_type=False)   # bytes packed as msgpack str
    s.send(raw.pack([1, 1, [[bad_id, b"q1", b"p"]]]))
    result = None
    deadline = time.monotonic() + 20
    while result is None and time.monotonic() < deadline:
        if s.poll(200):
            msg = msgpack.unpackb(s.recv(), raw=True)
            if msg[1] == 3:
                result = msg[2][0]
    s.close()
    assert result is not None, "no RESULT"
    assert result[0] == bad_id and result[1] == 0
    assert result[3] == bad_id + b"|1|q1"


def test_an_error_text_over_8_kib_keeps_its_first_line_and_the_innermost_frames(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", ["-m", "fleet.handler", "helpers:long_failure"])
    with fleet.Client(fleet_env.frontend, timeout=30) as c:
        with pytest.raises(fleet.BatchFailed) as info:
            c.submit(b"x").result()
    text = info.value.error
    assert text.startswith("RuntimeError: xxxx")
    assert len(text.encode()) <= 8192
    assert "(cut)" in text and "in long_failure" in text


def test_cancelled_batches_stop_counting_against_max_pending(fleet_env):
    fleet_env.broker()   # no worker: nothing ever finishes
    # resend_seconds far away: only forget_cancelled() can give the room back.
    with fleet.Client(fleet_env.frontend, max_pending=4, resend_seconds=1000) as c:
        futures = [c.submit(b"f%d" % i) for i in range(4)]
        for f in futures:
            assert f.cancel()
        c.forget_cancelled()
        got = []
        t = threading.Thread(target=lambda: got.append(c.submit(b"next")))
        t.start()
        t.join(20)
        assert got, "submit() still blocked by cancelled batches"
        c.close(wait=False)
