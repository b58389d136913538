"""Large arguments shared by digest (fleet.objects): fetched once per
handler through fleet-worker and the broker, cached there, released here
when the Parallel call ends; and the ways that can fail."""

import contextlib
import os
import subprocess
import sys
import threading

import joblib
import numpy as np
import pytest

import fleet
import fleet.joblib
from fleet import control, objects
from fleet.calls import ObjectError
from conftest import BIN, PYTHON, wait_for
from helpers import array_facts, blob_len, square

fleet.joblib.register()
CALLS = ["-m", "fleet.calls"]


def broker_stats(env):
    return control.stats(env.control)[1]


def blob_total(obj):
    return objects.encode(obj).total


def test_a_large_argument_crosses_once_per_handler_even_above_the_message_limit(fleet_env):
    # Frames of at most 1 MiB + 68 KiB: the 4.8 MB array travels in chunks.
    fleet_env.broker("--max-batch-bytes", str(1 << 20))
    fleet_env.handler_worker("w1", CALLS)
    fleet_env.handler_worker("w2", CALLS)
    fleet_env.wait_workers(2)
    X = np.random.default_rng(1).random((600, 1000))
    size = blob_total(X)
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        out = joblib.Parallel(n_jobs=2, batch_size=1)(
            joblib.delayed(array_facts)(X, i) for i in range(40))
        assert [o[1] for o in out] == pytest.approx([X[i].sum() for i in range(40)])
        assert all(o[0] == pytest.approx(X.sum()) for o in out)
        assert not any(o[2] for o in out)   # arrives read-only, as loky's memmaps
        handlers = {o[3] for o in out}
        moved = broker_stats(fleet_env)["object_bytes"]
        # Once per handler that ran a call: not once per call (40 x 4.8 MB).
        assert moved == size * len(handlers), (moved, size, handlers)
        assert len(objects.STORE) == 0   # released when the call ended
        # The next Parallel call with the same array finds it cached.
        out = joblib.Parallel(n_jobs=2, batch_size=1)(
            joblib.delayed(array_facts)(X, i) for i in range(10))
        assert broker_stats(fleet_env)["object_bytes"] == moved
        assert {o[3] for o in out} <= handlers
        # Large bytes, and a large list (shared as a whole argument).
        big = os.urandom(3 << 20)
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(blob_len)(big) for _ in range(4)) == \
            [(len(big), big[:4])] * 4
        L = list(range(300000))
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(len)(L) for _ in range(6)) == [300000] * 6
    stats = broker_stats(fleet_env)
    assert stats["object_bytes"] <= moved + 2 * (blob_total(big) + blob_total(L))
    assert len(objects.STORE) == 0


def test_an_object_stays_while_its_batch_is_queued_and_goes_when_the_call_ends(fleet_env):
    fleet_env.broker()
    X = np.arange(300000, dtype=np.float64)   # 2.4 MB
    out = []

    def run():   # joblib's backend choice is per thread: made in this one
        with joblib.parallel_backend("fleet", broker=fleet_env.frontend, max_workers=1):
            out.extend(joblib.Parallel(n_jobs=1)(
                joblib.delayed(array_facts)(X, 5) for _ in range(3)))

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: broker_stats(fleet_env).get("queued", 0) >= 1, what="queued calls")
    assert len(objects.STORE) == 1   # no worker yet: the array waits here
    fleet_env.handler_worker("w1", CALLS)
    t.join(60)
    assert not t.is_alive() and len(out) == 3 and out[0][1] == 5.0
    assert len(objects.STORE) == 0


def test_it_works_with_curve_on(fleet_env, tmp_path):
    for k in ("broker", "producer", "worker"):
        subprocess.run([str(BIN / "fleet-ctl"), "keygen", str(tmp_path / k)], check=True,
                       capture_output=True)
    keys = {k: str(tmp_path / k) for k in ("broker", "producer", "worker")}
    fleet_env.broker("--curve-secret-key", keys["broker"] + ".key",
                     "--curve-producers", keys["producer"] + ".pub",
                     "--curve-workers", keys["worker"] + ".pub",
                     "--curve-control", keys["worker"] + ".pub")
    fleet_env.handler_worker("w1", CALLS, "--curve-server-key", keys["broker"] + ".pub",
                             "--curve-key", keys["worker"] + ".key")
    X = np.random.default_rng(2).random((400, 1000))
    curve = {"server_key": keys["broker"] + ".pub", "key": keys["producer"] + ".key"}
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend, curve=curve, max_workers=1):
        out = joblib.Parallel(n_jobs=1)(joblib.delayed(array_facts)(X, i) for i in range(3))
    assert [o[1] for o in out] == pytest.approx([X[i].sum() for i in range(3)])


class _Gate:
    """Wraps the store: the first read past offset 0 signals, then waits."""

    def __init__(self, store):
        self.store = store
        self.reached = threading.Event()
        self.go = threading.Event()

    def read(self, digest, offset, length):
        if offset > 0 and not self.reached.is_set():
            self.reached.set()
            self.go.wait(30)
        return self.store.read(digest, offset, length)


@contextlib.contextmanager
def gated_call(fleet_env, X, i):
    """array_facts(X, i) through the fleet on a thread of its own, the
    producer's reads of X held at its first chunk past offset 0 until
    gate.go is set (at the latest when the block ends); yields (gate,
    thread, out)."""
    client = fleet.joblib._client_for(fleet_env.frontend, "default", None)
    gate = _Gate(objects.STORE)
    client.objects = gate
    out = []

    def run():   # joblib's backend choice is per thread: made in this one
        with joblib.parallel_backend("fleet", broker=fleet_env.frontend, max_workers=1):
            out.extend(joblib.Parallel(n_jobs=1)([joblib.delayed(array_facts)(X, i)]))

    t = threading.Thread(target=run)
    try:
        t.start()
        assert gate.reached.wait(30)
        yield gate, t, out
    finally:
        gate.go.set()
        client.objects = None


def test_a_worker_killed_in_the_middle_of_a_fetch_costs_nothing_but_a_retry(fleet_env):
    fleet_env.broker("--heartbeat-ms", "200")
    w1 = fleet_env.handler_worker("w1", CALLS, "--heartbeat-ms", "200")
    fleet_env.wait_workers(1)
    X = np.random.default_rng(3).random((1500, 1000))   # 12 MB: chunks of 2 MiB
    with gated_call(fleet_env, X, 7) as (gate, t, out):
        w1.stop(sig=9)   # the worker and its handler, mid-fetch
        fleet_env.handler_worker("w2", CALLS, "--heartbeat-ms", "200")
        wait_for(lambda: [w["id"] for w in fleet_env.workers()] == ["w2"],
                 what="w1 declared dead and w2 registered")
        gate.go.set()
        t.join(60)
    assert not t.is_alive()
    assert out[0][1] == pytest.approx(X[7].sum())
    stats = broker_stats(fleet_env)
    assert stats["requeued"] >= 1
    assert stats["object_replies_dropped"] >= 1   # the answer meant for w1


def test_a_worker_that_lost_its_batch_in_the_middle_of_a_fetch_retries_rather_than_fails(
        fleet_env):
    import signal
    fleet_env.broker("--heartbeat-ms", "200")
    w1 = fleet_env.handler_worker("w1", CALLS, "--heartbeat-ms", "200")
    fleet_env.wait_workers(1)
    X = np.random.default_rng(5).random((1500, 1000))
    try:
        with gated_call(fleet_env, X, 3) as (gate, t, out):
            os.kill(w1.p.pid, signal.SIGSTOP)   # the worker, not its handler, which waits
            wait_for(lambda: [w["id"] for w in fleet_env.workers()] == [],
                     what="w1 declared dead and its batch requeued")
            fleet_env.handler_worker("w2", CALLS, "--heartbeat-ms", "200")
            fleet_env.wait_workers(1)
            gate.go.set()
            os.kill(w1.p.pid, signal.SIGCONT)
            t.join(60)
            # w1 comes back, its handler asks again for a batch it no longer
            # holds, and ends the attempt as a retry (ignored by the broker).
            wait_for(lambda: "no longer this worker's" in w1.text(),
                     what="w1's handler to give up")
    finally:
        os.kill(w1.p.pid, signal.SIGCONT)
    assert not t.is_alive()
    assert out[0][1] == pytest.approx(X[3].sum())   # from w2's run, not w1's failure
    stats = broker_stats(fleet_env)
    assert stats["completed_ok"] == 1 and stats["completed_failed"] == 0, stats
    assert stats["object_requests"] > 0


PRODUCER = r"""
import sys, pickle, numpy as np, fleet
from fleet import objects
from helpers import array_facts
X = np.ones((400, 1000))
payload, used = objects.Sharing().dumps(("calls", [(array_facts, (X, 0), {})], None, None))
c = fleet.Client(sys.argv[1])
f = c.submit(payload, batch_id="orphan-1")
import time
while c.stats["submitted"] < 1 or any(e.state != 2 for e in c._pending.values()):
    time.sleep(0.01)   # until the broker acknowledged it
print("acked", flush=True)
import os; os._exit(0)
"""


def test_a_producer_gone_while_its_object_is_needed_fails_the_call_clearly(fleet_env, tmp_path):
    fleet_env.broker()
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER)
    r = subprocess.run([PYTHON, str(script), fleet_env.frontend], env=fleet_env.env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "acked", r.stderr
    fleet_env.handler_worker("w1", CALLS)
    wait_for(lambda: broker_stats(fleet_env).get("completed_ok", 0) == 1,
             what="the orphaned call to end")
    # The result is retained: re-submitting the id gets it (nothing runs again).
    with fleet.Client(fleet_env.frontend) as c:
        value, error = fleet.joblib._decode(c.submit(b"", batch_id="orphan-1").result(20))
    assert value is None and isinstance(error, ObjectError)
    assert "could not be fetched" in str(error) and "producer_gone" in str(error)
    # The handler goes on with the next call.
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        assert joblib.Parallel(n_jobs=1)([joblib.delayed(square)(4)]) == [16]


def test_an_object_larger_than_the_handlers_cache_fails_with_the_fix(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS + ["--cache-mb", "1"])
    X = np.zeros(300000)   # 2.4 MB
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        with pytest.raises(ObjectError, match=r"does not fit in this handler's object cache "
                                              r"of 1.0 MiB.*--cache-mb"):
            joblib.Parallel(n_jobs=1)([joblib.delayed(array_facts)(X)])
        assert broker_stats(fleet_env).get("object_bytes", 0) == 0   # never fetched
        # Smaller ones still go through the same handler.
        assert joblib.Parallel(n_jobs=1)([joblib.delayed(square)(3)]) == [9]


class _Corrupting:
    def __init__(self, store):
        self.store = store

    def read(self, digest, offset, length):
        status, total, data, error = self.store.read(digest, offset, length)
        if data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return status, total, data, error


def test_bytes_that_do_not_match_their_digest_are_refused_and_not_kept(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS)
    X = np.random.default_rng(4).random((300, 1000))
    client = fleet.joblib._client_for(fleet_env.frontend, "default", None)
    client.objects = _Corrupting(objects.STORE)
    try:
        with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
            with pytest.raises(ObjectError, match="do not match its digest"):
                joblib.Parallel(n_jobs=1)([joblib.delayed(array_facts)(X)])
    finally:
        client.objects = None
    # Not kept: with honest bytes it is fetched again and the call works.
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        [out] = joblib.Parallel(n_jobs=1)([joblib.delayed(array_facts)(X, 1)])
    assert out[1] == pytest.approx(X[1].sum())


def test_auto_batch_size_grows_for_short_calls(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS, "--concurrency", "2")
    client = fleet.joblib._client_for(fleet_env.frontend, "default", None)
    before = client.stats["submitted"]
    n = 3000
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        out = joblib.Parallel(n_jobs=2, batch_size="auto")(
            joblib.delayed(square)(i) for i in range(n))
    assert out == [i * i for i in range(n)]
    batches = client.stats["submitted"] - before
    # joblib measured the fleet's round trips and put many calls per batch.
    assert batches < n // 10, batches
