#!/usr/bin/python3
"""make bench: fleet against the ZeroMQ ceiling and Celery/Dask, in one run.

Runs every benchmark of issue 6 with sizes that finish in well under 15 minutes (5 here)
on 2 cores (--quick: a few minutes; --smoke: seconds, for the test suite),
prints one table, and writes bench/results/latest.json and PNG plots.

Each benchmark program prints one JSON object as its last stdout line:
  build/bin/fleet-bench          fleet (throughput, latency, memory, decision)
  build/bin/fleet-bench-ceiling  a minimal credit-window ZeroMQ broker
  bench/peers/celery_bench.py    Celery 5 + Redis
  bench/peers/dask_bench.py      Dask distributed (exit 3: not available)
  bench/scaling.py               burst trace through the autoscaler
  bench/python_bench.py          joblib (fleet, loky, Dask) and a Python function vs Celery
Figures are printed, never judged against time in a test; the targets of
issue 6 are reported as met or not.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["gnuplot-nox", "redis-server", "python3-celery", "python3-redis",
            "python3-distributed"]


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def ensure_packages(packages):
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p],
                           capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            missing.append(p)
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"bench: missing Debian packages {' '.join(missing)}; "
                 "install them (apt-get install) or run as root")
    log(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Waits for another apt (the image build, a parallel test) to finish.
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    cmd = apt + ["install", "-y", "-q", "--no-install-recommends"] + missing
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        # An apt cache older than the archive's files makes installs 404.
        subprocess.run(apt + ["update", "-q"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: apt-get install failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


class Runner:
    """Runs benchmark programs and keeps every result line."""

    def __init__(self, timeout):
        self.results = []
        self.errors = []
        self.timeout = timeout

    def run(self, label, argv, allow_unavailable=False):
        log(f"{label}: {' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in argv)}")
        started = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                               cwd=ROOT)
        except subprocess.TimeoutExpired:
            self.errors.append(f"{label}: timed out after {self.timeout} s")
            log(f"{label}: timed out")
            return None
        took = time.monotonic() - started
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        result = None
        if lines:
            try:
                result = json.loads(lines[-1])
            except json.JSONDecodeError:
                result = None
        if p.returncode == 3 and allow_unavailable:
            log(f"{label}: not available: {p.stderr.strip()[-300:]}")
            self.results.append({"label": label, "unavailable": p.stderr.strip()[-300:]})
            return None
        if p.returncode != 0 or result is None:
            tail = (p.stderr or p.stdout).strip()[-1500:]
            self.errors.append(f"{label}: exit {p.returncode}: {tail}")
            log(f"{label}: FAILED (exit {p.returncode})\n{tail}")
            return None
        result["label"] = label
        result["wall_seconds"] = round(took, 2)
        self.results.append(result)
        return result


def fmt_rate(v):
    if v is None:
        return "-"
    return f"{v / 1000:.1f}k" if v >= 10000 else f"{v:.0f}"


def fmt_us(v):
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} us"


def ratio(a, b):
    return a / b if a and b else None


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_bytes": mem,
            "kernel": platform.release()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    size.add_argument("--smoke", action="store_true",
                      help="tiny sizes: checks every benchmark runs (the test suite's form)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                    help="where fleet-bench and the fleet programs are (default build/bin)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                    help="directory for latest.json and the PNGs (default bench/results)")
    ap.add_argument("--no-peers", action="store_true", help="skip Celery and Dask")
    ap.add_argument("--no-install", action="store_true",
                    help="do not apt-get missing packages (fail instead)")
    args = ap.parse_args()

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if not args.no_install:
        ensure_packages(PACKAGES if not args.no_peers else ["gnuplot-nox"])
    os.makedirs(args.out, exist_ok=True)
    fb = os.path.join(args.bin, "fleet-bench")
    ceiling = os.path.join(args.bin, "fleet-bench-ceiling")
    for prog in (fb, ceiling):
        if not os.access(prog, os.X_OK):
            sys.exit(f"bench: {prog} not found; build first (make build)")
    py = "/usr/bin/python3"
    celery = [py, os.path.join(ROOT, "bench", "peers", "celery_bench.py")]
    dask = [py, os.path.join(ROOT, "bench", "peers", "dask_bench.py")]
    peers = [] if args.no_peers else [("celery", celery), ("dask", dask)]

    # Sizes per mode: counts of batches, seconds of open-loop offer.
    S = {
        "full": dict(count=200000, count_10k=40000, peer_count=10000, peer_count_10k=5000,
                     lat_seconds=5, peer_lat_seconds=5, sleep_seconds=5, mem_batches=1000000,
                     mem_workers=500, decision_rounds=200, worker_counts=[1, 2, 4, 8],
                     durable_count=200000, handler_counts=(200000, 100000, 100000, 50000, 100000, 4000),
                     scaling=[]),
        "quick": dict(count=50000, count_10k=10000, peer_count=3000, peer_count_10k=1000,
                      lat_seconds=2, peer_lat_seconds=2, sleep_seconds=2, mem_batches=200000,
                      mem_workers=50, decision_rounds=50, worker_counts=[1, 4],
                      durable_count=20000, handler_counts=(50000, 30000, 30000, 20000, 30000, 1500),
                      scaling=["--quick"]),
        "smoke": dict(count=2000, count_10k=500, peer_count=200, peer_count_10k=100,
                      lat_seconds=0.5, peer_lat_seconds=1, sleep_seconds=1, mem_batches=5000,
                      mem_workers=4, decision_rounds=5, worker_counts=[1, 2],
                      durable_count=1000, handler_counts=(2000, 2000, 2000, 1000, 1000, 100),
                      scaling=["--quick"]),
    }[mode]
    # Each fleet worker holds up to 64 batches (1 slot + 63 prefetched), and
    # each ceiling worker gets 64 credits: the same window per worker.
    prefetch = 63
    credit = 1 + prefetch
    timeout = 900 if mode == "full" else 300
    r = Runner(timeout)
    started = time.monotonic()

    def fleet_tp(workers, size, count, producers=1, extra=()):
        return r.run(f"fleet throughput {size}B w{workers} p{producers}{' '.join(extra)}",
                     [fb, "throughput", "--workers", str(workers), "--prefetch", str(prefetch),
                      "--size", str(size), "--count", str(count),
                      "--producers", str(producers), *extra])

    def ceiling_tp(workers, size, count, producers=1, extra=()):
        return r.run(f"ceiling throughput {size}B w{workers} p{producers}",
                     [ceiling, "throughput", "--workers", str(workers), "--credit",
                      str(credit), "--size", str(size), "--count", str(count),
                      "--producers", str(producers), *extra])

    # This machine's speed swings by a third within a minute (a shared VM):
    # each figure that goes into a ratio is the median of `reps` runs, and
    # the two sides of a ratio take turns, so a slow spell hits both alike.
    reps = {"full": 3, "quick": 2, "smoke": 1}[mode]

    def median_run(results):
        ok = sorted((x for x in results if x), key=lambda x: x["batches_per_s"])
        if not ok:
            return None
        m = dict(ok[len(ok) // 2])
        m["runs_batches_per_s"] = [round(x["batches_per_s"]) for x in results if x]
        return m

    def alternate(runs):
        got = {key: [] for key, _ in runs}
        for _ in range(reps):
            for key, fn in runs:
                got[key].append(fn())
        return {key: median_run(v) for key, v in got.items()}

    # 1 and 3: throughput, fleet next to the ceiling, same run.
    tp = {}
    for size, count in ((100, S["count"]), (10240, S["count_10k"])):
        for w in S["worker_counts"] + ([] if 4 in S["worker_counts"] else [4]):
            runs = [(("fleet", size, w, 1), lambda: fleet_tp(w, size, count)),
                    (("ceiling", size, w, 1), lambda: ceiling_tp(w, size, count))]
            if size == 100 and w == 4:
                runs.append((("fleet-1pm", 100, 4, 1),
                             lambda: fleet_tp(4, 100, count, extra=("--per-message", "1"))))
            tp.update(alternate(runs))
    # Many producers, many workers: 4 and 16 producers into 4 workers, and
    # 64 workers of one slot each, next to the ceiling with the same shape.
    many_p = 16 if mode != "smoke" else 4
    many_w = 64 if mode != "smoke" else 8
    for p in sorted({4, many_p}):
        tp.update(alternate([(("fleet", 100, 4, p), lambda: fleet_tp(4, 100, S["count"], producers=p)),
                             (("ceiling", 100, 4, p),
                              lambda: ceiling_tp(4, 100, S["count"], producers=p))]))
    tp.update(alternate([(("fleet", 100, many_w, 1), lambda: fleet_tp(many_w, 100, S["count"])),
                         (("ceiling", 100, many_w, 1), lambda: ceiling_tp(many_w, 100, S["count"]))]))

    # 4: the peers on the same workloads (4 worker processes each).
    for name, cmd in peers:
        for size, count in ((100, S["peer_count"]), (10240, S["peer_count_10k"])):
            tp[(name, size, 4, 1)] = r.run(
                f"{name} throughput {size}B w4", cmd + ["throughput", "--workers", "4",
                                                         "--size", str(size), "--count",
                                                         str(count)],
                allow_unavailable=True)
            if tp[(name, size, 4, 1)] is None and any(
                    x.get("label", "").startswith(name) and "unavailable" in x
                    for x in r.results):
                break

    # Users' code: the 100 B echo through one worker of 4 slots, run by the
    # built-in echo, by persistent handler processes (C++: fleet-test-handler,
    # which echoes; Python: the docs' example, which upper-cases), each one
    # batch at a time and with a depth of 16 (several batches at once), and
    # by exec (a shell per batch), same settings.
    handlers = {}
    upper_py = os.path.join(ROOT, "docs", "examples", "handlers", "upper.py")
    test_handler = os.path.join(args.bin, "fleet-test-handler")
    for (name, handler, command), count in zip(
            (("built-in echo", "echo", None),
             ("process, C++", "process", test_handler),
             ("process, C++, depth 16", "process", f"{test_handler} --depth 16"),
             ("process, Python", "process", f"{py} {upper_py}"),
             ("process, Python, depth 16", "process", f"{py} {upper_py} --depth 16"),
             ("exec (cat)", "exec", "cat")), S["handler_counts"]):
        handlers[name] = r.run(
            f"fleet handler {name}",
            [fb, "throughput", "--workers", "1", "--concurrency", "4", "--prefetch",
             str(prefetch), "--size", "100", "--count", str(count), "--handler", handler,
             *(["--exec", command] if command else [])])

    # 10 ms sleep batches, K = 4 workers of one slot each: ideal 400/s. One
    # batch prefetched hides the round trip to the broker between two.
    sleep = {}
    sleep_count = 4 * 100 * S["sleep_seconds"]
    sleep["fleet"] = r.run("fleet sleep 10ms w4",
                           [fb, "throughput", "--handler", "sleep", "--sleep-ms", "10",
                            "--workers", "4", "--concurrency", "1", "--prefetch", "1",
                            "--count", str(sleep_count)])
    for name, cmd in peers:
        if any(x.get("label", "").startswith(name) and "unavailable" in x for x in r.results):
            continue
        sleep[name] = r.run(f"{name} sleep 10ms w4",
                            cmd + ["sleep", "--workers", "4", "--sleep-ms", "10", "--count",
                                   str(sleep_count)], allow_unavailable=True)

    # 2: open-loop latency at 10/50/80 % of each system's own measured
    # maximum (4 workers, 100 B), plus idle latency (about one in flight).
    lat = {}

    def max_of(system):
        x = tp.get((system, 100, 4, 1))
        return x["batches_per_s"] if x else None

    def fleet_lat(rate, seconds, extra=(), system="fleet"):
        return r.run(f"{system} latency {rate:.0f}/s",
                     [fb, "latency", "--workers", "4", "--prefetch", str(prefetch),
                      "--size", "100", "--rate", f"{rate:.0f}", "--seconds", str(seconds),
                      *extra])

    def ceiling_lat(rate, seconds):
        return r.run(f"ceiling latency {rate:.0f}/s",
                     [ceiling, "latency", "--workers", "4", "--credit", str(credit),
                      "--size", "100", "--rate", f"{rate:.0f}", "--seconds", str(seconds)])

    idle_rate = 200
    lat[("fleet", "idle")] = fleet_lat(idle_rate, max(S["lat_seconds"], 1))
    lat[("ceiling", "idle")] = ceiling_lat(idle_rate, max(S["lat_seconds"], 1))
    for system, fn in (("fleet", fleet_lat), ("ceiling", ceiling_lat)):
        m = max_of(system)
        for pct in (10, 50, 80):
            if m:
                lat[(system, pct)] = fn(m * pct / 100, S["lat_seconds"])
    # The ceiling at fleet's 50% rate too: the same offered load, so the two
    # tails compare directly (the ceiling's own 50% is a higher rate).
    if max_of("fleet") and max_of("ceiling"):
        lat[("ceiling", "fleet 50%")] = ceiling_lat(max_of("fleet") * 0.5, S["lat_seconds"])
    for name, cmd in peers:
        m = max_of(name)
        if not m:
            continue
        for pct in (10, 50, 80):
            lat[(name, pct)] = r.run(
                f"{name} latency {pct}%", cmd + ["latency", "--workers", "4", "--size", "100",
                                                 "--rate", f"{m * pct / 100:.0f}", "--seconds",
                                                 str(S["peer_lat_seconds"])])

    # 6: durable mode next to in-memory, memory per queued batch and worker.
    # Next to an in-memory run of the same size, taking turns as above.
    durable = alternate([
        ("mem", lambda: fleet_tp(4, 100, S["durable_count"])),
        ("tp", lambda: r.run("fleet durable throughput 100B w4",
                             [fb, "throughput", "--durable", "--workers", "4", "--prefetch",
                              str(prefetch), "--size", "100", "--count",
                              str(S["durable_count"])]))])
    if durable["tp"]:
        durable["lat"] = fleet_lat(durable["tp"]["batches_per_s"] / 2, S["lat_seconds"],
                                   extra=("--durable",), system="fleet-durable")
    memory = r.run("fleet memory", [fb, "memory", "--batches", str(S["mem_batches"]),
                                    "--size", "100", "--workers", str(S["mem_workers"])])
    # 7: the autoscaler's cost per poll with 1,000 workers on the page.
    decision = r.run("fleet decision 1000 workers",
                     [fb, "decision", "--workers", "1000", "--rounds",
                      str(S["decision_rounds"])])
    # 5: scaling, each policy and a fixed pool (plots by bench/scaling.py).
    # A 50 ms poll: a burst is seen within about 50 ms (the autoscaler's
    # smallest --poll-ms; its default of 1 s suits steadier loads).
    scaling = r.run("scaling", [py, os.path.join(ROOT, "bench", "scaling.py"), "--bin",
                                args.bin, "--out", args.out, "--poll", "0.05",
                                *S["scaling"]])

    # ---- the table ----
    out = []

    def line(s=""):
        out.append(s)

    m = machine()
    line(f"fleet benchmarks ({mode}) on {m['cores']} cores, {m['cpu']}; "
         f"{datetime.date.today().isoformat()}")
    line()
    line("Throughput, echo, batches/s (1 producer unless noted; each fleet worker holds "
         f"1 + {prefetch} prefetched batches, each ceiling worker has {credit} credits)")
    systems = ["fleet", "ceiling"] + [n for n, _ in peers]
    line(f"  {'payload':>8} {'workers':>7} " + "".join(f"{s:>10}" for s in systems) +
         f"{'fleet/ceil':>12}{'fleet/celery':>14}{'fleet/dask':>12}")
    for size in (100, 10240):
        for w in sorted({k[2] for k in tp if k[1] == size and k[3] == 1 and k[0] == "fleet"}):
            vals = {s: (tp.get((s, size, w, 1)) or {}).get("batches_per_s") for s in systems}
            line(f"  {size:>7}B {w:>7} " + "".join(f"{fmt_rate(vals[s]):>10}" for s in systems) +
                 f"{fmt_ratio(ratio(vals['fleet'], vals['ceiling'])):>12}"
                 f"{fmt_ratio(ratio(vals['fleet'], vals.get('celery'))):>14}"
                 f"{fmt_ratio(ratio(vals['fleet'], vals.get('dask'))):>12}")
    for n in sorted({k[3] for k in tp if k[0] == "fleet" and k[1] == 100 and k[2] == 4
                     and k[3] > 1}):
        fx = tp.get(("fleet", 100, 4, n)) or {}
        cx = tp.get(("ceiling", 100, 4, n)) or {}
        fair = ""
        if "producer_min_over_max" in fx:
            fair = (f"; producers' rates slowest/fastest {fx['producer_min_over_max']:.2f}, "
                    f"Jain {fx['producer_jain']:.3f}")
        label = f"4, {n} producers"
        line(f"  {'100B':>8} {label:>14}: fleet {fmt_rate(fx.get('batches_per_s'))}, ceiling "
             f"{fmt_rate(cx.get('batches_per_s'))}, "
             f"{fmt_ratio(ratio(fx.get('batches_per_s'), cx.get('batches_per_s')))}{fair}")
    one = (tp.get(("fleet-1pm", 100, 4, 1)) or {}).get("batches_per_s")
    line(f"  {'100B':>8} {'4, one batch per SUBMIT':>23}: fleet {fmt_rate(one)}, "
         f"{fmt_ratio(ratio(one, (tp.get(('ceiling', 100, 4, 1)) or {}).get('batches_per_s')))}"
         " of the ceiling")
    cpu = [(label, tp.get(key)) for label, key in (("coalesced", ("fleet", 100, 4, 1)),
                                                    ("one per SUBMIT", ("fleet-1pm", 100, 4, 1)))]
    for label, x in cpu:
        if x and "producer_cpu_us_per_batch" in x:
            line(f"  CPU per batch, 100B, 4 workers, {label}: broker "
                 f"{x['broker_cpu_us_per_batch']:.2f} us, producer "
                 f"{x['producer_cpu_us_per_batch']:.2f} us, workers (all) "
                 f"{x['worker_cpu_us_per_batch']:.2f} us")
    line()
    line("Latency, 100 B echo, 4 workers, open loop (from the scheduled send time)")
    line(f"  {'system':>14} {'load':>9} {'rate/s':>9} {'p50':>10} {'p99':>10} {'p99.9':>10}")
    for key, x in lat.items():
        if not x:
            continue
        load = key[1] if isinstance(key[1], str) else f"{key[1]}%"
        line(f"  {key[0]:>14} {load:>9} {x['rate']:>9.0f} {fmt_us(x['p50_us']):>10} "
             f"{fmt_us(x['p99_us']):>10} {fmt_us(x['p999_us']):>10}")
    if durable.get("lat"):
        x = durable["lat"]
        line(f"  {'fleet-durable':>14} {'50%':>9} {x['rate']:>9.0f} {fmt_us(x['p50_us']):>10} "
             f"{fmt_us(x['p99_us']):>10} {fmt_us(x['p999_us']):>10}")
    line()
    line("Users' code: 100 B echo, 1 worker, --concurrency 4, 1 + "
         f"{prefetch} prefetched, batches/s")
    base = (handlers.get("built-in echo") or {}).get("batches_per_s")
    for name, x in handlers.items():
        if x:
            line(f"  {name:>25}: {fmt_rate(x['batches_per_s']):>8} "
                 f"({fmt_ratio(ratio(x['batches_per_s'], base))} the built-in echo; "
                 f"worker CPU {x['worker_cpu_us_per_batch']:.1f} us per batch, "
                 "handler processes not counted)")
    line()
    line("10 ms sleep batches, 4 workers of one slot (ideal 400/s)")
    for name, x in sleep.items():
        if x:
            line(f"  {name:>8}: {x['batches_per_s']:.0f}/s = {x['efficiency'] * 100:.1f}% of ideal")
    line()
    if durable.get("tp"):
        mem_tp = (durable.get("mem") or {}).get("batches_per_s")
        dx, mx = durable["tp"], durable.get("mem") or {}
        line(f"Durable (--data-dir): {fmt_rate(dx['batches_per_s'])} batches/s "
             f"vs in-memory {fmt_rate(mem_tp)} ({fmt_ratio(ratio(dx['batches_per_s'], mem_tp))}),"
             f" 100 B, 4 workers; broker CPU {dx.get('broker_cpu_us_per_batch', 0):.2f} vs "
             f"{mx.get('broker_cpu_us_per_batch', 0):.2f} us per batch")
    if memory:
        line(f"Broker memory: {memory['bytes_per_batch_beyond_payload']:.0f} B per queued batch "
             f"beyond its 100 B payload ({memory['batches']} queued, RSS "
             f"{memory['rss_queued_bytes'] / 2**20:.0f} MiB); "
             f"{memory.get('bytes_per_worker', 0) / 1024:.1f} KiB per connected worker "
             f"({memory.get('workers', 0)} workers; idle, with their heartbeats, the broker "
             f"uses {memory.get('broker_idle_cpu_percent', 0):.1f}% of a core, "
             f"{memory.get('broker_cpu_us_per_worker_heartbeat', 0):.1f} us per worker "
             f"heartbeat)")
    if decision:
        line(f"Autoscaler poll with 1000 workers' series ({decision['page_bytes'] / 1024:.0f} KiB "
             f"page): p50 {fmt_us(decision['p50_us'])}, p99 {fmt_us(decision['p99_us'])}")
    if scaling:
        line()
        line("Scaling: burst of 20 ms batches through the autoscaler (process launcher)")
        line(f"  {'run':>10} {'first result':>13} {'to target':>10} {'overshoot':>10} "
             f"{'back to min':>12} {'worker-s/ideal':>15} {'makespan':>9}")
        for run in scaling.get("runs", []):
            def g(k, unit="s"):
                v = run.get(k)
                return "-" if v is None else f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}"
            ws = run.get("worker_seconds")
            ideal = run.get("ideal_worker_seconds")
            line(f"  {run.get('name', '?'):>10} {g('first_result_s'):>13} "
                 f"{g('time_to_target_s'):>10} {g('overshoot', ''):>10} "
                 f"{g('scale_down_s'):>12} "
                 f"{(f'{ws:.1f}/{ideal:.0f}' if ws and ideal else '-'):>15} "
                 f"{g('makespan_s'):>9}")

    # ---- targets of issue 6 ----
    targets = []

    def target(name, value, met, shown):
        targets.append({"target": name, "value": value, "met": met})
        line(f"  [{'met' if met else 'MISSED' if met is False else 'n/a'}] {name}: {shown}")

    line()
    line("Targets (issue 6)")
    f = (tp.get(("fleet-1pm", 100, 4, 1)) or {}).get("batches_per_s")
    c = (tp.get(("ceiling", 100, 4, 1)) or {}).get("batches_per_s")
    v = ratio(f, c)
    target(">= 0.8x ceiling, 100 B, 4 workers, one batch per message", v,
           None if v is None else v >= 0.8, fmt_ratio(v))
    best = max((x["batches_per_s"] for k, x in tp.items()
                if x and k[0] == "fleet" and k[1] == 100), default=None)
    target(">= 200,000 batches/s with coalescing, 100 B echo", best,
           None if best is None else best >= 200000, fmt_rate(best) + "/s")
    for name, want in (("celery", 20), ("dask", 15)):
        v = ratio(max_of("fleet"), max_of(name))
        target(f">= {want}x {name} throughput (echo)", v, None if v is None else v >= want,
               fmt_ratio(v))
        a, b = lat.get(("fleet", 50)), lat.get((name, 50))
        v = (a["p99_us"], b["p99_us"]) if a and b else None
        target(f"lower p99 than {name} at 50% load", v,
               None if v is None else v[0] < v[1],
               "-" if v is None else f"{fmt_us(v[0])} vs {fmt_us(v[1])}")
    idle = lat.get(("fleet", "idle"))
    target("idle p50 <= 300 us", idle and idle["p50_us"],
           None if not idle else idle["p50_us"] <= 300, fmt_us(idle and idle["p50_us"]))
    target("idle p99 <= 1 ms", idle and idle["p99_us"],
           None if not idle else idle["p99_us"] <= 1000, fmt_us(idle and idle["p99_us"]))
    half = lat.get(("fleet", 50))
    same = lat.get(("ceiling", "fleet 50%"))
    target("p99 <= 5 ms at 50% of max", half and half["p99_us"],
           None if not half else half["p99_us"] <= 5000,
           fmt_us(half and half["p99_us"]) +
           (f" (ceiling at the same rate: {fmt_us(same['p99_us'])})" if same else ""))
    s = sleep.get("fleet")
    target(">= 95% of ideal with 10 ms sleeps", s and s["efficiency"],
           None if not s else s["efficiency"] >= 0.95,
           "-" if not s else f"{s['efficiency'] * 100:.1f}%")
    v = memory and memory["bytes_per_batch_beyond_payload"]
    target("<= 200 B broker memory per queued batch beyond payload", v,
           None if not memory else v <= 200, "-" if not memory else f"{v:.0f} B")
    if scaling:
        for run in scaling.get("runs", []):
            if run.get("name") in ("backlog", "throughput"):
                fr = run.get("first_result_s")
                target(f"scaling ({run['name']}): first batch within 100 ms from zero", fr,
                       None if fr is None else fr <= 0.1, "-" if fr is None else f"{fr:.3f} s")
                ov = run.get("overshoot")
                step = 4  # the autoscaler's default --max-step, which scaling.py keeps
                target(f"scaling ({run['name']}): no overshoot beyond one step", ov,
                       None if ov is None else ov <= step, f"{ov} (step {step})")
                down = run.get("scale_down_s")
                bound = (run.get("targets") or {}).get("scale_down_bound_s")
                target(f"scaling ({run['name']}): back to min within idle+cooldown+poll",
                       down, None if down is None or bound is None else down <= bound,
                       "-" if down is None else f"{down:.2f} s (bound {bound} s)")
    cpp = (handlers.get("process, C++, depth 16") or {}).get("batches_per_s")
    v = ratio(cpp, base)
    target("C++ persistent handler (depth 16) >= 0.5x the built-in echo (issue 15)", v,
           None if v is None else v >= 0.5, fmt_ratio(v))
    pyh = (handlers.get("process, Python") or {}).get("batches_per_s")
    target("Python persistent handler >= 10k batches/s, --concurrency 4 (issue 15)", pyh,
           None if pyh is None else pyh >= 10000, fmt_rate(pyh) + "/s")
    d = durable.get("tp")
    target("durable >= 50,000 batches/s", d and d["batches_per_s"],
           None if not d else d["batches_per_s"] >= 50000,
           "-" if not d else fmt_rate(d["batches_per_s"]) + "/s")
    # Issue 20: close to the ceiling everywhere, and durable close to memory.
    def ceil_ratio(key, ceiling_key):
        return ratio((tp.get(key) or {}).get("batches_per_s"),
                     (tp.get(ceiling_key) or {}).get("batches_per_s"))
    for w in sorted({k[2] for k in tp if k[0] == "fleet" and k[1] == 100 and k[3] == 1}):
        v = ceil_ratio(("fleet", 100, w, 1), ("ceiling", 100, w, 1))
        target(f">= 0.9x ceiling, 100 B, {w} workers (issue 20)", v,
               None if v is None else v >= 0.9, fmt_ratio(v))
    v = ceil_ratio(("fleet", 100, 4, 4), ("ceiling", 100, 4, 4))
    target(">= 0.9x ceiling, 4 producers (issue 20)", v, None if v is None else v >= 0.9,
           fmt_ratio(v))
    v = ceil_ratio(("fleet-1pm", 100, 4, 1), ("ceiling", 100, 4, 1))
    target(">= 0.9x ceiling, one batch per SUBMIT (issue 20)", v,
           None if v is None else v >= 0.9, fmt_ratio(v))
    v = (tp.get(("fleet", 100, 4, 1)) or {}).get("broker_cpu_us_per_batch")
    target("broker CPU <= 2 us per batch, 100 B, 4 workers (issue 20)", v,
           None if not v else v <= 2.0, "-" if not v else f"{v:.2f} us")
    v = ratio(d and d["batches_per_s"], (durable.get("mem") or {}).get("batches_per_s"))
    target("durable >= 0.9x in-memory (issue 20)", v, None if v is None else v >= 0.9,
           fmt_ratio(v))

    # Python and joblib (issue 16): bench/python_bench.py in the same run.
    python_res = None
    if mode != "smoke":
        argv = [py, os.path.join(ROOT, "bench", "python_bench.py"), "--bin", args.bin,
                "--no-install"]
        if mode == "quick":
            argv.append("--quick")
        if args.no_peers:
            argv.append("--no-peers")
        log("python_bench")
        p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if p.returncode == 0:
            lines = p.stdout.strip().splitlines()
            python_res = json.loads(lines[-1])
            line()
            for l in lines[:-1]:
                line(l)
            w = python_res.get("warm_vs_loky")
            target("joblib warm <= 1.5x loky (issue 16)", w, w is not None and w <= 1.5,
                   "-" if w is None else f"{w:.2f}x")
            z = python_res.get("fleet_cold", {}).get("from_zero_s")
            target("joblib from zero workers < 0.4 s (issue 16)", z, z is not None and z < 0.4,
                   "-" if z is None else f"{z * 1000:.0f} ms")
            c = python_res.get("fleet_vs_celery")
            target("short Python function >= 20x Celery (issue 16)", c,
                   None if c is None else c >= 20, "-" if c is None else f"{c:.1f}x")
        else:
            r.errors.append("python_bench failed: " + p.stderr[-500:])

    took = time.monotonic() - started
    line()
    line(f"{len(r.results)} runs in {took / 60:.1f} min; {len(r.errors)} failed. "
         f"Figures: {os.path.relpath(args.out, ROOT)}/latest.json")
    for e in r.errors:
        line(f"  FAILED {e.splitlines()[0]}")
    table = "\n".join(out)
    print(table)

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "mode": mode, "machine": m, "seconds": round(took, 1), "results": r.results,
           "targets": targets, "errors": r.errors, "table": table, "python": python_res}
    with open(os.path.join(args.out, "latest.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    plot_throughput(tp, systems, args.out)
    return 1 if r.errors else 0


def plot_throughput(tp, systems, out):
    """bench/results/throughput.png: batches/s by workers, per system (100 B)."""
    if not shutil.which("gnuplot"):
        return
    rows = sorted({k[2] for k in tp if k[1] == 100 and k[3] == 1 and k[0] == "fleet"})
    data = os.path.join(out, "throughput.dat")
    with open(data, "w") as fh:
        fh.write("workers " + " ".join(systems) + "\n")
        for w in rows:
            vals = [(tp.get((s, 100, w, 1)) or {}).get("batches_per_s") or 0 for s in systems]
            fh.write(f"{w} " + " ".join(f"{v:.0f}" for v in vals) + "\n")
    script = f"""
set terminal pngcairo size 900,500 noenhanced
set output '{os.path.join(out, "throughput.png")}'
set title 'Echo throughput, 100 B batches, 1 producer'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'batches/s'
set xlabel 'workers'
set key top left
set grid ytics
plot for [i=2:{len(systems) + 1}] '{data}' using i:xtic(1) title columnhead
"""
    subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
