"""A small synchronous client of fleet-broker's control socket
(docs/protocol.md, section 6): `workers` and `stats`, for tools and for the
joblib backend's n_jobs=-1."""

import os

import zmq

from . import _wire as w


class ControlError(RuntimeError):
    """No answer in time, or the broker refused the request."""


def call(endpoint, op, args=(), timeout=2.0, curve=None):
    """Sends one CONTROL request and returns the reply's fields after its
    request id: WORKERS_REPLY -> list of worker entries, STATS_REPLY ->
    (queues, counters), CONTROL_REPLY -> (code, message). Raises ControlError
    when nothing answers within `timeout` seconds."""
    w.check_endpoint(endpoint, "control endpoint")
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        w.apply_curve(sock, curve)
        sock.connect(endpoint)
        rid = int.from_bytes(os.urandom(6), "big")
        sock.send(w.pack([w.VERSION, w.CONTROL, rid, op, list(args)]))
        left = int(timeout * 1000)
        while sock.poll(left):
            msg = w.unpack(sock.recv())
            if len(msg) >= 3 and msg[1] in (w.CONTROL_REPLY, w.WORKERS_REPLY, w.STATS_REPLY) \
                    and msg[2] == rid:
                if msg[1] == w.CONTROL_REPLY and msg[3] != 0:
                    raise ControlError("%s %s: %s: %s" % (endpoint, op, w.code_name(msg[3]), msg[4]))
                return msg[3] if msg[1] == w.WORKERS_REPLY else tuple(msg[3:])
            left = 100  # an unrelated reply: keep listening a little
        raise ControlError("no answer from %s to %r within %s s (is fleet-broker running, "
                           "and is this its control endpoint?)" % (endpoint, op, timeout))
    finally:
        sock.close(0)


def workers(endpoint, timeout=2.0, curve=None):
    """Registered workers as dicts: id, state, concurrency, held,
    idle_seconds, processed, failed, slots."""
    names = ("id", "state", "concurrency", "held", "idle_seconds", "processed", "failed", "slots")
    out = []
    for entry in call(endpoint, "workers", timeout=timeout, curve=curve):
        d = dict(zip(names, entry))
        d.setdefault("slots", d["concurrency"])
        if not d["slots"]:
            d["slots"] = d["concurrency"]
        out.append(d)
    return out


def stats(endpoint, timeout=2.0, curve=None):
    """(queue depths, counters) as two dicts."""
    queues, counters = call(endpoint, "stats", timeout=timeout, curve=curve)
    return queues, counters
