#!/usr/bin/python3
"""make bench-flood: a connection flood against fleet-broker's memory.

Each flooding connection speaks ZMTP 3.0 as a DEALER, announces one frame of
the broker's whole transport limit (ZMQ_MAXMSGSIZE), sends all of it but
the last byte as fast as the broker reads, and never finishes it: libzmq
holds the frame out of the broker's sight. A connection the broker closes
comes back after --retry-ms, like a libzmq peer reconnecting.

For each broker setting it prints the broker's peak RSS (VmHWM) over its
RSS before the flood, the connections the inbound budget refused, and a
legitimate producer's throughput (fleet-submit, echo workers) alone and
during the flood. Settings:
  budget        the defaults (--max-message-bytes derived from
                --max-batch-bytes, --max-inbound-mb 256)
  no-budget     the same frame limit, --max-inbound-mb 0
  64mib-frames  --max-message-bytes 64 MiB (the old default; the old
                transport limit was twice that), no budget, --old-connections
The last stdout line is one JSON object with every figure.
"""
import argparse
import json
import os
import re
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def log(msg):
    print(f"[flood {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def metric_sum(url, name, labels=""):
    try:
        page = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return -1
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Broker:
    def __init__(self, bin_dir, tmp, flags, workers):
        self.tmp = tmp
        ready = os.path.join(tmp, "ready")
        self.log_path = os.path.join(tmp, "broker.log")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "fleet-broker"), "--frontend", "tcp://127.0.0.1:*",
             "--backend", "tcp://127.0.0.1:*", "--control", "tcp://127.0.0.1:*",
             "--metrics", "127.0.0.1:0", "--ready-file", ready] + flags,
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("broker did not start: " + open(self.log_path).read())
            time.sleep(0.05)
        self.ep = dict(line.strip().split("=", 1) for line in open(ready) if "=" in line)
        text = open(self.log_path).read()
        self.max_message = int(re.search(r"max-message-bytes (\d+)", text).group(1))
        self.workers = [
            subprocess.Popen([os.path.join(bin_dir, "fleet-worker"), "--broker",
                              self.ep["backend"], "--id", f"fw{i}", "--handler", "echo",
                              "--concurrency", "4"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(workers)]

    def stop(self):
        for p in self.workers + [self.proc]:
            p.terminate()
        for p in self.workers + [self.proc]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def submit(bin_dir, frontend, count, size):
    r = subprocess.run([os.path.join(bin_dir, "fleet-submit"), "--broker", frontend,
                        "--count", str(count), "--size", str(size), "--inflight", "500"],
                       capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("submitted=")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"fleet-submit failed: {r.stdout[-1000:]} {r.stderr[-1000:]}")
    kv = dict(x.split("=", 1) for x in line[-1].split())
    return float(kv["batches_per_s"]), int(kv["ok"])


def opening(frame_bytes):
    """ZMTP 3.0 greeting (NULL, client), READY as a DEALER, a long frame header."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + \
        b"\0" + b"\0" * 31
    prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + prop
    return greeting + b"\x04" + bytes([len(ready)]) + ready + b"\x02" + \
        struct.pack(">Q", frame_bytes)


class Flood:
    """`n` connections, each sending frame_bytes - 1 of an announced frame."""

    def __init__(self, host, port, n, frame_bytes, retry_ms, rate=0.0):
        self.rate = rate  # bytes/s per connection, 0: as fast as the broker reads
        self.addr = (host, port)
        self.n, self.frame, self.retry = n, frame_bytes, retry_ms / 1000.0
        self.head = opening(frame_bytes)
        self.chunk = b"x" * (256 << 10)
        self.stop_flag = False
        self.closed_by_peer = 0
        self.connects = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        sel = selectors.DefaultSelector()
        due = [0.0] * self.n   # when slot i may (re)connect
        conns = {}             # slot -> [socket, bytes left to send of head+body]
        while not self.stop_flag:
            now = time.monotonic()
            for i in range(self.n):
                if i not in conns and now >= due[i]:
                    s = socket.socket()
                    s.setblocking(False)
                    try:
                        s.connect(self.addr)
                    except BlockingIOError:
                        pass
                    self.connects += 1
                    conns[i] = [s, len(self.head) + self.frame - 1, 0, now]
                    sel.register(s, selectors.EVENT_WRITE | selectors.EVENT_READ, i)
            for key, ev in sel.select(timeout=0.05):
                i = key.data
                s, left, sent, began = conns[i]
                gone = False
                if ev & selectors.EVENT_READ:
                    try:
                        if s.recv(65536) == b"":
                            gone = True
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        gone = True
                if not gone and ev & selectors.EVENT_WRITE and left > 0:
                    if sent < len(self.head):
                        data = self.head[sent:]
                    else:
                        data = self.chunk[:min(len(self.chunk), left)]
                        if self.rate > 0:
                            allowed = int(self.rate * (time.monotonic() - began)) - sent
                            data = data[:max(0, allowed)]
                    try:
                        k = s.send(data) if data else 0
                        conns[i][1] -= k
                        conns[i][2] += k
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        gone = True
                    if conns[i][1] == 0:
                        sel.modify(s, selectors.EVENT_READ, i)  # hold the frame open
                if gone:
                    self.closed_by_peer += 1
                    sel.unregister(s)
                    s.close()
                    del conns[i]
                    due[i] = time.monotonic() + self.retry
        for s, *_ in conns.values():
            s.close()

    def stop(self):
        self.stop_flag = True
        self.thread.join()


def run_setting(args, name, flags):
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        b = Broker(args.bin, tmp, flags, args.workers)
        try:
            time.sleep(1.0)  # workers register
            old = name == "64mib-frames"
            frame = b.max_message + (64 << 10)  # ZMQ_MAXMSGSIZE
            n = args.old_connections if old else args.connections
            rate_alone, _ = submit(args.bin, b.ep["frontend"], args.count, args.size)
            rss_before = status_kb(b.proc.pid, "VmRSS")
            host, port = b.ep["frontend"][len("tcp://"):].rsplit(":", 1)
            flood = Flood(host, int(port), n, frame, args.retry_ms, args.rate_mb_s * (1 << 20))
            time.sleep(args.settle)
            rate_flood, ok = submit(args.bin, b.ep["frontend"], args.count, args.size)
            time.sleep(max(0.0, args.seconds - args.settle))
            rss_during = status_kb(b.proc.pid, "VmRSS")
            hwm = status_kb(b.proc.pid, "VmHWM")
            flood.stop()
            time.sleep(1.2)  # a housekeeping tick publishes the counters
            url = b.ep.get("metrics", "")
            refused = metric_sum(url, "fleet_connections_refused_total",
                                 'reason="inbound_budget"')
            evicted = metric_sum(url, "fleet_connections_refused_total",
                                 'reason="unproven_evicted"')
            alive = b.proc.poll() is None
        finally:
            b.stop()
    r = {"setting": name, "flags": " ".join(flags), "frame_bytes": frame,
         "connections": n, "connects": flood.connects,
         "closed_by_broker": flood.closed_by_peer,
         "rss_before_mb": round(rss_before / 1024, 1),
         "rss_during_mb": round(rss_during / 1024, 1), "peak_rss_mb": round(hwm / 1024, 1),
         "refused": max(refused, 0), "evicted": max(evicted, 0),
         "batches_per_s_alone": rate_alone, "batches_per_s_flood": rate_flood,
         "flood_ok": ok, "broker_alive": alive}
    log(f"{name}: peak RSS {r['peak_rss_mb']} MB (before the flood {r['rss_before_mb']} MB), "
        f"refused {r['refused']:.0f} evicted {r['evicted']:.0f}, producer "
        f"{rate_alone:.0f} batches/s alone, {rate_flood:.0f} during the flood")
    return r


def storm(args):
    """--storm N: N workers (DEALERs sending HELLO) connect at once to a
    broker with the default budget, as after a broker restart; reports how
    long until every one has its WELCOME and how many connections the
    budget refused meanwhile. A worker whose HELLO went unanswered sends it
    again after 1 s (fleet-worker waits heartbeat x liveness, 3 s)."""
    import msgpack
    import zmq
    with tempfile.TemporaryDirectory(prefix="flood-storm-") as tmp:
        b = Broker(args.bin, tmp, [], 0)
        ctx = zmq.Context()
        try:
            socks = []
            start = time.monotonic()
            for i in range(args.storm):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.IMMEDIATE, 1)
                s.connect(b.ep["backend"])
                socks.append(s)
            hello = [msgpack.packb([1, 10, f"storm-{i}", 1, 1, []]) for i in range(args.storm)]
            sent = [0.0] * args.storm
            welcomed = set()
            poller = zmq.Poller()
            for s in socks:
                poller.register(s, zmq.POLLIN)
            deadline = start + 120
            while len(welcomed) < args.storm and time.monotonic() < deadline:
                now = time.monotonic()
                for i, s in enumerate(socks):
                    if i not in welcomed and now - sent[i] >= 1.0:
                        try:
                            s.send(hello[i], zmq.NOBLOCK)
                            sent[i] = now
                        except zmq.Again:
                            pass
                for s, _ in poller.poll(50):
                    while True:
                        try:
                            m = msgpack.unpackb(s.recv(zmq.NOBLOCK), raw=False)
                        except zmq.Again:
                            break
                        if m[1] == 11:
                            welcomed.add(socks.index(s))
            took = time.monotonic() - start
            time.sleep(1.2)
            refused = metric_sum(b.ep["metrics"], "fleet_connections_refused_total")
        finally:
            for s in socks:
                s.close()
            ctx.term()
            b.stop()
    r = {"workers": args.storm, "registered": len(welcomed), "seconds": round(took, 2),
         "refused": refused}
    log(f"storm: {len(welcomed)} of {args.storm} workers registered in {took:.2f} s; "
        f"{refused:.0f} connections refused by the budget meanwhile")
    print(json.dumps({"storm": r}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "build", "bin"))
    ap.add_argument("--connections", type=int, default=64, help="flooding connections")
    ap.add_argument("--old-connections", type=int, default=8,
                    help="flooding connections with 64 MiB frames")
    ap.add_argument("--seconds", type=float, default=6.0, help="flood length")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="flood time before the producer starts")
    ap.add_argument("--rate-mb-s", type=float, default=0,
                    help="MiB/s each connection sends (0: as fast as the broker reads)")
    ap.add_argument("--retry-ms", type=float, default=100, help="reconnect after a close")
    ap.add_argument("--count", type=int, default=20000, help="producer batches")
    ap.add_argument("--size", type=int, default=100, help="producer payload bytes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--settings", default="budget,no-budget,64mib-frames")
    ap.add_argument("--quick", action="store_true", help="fewer connections and batches")
    ap.add_argument("--storm", type=int, default=0,
                    help="instead: N workers connecting at once (default budget)")
    args = ap.parse_args()
    if args.storm:
        storm(args)
        return
    if args.quick:
        args.connections, args.old_connections, args.count, args.seconds = 32, 4, 5000, 4.0
    settings = {
        "budget": [],
        "no-budget": ["--max-inbound-mb", "0"],
        "64mib-frames": ["--max-message-bytes", "67108864", "--max-inbound-mb", "0"],
    }
    results = [run_setting(args, s, settings[s]) for s in args.settings.split(",")]
    print(f"{'setting':<13} {'peak RSS':>9} {'refused':>8} {'evicted':>8} "
          f"{'alone b/s':>10} {'flood b/s':>10}")
    for r in results:
        print(f"{r['setting']:<13} {r['peak_rss_mb']:>6.0f} MB {r['refused']:>8.0f} "
              f"{r['evicted']:>8.0f} {r['batches_per_s_alone']:>10.0f} "
              f"{r['batches_per_s_flood']:>10.0f}")
    print(json.dumps({"flood": results}))


if __name__ == "__main__":
    main()
