"""fleet.Client: a producer for fleet-broker's frontend (docs/protocol.md).

One background thread owns the ZeroMQ socket (sockets never cross threads);
submit() from any thread hands the batch over through a deque and a wake-up
pipe, and the thread resolves each batch's concurrent.futures.Future when its
RESULT arrives. The thread sends whatever has piled up in one SUBMIT, so a
burst of submit() calls costs one message, not one per batch.

What the broker's rules ask of a producer, and what this one does:
- queue_full (the broker's queue is at --max-queue) and disk_full (a durable
  broker's disk is full): the batch is kept and sent again after
  `retry_seconds`, as often as it takes; never dropped.
- reconnects: after every completed handshake but the first, everything
  without a result is sent again (a re-submit is always safe: the broker
  deduplicates by id and re-sends a retained result).
- silence: a batch sent but not acknowledged for `resend_seconds` is sent
  again, one acknowledged but without a result is FETCHed (and sent again
  if the broker answers "unknown"); the broker never runs a known id twice.
- a RESULT for an id already finished is dropped (results can come twice).
- OBJECT_REQUEST (a worker fetching a large argument of one of our batches,
  docs/protocol.md section 5a) is answered from `objects`, this process's
  fleet.objects.STORE unless set otherwise.
"""

import collections
import concurrent.futures
import heapq
import itertools
import logging
import os
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import _wire as w


class BatchFailed(Exception):
    """A batch that ended without a result.

    Attributes:
        batch_id: the batch's id.
        reason: "failed" (the handler reported a failure), "dead_lettered"
            (its workers died or asked for retries --max-attempts times),
            "rejected" (the broker refused it: too large, invalid), "timeout"
            (no result within the client's timeout), "closed" (the client
            was closed first) or "auth" (the broker refused this client's
            CURVE handshake).
        error: the text that came with it (the handler's message, the
            broker's reason), "" if none.
        attempts: how many times the broker dispatched it (0 if unknown).
    """

    def __init__(self, batch_id, reason, error, attempts=0):
        super().__init__("batch %s %s: %s" % (batch_id, reason, error) if error
                         else "batch %s %s" % (batch_id, reason))
        self.batch_id = batch_id
        self.reason = reason
        self.error = error
        self.attempts = attempts


class BatchTimeout(BatchFailed, concurrent.futures.TimeoutError):
    """No result within the timeout (reason "timeout"). The batch may still
    run at the broker: the client only stops waiting for it."""


class ClientClosed(RuntimeError):
    """submit() after close()."""


# Entry states.
_LOCAL, _SENT, _ACKED = 0, 1, 2


class _Entry:
    __slots__ = ("payload", "queue", "future", "state", "since", "errors")

    def __init__(self, payload, queue, future):
        self.payload = payload
        self.queue = queue
        self.future = future
        self.state = _LOCAL
        self.since = 0.0     # when it was last sent (monotonic seconds)
        self.errors = 0      # ERROR replies since it was last acknowledged


def _check_name(name, what):
    """A queue name or batch id: a non-empty str of at most 256 bytes of
    UTF-8 (docs/protocol.md, section 8). Returns it; raises ValueError."""
    if not isinstance(name, str):
        raise ValueError("%s must be a str, not %s" % (what, type(name).__name__))
    try:
        n = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("%s %r is not valid UTF-8 text" % (what, name)) from None
    if not 1 <= n <= w.MAX_ID_BYTES:
        raise ValueError("%s must be 1 to %d bytes, got %d" % (what, w.MAX_ID_BYTES, n))
    return name


class Client:
    """A connection to fleet-broker's frontend.

    Args:
        endpoint: the broker's frontend, e.g. "tcp://127.0.0.1:5555".
        queue: the queue batches go to unless submit() names one ("" is the
            broker's "default").
        curve: None for plaintext, or {"server_key": broker .pub file (or
            its 40 Z85 characters), "key": this producer's .key file from
            `fleet-ctl keygen`}; the key must be on the broker's
            --curve-producers list.
        timeout: seconds a batch may wait for its result before its future
            fails with BatchTimeout (None: wait as long as it takes).
        max_pending: batches submitted and without a result at most; submit()
            blocks while that many are out (backpressure on the caller).
        max_payload_bytes: the largest payload submit() accepts (the broker's
            --max-batch-bytes, 16 MiB by default, refuses larger ones anyway).
        retry_seconds: wait before sending again a batch refused as
            queue_full, or after the broker answered ERROR.
        resend_seconds: a batch without an acknowledgement or a result this
            long is sent again (the broker deduplicates).

    Thread-safe: submit(), map() and close() may be called from any thread.
    Futures are resolved on the client's thread, so their done-callbacks run
    there: keep them short.
    """

    def __init__(self, endpoint="tcp://127.0.0.1:5555", queue="default", curve=None,
                 timeout=None, max_pending=100000, max_payload_bytes=16 << 20,
                 retry_seconds=0.2, resend_seconds=10.0):
        w.check_endpoint(endpoint)
        _check_name(queue or "default", "queue")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.endpoint = endpoint
        self.queue = queue or "default"
        self.timeout = timeout
        self.max_payload_bytes = max_payload_bytes
        self._retry_s = retry_seconds
        self._resend_s = resend_seconds

        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.DEALER)
        try:
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.IMMEDIATE, 1)
            self._sock.setsockopt(zmq.RCVHWM, 0)
            self._sock.setsockopt(zmq.SNDHWM, 0)
            w.apply_curve(self._sock, curve)
            self._curve = curve is not None
            self._monitor = self._sock.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            self._sock.connect(endpoint)
        except Exception:
            self._sock.close(0)
            self._ctx.term()
            raise

        self._prefix = "py-%s-" % os.urandom(6).hex()
        self._ids = itertools.count()
        self._seq = itertools.count()       # tie-breaker in the heaps
        self._inbox = collections.deque()   # (id, _Entry) from submit()
        self._room = threading.Semaphore(max_pending)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._wake_lock = threading.Lock()
        self._woken = False
        self._closing = False
        self._close_wait = True
        self._close_deadline = None
        self._closed = False
        self._dead = None                   # why the I/O thread stopped on its own
        self._lock = threading.Lock()       # _closing vs the inbox, _overdraft
        self._close_lock = threading.Lock()
        self._overdraft = 0                 # submits past max_pending (block=False, callbacks)
        self._purge = False                 # forget_cancelled() was called

        # Owned by the I/O thread.
        self._pending = {}                  # id -> _Entry
        self._outbox = collections.deque()  # ids to SUBMIT
        self._retry = []                    # heap of (time, id): queue_full waits
        self._deadlines = []                # heap of (time, id): per-batch timeouts
        self._handshakes = 0
        self._hangups = 0                   # NO_DETAIL handshake failures in a row
        self._first_hangup = 0.0            # when the first of them came
        self.auth_error = None              # text of a refused handshake, if any
        self.stats = collections.Counter()  # submitted, resent, queue_full, errors ...
        self.objects = None                 # what OBJECT_REQUESTs read: fleet.objects.STORE

        self._thread = threading.Thread(target=self._run, name="fleet-client", daemon=True)
        self._thread.start()

    # ---- the caller's side -------------------------------------------------

    def submit(self, payload, queue=None, batch_id=None, timeout=None, block=True):
        """Queues one batch; returns a Future that resolves to the handler's
        result (bytes), or fails with BatchFailed (reason and text kept).

        `payload` is bytes (or bytearray/memoryview), or str sent as UTF-8.
        Blocks while `max_pending` batches are out, unless block=False (then
        the batch is taken anyway: for callers that must not wait, such as
        a done-callback or code holding a lock a callback needs). Raises
        TypeError for another payload type, ValueError for a payload over
        max_payload_bytes or a bad queue or id, ClientClosed after close()
        (or after the client's thread failed; the error says why)."""
        if isinstance(payload, str):
            payload = payload.encode()
        elif isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        elif not isinstance(payload, bytes):
            raise TypeError("payload must be bytes or str, not %s" % type(payload).__name__)
        if len(payload) > self.max_payload_bytes:
            raise ValueError("payload of %d bytes is over max_payload_bytes (%d)"
                             % (len(payload), self.max_payload_bytes))
        queue = self.queue if queue is None else _check_name(queue or "default", "queue")
        if batch_id is None:
            batch_id = self._prefix + str(next(self._ids))
        else:
            _check_name(batch_id, "batch_id")
        own = threading.current_thread() is self._thread
        if own or not block:
            # A done-callback submitting (joblib dispatches the next batch
            # from one): this thread must never wait for itself.
            if not self._room.acquire(blocking=False):
                with self._lock:
                    self._overdraft += 1
        else:
            self._room.acquire()   # close() frees every claim, so this ends
        future = concurrent.futures.Future()
        entry = _Entry(payload, queue, future)
        t = self.timeout if timeout is None else timeout
        with self._lock:
            # Checked under the lock that close() takes to set _closing, so
            # nothing enters the inbox after the I/O thread's last look.
            if self._closing:
                self._give_back()
                raise ClientClosed(self._dead or "submit() after close()")
            self._inbox.append((batch_id, entry, None if t is None else time.monotonic() + t))
            if not own:   # our own loop takes the inbox again before it sends
                self._wake()
        return future

    def map(self, payloads, ordered=True, timeout=None, window=1000):
        """Submits every payload and yields the results (bytes).

        ordered=True yields them in the order of `payloads`; False as they
        finish. At most `window` batches are out at once. A failed batch
        raises its BatchFailed when its turn comes; `timeout` (seconds) bounds
        the whole call. Batches not yet finished are cancelled (client side)
        when the generator is closed early."""
        deadline = None if timeout is None else time.monotonic() + timeout
        it = iter(payloads)
        out = collections.deque()
        done_q = collections.deque()
        done_ev = threading.Condition()

        def note_done(f):
            with done_ev:
                done_q.append(f)
                done_ev.notify()

        def left():
            if deadline is None:
                return None
            return max(0.0, deadline - time.monotonic())

        def fill():
            while len(out) < window:
                try:
                    p = next(it)
                except StopIteration:
                    return
                f = self.submit(p)
                if not ordered:
                    f.add_done_callback(note_done)
                out.append(f)

        try:
            fill()
            while out:
                if ordered:
                    f = out.popleft()
                    try:
                        r = f.result(left())
                    except BatchFailed:
                        raise
                    except concurrent.futures.TimeoutError:
                        raise concurrent.futures.TimeoutError(
                            "map: no result within %s s" % timeout) from None
                else:
                    with done_ev:
                        while not done_q:
                            if not done_ev.wait(left()) and deadline is not None \
                                    and time.monotonic() >= deadline:
                                raise concurrent.futures.TimeoutError(
                                    "map: no result within %s s" % timeout)
                        f = done_q.popleft()
                    out.remove(f)
                    r = f.result()
                fill()
                yield r
        finally:
            if out:
                for f in out:
                    f.cancel()
                self.forget_cancelled()

    def forget_cancelled(self):
        """Asks the client's thread to drop the batches whose futures were
        cancelled (Future.cancel()) now, rather than at its next periodic
        scan, so they stop counting against max_pending and close(wait=True)
        does not wait for them. A batch already at the broker still runs
        there (the protocol has no cancel); its result is dropped."""
        self._purge = True
        with self._lock:
            if not self._closing:
                self._wake()

    def close(self, wait=True, timeout=None):
        """Stops the client. wait=True first waits (at most `timeout` seconds)
        for the batches still out; whatever is left fails with BatchFailed
        reason "closed". Idempotent; not from a done-callback (the client's
        own thread), where it raises RuntimeError."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("fleet.Client.close() from a done-callback: close it elsewhere")
        with self._close_lock:
            if self._closed:
                return
            with self._lock:
                self._close_wait = wait
                self._close_deadline = None if timeout is None else time.monotonic() + timeout
                self._closing = True
                self._wake()
            self._thread.join()
            with self._lock:   # no submit() touches the pipe once _closing is set
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(wait=exc[0] is None)

    # ---- the I/O thread ----------------------------------------------------

    def _give_back(self):
        # Undoes a submit()'s claim on max_pending (called under _lock).
        if self._overdraft:
            self._overdraft -= 1
        else:
            self._room.release()

    def _wake(self):
        with self._wake_lock:
            if self._woken:
                return
            self._woken = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _run(self):
        sock, mon = self._sock, self._monitor
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        want_out = False
        next_scan = time.monotonic() + self._resend_s / 2
        try:
            while True:
                now = time.monotonic()
                wait = next_scan - now
                if self._retry:
                    wait = min(wait, self._retry[0][0] - now)
                if self._deadlines:
                    wait = min(wait, self._deadlines[0][0] - now)
                if self._closing:
                    wait = min(wait, 0.05)
                events = dict(poller.poll(max(0, int(wait * 1000) + 1)))
                if self._wake_r in events:
                    with self._wake_lock:
                        self._woken = False
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                self._take_inbox()
                if events.get(sock, 0) & zmq.POLLIN:
                    self._read(sock)
                    self._take_inbox()   # what the results' callbacks submitted
                if mon in events:
                    self._read_monitor(mon)
                now = time.monotonic()
                while self._retry and self._retry[0][0] <= now:
                    _, _, bid, entry = heapq.heappop(self._retry)
                    e = self._pending.get(bid)
                    if e is entry and e.state == _LOCAL:
                        self._outbox.append(bid)
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, bid, entry = heapq.heappop(self._deadlines)
                    e = self._pending.get(bid)
                    if e is entry:   # not a later batch that re-used the id
                        self._finish(bid, e, BatchTimeout(bid, "timeout",
                                                          "no result in time", 0))
                if self._purge:
                    self._purge = False
                    for bid, e in list(self._pending.items()):
                        if e.future.cancelled():
                            del self._pending[bid]
                            self._release()
                if now >= next_scan:
                    self._scan(now)
                    next_scan = now + self._resend_s / 2
                blocked = self._flush(sock, now)
                if blocked != want_out:
                    want_out = blocked
                    poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if blocked else 0))
                if self._closing:
                    out_of_time = (self._close_deadline is not None
                                   and time.monotonic() >= self._close_deadline)
                    if not self._close_wait or not self._pending or out_of_time:
                        break
        except BaseException as exc:   # a bug of ours: say so, never leave futures hanging
            self._dead = "the fleet client's thread failed: %s: %s" % (type(exc).__name__, exc)
            logging.getLogger("fleet").exception(self._dead)
        finally:
            with self._lock:
                self._closing = True
            self._take_inbox()
            why = self._dead or "the client was closed first"
            for bid, e in list(self._pending.items()):
                self._finish(bid, e, BatchFailed(bid, "closed", why))
            self._monitor.close(0)
            sock.close(0)
            self._ctx.term()

    def _release(self):
        with self._lock:
            self._give_back()

    def _take_inbox(self):
        inbox = self._inbox
        while inbox:
            bid, e, deadline = inbox.popleft()
            if bid in self._pending:
                self._release()
                e.future.set_exception(ValueError("batch id %s is already out" % bid))
                continue
            self._pending[bid] = e
            self.stats["submitted"] += 1
            if self.auth_error is not None:
                # The broker refused us for good: nothing will get through.
                self._finish(bid, e, BatchFailed(bid, "auth", self.auth_error))
                continue
            self._outbox.append(bid)
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, next(self._seq), bid, e))

    def _finish(self, bid, e, error=None, result=None):
        del self._pending[bid]
        self._release()
        f = e.future
        try:
            if error is not None:
                f.set_exception(error)
            else:
                f.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass  # cancelled by the caller meanwhile

    def _flush(self, sock, now):
        """Sends the outbox in SUBMITs; returns True if the socket would block
        (not connected yet: ZMQ_IMMEDIATE), with the rest kept."""
        out = self._outbox
        pending = self._pending
        while out:
            batches, ids, size = [], [], 0
            while out and len(batches) < w.SUBMIT_MAX_BATCHES and size < w.SUBMIT_MAX_BYTES:
                bid = out.popleft()
                e = pending.get(bid)
                if e is None:
                    continue
                if e.future.cancelled():
                    del pending[bid]
                    self._release()
                    continue
                if e.errors and batches:
                    # It drew an ERROR: it travels alone, so one bad batch
                    # cannot fail the ones it was sent with.
                    out.appendleft(bid)
                    break
                if batches and size + len(e.payload) > w.SUBMIT_MAX_BYTES:
                    # Not past the cap with others: a large batch goes in
                    # the next SUBMIT (alone if it is over the cap), so no
                    # message exceeds the broker's --max-message-bytes.
                    out.appendleft(bid)
                    break
                batches.append([bid, e.queue, e.payload])
                ids.append(bid)
                size += len(e.payload)
                if e.errors:
                    break
            if not batches:
                break
            try:
                sock.send(w.pack([w.VERSION, w.SUBMIT, batches]), zmq.NOBLOCK)
            except zmq.Again:
                out.extendleft(reversed(ids))
                return True
            for bid in ids:
                e = pending[bid]
                if e.state == _LOCAL:
                    e.state = _SENT
                e.since = now
        return False

    def _read(self, sock):
        for _ in range(1000):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = w.unpack(frame)
                cmd = msg[1]
            except Exception:
                self.stats["bad_replies"] += 1
                continue
            if cmd == w.RESULT:
                self._on_results(msg[2])
            elif cmd == w.ACK:
                self._on_ack(msg[2], msg[3])
            elif cmd == w.ERROR:
                self._on_error(msg[2], msg[3])
            elif cmd == w.OBJECT_REQUEST:
                self._on_object_request(sock, msg)
            else:
                self.stats["bad_replies"] += 1

    def _on_object_request(self, sock, msg):
        """A worker reads a chunk of an object one of our batches names."""
        try:
            _, _, token, _batch_id, digest, offset, length = msg
        except ValueError:
            self.stats["bad_replies"] += 1
            return
        store = self.objects
        if store is None:
            from . import objects
            store = self.objects = objects.STORE
        status, total, data, error = store.read(bytes(digest), offset, length)
        self.stats["object_requests"] += 1
        self.stats["object_bytes"] += len(data)
        try:
            sock.send(w.object_reply(token, status, total, data, error), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats["object_replies_lost"] += 1   # not connected: the broker answers timeout

    def _on_results(self, items):
        pending = self._pending
        for rid, outcome, attempts, result, error in items:
            e = pending.get(rid)
            if e is None:
                self.stats["duplicates"] += 1
                continue
            if outcome == w.OK:
                self._finish(rid, e, result=result)
            elif outcome == w.UNKNOWN:   # the broker forgot it: send it again
                e.state = _LOCAL
                self._outbox.append(rid)
                self.stats["resent"] += 1
            else:
                reason = "dead_lettered" if error.startswith("dead-lettered") else "failed"
                self._finish(rid, e, BatchFailed(rid, reason, error, attempts))

    def _on_ack(self, accepted, rejected):
        pending = self._pending
        for rid in accepted:
            e = pending.get(rid)
            if e is not None:
                e.state = _ACKED
                e.errors = 0
        now = time.monotonic()
        for rid, code, text in rejected:
            e = pending.get(rid)
            if e is None:
                continue
            if code == w.QUEUE_FULL or code == w.DISK_FULL:
                self.stats["queue_full" if code == w.QUEUE_FULL else "disk_full"] += 1
                e.state = _LOCAL
                heapq.heappush(self._retry, (now + self._retry_s, next(self._seq), rid, e))
            else:
                self._finish(rid, e, BatchFailed(rid, "rejected",
                                                 "%s: %s" % (w.code_name(code), text)))

    def _on_error(self, code, text):
        # ERROR names no message: send again everything not acknowledged,
        # after a pause; a batch that keeps drawing errors fails.
        self.stats["errors"] += 1
        when = time.monotonic() + self._retry_s
        for rid, e in list(self._pending.items()):
            if e.state != _SENT:
                continue
            e.errors += 1
            if e.errors >= 5:
                self._finish(rid, e, BatchFailed(rid, "rejected", "broker error %s: %s"
                                                 % (w.code_name(code), text)))
            else:
                e.state = _LOCAL
                heapq.heappush(self._retry, (when, next(self._seq), rid, e))

    def _read_monitor(self, mon):
        while True:
            try:
                ev = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = ev["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.auth_error = None
                self._hangups = 0
                self._handshakes += 1
                if self._handshakes > 1:   # a new connection: re-own everything
                    self.stats["reconnects"] += 1
                    for rid, e in self._pending.items():
                        if e.state != _LOCAL:
                            e.state = _LOCAL
                            self._outbox.append(rid)
            else:
                # The rule of the C++ clients (common/handshake_watch.h): a
                # key refused (AUTH) or a mechanism mismatch (PROTOCOL:
                # plaintext to a CURVE broker, or the reverse) is final,
                # libzmq does not retry; a hang-up mid-handshake (NO_DETAIL:
                # the wrong server key) is final after 5 in a row over at
                # least 10 s with no successful handshake between (one is a
                # broker restart; a few within seconds, a broker's inbound
                # budget turning new connections away).
                if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    self._hangups += 1
                    if self._hangups == 1:
                        self._first_hangup = time.monotonic()
                    if self._hangups < 5 or time.monotonic() - self._first_hangup < 10.0:
                        continue
                    why = ("the broker hung up during the handshake %d times in a row (%s)"
                           % (self._hangups,
                              "is the curve server_key that broker's public key?" if self._curve
                              else "does the broker require CURVE? pass curve=..."))
                elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    why = ("the broker refused this client's key: it is not on the broker's "
                           "--curve-producers allowlist")
                elif ev["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    why = ("the broker does not speak CURVE and this client does"
                           if self._curve else
                           "the broker requires CURVE and this client speaks plain TCP "
                           "(pass curve={\"server_key\": ..., \"key\": ...})")
                else:
                    why = "its handshake failed (libzmq event %d, value %#x)" % (kind, ev["value"])
                self.auth_error = "authentication failed: %s: %s" % (self.endpoint, why)
                for rid, e in list(self._pending.items()):
                    self._finish(rid, e, BatchFailed(rid, "auth", self.auth_error))

    def _scan(self, now):
        """The net for silence (docs/protocol.md, "Reconnects"): a batch sent
        but not acknowledged for resend_seconds is sent again; one
        acknowledged but without a result is FETCHed (an "unknown" answer
        sends it again). Both are safe: the broker deduplicates by id."""
        limit = now - self._resend_s
        fetch = []
        for rid, e in list(self._pending.items()):
            if e.future.cancelled():
                del self._pending[rid]
                self._release()
            elif e.state == _SENT and e.since <= limit:
                e.state = _LOCAL
                self._outbox.append(rid)
                self.stats["resent"] += 1
            elif e.state == _ACKED and e.since <= limit:
                e.since = now
                fetch.append(rid)
        for k in range(0, len(fetch), w.SUBMIT_MAX_BATCHES):
            try:
                self._sock.send(w.pack([w.VERSION, w.FETCH, fetch[k:k + w.SUBMIT_MAX_BATCHES]]),
                                zmq.NOBLOCK)
                self.stats["fetched"] += len(fetch[k:k + w.SUBMIT_MAX_BATCHES])
            except zmq.Again:
                break   # not connected: the reconnect re-sends everything
