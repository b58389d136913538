#!/usr/bin/python3
"""Python figures, in one run: the seed's joblib case and a short Python
function through fleet and through Celery.

1. joblib, 20 calls of a trivial function, Parallel(n_jobs=2), on 2 cores:
   - loky (joblib's default): the first call (it spawns its processes) and
     warm calls;
   - Dask's joblib backend on a LocalCluster of 2 single-threaded worker
     processes: cluster start, first call, warm calls;
   - fleet, warm: fleet-broker and one fleet-worker (--concurrency 2)
     running `python3 -m fleet.calls`, already registered;
   - fleet from zero: fleet-broker and fleet-autoscaler (--min 0, process
     launcher) with no worker; each call waits for the autoscaler to start
     one, and the pool is back at zero before the next call.
   Each system runs in a fresh interpreter, so "first call" includes what a
   new Python session pays (imports, connections).
2. A short Python function (return the payload) over 100-byte payloads:
   fleet.Client.map into one fleet-worker (--concurrency 2, --prefetch 64)
   running it with fleet.serve (depth 16), against Celery 5 + Redis with a
   prefork worker of concurrency 2 (bench/peers/celery_bench.py, the same
   task body).

Prints a table and, as its last stdout line, one JSON object.
  /usr/bin/python3 bench/python_bench.py --bin build/bin [--quick]
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
CALLS = 20


def echo(payload):
    """The short Python function of part 2 (run by fleet.serve)."""
    return payload


def inc(x):
    return x + 1


def log(msg):
    print("python_bench: " + msg, file=sys.stderr, flush=True)


# ---- measurements that run in a fresh interpreter ------------------------

def _time_calls(reps):
    from joblib import Parallel, delayed
    t = time.perf_counter()
    out = Parallel(n_jobs=2)(delayed(inc)(i) for i in range(CALLS))
    first = time.perf_counter() - t
    assert out == [i + 1 for i in range(CALLS)]
    warm = []
    for _ in range(reps):
        t = time.perf_counter()
        out = Parallel(n_jobs=2)(delayed(inc)(i) for i in range(CALLS))
        warm.append(time.perf_counter() - t)
        assert out == [i + 1 for i in range(CALLS)]
    return first, warm


def child_loky(args):
    import joblib  # noqa: F401  (the import is not part of a call's time)
    first, warm = _time_calls(args.reps)
    return {"first_s": first, "warm_s": statistics.median(warm)}


def child_dask(args):
    import joblib
    from dask.distributed import Client, LocalCluster
    t = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=40)
    client = Client(cluster)
    start = time.perf_counter() - t
    try:
        with joblib.parallel_backend("dask"):
            first, warm = _time_calls(args.reps)
    finally:
        client.close()
        cluster.close()
    return {"cluster_start_s": start, "first_s": first, "warm_s": statistics.median(warm)}


def child_fleet_warm(args):
    import joblib
    import fleet.joblib
    fleet.joblib.register()
    with joblib.parallel_backend("fleet", broker=args.frontend):
        first, warm = _time_calls(args.reps)
    return {"first_s": first, "warm_s": statistics.median(warm)}


def child_fleet_cold(args):
    import joblib
    import fleet.joblib
    from fleet import control
    fleet.joblib.register()
    times, peaks = [], []
    with joblib.parallel_backend("fleet", broker=args.frontend, timeout=60):
        for _ in range(args.reps):
            deadline = time.monotonic() + 60
            while control.workers(args.control) and time.monotonic() < deadline:
                time.sleep(0.05)    # the pool goes back to zero between calls
            if control.workers(args.control):
                raise SystemExit("the pool did not go back to zero within 60 s")
            time.sleep(0.3)         # the autoscaler's next read sees it empty too
            t = time.perf_counter()
            out = joblib.Parallel(n_jobs=2)(joblib.delayed(inc)(i) for i in range(CALLS))
            times.append(time.perf_counter() - t)
            assert out == [i + 1 for i in range(CALLS)]
            peaks.append(len(control.workers(args.control)))
    return {"from_zero_s": statistics.median(times), "from_zero_all_s": times,
            "workers_after": peaks}


def child_fleet_tasks(args):
    import fleet
    payload = b"x" * 100
    with fleet.Client(args.frontend) as c:
        list(c.map([payload] * 2000, window=4000))   # warm-up
        t = time.perf_counter()
        n = 0
        for r in c.map([payload] * args.count, window=4000):
            n += len(r) == 100
        secs = time.perf_counter() - t
    assert n == args.count
    return {"count": args.count, "seconds": secs, "tasks_per_s": args.count / secs}


CHILDREN = {"loky": child_loky, "dask": child_dask, "fleet-warm": child_fleet_warm,
            "fleet-cold": child_fleet_cold, "fleet-tasks": child_fleet_tasks}


# ---- the orchestrator -----------------------------------------------------

class Procs:
    def __init__(self, bin_dir, tmp):
        self.bin, self.tmp, self.procs = bin_dir, tmp, []
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), HERE])

    def start(self, name, argv):
        out = open(os.path.join(self.tmp, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)
        self.procs.append((p, out))
        return p

    def autoscaler(self, ep, worker_args, idle_seconds):
        """fleet-autoscaler --min 0 --max 2 with the process launcher,
        scaling at once (no cooldown or stabilization, 100 ms poll)."""
        return self.start("autoscaler", [
            os.path.join(self.bin, "fleet-autoscaler"), "--control", ep["control"],
            "--metrics-source", ep["metrics"], "--launcher", "process",
            "--worker-args", worker_args, "--min", "0", "--max", "2",
            "--idle-seconds", str(idle_seconds), "--cooldown-seconds", "0",
            "--stabilization-seconds", "0", "--poll-ms", "100", "--metrics", "127.0.0.1:0"])

    def broker(self):
        ready = os.path.join(self.tmp, "broker.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.start("broker", [os.path.join(self.bin, "fleet-broker"),
                              "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                              "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0",
                              "--retire-linger-ms", "100", "--ready-file", ready])
        for _ in range(400):
            if os.path.exists(ready) and "metrics=" in open(ready).read():
                break
            time.sleep(0.025)
        return dict(line.split("=", 1) for line in open(ready).read().split())

    def stop_all(self):
        for p, out in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            out.close()
        self.procs = []


def child(kind, timeout, **kw):
    argv = [PY, os.path.abspath(__file__), "--child", kind]
    for k, v in kw.items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), HERE])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (kind, r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def wait_registered(ctl, n):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from fleet import control
    for _ in range(600):
        if len(control.workers(ctl)) >= n:
            return
        time.sleep(0.05)
    raise RuntimeError("workers did not register")


def calls_cmd():
    return "%s -m fleet.calls" % PY


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and tasks")
    ap.add_argument("--no-peers", action="store_true", help="skip Dask and Celery")
    ap.add_argument("--no-install", action="store_true",
                    help="do not apt-get missing packages (Dask, Celery, Redis)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--frontend", help=argparse.SUPPRESS)
    ap.add_argument("--control", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=30, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)))
        return 0

    if not args.no_install:   # Dask, Celery and Redis from Debian, as make bench does
        sys.path.insert(0, HERE)
        from run import PACKAGES, ensure_packages
        ensure_packages([p for p in PACKAGES if p != "gnuplot-nox"] if not args.no_peers else [])

    reps = 10 if args.quick else 30
    cold_reps = 3 if args.quick else 7
    tasks = 10000 if args.quick else 30000
    res = {"calls": CALLS}
    tmp = tempfile.mkdtemp(prefix="fleet-pybench-")
    procs = Procs(args.bin, tmp)
    try:
        log("loky")
        res["loky"] = child("loky", 300, reps=reps)
        if not args.no_peers:
            log("dask")
            try:
                res["dask"] = child("dask", 300, reps=reps)
            except Exception as e:  # not installed, or it failed: say so
                res["dask"] = {"error": str(e)[:300]}

        log("fleet, warm pool")
        ep = procs.broker()
        procs.start("worker", [os.path.join(args.bin, "fleet-worker"), "--broker", ep["backend"],
                               "--id", "bench-w1", "--concurrency", "2", "--handler", "process",
                               "--exec", calls_cmd()])
        wait_registered(ep["control"], 1)
        res["fleet_warm"] = child("fleet-warm", 300, reps=reps, frontend=ep["frontend"])
        procs.stop_all()

        log("fleet, from zero workers through the autoscaler")
        ep = procs.broker()
        worker_args = "--broker %s --concurrency 2 --handler process --exec %s" % (
            ep["backend"], shlex.quote(calls_cmd()))
        procs.autoscaler(ep, worker_args, idle_seconds=1)
        res["fleet_cold"] = child("fleet-cold", 600, reps=cold_reps, frontend=ep["frontend"],
                                  control=ep["control"])
        procs.stop_all()

        log("a short Python function: fleet")
        ep = procs.broker()
        procs.start("worker", [os.path.join(args.bin, "fleet-worker"), "--broker", ep["backend"],
                               "--id", "bench-w1", "--concurrency", "2", "--prefetch", "64",
                               "--handler", "process", "--exec",
                               "%s -m fleet.handler python_bench:echo --depth 16" % PY])
        wait_registered(ep["control"], 1)
        res["fleet_tasks"] = child("fleet-tasks", 600, frontend=ep["frontend"], count=tasks)
        procs.stop_all()
        if not args.no_peers:
            log("a short Python function: Celery + Redis")
            r = subprocess.run([PY, os.path.join(HERE, "peers", "celery_bench.py"), "throughput",
                                "--workers", "2", "--size", "100",
                                "--count", str(2000 if args.quick else 5000)],
                               capture_output=True, text=True, timeout=900)
            if r.returncode == 0:
                res["celery_tasks"] = json.loads(r.stdout.strip().splitlines()[-1])
            else:
                res["celery_tasks"] = {"error": r.stderr[-300:]}
    finally:
        procs.stop_all()

    def ms(v):
        return "%.1f ms" % (v * 1000) if isinstance(v, (int, float)) else "-"

    loky, dask = res["loky"], res.get("dask", {})
    print("joblib, %d calls of a trivial function, Parallel(n_jobs=2):" % CALLS)
    print("%-34s %12s %12s %14s" % ("system", "warm", "first call", "cluster start"))
    print("%-34s %12s %12s %14s" % ("loky (joblib's default)", ms(loky["warm_s"]),
                                    ms(loky["first_s"]), "-"))
    if "warm_s" in dask:
        print("%-34s %12s %12s %14s" % ("Dask LocalCluster (2 processes)", ms(dask["warm_s"]),
                                        ms(dask["first_s"]), ms(dask["cluster_start_s"])))
    fw, fc = res["fleet_warm"], res["fleet_cold"]
    print("%-34s %12s %12s %14s" % ("fleet, warm pool", ms(fw["warm_s"]), ms(fw["first_s"]), "-"))
    print("%-34s %12s %12s %14s" % ("fleet, from zero (autoscaler)", "-", ms(fc["from_zero_s"]),
                                    "-"))
    res["warm_vs_loky"] = fw["warm_s"] / loky["warm_s"]
    print("fleet warm / loky warm: %.2fx (goal <= 1.5x); from zero: %s (goal < 400 ms); "
          "from-zero runs: %s" % (res["warm_vs_loky"], ms(fc["from_zero_s"]),
                                   ", ".join(ms(t) for t in fc["from_zero_all_s"])))
    ft = res["fleet_tasks"]
    print("a short Python function, 100 B: fleet %.0f tasks/s" % ft["tasks_per_s"], end="")
    ct = res.get("celery_tasks", {})
    if "batches_per_s" in ct:
        res["fleet_vs_celery"] = ft["tasks_per_s"] / ct["batches_per_s"]
        print(", Celery + Redis %.0f tasks/s: %.1fx (goal >= 20x)"
              % (ct["batches_per_s"], res["fleet_vs_celery"]))
    else:
        print()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
