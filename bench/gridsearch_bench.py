#!/usr/bin/python3
"""The seed's example, measured: scikit-learn's GridSearchCV (20 fits of an
SGDClassifier over a 40 MB X, docs/examples/gridsearch.py) sequentially,
with loky, with Dask's joblib backend on a 2-worker LocalCluster, and on a
fleet: warm (fleet-broker and 2 fleet-workers of one fleet.calls handler,
already running) and from zero (fleet-autoscaler --min 0 --max 2, process
launcher, no worker when the fit starts). Each system runs in a fresh
interpreter with --repeat 3: the first fit is that interpreter's first
call, the median of the other two is "warm". For fleet it also reports
the bytes that crossed the broker: the calls' payloads and the shared
objects fetched by the workers (the broker's object_bytes).

  /usr/bin/python3 bench/gridsearch_bench.py --bin build/bin [--no-dask]

Prints a table and, as its last stdout line, one JSON object.
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
EXAMPLE = os.path.join(ROOT, "docs", "examples", "gridsearch.py")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from python_bench import Procs, wait_registered  # noqa: E402


def log(msg):
    print("gridsearch_bench: " + msg, file=sys.stderr, flush=True)


def run_example(backend, repeat, **kw):
    argv = [PY, EXAMPLE, "--backend", backend, "--repeat", str(repeat)]
    for k, v in kw.items():
        argv += ["--" + k, v]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (backend, r.returncode, r.stderr[-2000:]))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    t = out["times_s"]
    out["first_s"] = t[0]
    out["warm_s"] = statistics.median(t[1:]) if len(t) > 1 else None
    return out


def object_bytes(control):
    from fleet import control as ctl
    return ctl.stats(control)[1].get("object_bytes", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--no-dask", action="store_true", help="skip Dask")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    res = {}
    tmp = tempfile.mkdtemp(prefix="fleet-gsbench-")
    procs = Procs(args.bin, tmp)
    calls = "%s -m fleet.calls" % PY
    try:
        for b in ("sequential", "loky") + (() if args.no_dask else ("dask",)):
            log(b)
            try:
                res[b] = run_example(b, args.repeat)
            except Exception as e:   # Dask not installed, say
                res[b] = {"error": str(e)[-300:]}

        log("fleet, warm pool of 2 workers")
        ep = procs.broker()
        for i in (1, 2):
            procs.start("worker%d" % i, [os.path.join(args.bin, "fleet-worker"), "--broker",
                                         ep["backend"], "--id", "gs-w%d" % i, "--handler",
                                         "process", "--exec", calls])
        wait_registered(ep["control"], 2)
        r = run_example("fleet", args.repeat, broker=ep["frontend"], control=ep["control"])
        r["object_bytes"] = object_bytes(ep["control"])
        res["fleet_warm"] = r
        procs.stop_all()

        log("fleet from zero workers (autoscaler --min 0 --max 2)")
        ep = procs.broker()
        worker_args = "--broker %s --handler process --exec %s" % (ep["backend"],
                                                                   shlex.quote(calls))
        procs.autoscaler(ep, worker_args, idle_seconds=2)
        time.sleep(0.5)
        r = run_example("fleet", 1, broker=ep["frontend"], control=ep["control"])
        r["object_bytes"] = object_bytes(ep["control"])
        from fleet import control as ctl
        t = time.monotonic()
        while ctl.workers(ep["control"]) and time.monotonic() - t < 60:
            time.sleep(0.1)
        r["back_to_zero_s"] = time.monotonic() - t if not ctl.workers(ep["control"]) else None
        res["fleet_cold"] = r
    finally:
        procs.stop_all()

    def s(v):
        return "%.2f s" % v if isinstance(v, (int, float)) else "-"

    mb = 1e6
    print("GridSearchCV, 20 fits, X of %.0f MB, 2 cores:" % (res["loky"]["x_bytes"] / mb))
    print("%-36s %10s %10s  %s" % ("system", "warm", "first fit", "best (alpha, score)"))
    for name, key in (("sequential", "sequential"), ("loky (joblib's default)", "loky"),
                      ("Dask LocalCluster (2 processes)", "dask"),
                      ("fleet, warm pool (2 workers)", "fleet_warm"),
                      ("fleet, from zero (autoscaler)", "fleet_cold")):
        r = res.get(key)
        if not r or "error" in r:
            continue
        print("%-36s %10s %10s  %s %.6f" % (name, s(r["warm_s"]), s(r["first_s"]),
                                            r["best_params"]["alpha"], r["best_score"]))
    for key in ("fleet_warm", "fleet_cold"):
        r = res[key]
        print("%s: %d batches, %.1f MB of payloads, %.1f MB of objects relayed to workers "
              "(X is %.1f MB; per call it would be %.0f MB)"
              % (key, r["sent"]["batches"], r["sent"]["payload_bytes"] / mb,
                 r["object_bytes"] / mb, r["x_bytes"] / mb,
                 r["sent"]["batches"] * r["x_bytes"] / mb))
    lw, fw = res["loky"].get("warm_s"), res["fleet_warm"].get("warm_s")
    if lw and fw:
        res["warm_vs_loky"] = fw / lw
        res["cold_vs_loky_first"] = res["fleet_cold"]["first_s"] / res["loky"]["first_s"]
        print("fleet warm / loky warm: %.2fx (goal <= 1.1x); fleet from zero / loky's first "
              "call: %.2fx (goal <= 1x); pool back at zero %s after the fit"
              % (res["warm_vs_loky"], res["cold_vs_loky_first"],
                 s(res["fleet_cold"]["back_to_zero_s"])))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
