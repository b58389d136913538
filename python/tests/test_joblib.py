"""The "fleet" joblib backend against real fleet processes."""

import os
import threading
import time

import joblib
import pytest

import fleet.joblib
from conftest import HEARTBEAT_MS, wait_for
from helpers import lazy_nested, maybe_fail, raise_picky, slow_square, square

fleet.joblib.register()
CALLS = ["-m", "fleet.calls"]


def test_parallel_runs_calls_on_the_fleet(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS, "--concurrency", "2")
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend, control=fleet_env.control):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(square)(i) for i in range(20))
        assert out == [i * i for i in range(20)]
        # A function defined here (pickled by value) and a closure.
        k = 7
        out = joblib.Parallel(n_jobs=-1)(joblib.delayed(lambda x: x + k)(i) for i in range(50))
        assert out == [i + 7 for i in range(50)]
        # Where did the calls run: in the worker's handler processes.
        pids = set(joblib.Parallel(n_jobs=2)(joblib.delayed(os.getpid)() for _ in range(10)))
        assert os.getpid() not in pids


def test_n_jobs_minus_one_asks_the_broker_or_takes_max_workers(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS, "--concurrency", "3")
    fleet_env.wait_workers(1)
    b = fleet.joblib.FleetBackend(broker=fleet_env.frontend, control=fleet_env.control)
    assert b.effective_n_jobs(-1) == 3
    assert b.effective_n_jobs(-2) == 2
    assert b.effective_n_jobs(5) == 5
    assert fleet.joblib.FleetBackend(broker=fleet_env.frontend, max_workers=8,
                                     slots_per_worker=2).effective_n_jobs(-1) == 16


def test_a_failing_call_reraises_with_the_remote_traceback_and_stops_the_rest(fleet_env, tmp_path):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS)
    markers = tmp_path / "ran"
    markers.mkdir()
    n = 300
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        with pytest.raises(KeyError, match="call 3 failed on purpose") as info:
            joblib.Parallel(n_jobs=2, batch_size=1)(
                joblib.delayed(maybe_fail)(i, 3, str(markers)) for i in range(n))
    cause = info.value.__cause__
    assert isinstance(cause, fleet.joblib.RemoteTraceback)
    assert "maybe_fail" in cause.tb and "helpers.py" in cause.tb
    assert "Traceback (most recent call last)" in str(cause)
    # joblib stopped dispatching at the failure: most calls never ran.
    # Let what was already queued at the broker finish before counting.
    from fleet import control

    def drained():
        counters = control.stats(fleet_env.control)[1]
        return counters.get("queued", 1) == 0 and counters.get("inflight", 1) == 0
    wait_for(drained, what="the broker to run what it had queued")
    ran = len(os.listdir(markers))
    assert 4 <= ran < n // 2, ran
    # The backend is still usable after the abort.
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(square)(i) for i in range(5)) == \
            [0, 1, 4, 9, 16]


def test_a_call_that_cannot_be_answered_fails_clearly(fleet_env):
    fleet_env.broker("--max-attempts", "2")
    fleet_env.handler_worker("w1", CALLS)

    def die():
        os._exit(3)   # kills the handler in the middle of the batch

    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        with pytest.raises(fleet.BatchFailed) as info:
            joblib.Parallel(n_jobs=1)([joblib.delayed(die)()])
    assert info.value.reason == "dead_lettered"
    assert "handler exited" in info.value.error


def test_the_pool_grows_from_zero_for_a_parallel_call_and_returns_to_zero(fleet_env):
    """The seed's story: autoscaler at --min 0 with the process launcher."""
    fleet_env.broker("--heartbeat-ms", str(HEARTBEAT_MS), "--retire-linger-ms", "100")
    fleet_env.calls_autoscaler(max_workers=3)
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                seen.append(len(fleet_env.workers()))
            except Exception:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        assert fleet_env.workers() == []
        # As the README shows it: n_jobs=-1 with no worker registered asks the
        # broker, gets 1, and joblib queues every call at once.
        with joblib.parallel_backend("fleet", broker=fleet_env.frontend,
                                     control=fleet_env.control, timeout=120):
            out = joblib.Parallel(n_jobs=-1)(
                joblib.delayed(slow_square)(i, 0.2) for i in range(20))
        assert out == [i * i for i in range(20)]    # no call lost
        wait_for(lambda: fleet_env.workers() == [], 60, "the pool to go back to zero")
    finally:
        stop.set()
        t.join()
    assert max(seen) >= 2, seen


def test_a_parallel_inside_a_remote_call_runs_there_on_threads(fleet_env):
    from nested_helpers import nested
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS)
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        [(backend, pid, inner)] = joblib.Parallel(n_jobs=1)([joblib.delayed(nested)(6)])
    assert backend == "ThreadingBackend"
    assert pid != os.getpid()
    assert inner == [pid] * 6     # ran in the handler process itself, not in the fleet


def test_a_call_that_imports_joblib_itself_still_runs_its_parallel_on_threads(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS)
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        [(backend, pid, inner)] = joblib.Parallel(n_jobs=1)([joblib.delayed(lazy_nested)(4)])
    assert backend != "LokyBackend"
    assert inner == [pid] * 4


def test_an_argument_that_cannot_be_pickled_raises_even_from_a_later_batch(fleet_env):
    import threading as th
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS, "--concurrency", "2")
    args = list(range(20))
    args[15] = th.Lock()   # dispatched from a result callback, not the main thread
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        with pytest.raises(TypeError, match="lock"):
            joblib.Parallel(n_jobs=2, batch_size=1)(joblib.delayed(id)(a) for a in args)


def test_an_exception_that_cannot_be_unpickled_keeps_its_type_message_and_traceback(fleet_env):
    fleet_env.broker()
    fleet_env.handler_worker("w1", CALLS)
    with joblib.parallel_backend("fleet", broker=fleet_env.frontend):
        with pytest.raises(fleet.joblib.RemoteError) as info:
            joblib.Parallel(n_jobs=1)([joblib.delayed(raise_picky)(7)])
    assert info.value.type_name == "PickyError"
    assert "picky 7 two" in str(info.value)
    assert "raise_picky" in info.value.__cause__.tb
