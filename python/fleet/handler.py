"""fleet.serve: run a Python function as a persistent handler of fleet-worker.

    fleet-worker --handler process --exec "python3 -m fleet.handler mymodule:work"

fleet-worker starts the handler once per slot and keeps it running; this
module speaks the framed stdin/stdout protocol of docs/handler-protocol.md
for it: it says ready, then reads one batch at a time, calls the function
with the payload and writes back its result. What the module loads at start
(a model, a connection) stays loaded for every batch after.

An exception in the function fails that batch (outcome failed) with a text
that starts with "Type: message" and carries the traceback; the process goes
on with the next batch. The process exits 0 when the worker closes its
stdin (the worker is stopping).
"""

import collections
import itertools
import os
import select
import struct
import sys
import time
import traceback

import msgpack

PROTOCOL_VERSION = 1
MAX_ERROR_BYTES = 8192   # the worker cuts an error text there
_MAX_FRAME = (64 << 20) + (64 << 10)

_current = None
_pipes = None   # the frame pipes while serve() runs: fetch_object() uses them

# Fetching objects (docs/handler-protocol.md, "Objects"): chunks asked at
# once, their size, and the pause before asking again after busy/unavailable.
_FETCH_WINDOW = 4
_FETCH_CHUNK = 4 << 20
_FETCH_RETRY_SECONDS = 0.1
_BUSY, _UNAVAILABLE = 4, 7
_STATUS_NAMES = ("ok", "unknown_object", "producer_gone", "unknown_batch", "busy", "timeout",
                 "bad_request", "unavailable")
_tags = itertools.count(1)


class ObjectFetchError(Exception):
    """An object could not be fetched for the running batch: `status` is
    the name from docs/protocol.md section 7 ("producer_gone", "timeout",
    ...), or "worker" when the worker cannot fetch objects at all."""

    def __init__(self, status, message):
        super().__init__("%s: %s" % (status, message))
        self.status = status
        self.message = message

    def __reduce__(self):
        return (ObjectFetchError, (self.status, self.message))


def current_batch():
    """(id, attempt, queue) of the batch the function is running, or None
    outside a batch. attempt > 1 means an earlier try did not finish (its
    worker or handler died): make side effects idempotent per id."""
    return _current


def error_text(exc):
    """"Type: message", then the traceback, within the worker's 8 KiB: the
    first line is kept whole and the traceback keeps its innermost end."""
    try:
        message = str(exc)
    except Exception:   # an exception whose __str__ fails still fails its batch
        message = "<%s.__str__ failed>" % type(exc).__name__
    head = "%s: %s" % (type(exc).__name__, message)
    try:
        # The traceback without its last line, which would repeat `head`
        # (a long message would then fill the room meant for the frames).
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        only = traceback.format_exception_only(type(exc), exc)
        if lines[-len(only):] == only:
            lines = lines[:-len(only)]
        tb = "".join(lines)
    except Exception:
        tb = ""
    text = head + "\n" + tb
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_ERROR_BYTES:
        return text
    head_raw = head.encode("utf-8", "replace")[:MAX_ERROR_BYTES // 2]
    room = MAX_ERROR_BYTES - len(head_raw) - 32
    tail = tb.encode("utf-8", "replace")[-room:]
    return (head_raw + b"\n...(cut)...\n" + tail).decode("utf-8", "replace")


def _as_bytes(result):
    if isinstance(result, bytes):
        return result
    if result is None:
        return b""
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, (bytearray, memoryview)):
        return bytes(result)
    raise TypeError("the handler function returned %s; return bytes, str or None"
                    % type(result).__name__)


def _take_pipes():
    """Keeps fds 0/1 for frames only: afterwards fd 1 and sys.stdout are
    stderr and fd 0 is /dev/null, so a print() or a child process cannot
    write into the frame stream or read frames meant for us."""
    fin = os.dup(0)
    fout = os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)
    return fin, fout


class _Pipes:
    """Frames over two file descriptors, with answers held back while more
    frames are already buffered (the protocol's depth: one write for
    several answers, and no write before a read that will not block)."""

    def __init__(self, fin, fout):
        self.fin, self.fout = fin, fout
        self.buf = bytearray()
        self.pos = 0
        self.out = []
        self.stash = collections.deque()   # batch frames read while fetching
        self.packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")

    def send(self, message):
        body = self.packer.pack(message)
        self.out.append(struct.pack(">I", len(body)))
        self.out.append(body)

    def flush(self):
        if not self.out:
            return
        data = memoryview(b"".join(self.out))
        self.out.clear()
        while data:
            n = os.write(self.fout, data)
            data = data[n:]

    def _whole_frame(self):
        avail = len(self.buf) - self.pos
        if avail < 4:
            return None
        (n,) = struct.unpack_from(">I", self.buf, self.pos)
        if n > _MAX_FRAME:
            raise ValueError("frame of %d bytes from the worker" % n)
        if avail < 4 + n:
            return None
        start = self.pos + 4
        self.pos = start + n
        return bytes(self.buf[start:self.pos])

    def read(self):
        """The next frame's body, or None at end-of-file."""
        if self.stash:
            return self.stash.popleft()
        return self.next_frame()

    def next_frame(self, timeout=None):
        """The next frame's body from the pipe (not the stash); None at
        end-of-file; False when `timeout` seconds pass first."""
        while True:
            body = self._whole_frame()
            if body is not None:
                return body
            self.flush()   # about to block: every answer goes out first
            if self.pos:
                del self.buf[:self.pos]
                self.pos = 0
            if timeout is not None:
                ready, _, _ = select.select([self.fin], [], [], max(0.0, timeout))
                if not ready:
                    return False
            want = 1 << 16
            if len(self.buf) >= 4:   # the rest of a large frame in few reads
                (n,) = struct.unpack_from(">I", self.buf, 0)
                want = max(want, min(4 + n - len(self.buf), 16 << 20))
            chunk = os.read(self.fin, want)
            if not chunk:
                if self.buf:
                    raise EOFError("end-of-file inside a frame")
                return None
            self.buf += chunk


def fetch_object(digest, size, timeout=60.0):
    """The `size` bytes of the object named `digest` (a bytearray), fetched
    through fleet-worker from the producer of the batch being run, in
    chunks, several at once. Raises ObjectFetchError when the worker cannot
    fetch objects, a status other than busy/unavailable comes back, or
    nothing arrives for `timeout` seconds. Call it only from inside the
    function serve() runs (while a batch is running)."""
    pipes = _pipes
    if pipes is None or _current is None:
        raise ObjectFetchError("worker", "fetch_object() is only for a batch being run by serve()")
    if "objects" not in os.environ.get("FLEET_HANDLER_FEATURES", "").split(","):
        raise ObjectFetchError("worker", "this fleet-worker cannot fetch objects (it does not "
                               "set FLEET_HANDLER_FEATURES=objects): upgrade it")
    buf = bytearray(size)
    view = memoryview(buf)
    todo = collections.deque((off, min(size, off + _FETCH_CHUNK))
                             for off in range(0, size, _FETCH_CHUNK))
    out = {}       # tag -> (offset, end)
    again = []     # (when, offset, end): busy or unavailable, in the order they came
    last = time.monotonic()
    got = 0
    while todo or out or again:
        now = time.monotonic()
        while again and again[0][0] <= now:
            _, off, end = again.pop(0)
            todo.appendleft((off, end))
        sent = False
        while todo and len(out) < _FETCH_WINDOW:
            off, end = todo.popleft()
            tag = next(_tags)
            out[tag] = (off, end)
            pipes.send(["get", tag, digest, off, end - off])
            sent = True
        if sent:
            pipes.flush()
        wait = last + timeout - now
        if wait <= 0:
            raise ObjectFetchError("timeout", "no data for %.0f s (%d of %d bytes arrived)"
                                   % (timeout, got, size))
        if again:
            wait = min(wait, again[0][0] - now)
        body = pipes.next_frame(wait)
        if body is False:
            continue
        if body is None:
            raise ObjectFetchError("worker", "the worker closed the pipe during a fetch")
        msg = msgpack.unpackb(body, raw=False, unicode_errors="surrogateescape")
        if not (isinstance(msg, list) and msg and isinstance(msg[0], str)):
            raise ValueError("not a handler-protocol message: %r" % (msg,))
        if msg[0] == "batch":
            pipes.stash.append(body)   # with a depth: run it after this one
            continue
        if msg[0] != "object" or len(msg) < 7:
            continue
        tag, status, total, offset, data, error = msg[1:7]
        r = out.pop(tag, None)
        if r is None:
            continue   # the answer to a request of an earlier, failed fetch
        off, end = r
        if status == 0:
            n = len(data)
            if total != size or offset != off or n > end - off or (n == 0 and off < end):
                raise ObjectFetchError("bad_request", "the answer for bytes %d..%d of an object "
                                       "of %d is %d bytes at %d of an object of %d"
                                       % (off, end, size, n, offset, total))
            view[off:off + n] = data
            got += n
            last = time.monotonic()
            if off + n < end:   # shortened on the way: ask for the rest
                todo.appendleft((off + n, end))
        elif status in (_BUSY, _UNAVAILABLE):
            again.append((now + _FETCH_RETRY_SECONDS, off, end))
        else:
            name = _STATUS_NAMES[status] if 0 <= status < len(_STATUS_NAMES) else str(status)
            raise ObjectFetchError(name, error or name)
    return buf


def serve(fn, depth=1, _fds=None):
    """Runs `fn(payload: bytes) -> bytes` for every batch fleet-worker sends,
    until the worker closes stdin; returns then (exit status 0 is yours to
    give). Must be called in a process started by
    `fleet-worker --handler process --exec ...`.

    `fn` may return bytes, str (sent as UTF-8) or None (empty). `depth` (1 to
    64) lets the worker queue that many batches at this handler at once
    (with fleet-worker's --prefetch): worth it for batches of microseconds
    to milliseconds; keep 1 for long or uneven ones."""
    if not 1 <= depth <= 64:
        raise ValueError("depth must be 1 to 64")
    global _pipes
    fin, fout = _fds if _fds is not None else _take_pipes()
    pipes = _Pipes(fin, fout)
    _pipes = pipes
    try:   # objects arrive in chunks of megabytes: fewer, larger reads
        import fcntl
        fcntl.fcntl(fin, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass
    pipes.send(["ready", PROTOCOL_VERSION] if depth == 1 else ["ready", PROTOCOL_VERSION, depth])
    pipes.flush()
    try:
        _loop(fn, depth, pipes)
    finally:
        pipes.flush()   # answers held back still go out, even on SystemExit


# With a depth, answers wait while more frames are buffered, but never
# longer than this: the worker's --batch-timeout keeps counting for a batch
# whose answer is held, and a result should not wait for slow neighbours.
_HOLD_SECONDS = 0.002


def _loop(fn, depth, pipes):
    global _current
    held_since = None   # when the oldest answer not yet written was made
    last_took = 0.0
    while True:
        body = pipes.read()
        if body is None:
            return
        msg = msgpack.unpackb(body, raw=False, unicode_errors="surrogateescape")
        if not (isinstance(msg, list) and msg and isinstance(msg[0], str)):
            raise ValueError("not a handler-protocol message: %r" % (msg,))
        if msg[0] != "batch":
            if msg[0] != "object":   # objects: late answers of a failed fetch
                print("fleet.serve: ignoring unknown message %r" % (msg[0],), file=sys.stderr)
            continue
        batch_id, payload, attempt, queue = msg[1], msg[2], msg[3], msg[4]
        if isinstance(payload, str):
            payload = payload.encode("utf-8", "surrogateescape")
        _current = (batch_id, attempt, queue)
        if held_since is not None and last_took >= _HOLD_SECONDS:
            pipes.flush()   # batches are slow now: don't keep answers waiting
            held_since = None
        started = time.monotonic()
        try:
            result = _as_bytes(fn(payload))
        except Exception as exc:  # the batch fails, the handler lives on
            _current = None
            text = error_text(exc)
            print("fleet.serve: batch %s failed: %s" % (batch_id, text.splitlines()[0]),
                  file=sys.stderr, flush=True)
            pipes.send(["error", batch_id, text])
            pipes.flush()   # failures are rare: no reason to hold them
            held_since = None
            continue
        _current = None
        pipes.send(["ok", batch_id, result])
        now = time.monotonic()
        last_took = now - started
        if held_since is None:
            held_since = now
        if depth == 1 or now - held_since >= _HOLD_SECONDS:
            pipes.flush()
            held_since = None


def _load(spec):
    import importlib
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise SystemExit("fleet.serve: expected MODULE:FUNCTION, got %r" % spec)
    sys.path.insert(0, os.getcwd())
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise SystemExit("fleet.serve: %s is not callable" % spec)
    return fn


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m fleet.handler",
        description="Run MODULE:FUNCTION as a persistent handler of fleet-worker: "
                    "fleet-worker --handler process --exec \"python3 -m fleet.handler "
                    "mymodule:work\". FUNCTION takes the payload (bytes) and returns "
                    "the result (bytes, str or None); an exception fails the batch.")
    ap.add_argument("function", metavar="MODULE:FUNCTION",
                    help="what to run, e.g. mypackage.tasks:resize (imported from the "
                         "current directory and sys.path)")
    ap.add_argument("--depth", type=int, default=1,
                    help="batches the worker may queue here at once, 1 to 64 (default 1; "
                         "use with fleet-worker --prefetch for short batches)")
    args = ap.parse_args(argv)
    if os.isatty(0):
        ap.error("stdin is a terminal: this runs under fleet-worker --handler process --exec")
    # The frame pipes first: whatever the module prints while it loads goes
    # to stderr, not into the frames ahead of "ready".
    fds = _take_pipes()
    fn = _load(args.function)
    serve(fn, depth=args.depth, _fds=fds)
    return 0


if __name__ == "__main__":
    from fleet.handler import main as _main   # the module's own copy, not __main__'s
    sys.exit(_main())
