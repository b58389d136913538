#!/usr/bin/python3
"""A fleet producer written from docs/protocol.md alone (pyzmq + msgpack).

Submits --count batches to queue "default", waits for one result per batch
and prints "<id> <outcome> <result>" lines, then "ok=N failed=N missing=N".
Exits 0 only if every batch got an ok result.
"""
import argparse
import os
import sys
import time

import msgpack
import zmq

VERSION = 1
SUBMIT, ACK, RESULT, ERROR = 1, 2, 3, 40
QUEUE_FULL, DISK_FULL = 5, 13  # both: the broker asks to retry later
OUTCOMES = {0: "ok", 1: "failed", 2: "unknown"}
CHUNK = 1000        # batches per SUBMIT message
RETRY_S = 0.2       # wait before re-submitting after queue_full or disk_full
RESUBMIT_S = 5.0    # re-submit ids still unacknowledged after this long


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--broker", default="tcp://127.0.0.1:5555")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--payload", default="hello")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.broker)

    prefix = "py-%s-" % os.urandom(6).hex()
    ids = [prefix + str(n) for n in range(args.count)]
    wanted = set(ids)
    payload = args.payload.encode()
    results = {}             # id -> (outcome name, result text)
    unacked = {}             # id -> time to (re-)submit it; 0 means now
    for i in ids:
        unacked[i] = 0.0

    def submit_due(now):
        due = [i for i, t in unacked.items() if t <= now and i not in results]
        for k in range(0, len(due), CHUNK):
            batches = [[i, "default", payload] for i in due[k:k + CHUNK]]
            sock.send(msgpack.packb([VERSION, SUBMIT, batches], use_bin_type=True))
        for i in due:
            unacked[i] = now + RESUBMIT_S  # re-submitting is always safe

    deadline = time.monotonic() + args.timeout
    while len(results) < len(ids) and time.monotonic() < deadline:
        submit_due(time.monotonic())
        if not sock.poll(50):
            continue
        msg = msgpack.unpackb(sock.recv(), raw=False)
        if not isinstance(msg, list) or len(msg) < 2 or msg[0] != VERSION:
            print("unexpected message: %r" % (msg,), file=sys.stderr)
        elif msg[1] == ACK:
            for i in msg[2]:
                unacked.pop(i, None)
            for rid, code, text in msg[3]:
                if rid not in unacked or rid in results:
                    continue
                if code in (QUEUE_FULL, DISK_FULL):
                    unacked[rid] = time.monotonic() + RETRY_S
                else:  # refused for good: report it as a failed batch
                    unacked.pop(rid)
                    results[rid] = ("failed", "rejected (code %d): %s" % (code, text))
                    print(rid, "failed", results[rid][1])
        elif msg[1] == RESULT:  # may arrive before the ACK of its batch
            for rid, outcome, _attempts, result, error in msg[2]:
                if rid in results or rid not in wanted:
                    continue
                unacked.pop(rid, None)
                name = OUTCOMES.get(outcome, str(outcome))
                text = result.decode("utf-8", "replace") if isinstance(result, bytes) else str(result)
                if error:
                    text += " error=" + error
                results[rid] = (name, text)
                print(rid, name, text)
        elif msg[1] == ERROR:  # not tied to one message: re-submit what is unacknowledged
            print("broker error %d: %s" % (msg[2], msg[3]), file=sys.stderr)
            for i in unacked:
                unacked[i] = time.monotonic() + RETRY_S

    ok = sum(1 for v in results.values() if v[0] == "ok")
    failed = len(results) - ok
    missing = len(ids) - len(results)
    print("ok=%d failed=%d missing=%d" % (ok, failed, missing))
    sock.close()
    ctx.term()
    return 0 if ok == len(ids) else 1


if __name__ == "__main__":
    sys.exit(main())
