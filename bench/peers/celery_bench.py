#!/usr/bin/python3
"""Peer benchmark: Celery 5 + Redis doing fleet's echo / sleep workloads.

Run with Debian's interpreter (it sees the python3-* packages):

  /usr/bin/python3 bench/peers/celery_bench.py throughput --workers K --size B --count N [--producers P]
  /usr/bin/python3 bench/peers/celery_bench.py sleep      --workers K --sleep-ms 10 --count N
  /usr/bin/python3 bench/peers/celery_bench.py latency    --workers K --size B --rate R --seconds S

Packages: apt-get install -y python3-celery python3-redis redis-server
The last stdout line is one JSON object (see bench/peers/README.md); progress
goes to stderr. Exit 0 ok, 1 failed (a task lost, a server died), 3 Celery or
Redis not available here.

Set-up (each run builds and removes all of it):
  * its own redis-server on a free 127.0.0.1 port, temp dir, no RDB/AOF; it is
    both the broker and the result backend (the usual Celery + Redis pairing);
  * one `celery worker` with the prefork pool and --concurrency K, i.e. K
    worker processes each running one task at a time, like fleet's K workers;
    -O fair, --prefetch-multiplier 16 (see below), no gossip / mingle /
    heartbeat / events (nothing else on the wire), rate limits disabled;
  * serializer msgpack for tasks and results: carries the payload as bytes,
    like fleet does, and is the fastest of json/msgpack/pickle here (pickle
    would also need C_FORCE_ROOT as root);
  * acks on receipt (Celery's default, acks_late off): the same at-most-once
    hand-off as an in-memory broker;
  * the client submits with apply_async through one held producer connection
    and gets results through Celery's own Redis pub/sub result consumer
    (AsyncResult.then callbacks + drain_events), i.e. the normal client path.
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import peerlib as pl  # noqa: E402

SYSTEM = "celery"
SERIALIZER = os.environ.get("FLEET_PEER_CELERY_SERIALIZER", "msgpack")
PREFETCH = int(os.environ.get("FLEET_PEER_CELERY_PREFETCH", "16"))
URL_ENV = "FLEET_PEER_CELERY_URL"


def make_app(url):
    from celery import Celery
    app = Celery("fleetpeer", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_serializer=SERIALIZER,
        result_serializer=SERIALIZER,
        accept_content=[SERIALIZER],
        result_accept_content=[SERIALIZER],
        worker_prefetch_multiplier=PREFETCH,
        task_acks_late=False,
        worker_disable_rate_limits=True,
        task_track_started=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        result_extended=False,
        result_expires=3600,
        broker_heartbeat=0,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )

    @app.task(name="fleetpeer.echo")
    def echo(payload):
        return payload

    @app.task(name="fleetpeer.sleep")
    def sleep_task(ms):
        time.sleep(ms / 1000.0)
        return ms

    app.finalize()
    return app, echo, sleep_task


# The worker imports this module (`-A celery_bench:app`); it finds the broker
# address in the environment. Nothing else runs at import time.
if __name__ != "__main__" and os.environ.get(URL_ENV):
    app, _echo, _sleep = make_app(os.environ[URL_ENV])


def import_or_unavailable():
    try:
        import celery  # noqa: F401
        import redis   # noqa: F401
        import kombu   # noqa: F401
        if SERIALIZER == "msgpack":
            import msgpack  # noqa: F401
    except ImportError as e:
        raise pl.Unavailable("%s (apt-get install -y python3-celery python3-redis "
                             "python3-msgpack redis-server; run with /usr/bin/python3)" % e)
    import celery
    if int(celery.__version__.split(".")[0]) < 5:
        raise pl.Unavailable("Celery %s is older than 5" % celery.__version__)
    return celery.__version__


# --------------------------------------------------------------------------
# Client side
# --------------------------------------------------------------------------

class Client:
    """Submits tasks and collects results through Celery's result consumer.
    Single-threaded: results are drained between sends (Celery's result
    consumer is not thread-safe), callbacks stamp the receive time."""

    def __init__(self, url):
        self.app, self.echo, self.sleep = make_app(url)
        self.consumer = self.app.backend.result_consumer
        self.ok = 0
        self.bad = 0
        self.last_done = 0.0
        self._prod_cm = self.app.producer_or_acquire()
        self.producer = self._prod_cm.__enter__()
        self.keep = []

    def close(self):
        """Drop pending results and the pub/sub link while redis is still
        up, so that no AsyncResult.__del__ talks to a stopped server."""
        self.keep.clear()
        try:
            for mapping in self.app.backend._pending_results:
                mapping.clear()
            self.consumer.stop()
        except Exception:
            pass
        self.consumer._pubsub = None
        try:
            self._prod_cm.__exit__(None, None, None)
        except Exception:
            pass

    def send(self, task, args, on_done):
        r = task.apply_async(args, producer=self.producer)
        r.then(on_done)
        self.keep.append(r)
        return r

    def check(self, r, expect):
        now = time.monotonic()
        self.last_done = now
        try:
            good = r.successful() and r.result == expect
        except Exception:
            good = False
        if good:
            self.ok += 1
        else:
            self.bad += 1
            if self.bad <= 3:
                pl.log(("bad result: state=%s result=%r" % (r.state, r.result))[:200])
        return now

    def drain(self, timeout):
        self.consumer.drain_events(timeout=timeout)

    def drain_ready(self, max_msgs=256):
        # Read what is already there without blocking (keeps the pub/sub
        # buffer small while submitting a large window).
        for _ in range(max_msgs):
            before = self.ok + self.bad
            self.consumer.drain_events(timeout=0)
            if self.ok + self.bad == before:
                ps = self.consumer._pubsub
                if ps is None or not ps.connection or not ps.connection.can_read(timeout=0):
                    break

    def wait_done(self, total, deadline):
        while self.ok + self.bad < total and time.monotonic() < deadline:
            self.drain(min(0.1, max(0.001, deadline - time.monotonic())))
        return total - (self.ok + self.bad)

    def run_batch(self, task, args, expect, count, timeout, interleave=64):
        """Submit `count` tasks as fast as possible, collect all. Returns
        (t_first_submit, t_last_result, missing)."""
        cb = lambda r: self.check(r, expect)
        base = self.ok + self.bad
        t0 = time.monotonic()
        for i in range(count):
            self.send(task, args, cb)
            if interleave and i % interleave == interleave - 1:
                self.drain_ready()
        missing = self.wait_done(base + count, t0 + timeout)
        self.keep.clear()
        return t0, self.last_done, missing


def producer_proc(url, count, size, timeout, ready_q, go, out_q):
    """One of P producer processes (spawned): warm its connections, wait for
    the common start, submit its share, report its first-submit and
    last-result times (CLOCK_MONOTONIC is system-wide)."""
    try:
        c = Client(url)
        payload = pl.payload_bytes(size)
        c.run_batch(c.echo, (payload,), payload, 5, 60)
        c.ok = c.bad = 0
        ready_q.put(os.getpid())
        if not go.wait(120):
            out_q.put(("error", "no start signal"))
            return
        t0, t1, missing = c.run_batch(c.echo, (payload,), payload, count, timeout)
        out_q.put(("ok", t0, t1, missing, c.bad))
        c.close()
    except BaseException as e:  # report, never hang the parent
        out_q.put(("error", "%s: %s" % (type(e).__name__, e)))


# --------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------

def start_worker(children, url, k):
    d = children.tmpdir("fleet-peer-celery-")
    env = dict(os.environ)
    env[URL_ENV] = url
    env["PYTHONPATH"] = HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["FLEET_PEER_CELERY_SERIALIZER"] = SERIALIZER
    env["FLEET_PEER_CELERY_PREFETCH"] = str(PREFETCH)
    logpath = os.path.join(d, "worker.log")
    logf = open(logpath, "wb")
    children.spawn("celery worker x%d" % k, [
        pl.PYTHON, "-m", "celery", "-A", "celery_bench:app", "worker",
        "--pool", "prefork", "--concurrency", str(k),
        "-O", "fair", "--prefetch-multiplier", str(PREFETCH),
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel", "WARNING", "-n", "fleetpeer%d@localhost" % os.getpid(),
    ], env=env, cwd=HERE, stdout=logf, stderr=logf,
        term_signal=signal.SIGQUIT)  # cold shutdown: results are in already
    logf.close()
    return logpath


def tail(path, n=15):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


def setup(children, args):
    version = import_or_unavailable()
    port = pl.start_redis(children)
    url = "redis://127.0.0.1:%d/0" % port
    pl.log("celery %s, redis on 127.0.0.1:%d, %d worker process(es), serializer %s, "
           "prefetch x%d" % (version, port, args.workers, SERIALIZER, PREFETCH))
    logpath = start_worker(children, url, args.workers)
    client = Client(url)
    children.on_close.append(client.close)
    # Warm-up (untimed): also proves the worker is up and all K children run.
    n = max(args.warmup, 2 * args.workers)
    payload = pl.payload_bytes(getattr(args, "size", 100))
    t = time.monotonic()
    _t0, _t1, missing = client.run_batch(client.echo, (payload,), payload, n, 90)
    if missing or client.bad:
        children.check_alive()
        raise pl.BenchError("warm-up: %d of %d tasks without result in 90 s; worker log:\n%s"
                            % (missing + client.bad, n, tail(logpath)))
    pl.log("warm-up: %d tasks in %.2f s" % (n, time.monotonic() - t))
    client.ok = client.bad = 0
    return url, client, logpath


def bench_throughput(children, args):
    url, client, logpath = setup(children, args)
    payload = pl.payload_bytes(args.size)
    timeout = args.timeout or (60.0 + args.count / 100.0)
    P = args.producers
    if P == 1:
        t0, t1, missing = client.run_batch(client.echo, (payload,), payload, args.count, timeout)
        bad = client.bad
        starts, ends = [t0], [t1]
    else:
        starts, ends, missing, bad = pl.run_producer_processes(
            children, producer_proc, url, args.count, P, args.size, timeout, 60)
    children.check_alive()
    res = pl.throughput_result(SYSTEM, args, P, starts, ends, missing, bad)
    if missing:
        pl.log("worker log tail:\n" + tail(logpath))
    return res


def bench_sleep(children, args):
    url, client, logpath = setup(children, args)
    ms = args.sleep_ms
    ideal_time = args.count * ms / 1000.0 / args.workers
    timeout = args.timeout or (60.0 + 3 * ideal_time)
    t0, t1, missing = client.run_batch(client.sleep, (ms,), ms, args.count, timeout)
    children.check_alive()
    if client.bad:
        raise pl.BenchError("%d task(s) returned a wrong result or failed" % client.bad)
    seconds = t1 - t0
    rate = (args.count - missing) / seconds if seconds > 0 else 0.0
    ideal = args.workers * 1000.0 / ms if ms > 0 else None
    res = {"system": SYSTEM, "bench": "sleep", "sleep_ms": pl.num(args.sleep_ms),
           "workers": args.workers, "count": args.count,
           "seconds": round(seconds, 6), "batches_per_s": round(rate, 1),
           "ideal_per_s": round(ideal, 1) if ideal else None,
           "efficiency": round(rate / ideal, 4) if ideal else None}
    if missing:
        res["lost"] = missing
    return res


def bench_latency(children, args):
    url, client, logpath = setup(children, args)
    payload = pl.payload_bytes(args.size)
    n = max(1, int(round(args.rate * args.seconds)))
    period = 1.0 / args.rate
    lat = [None] * n
    lag = [0.0] * n

    def make_cb(i, sched):
        def cb(r):
            now = client.check(r, payload)
            lat[i] = now - sched
        return cb

    grace = args.timeout or 30.0
    start = time.monotonic() + 0.02
    i = 0
    end_deadline = None
    # One loop: send each task at its scheduled time, never waiting for
    # earlier results; between sends, drain results (callbacks stamp them).
    while True:
        now = time.monotonic()
        if i < n:
            sched = start + i * period
            if now >= sched:
                lag[i] = now - sched
                client.send(client.echo, (payload,), make_cb(i, sched))
                if i == 0:
                    first_sent = now
                last_sent = now
                i += 1
                continue
            wait = sched - now
            if wait <= 0.0015:
                # polling wakes up to 1 ms late (whole-ms timeouts): sleep
                # the last stretch precisely instead.
                time.sleep(wait)
                continue
            wait = min(wait - 0.0015, 0.05)
        else:
            if end_deadline is None:
                end_deadline = now + grace
            if client.ok + client.bad >= n or now >= end_deadline:
                break
            wait = min(0.05, end_deadline - now)
        client.drain(max(wait, 0.0))
    children.check_alive()
    if client.bad:
        raise pl.BenchError("%d task(s) returned a wrong result or failed" % client.bad)
    got = [x for x in lat if x is not None]
    lost = n - len(got)
    lag.sort()
    res = {"system": SYSTEM, "bench": "latency", "size": args.size,
           "workers": args.workers, "rate": pl.num(args.rate),
           "achieved_rate": round((n - 1) / (last_sent - first_sent), 1)
           if n > 1 and last_sent > first_sent else args.rate,
           "samples": len(got), "lost": lost}
    res.update(pl.latency_figures(got))
    res["send_lag_p50_us"] = int(pl.nearest_rank(lag, 50) * 1e6)
    res["send_lag_max_us"] = int(lag[-1] * 1e6)
    return res


def main():
    pl.reexec_with_debian_python(["celery", "redis", "msgpack"])
    args = pl.parse_args(SYSTEM, __doc__.split("\n\n")[0] + "\n\n" + "\n".join(
        __doc__.split("\n")[2:7]))
    body = {"throughput": bench_throughput, "sleep": bench_sleep,
            "latency": bench_latency}[args.mode]
    return pl.run_main(SYSTEM, lambda ch: body(ch, args))


if __name__ == "__main__":
    sys.exit(main())
