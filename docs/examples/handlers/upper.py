#!/usr/bin/python3
"""Example persistent handler for fleet-worker: answers every batch with its
payload upper-cased.

Run it with:

    fleet-worker --handler process --exec "/usr/bin/python3 docs/examples/handlers/upper.py"

It speaks the protocol of docs/handler-protocol.md: it sends ["ready", 1]
(["ready", 1, N] with --depth N), then
reads one "batch" frame at a time from stdin and answers "ok" or "error" on
stdout, and exits with status 0 when stdin reaches end-of-file.

To write your own handler, replace handle() below; load anything expensive
(models, connections) at module level, before ready is sent.  An exception
raised by handle() becomes an "error" answer ("Type: message", traceback on
stderr) and the handler carries on with the next batch.

For tests: a payload starting with b"fail:" raises ValueError with the rest
of the payload as its message, so the producer sees the batch fail.

Needs only the standard library and msgpack (Debian: python3-msgpack).
"""

import os
import struct
import sys
import traceback

import msgpack

PROTOCOL_VERSION = 1


def handle(payload: bytes) -> bytes:
    """Your code goes here: take a batch's payload, return its result."""
    if payload.startswith(b"fail:"):
        raise ValueError(payload[len(b"fail:"):].decode("utf-8", "replace"))
    return payload.upper()


def log(message):
    # The worker logs every stderr line as "handler slot N: <line>".
    print(message, file=sys.stderr, flush=True)


def take_protocol_pipes():
    """Keep stdin/stdout for frames only; return (frames_in, frames_out).

    Afterwards file descriptor 1 and sys.stdout point at stderr and fd 0 at
    /dev/null, so print() calls, C libraries and child processes cannot write
    stray bytes into the frame stream or read frames meant for us."""
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)
    return frames_in, frames_out


def read_exact(stream, n):
    """Read exactly n bytes; a pipe may return fewer per read.  Returns b""
    on end-of-file before the first byte; raises EOFError on a cut frame."""
    data = stream.read(n)
    while 0 < len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            raise EOFError(f"end-of-file inside a frame ({len(data)} of {n} bytes)")
        data += more
    return data


# Strings are not checked for UTF-8: surrogateescape lets any id round-trip.
packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")


def write_frame(stream, body):
    stream.write(struct.pack(">I", len(body)))
    stream.write(body)
    stream.flush()  # or the worker waits for an answer stuck in our buffer


def answer(batch_id, payload):
    """Run handle() on one batch and return the body of its answer."""
    try:
        if isinstance(payload, str):  # the spec allows str in place of bin
            payload = payload.encode("utf-8", "surrogateescape")
        result = handle(payload)
        if not isinstance(result, (bytes, bytearray)):
            raise TypeError(f"handle() returned {type(result).__name__}, not bytes")
        return packer.pack(["ok", batch_id, result])
    except Exception as exc:
        log(f"batch {batch_id} failed:\n{traceback.format_exc().rstrip()}")
        message = f"{type(exc).__name__}: {exc}"[:8192]  # the worker cuts at 8 KiB
        return packer.pack(["error", batch_id, message])


def main():
    # A frame that is cut short or is not a protocol message raises: the
    # handler exits with status 1 and the worker restarts it.
    frames_in, frames_out = take_protocol_pipes()
    log(f"upper.py starting: slot {os.environ.get('FLEET_HANDLER_SLOT')}, "
        f"worker {os.environ.get('FLEET_WORKER_ID')}")
    # "--depth N": take up to N batches at once (still one at a time, in
    # order); worth it for short batches with the worker's --prefetch.
    depth = 1
    if len(sys.argv) == 3 and sys.argv[1] == "--depth":
        depth = int(sys.argv[2])
    elif len(sys.argv) != 1:
        log(f"usage: {sys.argv[0]} [--depth N]")
        return 2
    ready = ["ready", PROTOCOL_VERSION] if depth == 1 else ["ready", PROTOCOL_VERSION, depth]
    write_frame(frames_out, packer.pack(ready))
    while True:
        header = read_exact(frames_in, 4)
        if not header:
            return 0  # end-of-file on stdin: the worker wants us to stop
        (length,) = struct.unpack(">I", header)
        message = msgpack.unpackb(read_exact(frames_in, length), raw=False,
                                  unicode_errors="surrogateescape")
        if not (isinstance(message, list) and message and isinstance(message[0], str)):
            raise ValueError(f"not a protocol message: {message!r:.200}")
        if message[0] != "batch":
            log(f"ignoring unknown message {message[0]!r}")
            continue
        _, batch_id, payload, _attempt, _queue = message
        write_frame(frames_out, answer(batch_id, payload))


if __name__ == "__main__":
    sys.exit(main())
