"""Functions the tests' handlers and joblib calls run on the workers."""

import os
import time


def work(payload):
    """fleet.handler test function: b"fail:TEXT" raises ValueError(TEXT);
    b"pid" answers the handler's pid; b"sleep:MS" sleeps; else upper-case."""
    if payload.startswith(b"fail:"):
        raise ValueError(payload[5:].decode())
    if payload == b"pid":
        return str(os.getpid())
    if payload.startswith(b"sleep:"):
        time.sleep(int(payload[6:]) / 1000)
        return b"slept"
    return payload.upper()


def square(x):
    return x * x


def slow_square(x, seconds=0.05):
    time.sleep(seconds)
    return x * x


def maybe_fail(x, bad, marker_dir=None):
    if marker_dir is not None:
        open(os.path.join(marker_dir, "ran-%d" % x), "w").close()
    time.sleep(0.02)
    if x == bad:
        raise KeyError("call %d failed on purpose" % x)
    return x


def lazy_nested(n):
    """Imports joblib only when called (after the handler started)."""
    import joblib
    backend = type(joblib.parallel.get_active_backend()[0]).__name__
    return backend, os.getpid(), joblib.Parallel(n_jobs=2)(
        joblib.delayed(os.getpid)() for _ in range(n))


class PickyError(Exception):
    """Pickles, but cannot be unpickled (its __init__ takes two arguments)."""

    def __init__(self, a, b):
        super().__init__("picky %s %s" % (a, b))


def raise_picky(x):
    raise PickyError(x, "two")


def whoami(payload):
    """Answers the running batch's (id, attempt, queue) as text."""
    import fleet
    bid, attempt, queue = fleet.current_batch()
    return ("%s|%d|%s" % (bid, attempt, queue)).encode("utf-8", "surrogateescape")


def long_failure(payload):
    raise RuntimeError("x" * 20000)


def array_facts(a, i=0):
    """What a call sees of a shared array: its sum, one row's sum, whether
    it may write to it, and the handler's pid."""
    return float(a.sum()), float(a[i].sum()), bool(a.flags.writeable), os.getpid()


def blob_len(b):
    return len(b), bytes(b[:4])
