#!/usr/bin/python3
"""Scaling benchmark for fleet (issue 6, item 5).

Runs a burst trace -- quiet, then N batches of a 20 ms sleep at once, then
quiet until the pool is back at its minimum -- through fleet-autoscaler with
the process launcher, once per policy (backlog, throughput), and once through a
fixed pool of --max workers started directly (no autoscaler).

Everything runs on 127.0.0.1 with ports picked by the kernel, in a temporary
directory, and is stopped at the end, also on an error, SIGINT or SIGTERM.

Batches are submitted by a small pyzmq producer written from docs/protocol.md
(one SUBMIT carrying every batch), so the first-submit, first-result and
last-result instants are exact; with --submitter fleet-submit the stock CLI
is used instead and those instants come from the 50 ms sampler (coarser).

While a run is going, a sampler thread records every --sample-ms: the queue
depth, in-flight count and workers by state (control socket `stats`), the
autoscaler's desired size and starting workers (its /metrics), and the
worker processes alive (children of the autoscaler, or the fixed pool).

Output: per run a CSV and a gnuplot PNG in --out, human progress on stderr,
and as the last stdout line one JSON object {"bench":"scaling","runs":[...]}.
Exits non-zero when a run loses batches or times out.
"""

import argparse
import csv
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# Wire protocol (docs/protocol.md, version 1).
VERSION = 1
SUBMIT, ACK, RESULT = 1, 2, 3
CONTROL, CONTROL_REPLY, WORKERS_REPLY, STATS_REPLY, ERROR = 30, 31, 32, 33, 40

SLEEP_MS = 20
CSV_COLUMNS = ["time", "queued", "inflight", "idle", "busy", "retiring", "desired",
               "starting", "processes", "completed"]


class BenchError(Exception):
    """A run went wrong in a way the figures cannot cover (loss, timeout)."""


class Interrupted(Exception):
    pass


def log(msg):
    print(f"[scaling {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pack(msg):
    return msgpack.packb(msg, use_bin_type=True)


def unpack(frame):
    return msgpack.unpackb(frame, raw=False)


# --- processes ---------------------------------------------------------------

class Procs:
    """Every process this benchmark starts, so that all of them can be stopped."""

    def __init__(self):
        self.procs = []  # (name, Popen)
        self.extra_pids = {}  # worker pids seen as children of the autoscaler: pid -> cmdline

    def start(self, name, argv, log_path):
        logf = open(log_path, "ab")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
        logf.close()
        self.procs.append((name, p))
        return p

    def note_pid(self, pid):
        if pid not in self.extra_pids:
            self.extra_pids[pid] = read_cmdline(pid)

    def stop(self, p, grace=5.0):
        """SIGTERM, wait up to grace, then SIGKILL (the whole process group)."""
        if p.poll() is not None:
            return
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(timeout=5)

    def stop_all(self):
        # Autoscalers first (they drain their workers), then workers, then the broker.
        order = sorted(self.procs, key=lambda np: {"autoscaler": 0, "broker": 2}.get(np[0], 1))
        for name, p in order:
            try:
                self.stop(p)
            except Exception as e:  # keep stopping the others
                log(f"could not stop {name} (pid {p.pid}): {e}")
        # Workers the autoscaler started, in case it could not stop them.
        for pid, cmdline in self.extra_pids.items():
            if cmdline and read_cmdline(pid) == cmdline:
                log(f"worker pid {pid} outlived its autoscaler: SIGKILL")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.procs = []
        self.extra_pids = {}


def read_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def children_of(pid):
    """Direct children of pid (all threads), from /proc."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


STOP = {"sig": None}


def wait_for(pred, timeout, what, procs_to_watch=()):
    deadline = time.monotonic() + timeout
    while True:
        if STOP["sig"] is not None:
            raise Interrupted()
        v = pred()
        if v:
            return v
        for name, p in procs_to_watch:
            if p.poll() is not None:
                raise BenchError(f"{name} exited with status {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def read_kv_file(path):
    try:
        with open(path) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)
    except OSError:
        return {}


# --- broker access -----------------------------------------------------------

class Control:
    """A DEALER on the broker's control endpoint (docs/protocol.md section 6)."""

    def __init__(self, ctx, endpoint):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.ids = itertools.count(1)

    def call(self, op, args=(), timeout=2.0):
        rid = next(self.ids)
        self.sock.send(pack([VERSION, CONTROL, rid, op, list(args)]))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise BenchError(f"broker control: no answer to {op} within {timeout:g} s")
            msg = unpack(self.sock.recv())
            if msg[1] == ERROR:
                raise BenchError(f"broker control: {op}: error {msg[2]}: {msg[3]}")
            if msg[2] == rid:
                return msg

    def stats(self):
        return self.call("stats")[4]  # {name: value}

    def close(self):
        self.sock.close()


def scrape(url, timeout=1.0):
    """Prometheus text page -> {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            pass
    return out


# --- sampler -----------------------------------------------------------------

class Sampler(threading.Thread):
    def __init__(self, ctx, control_ep, period, as_metrics_url, pool_pids_fn, fixed_desired):
        super().__init__(daemon=True)
        self.ctx = ctx
        self.control_ep = control_ep
        self.period = period
        self.as_url = as_metrics_url
        self.pool_pids_fn = pool_pids_fn
        self.fixed_desired = fixed_desired
        self.rows = []  # dicts with an absolute monotonic "t"
        self.stop_event = threading.Event()
        self.error = None
        self.lock = threading.Lock()

    def run(self):
        ctl = Control(self.ctx, self.control_ep)
        try:
            nxt = time.monotonic()
            while not self.stop_event.is_set():
                t = time.monotonic()
                row = {"t": t}
                try:
                    s = ctl.stats()
                except BenchError as e:
                    self.error = str(e)
                    s = {}
                row["queued"] = s.get("queued", math.nan)
                row["inflight"] = s.get("inflight", math.nan)
                row["idle"] = s.get("workers_idle", math.nan)
                row["busy"] = s.get("workers_busy", math.nan)
                row["retiring"] = s.get("workers_retiring", math.nan)
                row["completed"] = s.get("completed_ok", 0) + s.get("completed_failed", 0)
                row["desired"] = self.fixed_desired if self.fixed_desired is not None else math.nan
                row["starting"] = 0 if self.fixed_desired is not None else math.nan
                if self.as_url:
                    try:
                        m = scrape(self.as_url)
                        row["desired"] = m.get(("fleet_autoscaler_desired_workers", frozenset()),
                                               math.nan)
                        row["starting"] = m.get(("fleet_autoscaler_workers",
                                                 frozenset({("state", "starting")})), math.nan)
                    except Exception:
                        pass
                row["processes"] = len(self.pool_pids_fn())
                with self.lock:
                    self.rows.append(row)
                nxt += self.period
                delay = nxt - time.monotonic()
                if delay < 0:
                    nxt = time.monotonic()
                    delay = 0
                self.stop_event.wait(delay)
        finally:
            ctl.close()


# --- producers ---------------------------------------------------------------

def check_alive(watch):
    for name, p in watch:
        if name != "worker" and p.poll() is not None:
            raise BenchError(f"{name} exited with status {p.returncode} during the run")


def submit_python(ctx, frontend, count, payload, timeout, stop_flag, watch=()):
    """One SUBMIT with every batch; returns (t_first_submit, t_first_result, t_last_result,
    ok, failed, lost)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect(frontend)
    try:
        # Make sure the connection is up before the clock starts.
        wait_for(lambda: sock.poll(0, zmq.POLLOUT), 5.0, "the producer's connection to the broker")
        run = f"scal-{os.getpid()}-{time.monotonic_ns()}"
        ids = [f"{run}-{i}" for i in range(count)]
        body = payload.encode()
        msg = pack([VERSION, SUBMIT, [[i, "default", body] for i in ids]])
        pending = set(ids)
        ok = failed = 0
        rejected = []
        t_first = None
        t0 = time.monotonic()
        sock.send(msg)
        deadline = t0 + timeout
        while pending:
            if stop_flag():
                raise Interrupted()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not sock.poll(int(min(left, 0.2) * 1000) + 1):
                check_alive(watch)
                continue
            frame = sock.recv()
            now = time.monotonic()
            m = unpack(frame)
            if m[1] == ACK:
                for bid, code, text in m[3]:
                    rejected.append((bid, code, text))
                    pending.discard(bid)
            elif m[1] == RESULT:
                for bid, outcome, _attempts, _result, _err in m[2]:
                    if bid not in pending:
                        continue
                    pending.discard(bid)
                    if t_first is None:
                        t_first = now
                    t_last = now
                    if outcome == 0:
                        ok += 1
                    else:
                        failed += 1
            elif m[1] == ERROR:
                raise BenchError(f"broker answered the SUBMIT with error {m[2]}: {m[3]}")
        if rejected:
            raise BenchError(f"{len(rejected)} batches rejected by the broker, e.g. {rejected[0]}")
        lost = len(pending)
        return t0, t_first, (t_last if t_first is not None else None), ok, failed, lost
    finally:
        sock.close()


def submit_cli(procs, bindir, tmp, frontend, count, payload, inflight, timeout, sampler, stop_flag,
               watch=()):
    """fleet-submit as a child; instants from the sampler (completed counter)."""
    out = os.path.join(tmp, "submit-results.jsonl")
    logp = os.path.join(tmp, "submit.log")
    argv = [os.path.join(bindir, "fleet-submit"), "--broker", frontend, "--count", str(count),
            "--payload", payload, "--inflight", str(inflight), "--output", out,
            "--timeout-seconds", str(timeout)]
    t0 = time.monotonic()
    p = procs.start("submit", argv, logp)
    while p.poll() is None:
        if stop_flag():
            raise Interrupted()
        check_alive(watch)
        time.sleep(0.02)
    t_end = time.monotonic()
    with open(logp) as f:
        lines = [l.strip() for l in f if l.strip()]
    summary = next((l for l in reversed(lines) if l.startswith("submitted=")), "")
    kv = dict(x.split("=", 1) for x in summary.split() if "=" in x)
    if p.returncode != 0:
        raise BenchError(f"fleet-submit exited with status {p.returncode} ({summary or 'no summary'};"
                         f" log {logp})")
    rows = [r for r in sampler.rows if r["t"] >= t0]
    t_first = next((r["t"] for r in rows if r["completed"] > 0), None)
    t_last = next((r["t"] for r in rows if r["completed"] >= count), t_end)
    return (t0, t_first, t_last, int(kv.get("ok", 0)), int(kv.get("failed", 0)),
            int(kv.get("lost", 0)))


# --- one run -----------------------------------------------------------------

def pool_of(row):
    v = row["idle"] + row["busy"] + row["retiring"]
    return v if not math.isnan(v) else 0


def integrate(rows, key, t_from, t_to):
    """Step integral of key(row) over [t_from, t_to] (each sample holds until the next)."""
    total = 0.0
    for a, b in zip(rows, rows[1:] + [None]):
        lo = max(a["t"], t_from)
        hi = min(b["t"] if b else t_to, t_to)
        if hi > lo:
            total += key(a) * (hi - lo)
    return total


def run_one(name, policy, args, tmp_root, stop_flag):
    bindir = args.bin
    tmp = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_root)
    procs = Procs()
    ctx = zmq.Context()
    sampler = None
    try:
        ready = os.path.join(tmp, "broker.ready")
        broker = procs.start("broker", [
            os.path.join(bindir, "fleet-broker"),
            "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
            "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0",
            "--ready-file", ready] + args.broker_arg, os.path.join(tmp, "broker.log"))
        ep = wait_for(lambda: (lambda kv: kv if {"frontend", "backend", "control", "metrics"}
                               <= kv.keys() else None)(read_kv_file(ready)),
                      10, "the broker's ready file", [("broker", broker)])
        log(f"{name}: broker up (frontend {ep['frontend']}, metrics {ep['metrics']})")

        worker_bin = os.path.join(bindir, "fleet-worker")
        worker_args = ["--broker", ep["backend"], "--handler", "sleep", "--log-level", "warn"]
        as_url = None
        watch = [("broker", broker)]
        settings = {"min": args.min if policy else args.max, "max": args.max}
        if policy:
            aslog = os.path.join(tmp, "autoscaler.log")
            scaler = procs.start("autoscaler", [
                os.path.join(bindir, "fleet-autoscaler"),
                "--control", ep["control"], "--metrics-source", ep["metrics"],
                "--launcher", "process", "--worker-bin", worker_bin,
                "--worker-args", " ".join(worker_args),
                "--policy", policy, "--min", str(args.min), "--max", str(args.max),
                "--idle-seconds", str(args.idle), "--cooldown-seconds", str(args.cooldown),
                "--stabilization-seconds", str(args.stabilization),
                "--poll-ms", str(int(round(args.poll * 1000))),
                "--grace-seconds", str(args.grace),
                "--metrics", "127.0.0.1:0"] + args.autoscaler_arg, aslog)
            watch.append(("autoscaler", scaler))

            def own_url():
                try:
                    with open(aslog) as f:
                        m = re.search(r"own metrics (http://\S+?/metrics)", f.read())
                    return m.group(1) if m else None
                except OSError:
                    return None
            as_url = wait_for(own_url, 10, "the autoscaler's metrics address", watch)
            pool_pids = lambda: children_of(scaler.pid)
            settings.update(policy=policy, idle_s=args.idle, cooldown_s=args.cooldown,
                            poll_s=args.poll, stabilization_s=args.stabilization,
                            grace_s=args.grace, launcher="process")
            log(f"{name}: autoscaler up (policy {policy}, metrics {as_url})")
        else:
            workers = []
            for i in range(args.max):
                workers.append(procs.start("worker", [worker_bin, "--id", f"fixed-{i}"] + worker_args,
                                           os.path.join(tmp, f"worker-{i}.log")))
            watch += [("worker", w) for w in workers]
            pool_pids = lambda: [w.pid for w in workers if w.poll() is None]
            settings.update(policy="fixed", launcher="none (started directly)")

        def pids_noted():
            pids = pool_pids()
            for pid in pids:
                procs.note_pid(pid)
            return pids

        sampler = Sampler(ctx, ep["control"], args.sample_ms / 1000.0, as_url, pids_noted,
                          None if policy else args.max)
        sampler.start()
        ctl = Control(ctx, ep["control"])
        try:
            if not policy:
                wait_for(lambda: ctl.stats().get("workers_idle", 0) >= args.max, 15,
                         f"{args.max} fixed workers to register", watch)
            else:
                # The pool must start at its minimum, or the trace measures nothing.
                wait_for(lambda: pool_of({k: ctl.stats().get("workers_" + k, 0)
                                          for k in ("idle", "busy", "retiring")}) <= args.min,
                         15, "the pool at its minimum before the burst", watch)
        finally:
            ctl.close()
        log(f"{name}: quiet for {args.quiet:g} s")
        end_quiet = time.monotonic() + args.quiet
        while time.monotonic() < end_quiet:
            if stop_flag():
                raise Interrupted()
            time.sleep(0.05)

        log(f"{name}: burst of {args.count} x {SLEEP_MS} ms ({args.submitter})")
        if args.submitter == "python":
            t0, t_first, t_last, ok, failed, lost = submit_python(
                ctx, ep["frontend"], args.count, str(SLEEP_MS), args.burst_timeout, stop_flag,
                watch)
        else:
            t0, t_first, t_last, ok, failed, lost = submit_cli(
                procs, bindir, tmp, ep["frontend"], args.count, str(SLEEP_MS), args.count,
                args.burst_timeout, sampler, stop_flag, watch)
        if lost or t_last is None:
            raise BenchError(f"{name}: {lost} of {args.count} batches got no result within "
                             f"{args.burst_timeout:g} s (ok {ok}, failed {failed})")
        if failed:
            raise BenchError(f"{name}: {failed} of {args.count} batches failed")
        log(f"{name}: all {ok} results in {t_last - t0:.2f} s; waiting for the pool to shrink")

        minimum = args.min if policy else args.max
        t_min = None
        seen = 0
        deadline = time.monotonic() + args.down_timeout
        while True:
            if stop_flag():
                raise Interrupted()
            # Every sample since the last look, not just the newest: under load the
            # sampler may have added several. "starting" is NaN when the autoscaler's page
            # could not be read: then the broker's count alone decides.
            with sampler.lock:
                fresh = sampler.rows[seen:]
            seen += len(fresh)
            t_min = next((r["t"] for r in fresh if r["t"] > t_last and pool_of(r) <= minimum
                          and not r["starting"] > 0), None)
            if t_min is not None:
                break
            if time.monotonic() > deadline:
                break
            check_alive(watch)
            time.sleep(0.02)
        # Keep sampling a little for the plot's tail (and to see processes exit).
        tail_end = time.monotonic() + args.tail
        while time.monotonic() < tail_end and not stop_flag():
            time.sleep(0.05)
        sampler.stop_event.set()
        sampler.join()
        if t_min is None:
            raise BenchError(f"{name}: the pool did not get back to {minimum} within "
                             f"{args.down_timeout:g} s of the last result"
                             + (f" (logs in {tmp})" if args.keep_tmp else
                                " (rerun with --keep-tmp to keep the logs)"))

        rows = sampler.rows
        # The state at t0 is the last sample before it; count it as taken at t0.
        before = [r for r in rows if r["t"] < t0]
        after = ([dict(before[-1], t=t0)] if before else []) + [r for r in rows if r["t"] >= t0]
        need = args.max  # 2000 x 20 ms = 40 worker-seconds: the backlog wants the whole pool
        reached = next((r["t"] for r in after if pool_of(r) >= need), None)
        procs_gone = next((r["t"] for r in rows if r["t"] > t_last and r["processes"] <= minimum),
                          None)
        max_pool = max(pool_of(r) for r in after)
        max_processes = max(r["processes"] for r in after)
        ws_end = t_min if policy else t_last
        ws = integrate(rows, pool_of, t0, ws_end)
        ps = integrate(rows, lambda r: r["processes"], t0, ws_end)
        ideal = args.count * SLEEP_MS / 1000.0
        res = {
            "name": name,
            "batches": args.count,
            "submitter": args.submitter,
            "first_result_s": round(t_first - t0, 4),
            "time_to_target_s": round(max(0.0, reached - t0), 3) if reached is not None else None,
            "needed_workers": need,
            # A fixed pool is always at its minimum (its size): nothing to scale down.
            "scale_down_s": round(t_min - t_last, 3) if policy else None,
            "processes_gone_s": (round(procs_gone - t_last, 3)
                                 if policy and procs_gone is not None else None),
            "max_pool": int(max_pool),
            "max_processes": int(max_processes),
            "overshoot": int(max(0, max_pool - need)),
            "worker_seconds": round(ws, 2),
            "process_seconds": round(ps, 2),
            "ideal_worker_seconds": round(ideal, 2),
            "worker_seconds_ratio": round(ws / ideal, 3),
            "makespan_s": round(t_last - t0, 3),
            "ideal_makespan_s": round(ideal / need, 3),
            "settings": settings,
        }
        if policy:
            bound = args.idle + args.cooldown + args.poll
            res["targets"] = {
                "first_result_within_0.1s": res["first_result_s"] <= 0.1,
                "overshoot_within_one_step": res["overshoot"] <= 0,
                "scale_down_bound_s": round(bound, 3),
                "scale_down_within_bound": res["scale_down_s"] <= bound,
            }
        if sampler.error:
            res["sampler_error"] = sampler.error

        os.makedirs(args.out, exist_ok=True)
        csv_path = os.path.join(args.out, f"scaling-{name}.csv")
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for r in rows:
                w.writerow([f"{r['t'] - t0:.4f}"] + [fmt_num(r[c]) for c in CSV_COLUMNS[1:]])
        res["csv"] = show_path(csv_path)
        png_path = os.path.join(args.out, f"scaling-{name}.png")
        if plot(csv_path, png_path, name, res, t_last - t0, (t_min - t0) if policy else None):
            res["png"] = show_path(png_path)
        else:
            res["png"] = None
        for k in ("broker.log", "autoscaler.log"):
            src = os.path.join(tmp, k)
            if os.path.exists(src) and args.keep_logs:
                shutil.copy(src, os.path.join(args.out, f"scaling-{name}-{k}"))
        down = (f"back to {minimum} {res['scale_down_s']} s after the last result, "
                if policy else "")
        log(f"{name}: first result {res['first_result_s']*1000:.0f} ms, pool at {need} after "
            f"{res['time_to_target_s']} s, makespan {res['makespan_s']} s, {down}"
            f"{res['worker_seconds']} worker-s ({res['worker_seconds_ratio']}x ideal)")
        return res
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop_event.set()
            sampler.join(timeout=5)
        procs.stop_all()
        ctx.term()
        if not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def show_path(path):
    """Relative to the current directory when inside it, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def fmt_num(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:g}"


def plot(csv_path, png_path, name, res, t_last, t_min):
    gp = shutil.which("gnuplot")
    if gp is None:
        log("gnuplot not found (apt-get install -y gnuplot-nox): no PNG")
        return False
    title = (f"{name}: {res['batches']} x {SLEEP_MS} ms; first result "
             f"{res['first_result_s']*1000:.0f} ms, makespan {res['makespan_s']:.2f} s, "
             f"{res['worker_seconds']:.1f} worker-s ({res['worker_seconds_ratio']:.2f}x ideal)")
    sets = (f"csv='{csv_path}'; png='{png_path}'; ttl='{title}'; tlast={t_last:.4f}; "
            f"tmin={t_min if t_min is not None else -1:.4f}")
    r = subprocess.run([gp, "-e", sets, os.path.join(HERE, "scaling.gp")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        log(f"gnuplot failed: {r.stderr.strip()}")
        return False
    return True


# --- main --------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="fleet scaling benchmark: a burst of 20 ms sleep batches through "
                    "fleet-autoscaler (backlog and throughput policies, process launcher) and "
                    "through a fixed pool of --max workers. Progress on stderr; the last stdout "
                    "line is one JSON object.")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"),
                    help="where the fleet binaries are (default: %(default)s)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"),
                    help="output directory for CSVs and PNGs (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 200 batches, 1 s quiet, shorter timeouts")
    ap.add_argument("--runs", default="backlog,throughput,fixed",
                    help="comma-separated subset of backlog,throughput,fixed (default: all)")
    ap.add_argument("--count", type=int, help="batches in the burst (default 2000, --quick 200)")
    ap.add_argument("--quiet", type=float, help="seconds of quiet before the burst (3, --quick 1)")
    ap.add_argument("--min", type=int, default=0, help="autoscaler --min (default 0)")
    ap.add_argument("--max", type=int, default=8,
                    help="autoscaler --max and the fixed pool's size (default 8)")
    ap.add_argument("--idle", type=float, default=2.0, help="--idle-seconds (default 2)")
    ap.add_argument("--cooldown", type=float, default=2.0, help="--cooldown-seconds (default 2)")
    ap.add_argument("--poll", type=float, default=0.1, help="poll interval, s (default 0.1)")
    ap.add_argument("--stabilization", type=float, default=0.0,
                    help="--stabilization-seconds (default 0: the issue's scale-down bound is "
                         "idle + cooldown + one poll)")
    ap.add_argument("--grace", type=float, default=2.0,
                    help="--grace-seconds for retired workers (default 2; > 20 ms batches)")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="sampling period (default 50)")
    ap.add_argument("--submitter", choices=["python", "fleet-submit"], default="python",
                    help="python: a pyzmq producer from docs/protocol.md with exact timestamps "
                         "(default); fleet-submit: the CLI, instants from the sampler")
    ap.add_argument("--burst-timeout", type=float, help="seconds for all results (120, quick 30)")
    ap.add_argument("--down-timeout", type=float,
                    help="seconds after the last result for the pool to reach its minimum "
                         "(default 60, quick 30)")
    ap.add_argument("--tail", type=float, default=1.0,
                    help="seconds sampled after the pool is back at its minimum (default 1)")
    ap.add_argument("--broker-arg", action="append", default=[],
                    help="extra fleet-broker argument (repeatable), e.g. --broker-arg=--heartbeat-ms=200")
    ap.add_argument("--autoscaler-arg", action="append", default=[],
                    help="extra fleet-autoscaler argument (repeatable)")
    ap.add_argument("--keep-logs", action="store_true",
                    help="copy each run's broker and autoscaler logs into --out")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory")
    a = ap.parse_args(argv)
    a.count = a.count or (200 if a.quick else 2000)
    a.quiet = a.quiet if a.quiet is not None else (1.0 if a.quick else 3.0)
    a.burst_timeout = a.burst_timeout or (30.0 if a.quick else 120.0)
    a.down_timeout = a.down_timeout or (30.0 if a.quick else 60.0)
    if a.quick:
        a.tail = min(a.tail, 0.5)
    a.bin = os.path.abspath(a.bin)
    a.out = os.path.abspath(a.out)
    a.runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    for r in a.runs:
        if r not in ("backlog", "throughput", "fixed"):
            ap.error(f"--runs: unknown run {r!r}")
    for prog in ("fleet-broker", "fleet-worker", "fleet-autoscaler", "fleet-submit"):
        if not os.access(os.path.join(a.bin, prog), os.X_OK):
            ap.error(f"{prog} not found in {a.bin} (build first, or pass --bin)")
    if not 0 <= a.min < a.max:
        ap.error("need 0 <= --min < --max")
    return a


def main(argv):
    args = parse_args(argv)
    stop = STOP

    def on_signal(signum, _frame):
        stop["sig"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stop_flag = lambda: stop["sig"] is not None

    runs = []
    tmp_root = tempfile.mkdtemp(prefix="fleet-scaling-")
    code = 0
    try:
        for name in args.runs:
            if stop_flag():
                raise Interrupted()
            runs.append(run_one(name, None if name == "fixed" else name, args, tmp_root, stop_flag))
    except Interrupted:
        log(f"interrupted by signal {stop['sig']}: everything stopped")
        code = 128 + (stop["sig"] or signal.SIGINT)
    except BenchError as e:
        log(f"FAILED: {e}")
        code = 1
    finally:
        if not args.keep_tmp:
            shutil.rmtree(tmp_root, ignore_errors=True)
    print(json.dumps({"bench": "scaling", "runs": runs,
                      **({"error": f"exit {code}"} if code else {})}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
