"""Run pickled calls on fleet workers: the worker side of fleet.joblib.

    fleet-worker --handler process --exec "python3 -m fleet.calls"

A batch's payload is a pickle (made with cloudpickle, so functions defined
in __main__, closures and lambdas travel by value) of one of:

- ("calls", [(func, args, kwargs), ...], nested, n_jobs): run each call in
  order and answer the list of their values (what fleet.joblib sends for
  one joblib batch). When joblib is loaded here, the calls run inside
  joblib.parallel_backend(nested, n_jobs=n_jobs), so a Parallel call inside
  them runs locally ("threading" or "sequential"), never back into the
  fleet.
- ("call", callable): call it with no arguments and answer its value.

The answer is a pickled envelope: (0, value) when the calls returned, or
(1, pickled exception or None, traceback text, type name, message) when
one raised; then the batch is still ok at the broker (it ran to an answer)
and the caller re-raises the exception, or a RemoteError with its type name
and message when it cannot be pickled here or unpickled there.

Run as `python3 -m fleet.calls`, it sets JOBLIB_MULTIPROCESSING=0 (unless
set), so joblib inside a call never starts processes of its own: a
Parallel there runs on threads in this handler process.

Start-up is kept short (a worker started from zero by the autoscaler waits
for it): this module imports neither joblib nor cloudpickle unless a batch
needs them (unpickling a by-value function imports cloudpickle by itself).
"""

import os
import pickle
import sys
import traceback


class RemoteError(Exception):
    """Stands for a remote exception that could not be pickled (or unpickled):
    its type's name and message are kept, the traceback rides along."""

    def __init__(self, type_name, message):
        super().__init__("%s: %s" % (type_name, message))
        self.type_name = type_name
        self.message = message

    def __reduce__(self):
        return (RemoteError, (self.type_name, self.message))


def _dumps(obj):
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # a lambda or a local class in the value: by value
        import cloudpickle
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _run_calls(items, nested, n_jobs):
    joblib = sys.modules.get("joblib")
    if joblib is None or nested is None:
        return [f(*a, **kw) for f, a, kw in items]
    with joblib.parallel_backend(nested, n_jobs=n_jobs):
        return [f(*a, **kw) for f, a, kw in items]


def run(payload):
    """The handler function: payload in, pickled envelope out."""
    work = pickle.loads(payload)
    try:
        if work[0] == "calls":
            value = _run_calls(work[1], work[2], work[3])
        elif work[0] == "call":
            value = work[1]()
        else:
            raise ValueError("fleet.calls: unknown payload kind %r" % (work[0],))
        return _dumps((0, value))
    except Exception as exc:
        tb = traceback.format_exc()
        try:
            message = str(exc)
        except Exception:
            message = "<%s.__str__ failed>" % type(exc).__name__
        try:
            pickled = _dumps(exc)
        except Exception:
            pickled = None
        return _dumps((1, pickled, tb, type(exc).__name__, message))


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m fleet.calls",
        description="Persistent handler for fleet-worker that runs pickled calls "
                    "(what fleet.joblib's backend sends): fleet-worker --handler process "
                    "--exec \"python3 -m fleet.calls\". The calls' imports are resolved "
                    "here, so this Python needs the caller's libraries.")
    ap.add_argument("--depth", type=int, default=1,
                    help="batches the worker may queue here at once, 1 to 64 (default 1)")
    args = ap.parse_args(argv)
    # Before anything imports joblib: nested Parallel calls use threads here.
    os.environ.setdefault("JOBLIB_MULTIPROCESSING", "0")
    from fleet.handler import serve
    serve(run, depth=args.depth)
    return 0


if __name__ == "__main__":
    from fleet.calls import main as _main   # the module's own copy, not __main__'s
    sys.exit(_main())
