"""A joblib backend that runs Parallel calls on a fleet.

    import joblib
    import fleet.joblib
    fleet.joblib.register()
    with joblib.parallel_backend("fleet", broker="tcp://127.0.0.1:5555"):
        results = joblib.Parallel(n_jobs=-1)(joblib.delayed(f)(x) for x in items)

Each joblib batch of calls (joblib's BatchedCalls) is cloudpickled into one
fleet batch (its calls and the nested backend's name; see fleet.calls); a worker running `python3 -m fleet.calls` as its handler
unpickles it, runs it and sends back the values, or the exception and its
traceback. The caller re-raises a remote exception with the remote traceback
as its cause, and cancels what it has not sent yet (joblib stops dispatching
at the first failure); batches already queued at the broker still run there,
since the protocol has no cancel, but their results are dropped.

With fleet-autoscaler at --min 0 the first call's batches are the queue
depth that starts workers, and the idle pool goes back to zero afterwards.

Large arguments travel once per worker, not once per call: an argument of
`share_threshold` bytes or more (1 MiB by default: a numpy array, bytes,
or any argument whose pickle is that large) is pickled once per Parallel
call, kept in this process and replaced in each call by its digest; a
worker fetches it from here through the broker the first time it needs it
and keeps it (fleet.objects, fleet.calls). It stays here while a batch
that names it is out, and goes when the Parallel call ends.

The backend keeps one fleet.Client per (broker, queue, curve) for the life
of the process, so the second Parallel call finds the connection warm.
"""

import atexit
import collections
import concurrent.futures
import logging
import os
import pickle
import threading
import time
import warnings

import cloudpickle
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase
from joblib.parallel import register_parallel_backend

from . import _wire
from . import control as _control
from . import objects as _objects
from .client import Client
from .calls import RemoteError  # noqa: F401  (re-exported: remote exceptions may be one)

_clients = {}
# What this process sent through the backend: batches, their payload bytes,
# and the bytes of the objects it shared (each fetched once per handler).
stats = collections.Counter()
_asked = {}   # control endpoint -> (valid until, slots): the broker's answer
_clients_lock = threading.Lock()


def _client_for(broker, queue, curve):
    key = (broker, queue, repr(curve))
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            c = Client(broker, queue=queue, curve=curve)
            _clients[key] = c
        return c


@atexit.register
def _close_clients():
    with _clients_lock:
        for c in _clients.values():
            c.close(wait=False)
        _clients.clear()


class RemoteTraceback(Exception):
    """The cause attached to a re-raised remote exception: its text is the
    traceback as the worker saw it."""

    def __init__(self, tb):
        super().__init__(tb)
        self.tb = tb

    def __str__(self):
        return '\n"""\n%s"""' % self.tb


def _decode(data):
    """(value, None) or (None, exception) from a fleet.calls envelope."""
    try:
        env = pickle.loads(data)
    except Exception as exc:
        return None, RemoteError("UnpicklingError",
                                 "the result could not be unpickled here: %s: %s"
                                 % (type(exc).__name__, exc))
    if env[0] == 0:
        return env[1], None
    _, pickled, tb, type_name, message = env
    exc = None
    if pickled is not None:
        try:
            exc = pickle.loads(pickled)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RemoteError(type_name, message)
    exc.__cause__ = RemoteTraceback(tb)
    return None, exc


class _Job:
    """What apply_async returns: joblib calls get(timeout)."""

    __slots__ = ("future", "value", "error", "decoded")

    def __init__(self, future):
        self.future = future
        self.decoded = False
        self.value = self.error = None

    def settle(self):
        if not self.decoded:
            self.value, self.error = _decode(self.future.result())
            self.decoded = True

    def get(self, timeout=None):
        self.future.result(timeout)   # BatchFailed / BatchTimeout / cancelled
        self.settle()
        if self.error is not None:
            raise self.error
        return self.value


class FleetBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib backend "fleet". Options (parallel_backend("fleet", ...)):

    broker: the broker's frontend (default tcp://127.0.0.1:5555, or
        FLEET_BROKER in the environment).
    queue: the fleet queue the calls go to (default "default"); its workers
        must run `python3 -m fleet.calls` as their handler.
    curve: CURVE settings as for fleet.Client.
    max_workers: how many workers the fleet may grow to (fleet-autoscaler's
        --max), and slots_per_worker their --concurrency: n_jobs=-1 means
        max_workers * slots_per_worker. Without max_workers (or
        FLEET_MAX_WORKERS), n_jobs=-1 asks the broker's control endpoint
        (`control`, by default the frontend's port + 2; with CURVE on, give
        `control_curve`, a key listed in the broker's --curve-control, or
        max_workers) for the slots of the registered workers; with none
        registered it is 1, which makes joblib queue every call at once, so
        the autoscaler sees the whole backlog and sizes the pool.
    timeout: seconds a batch may wait for its result (default: none);
        Parallel(timeout=...) also works.
    share_threshold: arguments of this many bytes or more are shared by
        digest instead of sent with every call (default 1 MiB; None sends
        everything with the calls).
    """

    supports_timeout = True
    supports_sharedmem = False
    uses_threads = False

    def __init__(self, broker=None, queue="default", curve=None, control=None, control_curve=None,
                 max_workers=None, slots_per_worker=1, timeout=None,
                 share_threshold=_objects.DEFAULT_THRESHOLD, nesting_level=None,
                 inner_max_num_threads=None, **kwargs):
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)
        self.broker = broker or os.environ.get("FLEET_BROKER", "tcp://127.0.0.1:5555")
        self.queue = queue
        self.curve = curve
        self.control = control or _wire.control_endpoint_for(self.broker)
        self.control_curve = control_curve
        env_max = os.environ.get("FLEET_MAX_WORKERS")
        self.max_workers = max_workers if max_workers is not None else (
            int(env_max) if env_max else None)
        self.slots_per_worker = slots_per_worker
        self.timeout = timeout
        self.share_threshold = share_threshold
        self._sharing = None
        self._client = None
        self._jobs = set()
        self._jobs_lock = threading.Lock()

    # -- sizing --

    def _capacity(self):
        if self.max_workers is not None:
            return max(1, self.max_workers * self.slots_per_worker)
        if self.control is None:
            return 1
        now = time.monotonic()
        cached = _asked.get(self.control)
        if cached is not None and now < cached[0]:
            return cached[1]
        try:
            ws = _control.workers(self.control, timeout=1.0, curve=self.control_curve)
            n = max(1, sum(w["slots"] for w in ws if w["state"] != "retiring"))
            _asked[self.control] = (now + 2.0, n)   # a Parallel call in a loop asks once
        except Exception as exc:
            warnings.warn("fleet: could not ask %s for the pool size (%s); n_jobs=-1 "
                          "taken as 1 for a minute: pass control= or max_workers= to "
                          "the backend" % (self.control, exc))
            n = 1
            _asked[self.control] = (now + 60.0, n)
        return n

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            n_jobs = -1
        if n_jobs < 0:
            return max(1, self._capacity() + 1 + n_jobs)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **kwargs):
        if require == "sharedmem":
            raise ValueError("the fleet backend runs calls in other processes: "
                             "require='sharedmem' cannot be met")
        self.parallel = parallel
        n = self.effective_n_jobs(n_jobs)
        self._client = _client_for(self.broker, self.queue, self.curve)
        if self._sharing is not None:   # a call that ended without terminate()
            self._sharing.close()
        self._sharing = (_objects.Sharing(self.share_threshold)
                         if self.share_threshold is not None else None)
        return n

    # -- running --

    def apply_async(self, func, callback=None):
        items = getattr(func, "items", None)
        if items is not None:   # joblib's BatchedCalls: ship the calls only
            nested = getattr(func, "_backend", None)
            name = {"ThreadingBackend": "threading", "SequentialBackend": "sequential"}.get(
                type(nested).__name__, "sequential")
            work = ("calls", items, name, getattr(func, "_n_jobs", None))
            candidates = [a for _, args, kwargs in items for a in (*args, *kwargs.values())]
        else:
            work = ("call", func)
            candidates = ()
        used = ()
        sharing = self._sharing
        try:
            if sharing is not None:
                payload, used = sharing.dumps(work, candidates)
            else:
                payload = cloudpickle.dumps(work, protocol=pickle.HIGHEST_PROTOCOL)
            # Never block: joblib calls this holding Parallel's lock, which
            # the result callbacks (on the client's thread) need too.
            future = self._client.submit(payload, timeout=self.timeout, block=False)
            stats["batches"] += 1
            stats["payload_bytes"] += len(payload)
        except Exception as exc:
            if used:
                sharing.store.release(used)
            # Called from a result callback for every batch after the first
            # few, where an exception would vanish: hand it to joblib as
            # this batch's outcome instead, so Parallel raises it.
            future = concurrent.futures.Future()
            future.set_result(None)
            job = _Job(future)
            job.decoded, job.error = True, exc
            return job
        job = _Job(future)
        with self._jobs_lock:
            self._jobs.add(future)

        def done(f):
            if used:   # the objects it named may go once the call ends
                sharing.store.release(used)
            with self._jobs_lock:
                self._jobs.discard(f)
            if callback is None or f.cancelled() or f.exception() is not None:
                return
            job.settle()
            if job.error is None:
                try:
                    callback(job.value)
                except Exception:   # joblib's own; logged, not lost silently
                    logging.getLogger("fleet").exception("joblib's batch callback failed")

        future.add_done_callback(done)
        return job

    def abort_everything(self, ensure_ready=True):
        """A call failed: cancel what has not been sent (joblib already stops
        dispatching); results of batches still out are dropped."""
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, set()
        for f in jobs:
            f.cancel()
        if self._client is not None:
            self._client.forget_cancelled()

    def terminate(self):
        # The client stays open for the next Parallel call (warm start); the
        # batch size learnt for this call's function is not the next one's.
        # The objects this call shared go once no batch of it is out.
        self.reset_batch_stats()
        if self._sharing is not None:
            stats["shared_bytes"] += self._sharing.shared_bytes
            self._sharing.close()
            self._sharing = None


def register():
    """Adds the "fleet" backend to joblib: then
    joblib.parallel_backend("fleet", broker=...) selects it."""
    register_parallel_backend("fleet", FleetBackend)
