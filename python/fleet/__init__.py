"""fleet for Python: submit batches to a fleet of workers, run Python
functions as fleet-worker handlers, and a joblib backend.

    import fleet
    with fleet.Client("tcp://127.0.0.1:5555") as c:
        print(c.submit(b"hello").result())

    # the worker side, run by fleet-worker --handler process --exec "python3 -m fleet.handler mod:fn"
    fleet.serve(fn)

    # joblib
    import fleet.joblib, joblib
    fleet.joblib.register()
    with joblib.parallel_backend("fleet", broker="tcp://127.0.0.1:5555"):
        joblib.Parallel(n_jobs=-1)(joblib.delayed(f)(x) for x in items)

Protocols: docs/protocol.md (the broker) and docs/handler-protocol.md (the
worker's handlers) in fleet's repository.

Names load on first use, so a handler process (fleet.serve, fleet.calls)
starts without importing pyzmq.
"""

__version__ = "0.1.0"
__all__ = ["Client", "BatchFailed", "BatchTimeout", "ClientClosed", "serve", "current_batch"]

_CLIENT = ("Client", "BatchFailed", "BatchTimeout", "ClientClosed")
_HANDLER = ("serve", "current_batch")


def __getattr__(name):
    if name in _CLIENT:
        from . import client
        return getattr(client, name)
    if name in _HANDLER:
        from . import handler
        return getattr(handler, name)
    raise AttributeError("module 'fleet' has no attribute %r" % name)


def __dir__():
    return sorted(list(globals()) + list(__all__))
