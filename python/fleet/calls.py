"""Run pickled calls on fleet workers: the worker side of fleet.joblib.

    fleet-worker --handler process --exec "python3 -m fleet.calls"

A batch's payload is a pickle (made with cloudpickle, so functions defined
in __main__, closures and lambdas travel by value), preceded, when it names
shared objects, by their list (fleet.objects.name_objects: b"fon1", a u32
count, then each object's 32-byte digest and u64 size, little-endian), of
one of:

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

Large arguments (fleet.objects): a call may name objects by digest instead
of carrying them; the first call that needs one fetches it in chunks from
its producer through the worker (docs/handler-protocol.md, "Objects"),
checks its digest and keeps it in a cache of --cache-mb (least recently
used out first, never one the running call uses), so later calls on this
handler find it. An object larger than the whole cache, one that cannot be
fetched (its producer is gone, ...) or whose bytes do not match its digest
fails the call with an ObjectError that says so. The objects the payload
lists start arriving (4 chunks each) while the pickle is being loaded. When
the broker says the running batch is no longer this worker's
(unknown_batch: it was requeued while the worker's connection was down),
the handler exits with status 75 so the attempt ends as a retry.

Start-up is kept short (a worker started from zero by the autoscaler waits
for it): this module imports neither joblib nor cloudpickle unless a batch
needs them (unpickling a by-value function imports cloudpickle by itself).
"""

import collections
import io
import os
import pickle
import sys
import time
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


class ObjectError(Exception):
    """A shared argument could not be had: too large for the handler's
    cache, not fetched (its producer gone, released, ...), or its bytes did
    not match its digest (then it is not kept)."""

    def __reduce__(self):
        return (ObjectError, self.args)


DEFAULT_CACHE_MB = 1024
OBJECT_TIMEOUT_SECONDS = 60.0


class _Cache:
    """Objects by digest, at most `cap` bytes, least recently used out
    first; the objects of the running call are never dropped."""

    def __init__(self, cap):
        self.cap = cap
        self.bytes = 0
        self.items = collections.OrderedDict()   # digest -> (obj, size)
        self.fetched = 0                         # bytes fetched, in all

    def get(self, digest):
        entry = self.items.get(digest)
        if entry is None:
            return None
        self.items.move_to_end(digest)
        return entry

    def make_room(self, size, keep):
        for d in list(self.items):
            if self.bytes + size <= self.cap:
                return
            if d in keep:
                continue
            self.bytes -= self.items.pop(d)[1]

    def put(self, digest, obj, size):
        self.items[digest] = (obj, size)
        self.bytes += size


_cache = None
_in_use = set()   # digests the running call has loaded


def _cache_now():
    global _cache
    if _cache is None:
        mb = os.environ.get("FLEET_OBJECT_CACHE_MB")
        _cache = _Cache(int(mb) << 20 if mb else DEFAULT_CACHE_MB << 20)
    return _cache


def _load_object(pid):
    from . import objects
    if not (isinstance(pid, tuple) and len(pid) == 3 and pid[0] == objects.PID_TAG):
        raise pickle.UnpicklingError("unknown persistent id %r" % (pid,))
    _, digest, size = pid
    cache = _cache_now()
    entry = cache.get(digest)
    name = "%s (%s)" % (digest.hex()[:16], _size_text(size))
    if entry is not None:
        _in_use.add(digest)
        return entry[0]
    if size > cache.cap:
        raise ObjectError("object %s does not fit in this handler's object cache of %s: "
                          "start the handler with a larger --cache-mb (python3 -m fleet.calls "
                          "--cache-mb N) or FLEET_OBJECT_CACHE_MB" % (name, _size_text(cache.cap)))
    from .handler import fetch_object, ObjectFetchError
    cache.make_room(size, _in_use)
    started = time.monotonic()
    try:
        data = fetch_object(digest, size, timeout=OBJECT_TIMEOUT_SECONDS)
    except ObjectFetchError as exc:
        if exc.status == "unknown_batch":
            _not_ours_any_more(name, exc)
        raise ObjectError("object %s could not be fetched from the producer: %s"
                          % (name, exc)) from None
    h = objects.new_hash()
    h.update(data)
    if h.digest() != digest:
        print("fleet.calls: object %s refused: its bytes do not match its digest (%s)"
              % (name, h.hexdigest()[:16]), file=sys.stderr, flush=True)
        raise ObjectError("object %s refused: the bytes received do not match its digest "
                          "(they hash to %s); not kept" % (name, h.hexdigest()[:16]))
    obj = objects.decode(data)
    cache.put(digest, obj, size)
    cache.fetched += size
    _in_use.add(digest)
    print("fleet.calls: fetched object %s in %.2f s; cache %s of %s"
          % (name, time.monotonic() - started, _size_text(cache.bytes), _size_text(cache.cap)),
          file=sys.stderr, flush=True)
    return obj


# The exit status that makes fleet-worker report the running batch as
# "retry" (any exit does; this one says why in the worker's log).
EXIT_NOT_OURS = 75


def _not_ours_any_more(name, exc):
    """The broker no longer counts the running batch as this worker's (it
    was requeued: the worker's connection dropped meanwhile). A failure
    reported now would still count, as the first result, for a call that
    runs again elsewhere; exiting makes this attempt a retry, which the
    broker ignores as the late answer of an earlier holder."""
    from .handler import current_batch
    batch = current_batch()
    print("fleet.calls: batch %s is no longer this worker's (fetching object %s: %s); "
          "exiting so that this attempt ends as a retry, not a failure"
          % (batch[0] if batch else "?", name, exc.message), file=sys.stderr, flush=True)
    os._exit(EXIT_NOT_OURS)


def _size_text(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d bytes" % n


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        return _load_object(pid)


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
    from . import objects
    from .handler import forget_fetches, prefetch_objects
    _in_use.clear()
    try:
        names, pickled = objects.named_objects(payload)
        if names:   # fetched while the unpickling imports what the calls need
            cache = _cache_now()
            prefetch_objects([(d, n) for d, n in names
                              if d not in cache.items and n <= cache.cap])
        work = _Unpickler(io.BytesIO(pickled)).load()
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
    finally:
        forget_fetches()


def main(argv=None):
    global _cache, OBJECT_TIMEOUT_SECONDS
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m fleet.calls",
        description="Persistent handler for fleet-worker that runs pickled calls "
                    "(what fleet.joblib's backend sends): fleet-worker --handler process "
                    "--exec \"python3 -m fleet.calls\". The calls' imports are resolved "
                    "here, so this Python needs the caller's libraries.")
    ap.add_argument("--depth", type=int, default=1,
                    help="batches the worker may queue here at once, 1 to 64 (default 1)")
    ap.add_argument("--cache-mb", type=int, default=None,
                    help="room for large arguments fetched from producers, kept for later "
                         "calls, least recently used out first (default %d, or "
                         "FLEET_OBJECT_CACHE_MB); an object larger than this fails its call"
                         % DEFAULT_CACHE_MB)
    ap.add_argument("--object-timeout", type=float, default=OBJECT_TIMEOUT_SECONDS,
                    help="seconds without data after which a fetch fails (default %.0f)"
                         % OBJECT_TIMEOUT_SECONDS)
    args = ap.parse_args(argv)
    if args.cache_mb is not None and args.cache_mb < 1:
        ap.error("--cache-mb must be at least 1")
    if args.object_timeout <= 0:
        ap.error("--object-timeout must be positive")
    if args.cache_mb is not None:
        _cache = _Cache(args.cache_mb << 20)
    OBJECT_TIMEOUT_SECONDS = args.object_timeout
    # Before anything imports joblib: nested Parallel calls use threads here.
    os.environ.setdefault("JOBLIB_MULTIPROCESSING", "0")
    from fleet.handler import serve
    serve(run, depth=args.depth)
    return 0


if __name__ == "__main__":
    from fleet.calls import main as _main   # the module's own copy, not __main__'s
    sys.exit(_main())
