"""Run cloudpickled calls on fleet workers: the worker side of fleet.joblib.

    fleet-worker --handler process --exec "python3 -m fleet.calls"

Each batch's payload is a cloudpickled callable taking no arguments (the
joblib backend sends joblib's BatchedCalls). The result travels back as a
pickled envelope: (0, value) when the call returned, (1, exception,
traceback text) when it raised. A raised exception is therefore an ok batch
at the broker (the call ran to an answer); the caller re-raises it.
"""

import pickle
import sys
import traceback

import cloudpickle


class RemoteError(Exception):
    """Stands for a remote exception that could not be pickled (or unpickled):
    its type's name and message are kept, the traceback rides along."""

    def __init__(self, type_name, message):
        super().__init__("%s: %s" % (type_name, message))
        self.type_name = type_name
        self.message = message

    def __reduce__(self):
        return (RemoteError, (self.type_name, self.message))


def run(payload):
    call = pickle.loads(payload)
    try:
        value = call()
        return cloudpickle.dumps((0, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        tb = traceback.format_exc()
        try:
            return cloudpickle.dumps((1, exc, tb), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return cloudpickle.dumps((1, RemoteError(type(exc).__name__, str(exc)), tb),
                                     protocol=pickle.HIGHEST_PROTOCOL)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m fleet.calls",
        description="Persistent handler for fleet-worker that runs cloudpickled calls "
                    "(what fleet.joblib's backend sends): fleet-worker --handler process "
                    "--exec \"python3 -m fleet.calls\". Imports in the calls are resolved "
                    "here, so the worker's Python needs the caller's libraries.")
    ap.add_argument("--depth", type=int, default=1,
                    help="batches the worker may queue here at once, 1 to 64 (default 1)")
    args = ap.parse_args(argv)
    from fleet.handler import serve
    serve(run, depth=args.depth)
    return 0


if __name__ == "__main__":
    from fleet.calls import main as _main   # the module's own copy, not __main__'s
    sys.exit(_main())
