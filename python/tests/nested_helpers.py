"""A call that runs a Parallel of its own (joblib imported at module level,
as a library that uses joblib would)."""

import os

import joblib


def nested(n):
    backend = joblib.parallel.get_active_backend()[0]
    out = joblib.Parallel(n_jobs=2)(joblib.delayed(os.getpid)() for _ in range(n))
    return type(backend).__name__, os.getpid(), out
