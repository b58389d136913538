#!/usr/bin/python3
"""Peer benchmark: Dask distributed doing fleet's echo / sleep workloads.

Run with Debian's interpreter (it sees the python3-* packages):

  /usr/bin/python3 bench/peers/dask_bench.py throughput --workers K --size B --count N [--producers P]
  /usr/bin/python3 bench/peers/dask_bench.py sleep      --workers K --sleep-ms 10 --count N
  /usr/bin/python3 bench/peers/dask_bench.py latency    --workers K --size B --rate R --seconds S

Package: apt-get install -y python3-distributed
The last stdout line is one JSON object (see bench/peers/README.md); progress
goes to stderr. Exit 0 ok, 1 failed (a task lost, a server died), 3 Dask
distributed not available here ("dask: not available: ...").

Set-up (each run builds and removes all of it):
  * its own `dask-scheduler` on 127.0.0.1, port chosen by the OS (0), address
    handed over in a scheduler file in a temp dir, no dashboard;
  * one `dask-worker --nworkers K --nthreads 1`: K single-threaded worker
    processes, each under its nanny (Dask's standard deployment, the same
    processes LocalCluster(processes=True, threads_per_worker=1) starts);
    the nannies are not on the task path;
  * Dask's defaults otherwise (work stealing on, no memory limit changes);
  * the task functions are imported by reference from this module on the
    workers (PYTHONPATH), so no function is pickled by value per task;
  * the client is the ordinary distributed.Client: throughput and sleep use
    client.map (all tasks in one submission) and gather; latency uses the
    asyncio Client, one submit per scheduled time and an awaiting coroutine
    per task that stamps the time the result is in the client's hands.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import peerlib as pl  # noqa: E402

SYSTEM = "dask"


# Task functions: imported by the workers as dask_bench.echo / .sleep_task.
def echo(payload):
    return payload


def sleep_task(ms):
    time.sleep(ms / 1000.0)
    return ms


def _tasks():
    """The task functions as attributes of the importable module
    `dask_bench`, so that they pickle by reference (not __main__)."""
    import importlib
    mod = importlib.import_module("dask_bench")
    return mod.echo, mod.sleep_task


def import_or_unavailable():
    try:
        import dask  # noqa: F401
        import distributed
    except Exception as e:  # ImportError, or a broken dependency
        raise pl.Unavailable("%s: %s (apt-get install -y python3-distributed; "
                             "run with /usr/bin/python3)" % (type(e).__name__, e))
    return distributed.__version__


def quiet_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DASK_LOGGING__DISTRIBUTED"] = "warning"
    env["DASK_DISTRIBUTED__WORKER__DAEMON"] = "True"
    return env


def tail(path, n=15):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


def start_cluster(children, k):
    d = children.tmpdir("fleet-peer-dask-")
    sfile = os.path.join(d, "scheduler.json")
    env = quiet_env()
    slog = os.path.join(d, "scheduler.log")
    with open(slog, "wb") as f:
        sched = children.spawn("dask-scheduler", [
            pl.PYTHON, "-m", "distributed.cli.dask_scheduler",
            "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--no-show",
            "--scheduler-file", sfile,
        ], env=env, cwd=d, stdout=f, stderr=f)
    deadline = time.monotonic() + 60
    while not os.path.exists(sfile):
        if sched.poll() is not None:
            raise pl.Unavailable("dask-scheduler exited with code %s:\n%s"
                                 % (sched.returncode, tail(slog)))
        if time.monotonic() > deadline:
            raise pl.Unavailable("dask-scheduler wrote no address in 60 s:\n%s" % tail(slog))
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one go; let it land
    wlog = os.path.join(d, "workers.log")
    with open(wlog, "wb") as f:
        children.spawn("dask-worker x%d" % k, [
            pl.PYTHON, "-m", "distributed.cli.dask_worker",
            "--scheduler-file", sfile, "--host", "127.0.0.1",
            "--nworkers", str(k), "--nthreads", "1", "--nanny",
            "--no-dashboard", "--local-directory", d,
            "--death-timeout", "60",
        ], env=env, cwd=d, stdout=f, stderr=f)
    return sfile, slog, wlog


def connect(children, sfile, k, logs):
    from distributed import Client
    c = Client(scheduler_file=sfile, set_as_default=True, timeout=30)
    children.on_close.append(lambda: c.close(timeout=3))
    try:
        c.wait_for_workers(k, timeout=90)
    except Exception as e:
        children.check_alive()
        raise pl.Unavailable("only %d of %d dask workers registered in 90 s (%s):\n%s"
                             % (len(c.scheduler_info()["workers"]), k, e,
                                tail(logs[1])))
    return c


def run_map(client, fn, arg, expect, count, timeout):
    """Submit `count` tasks at once (client.map), gather all. Returns
    (t_first_submit, t_last_result, missing, bad)."""
    from distributed import wait
    t0 = time.monotonic()
    futs = client.map(fn, [arg] * count, pure=False)
    try:
        wait(futs, timeout=timeout)
    except Exception:  # TimeoutError (type differs across versions)
        pass
    done = [f for f in futs if f.status == "finished"]
    missing = count - len(done)
    results = client.gather(done, errors="skip")
    t1 = time.monotonic()
    bad = sum(1 for r in results if r != expect) + (len(done) - len(results))
    client.cancel(futs)
    return t0, t1, missing, bad


def producer_proc(sfile, count, size, timeout, ready_q, go, out_q):
    try:
        from distributed import Client
        fn, _ = _tasks()
        payload = pl.payload_bytes(size)
        c = Client(scheduler_file=sfile, set_as_default=True, timeout=30)
        run_map(c, fn, payload, payload, 5, 60)
        ready_q.put(os.getpid())
        if not go.wait(120):
            out_q.put(("error", "no start signal"))
            return
        t0, t1, missing, bad = run_map(c, fn, payload, payload, count, timeout)
        out_q.put(("ok", t0, t1, missing, bad))
        c.close()
    except BaseException as e:
        out_q.put(("error", "%s: %s" % (type(e).__name__, e)))


def setup(children, args):
    version = import_or_unavailable()
    sfile, slog, wlog = start_cluster(children, args.workers)
    client = connect(children, sfile, args.workers, (slog, wlog))
    pl.log("distributed %s, scheduler %s, %d single-threaded worker process(es)"
           % (version, client.scheduler.address, args.workers))
    echo_fn, _ = _tasks()
    n = max(args.warmup, 2 * args.workers)
    payload = pl.payload_bytes(getattr(args, "size", 100))
    t = time.monotonic()
    _t0, _t1, missing, bad = run_map(client, echo_fn, payload, payload, n, 90)
    if missing or bad:
        children.check_alive()
        raise pl.BenchError("warm-up: %d of %d tasks failed or missing; worker log:\n%s"
                            % (missing + bad, n, tail(wlog)))
    pl.log("warm-up: %d tasks in %.2f s" % (n, time.monotonic() - t))
    return sfile, client, wlog


def bench_throughput(children, args):
    sfile, client, wlog = setup(children, args)
    echo_fn, _ = _tasks()
    payload = pl.payload_bytes(args.size)
    timeout = args.timeout or (60.0 + args.count / 100.0)
    P = args.producers
    if P == 1:
        t0, t1, missing, bad = run_map(client, echo_fn, payload, payload, args.count, timeout)
        starts, ends = [t0], [t1]
    else:
        starts, ends, missing, bad = pl.run_producer_processes(
            children, producer_proc, sfile, args.count, P, args.size, timeout, 90)
    children.check_alive()
    res = pl.throughput_result(SYSTEM, args, P, starts, ends, missing, bad)
    if missing:
        pl.log("worker log tail:\n" + tail(wlog))
    return res


def bench_sleep(children, args):
    sfile, client, wlog = setup(children, args)
    _, sleep_fn = _tasks()
    ms = args.sleep_ms
    ideal_time = args.count * ms / 1000.0 / args.workers
    timeout = args.timeout or (60.0 + 3 * ideal_time)
    t0, t1, missing, bad = run_map(client, sleep_fn, ms, ms, args.count, timeout)
    children.check_alive()
    if bad:
        raise pl.BenchError("%d task(s) returned a wrong result or failed" % bad)
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
    import asyncio
    sfile, sync_client, wlog = setup(children, args)
    echo_fn, _ = _tasks()
    payload = pl.payload_bytes(args.size)
    n = max(1, int(round(args.rate * args.seconds)))
    period = 1.0 / args.rate
    grace = args.timeout or 30.0
    lat = [None] * n
    lag = [0.0] * n
    sent = [0.0, 0.0]
    bad = [0]

    async def run():
        from distributed import Client
        c = await Client(scheduler_file=sfile, asynchronous=True,
                         set_as_default=False, timeout=30)
        try:
            # a few untimed round trips on this client's own connection
            for _ in range(20):
                await c.submit(echo_fn, payload, pure=False)

            async def collect(i, fut, sched):
                r = await fut  # result fetched into the client
                lat[i] = time.monotonic() - sched
                if r != payload:
                    bad[0] += 1

            tasks = []
            start = time.monotonic() + 0.02
            for i in range(n):
                sched = start + i * period
                d = sched - time.monotonic()
                if d > 0.0015:
                    # the event loop wakes up to 1 ms late (epoll rounds up
                    # to whole ms): wait there until just before the time,
                    # then sleep the rest precisely.
                    await asyncio.sleep(d - 0.0015)
                d = sched - time.monotonic()
                if d > 0:
                    time.sleep(d)
                now = time.monotonic()
                lag[i] = now - sched
                fut = c.submit(echo_fn, payload, pure=False)
                tasks.append(asyncio.ensure_future(collect(i, fut, sched)))
                if i == 0:
                    sent[0] = now
                sent[1] = now
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for t in pending:
                t.cancel()
        finally:
            await c.close()

    asyncio.run(run())
    children.check_alive()
    if bad[0]:
        raise pl.BenchError("%d task(s) returned a wrong result" % bad[0])
    got = [x for x in lat if x is not None]
    lag.sort()
    res = {"system": SYSTEM, "bench": "latency", "size": args.size,
           "workers": args.workers, "rate": pl.num(args.rate),
           "achieved_rate": round((n - 1) / (sent[1] - sent[0]), 1)
           if n > 1 and sent[1] > sent[0] else args.rate,
           "samples": len(got), "lost": n - len(got)}
    res.update(pl.latency_figures(got))
    res["send_lag_p50_us"] = int(pl.nearest_rank(lag, 50) * 1e6)
    res["send_lag_max_us"] = int(lag[-1] * 1e6)
    return res


def main():
    pl.reexec_with_debian_python(["distributed"])
    args = pl.parse_args(SYSTEM, "\n".join(__doc__.split("\n")[0:8]))
    body = {"throughput": bench_throughput, "sleep": bench_sleep,
            "latency": bench_latency}[args.mode]
    return pl.run_main(SYSTEM, lambda ch: body(ch, args))


if __name__ == "__main__":
    sys.exit(main())
