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
import mmap
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
_FETCH_WINDOW = 2
_FETCH_CHUNK = 2 << 20
_FETCH_RETRY_SECONDS = 0.1
_MAX_GETS_OUT = 16   # what fleet-worker takes from one handler at once
# Chunks asked per object as a batch starts (prefetch_objects). Not more:
# tens of MiB arriving at once in fresh memory on every hop stalled a
# 2-core virtual machine for a second (workers missed 200 ms heartbeats).
_PREFETCH = 4
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

    def next_frame(self, timeout=None, sink=None):
        """The next frame's body from the pipe (not the stash); None at
        end-of-file; False when `timeout` seconds pass first. With `sink`,
        the data of an `object` frame goes straight into the buffer
        `sink(tag, status, total, offset, n)` returns for it (a writable
        memoryview of n bytes), with no copy on the way, and the result is
        ("object", tag, status, total, offset, n); when sink returns None,
        the body as for any other frame."""
        while True:
            avail = len(self.buf) - self.pos
            if sink is not None and avail >= 4:
                (n,) = struct.unpack_from(">I", self.buf, self.pos)
                if n > _MAX_FRAME:
                    raise ValueError("frame of %d bytes from the worker" % n)
                head = _object_head(self.buf, self.pos + 4, avail - 4, n)
                if head is not _MORE and head is not None and head[4] > 0:
                    dest = sink(*head[:5])
                    if dest is not None:
                        return self._object_into(n, head, dest)
                if head is not _MORE:
                    body = self._whole_frame()
                    if body is not None:
                        return body
            elif sink is None:
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

    def _object_into(self, n, head, dest):
        tag, status, total, offset, size, data_at = head
        start = self.pos + 4 + data_at
        have = min(len(self.buf) - start, size)
        with memoryview(self.buf) as buffered:
            dest[:have] = buffered[start:start + have]
        self.pos = start + have
        got = have
        if got < size:   # the buffer is used up: the rest straight from the pipe
            del self.buf[:]
            self.pos = 0
            self.flush()
            while got < size:
                k = os.readv(self.fin, [dest[got:]])
                if k == 0:
                    raise EOFError("end-of-file inside a frame")
                got += k
        trailer = n - data_at - size   # the error text ("" for data)
        while len(self.buf) - self.pos < trailer:
            chunk = os.read(self.fin, max(1 << 16, trailer))
            if not chunk:
                raise EOFError("end-of-file inside a frame")
            self.buf += chunk
        self.pos += trailer
        return ("object", tag, status, total, offset, size)


_MORE = object()
_OBJECT_PREFIX = b"\x97\xa6object"
_UINT_SIZES = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}
_BIN_SIZES = {0xc4: 1, 0xc5: 2, 0xc6: 4}


def _object_head(buf, start, have, n):
    """(tag, status, total, offset, data_len, data_at) of the `object`
    frame whose body starts at buf[start] (`have` of its `n` bytes are
    there; data_at counts from the body's start), None when the body is not
    such a frame in the layout fleet-worker writes, _MORE when more bytes
    are needed to tell."""
    need = min(n, 64)
    if have < need:
        k = min(have, len(_OBJECT_PREFIX))
        return _MORE if buf[start:start + k] == _OBJECT_PREFIX[:k] else None
    if buf[start:start + len(_OBJECT_PREFIX)] != _OBJECT_PREFIX:
        return None
    i = start + len(_OBJECT_PREFIX)
    end = start + need
    fields = []
    for _ in range(4):
        if i >= end:
            return None
        b = buf[i]
        if b <= 0x7f:
            fields.append(b)
            i += 1
            continue
        k = _UINT_SIZES.get(b)
        if k is None or i + 1 + k > end:
            return None
        fields.append(int.from_bytes(buf[i + 1:i + 1 + k], "big"))
        i += 1 + k
    if i >= end:
        return None
    k = _BIN_SIZES.get(buf[i])
    if k is None or i + 1 + k > end:
        return None
    size = int.from_bytes(buf[i + 1:i + 1 + k], "big")
    data_at = i + 1 + k - start
    if data_at + size > n:
        return None
    return (fields[0], fields[1], fields[2], fields[3], size, data_at)


def _object_buffer(size):
    """Room for an object of `size` bytes: anonymous memory with its pages
    made at once (MAP_POPULATE: one system call instead of a page fault per
    4 KiB, which costs 100 ms for 40 MB on a virtual machine), or a
    bytearray where that is not available."""
    flags = getattr(mmap, "MAP_POPULATE", None)
    if size > 0 and flags is not None:
        try:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
        except (OSError, ValueError):
            pass
    return bytearray(size)


class _Fetch:
    """One object being fetched: its buffer, the chunks not asked for yet,
    those to ask again (busy, unavailable), and what has arrived."""

    def __init__(self, digest, size):
        self.digest, self.size = digest, size
        self.buf = _object_buffer(size)
        self.view = memoryview(self.buf)
        self.todo = collections.deque((off, min(size, off + _FETCH_CHUNK))
                                      for off in range(0, size, _FETCH_CHUNK))
        self.again = []   # (when, offset, end), in the order they came
        self.out = 0      # requests of ours not answered
        self.got = 0
        self.last = time.monotonic()   # when data last came
        self.error = None

    def ask(self, pipes, limit):
        """Sends gets while fewer than `limit` of ours, and fewer than the
        worker's 16 in all, are out; True if it sent any."""
        now = time.monotonic()
        while self.again and self.again[0][0] <= now:
            _, off, end = self.again.pop(0)
            self.todo.appendleft((off, end))
        sent = False
        while self.todo and self.out < limit and len(_by_tag) < _MAX_GETS_OUT:
            off, end = self.todo.popleft()
            tag = next(_tags)
            _by_tag[tag] = (self, off, end)
            self.out += 1
            pipes.send(["get", tag, self.digest, off, end - off])
            sent = True
        return sent


_fetches = {}   # digest -> _Fetch under way for the running batch
_by_tag = {}    # tag of a get not answered -> (_Fetch, offset, end)


def _sink(tag, status, total, offset, n):
    """Where the data of an `object` answer goes (its fetch's buffer), or
    None when it is not good data for a request still out."""
    entry = _by_tag.get(tag)
    if entry is None or status != 0:
        return None
    f, off, end = entry
    if total != f.size or offset != off or n > end - off:
        return None
    return f.view[offset:offset + n]


def _on_object(tag, status, total, offset, n, data, error):
    """An `object` answer: its data is in place (data None) or in `data`."""
    entry = _by_tag.pop(tag, None)
    if entry is None:
        return   # a request of an earlier batch or a failed fetch
    f, off, end = entry
    f.out -= 1
    if status == 0:
        if total != f.size or offset != off or n > end - off or (n == 0 and off < end):
            f.error = ObjectFetchError(
                "bad_request", "the answer for bytes %d..%d of an object of %d is %d bytes at "
                "%d of an object of %d" % (off, end, f.size, n, offset, total))
            return
        if data is not None:
            f.view[off:off + n] = data
        f.got += n
        f.last = time.monotonic()
        if off + n < end:   # shortened on the way: ask for the rest
            f.todo.appendleft((off + n, end))
    elif status in (_BUSY, _UNAVAILABLE):
        f.again.append((time.monotonic() + _FETCH_RETRY_SECONDS, off, end))
    elif f.error is None:
        name = _STATUS_NAMES[status] if 0 <= status < len(_STATUS_NAMES) else str(status)
        f.error = ObjectFetchError(name, error or name)


def _can_fetch():
    if _pipes is None or _current is None:
        raise ObjectFetchError("worker", "fetch_object() is only for a batch being run by serve()")
    if "objects" not in os.environ.get("FLEET_HANDLER_FEATURES", "").split(","):
        raise ObjectFetchError("worker", "this fleet-worker cannot fetch objects (it does not "
                               "set FLEET_HANDLER_FEATURES=objects): upgrade it")


def prefetch_objects(objects):
    """Starts fetching `objects` ((digest, size) pairs) for the running
    batch without waiting: as many requests as the worker takes at once go
    out now, and the data waits in the worker and the pipe while the batch
    does other things (imports, unpickling) until fetch_object() collects
    it. Does nothing outside a batch or when the worker cannot fetch."""
    try:
        _can_fetch()
    except ObjectFetchError:
        return
    sent = False
    for digest, size in objects:
        if digest not in _fetches and size > 0:
            f = _fetches[digest] = _Fetch(digest, size)
            sent = f.ask(_pipes, _PREFETCH) or sent
    if sent:
        _pipes.flush()


def forget_fetches():
    """The batch is over: fetches it started and did not collect are
    dropped (answers still out are read and dropped when they come)."""
    _fetches.clear()


def fetch_object(digest, size, timeout=60.0):
    """The `size` bytes of the object named `digest` (a writable buffer:
    an anonymous mmap, or a bytearray), fetched through fleet-worker from
    the producer of the batch being run, in chunks, two at a time (or
    collected from prefetch_objects()). Raises ObjectFetchError when the
    worker cannot fetch objects, a status other than busy/unavailable comes
    back, or nothing arrives for `timeout` seconds. Call it only from
    inside the function serve() runs (while a batch is running)."""
    _can_fetch()
    pipes = _pipes
    f = _fetches.get(digest)
    if f is None or f.size != size:
        f = _fetches[digest] = _Fetch(digest, size)
    f.last = time.monotonic()
    try:
        while f.got < size:
            if f.error is not None:
                raise f.error
            if f.ask(pipes, _FETCH_WINDOW):
                pipes.flush()
            now = time.monotonic()
            wait = f.last + timeout - now
            if wait <= 0:
                raise ObjectFetchError("timeout", "no data for %.0f s (%d of %d bytes arrived)"
                                       % (timeout, f.got, size))
            if f.again and not f.out:
                wait = min(wait, max(0.0, f.again[0][0] - now))
            body = pipes.next_frame(wait, _sink)
            if body is False:
                continue
            if body is None:
                raise ObjectFetchError("worker", "the worker closed the pipe during a fetch")
            if isinstance(body, tuple):   # data already in place (_sink)
                _on_object(body[1], body[2], body[3], body[4], body[5], None, None)
                continue
            msg = msgpack.unpackb(body, raw=False, unicode_errors="surrogateescape")
            if not (isinstance(msg, list) and msg and isinstance(msg[0], str)):
                raise ValueError("not a handler-protocol message: %r" % (msg,))
            if msg[0] == "batch":
                pipes.stash.append(body)   # with a depth: run it after this one
            elif msg[0] == "object" and len(msg) >= 7:
                tag, status, total, offset, data, error = msg[1:7]
                _on_object(tag, status, total, offset, len(data) if status == 0 else 0,
                           data, error)
        if f.error is not None:
            raise f.error
        return f.buf
    finally:
        _fetches.pop(digest, None)


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
            if msg[0] == "object" and len(msg) > 1:   # a late answer: not waited for
                _by_tag.pop(msg[1], None)
            else:
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
