#!/usr/bin/env python3
"""End-to-end test of the docker-compose deployment, as a user runs it.

Brings up broker, autoscaler and Prometheus (the locally built Prometheus
image; Grafana's image cannot be pulled here, its dashboard is checked
against this Prometheus) under a project name of its own, then from the host:

  1. pushes 500 batches of 200 ms sleep with fleet-submit: the pool grows
     past 1, every batch is ok; idle, the pool returns to the minimum and the
     retired containers are removed;
  2. kills a busy worker container with `docker kill` mid-run: its batches
     are requeued and completed, and the autoscaler starts a replacement;
  3. kills the autoscaler container mid-run and starts it again: it adopts
     the running workers (no duplicates, no orphans, never past --max);
  4. checks that Prometheus has the whole history (every worker container
     was scraped) and that every query of the Grafana dashboard returns data;
  5. `docker-compose down -v` leaves no container, network or volume.

Prints what it does with timestamps; exits 0 only when everything held.
Needs the images from docker/build-images.sh (the docker_images fixture).
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout, interval=0.5):
    """Calls fn until it returns a truthy value; that value, or Failure."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def check_all_ok(out, returncode, count):
    """fleet-submit's output: its summary line says all `count` batches
    came back ok (none failed or lost) and it exited 0. Returns the line."""
    lines = [l for l in out.splitlines() if l.startswith("submitted=")]
    check(lines, f"fleet-submit printed no summary:\n{out}")
    s = dict(kv.split("=", 1) for kv in lines[-1].split())
    check(returncode == 0 and s["ok"] == str(count) and s["lost"] == "0" and s["failed"] == "0",
          f"not every batch ok: {s}")
    return lines[-1]


class Deployment:
    MAX = 4

    def __init__(self, source_dir, bin_dir, tmp):
        self.source_dir = source_dir
        self.bin_dir = bin_dir
        self.tmp = tmp
        tag = f"{os.getpid()}{random.randrange(10000)}"
        self.project = f"fleetct{tag}"
        self.pool = f"fleetct{tag}"
        self.frontend_port = free_port()
        self.control_port = free_port()
        self.prometheus_port = free_port()
        # Prometheus finds this run's workers by its pool label.
        with open(os.path.join(source_dir, "docker/prometheus/fleet.yml")) as f:
            config = f.read()
        check('"fleet.pool=fleet"' in config, "fleet.yml no longer filters on fleet.pool=fleet")
        self.prometheus_config = os.path.join(tmp, "prometheus.yml")
        with open(self.prometheus_config, "w") as f:
            f.write(config.replace('"fleet.pool=fleet"', f'"fleet.pool={self.pool}"'))
        os.chmod(tmp, 0o755)
        os.chmod(self.prometheus_config, 0o644)
        self.env = dict(os.environ)
        self.env.update({
            "COMPOSE_PROJECT_NAME": self.project,
            "FLEET_NETWORK": f"{self.project}_internal",
            "FLEET_POOL": self.pool,
            "FLEET_PROMETHEUS_IMAGE": os.environ.get("FLEET_PROMETHEUS_LOCAL_IMAGE",
                                                     "fleet-prometheus:local"),
            "FLEET_PROMETHEUS_CONFIG": self.prometheus_config,
            "FLEET_FRONTEND_PORT": str(self.frontend_port),
            "FLEET_CONTROL_PORT": str(self.control_port),
            "FLEET_PROMETHEUS_PORT": str(self.prometheus_port),
            "FLEET_MIN": "1",
            "FLEET_MAX": str(self.MAX),
            "FLEET_TARGET_PER_WORKER": "4",
            "FLEET_IDLE_SECONDS": "3",
            "FLEET_COOLDOWN_SECONDS": "2",
            "FLEET_STABILIZATION_SECONDS": "3",
            "FLEET_POLL_MS": "500",
            "FLEET_GRACE_SECONDS": "10",
            "FLEET_WORKER_CONCURRENCY": "4",
            "FLEET_WORKER_HANDLER": "sleep",
            "FLEET_AUTOSCALER_STOP_GRACE": "40s",
        })
        # Never let the host's own FLEET_* settings leak into the CLIs.
        self.cli_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        # Container name -> [first seen, last seen] while running.
        self.seen = {}
        self.max_running = 0
        self._sampling = False
        self._lock = threading.Lock()

    # --- commands -------------------------------------------------------
    def compose(self, *args, timeout=300, check_rc=True):
        r = subprocess.run(["docker-compose", "-f", os.path.join(self.source_dir,
                                                                 "docker-compose.yml"),
                            "-p", self.project, *args],
                           cwd=self.source_dir, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check_rc and r.returncode != 0:
            raise Failure(f"docker-compose {' '.join(args)} failed ({r.returncode}):\n"
                          f"{r.stdout}{r.stderr}")
        return r

    def docker(self, *args, timeout=120):
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              timeout=timeout)

    def ctl(self, *args):
        r = subprocess.run([os.path.join(self.bin_dir, "fleet-ctl"), "--control",
                            f"tcp://127.0.0.1:{self.control_port}", "--timeout-ms", "3000",
                            "--json", *args],
                           capture_output=True, text=True, timeout=30, env=self.cli_env)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def workers(self):
        j = self.ctl("workers")
        return None if j is None else j["workers"]

    def stat(self, name):
        j = self.ctl("stats")
        return None if j is None else j["values"].get(name)

    def containers(self, everything=False):
        """{name: state} of this run's worker containers."""
        args = ["ps", "--filter", f"label=fleet.pool={self.pool}", "--format",
                "{{.Names}} {{.State}}"]
        if everything:
            args.insert(1, "-a")
        r = self.docker(*args)
        out = {}
        for line in r.stdout.split("\n"):
            if line.strip():
                name, _, state = line.partition(" ")
                out[name] = state
        return out

    def running(self):
        return {n for n, s in self.containers().items() if s == "running"}

    def worker_id(self, container_name):
        return container_name[len(self.pool) + 1:]

    def submit(self, count, payload, output):
        cmd = [os.path.join(self.bin_dir, "fleet-submit"), "--broker",
               f"tcp://127.0.0.1:{self.frontend_port}", "--count", str(count), "--payload",
               payload, "--inflight", str(count), "--timeout-seconds", "300",
               "--resend-after-seconds", "60", "--output", output]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.cli_env)

    @staticmethod
    def summary(proc, timeout=360):
        out, _ = proc.communicate(timeout=timeout)
        lines = [l for l in out.strip().split("\n") if l.startswith("submitted=")]
        check(lines, f"fleet-submit printed no summary:\n{out}")
        return dict(kv.split("=", 1) for kv in lines[-1].split()), out

    def prom(self, expr):
        url = (f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as r:
            j = json.load(r)
        check(j.get("status") == "success", f"Prometheus query failed: {expr}: {j}")
        return j["data"]["result"]

    # --- the sampler: every worker container seen running ----------------
    def start_sampler(self):
        self._sampling = True

        def run():
            while self._sampling:
                now = time.monotonic()
                names = self.running()
                with self._lock:
                    self.max_running = max(self.max_running, len(names))
                    for n in names:
                        self.seen.setdefault(n, [now, now])[1] = now
                time.sleep(0.3)

        self._sampler = threading.Thread(target=run, daemon=True)
        self._sampler.start()

    def stop_sampler(self):
        self._sampling = False
        self._sampler.join()

    def wait_min_pool(self, timeout=120):
        """Pool back at the minimum: one worker at the broker, one container
        (running), and no exited container left behind."""
        def settled():
            w = self.workers()
            every = self.containers(everything=True)
            if w is None or len(w) != 1 or len(every) != 1:
                return False
            name, state = next(iter(every.items()))
            return state == "running" and self.worker_id(name) == w[0]["id"]
        wait_for("the pool to return to its minimum of 1 with the rest removed", settled,
                 timeout)

    def dump_logs(self):
        for service in ("autoscaler", "broker", "prometheus"):
            r = self.compose("logs", "--no-color", "--tail", "80", service, check_rc=False)
            print(f"----- {service} (last 80 lines) -----\n{r.stdout}{r.stderr}", flush=True)


def phase_scale_up_and_down(d):
    log("phase 1: 500 batches of 200 ms from the host")
    out = os.path.join(d.tmp, "p1.jsonl")
    s, text = d.summary(d.submit(500, "200", out))
    log(f"fleet-submit: {text.strip().splitlines()[-1]}")
    check(s["ok"] == "500" and s["failed"] == "0" and s["lost"] == "0",
          f"not every batch ok: {s}")
    with open(out) as f:
        results = [json.loads(l) for l in f if l.strip()]
    check(len(results) == 500 and all(r.get("outcome") == "ok" for r in results),
          "the output file does not hold 500 ok results")
    check(d.max_running > 1, f"the pool never grew past 1 (max {d.max_running})")
    log(f"the pool grew to {d.max_running} containers")
    d.wait_min_pool()
    log("idle: the pool is back at 1 and the retired containers are gone")


def phase_docker_kill(d):
    log("phase 2: docker kill of a busy worker mid-run")
    requeued_before = d.stat("requeued") or 0
    # Enough work that a backlog outlasts the kill by far: the replacement is
    # only wanted while there is work for it, and a loaded Docker engine can
    # take seconds per container start.
    count = 2000
    proc = d.submit(count, "200", os.path.join(d.tmp, "p2.jsonl"))

    def busy_target():
        w = d.workers() or []
        busy = [x for x in w if x["held"] > 0 and x["state"] != "retiring"]
        names = d.running()
        if len(names) < 3 or not busy:
            return None
        for x in busy:
            name = f"{d.pool}-{x['id']}"
            if name in names:
                return name, names
        return None

    victim, before = wait_for("3 running workers, one of them busy", busy_target, 120, 0.2)
    killed_at = time.monotonic()
    r = d.docker("kill", victim)
    check(r.returncode == 0, f"docker kill {victim}: {r.stderr}")
    log(f"killed {victim} (pool was {len(before)})")

    def replacement_started():
        with d._lock:
            return sorted(n for n, (first, _) in d.seen.items()
                          if n not in before and first >= killed_at)
    # Asked while the backlog is still there (the run has not ended), so the
    # autoscaler has a reason to replace the killed worker.
    replacements = wait_for("the autoscaler to start a worker after the kill, while the "
                            "backlog lasts", lambda: replacement_started() or proc.poll() is not None,
                            120, 0.3)
    check(replacements is not True, "the run ended with no worker started after the kill")
    log(f"replacement capacity started after the kill: {replacements}")
    s, text = d.summary(proc)
    log(f"fleet-submit: {text.strip().splitlines()[-1]}")
    check(s["ok"] == str(count) and s["lost"] == "0" and s["failed"] == "0",
          f"batches lost or failed after the kill: {s}")
    requeued = wait_for("the broker to count the requeued batches",
                        lambda: (d.stat("requeued") or 0) > requeued_before and
                        d.stat("requeued"), 30)
    log(f"requeued by the broker: {requeued - requeued_before:.0f}")
    check(victim not in d.containers(everything=True),
          f"the killed container {victim} was not removed")
    d.wait_min_pool()
    log("idle again: pool at 1")


def phase_autoscaler_restart(d):
    log("phase 3: the autoscaler is killed mid-run and started again")
    proc = d.submit(600, "200", os.path.join(d.tmp, "p3.jsonl"))
    wait_for("3 running workers", lambda: len(d.running()) >= 3, 120, 0.2)
    cid = d.compose("ps", "-q", "autoscaler").stdout.strip()
    check(cid, "no autoscaler container")
    r = d.docker("kill", cid)
    check(r.returncode == 0, f"docker kill autoscaler: {r.stderr}")
    running_at_kill = d.running()
    log(f"killed the autoscaler with {len(running_at_kill)} workers running")
    time.sleep(1)  # the workers carry on alone for a moment
    d.compose("start", "autoscaler")
    log("autoscaler started again")

    def adopted_all():
        logs = d.compose("logs", "--no-color", "autoscaler", check_rc=False).stdout
        still = d.running() & running_at_kill
        return all(f"worker {d.worker_id(n)})" in logs and "adopted running container" in logs
                   for n in still) and still
    adopted = wait_for("the new autoscaler to adopt the running workers", adopted_all, 60)
    log(f"adopted {len(adopted)} running workers")
    s, text = d.summary(proc)
    log(f"fleet-submit: {text.strip().splitlines()[-1]}")
    check(s["ok"] == "600" and s["lost"] == "0" and s["failed"] == "0",
          f"batches lost or failed around the restart: {s}")
    check(d.max_running <= d.MAX, f"{d.max_running} workers ran at once (max {d.MAX}): "
          "a double pool")
    # No duplicates, no orphans: the broker's workers and the containers are
    # the same set, then the pool shrinks to 1 with every other container gone.
    def same_sets():
        w = d.workers()
        if w is None:
            return False
        return {x["id"] for x in w} == {d.worker_id(n) for n in d.running()}
    wait_for("the broker's workers and the running containers to match", same_sets, 60)
    d.wait_min_pool()
    log("idle: pool at 1, no orphan container")


def phase_producer_profile(d):
    log("phase 3b: the example producer of the compose file's producer profile")
    env_count = d.env.get("FLEET_PRODUCER_COUNT")
    d.env["FLEET_PRODUCER_COUNT"] = "50"
    d.env["FLEET_PRODUCER_PAYLOAD"] = "20"
    try:
        r = d.compose("--profile", "producer", "run", "--rm", "producer", timeout=180)
    finally:
        if env_count is None:
            d.env.pop("FLEET_PRODUCER_COUNT", None)
    lines = [l for l in r.stdout.splitlines() if l.startswith("submitted=")]
    check(lines and "ok=50 " in lines[-1] and "lost=0" in lines[-1],
          f"the producer service did not get 50 ok results:\n{r.stdout}{r.stderr}")
    log(f"producer service: {lines[-1]}")


def phase_history_and_dashboard(d, source_dir):
    log("phase 4: Prometheus history and the Grafana dashboard")
    # One failed batch, so the dashboard's failed-throughput query has data.
    s, _ = d.summary(d.submit(1, "not-a-number", os.path.join(d.tmp, "p4.jsonl")))
    check(s["failed"] == "1" and s["lost"] == "0", f"the bad batch did not fail cleanly: {s}")
    with d._lock:
        long_lived = {d.worker_id(n) for n, (a, b) in d.seen.items() if b - a >= 8}
    scraped = {r["metric"].get("worker") for r in
               d.prom('count by (worker) (count_over_time(up{job="workers"}[1h]))')}
    missing = long_lived - scraped
    check(not missing, f"workers never scraped by Prometheus: {sorted(missing)}")
    log(f"Prometheus scraped all {len(long_lived)} workers that ran 8 s or more "
        f"({len(scraped)} in all)")
    peak = d.prom('max_over_time(sum(fleet_workers)[1h:2s])')
    check(peak and float(peak[0]["value"][1]) > 1, f"no pool growth in Prometheus: {peak}")
    launched = d.prom("max_over_time(fleet_autoscaler_workers_launched_total[1h])")
    check(launched, "no launch counter in Prometheus")
    log(f"Prometheus: peak pool {peak[0]['value'][1]}")
    r = subprocess.run(["/usr/bin/python3", os.path.join(source_dir, "tests/docker/check_dashboard.py"),
                        "--prometheus", f"http://127.0.0.1:{d.prometheus_port}", "--wait", "90"],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout + r.stderr, flush=True)
    check(r.returncode == 0, "dashboard queries failed against the deployment's Prometheus")


def phase_down(d):
    log("phase 5: docker-compose down -v")
    d.compose("down", "-v", timeout=240)
    left = d.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={d.project}").stdout.split()
    left += d.docker("ps", "-aq", "--filter", f"label=fleet.pool={d.pool}").stdout.split()
    check(not left, f"containers left behind: {left}")
    nets = [n for n in d.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n.startswith(d.project)]
    check(not nets, f"networks left behind: {nets}")
    vols = d.docker("volume", "ls", "-q", "--filter",
                    f"label=com.docker.compose.project={d.project}").stdout.split()
    check(not vols, f"volumes left behind: {vols}")
    log("nothing left behind")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--bin-dir", required=True, help="where fleet-submit and fleet-ctl are")
    args = ap.parse_args()
    if shutil.which("docker-compose") is None:
        print("docker-compose not found", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="fleet-compose-")
    d = Deployment(os.path.abspath(args.source_dir), os.path.abspath(args.bin_dir), tmp)
    ok = False
    try:
        log(f"project {d.project}: up broker, autoscaler, prometheus")
        d.compose("up", "-d", "broker", "autoscaler", "prometheus", timeout=300)
        d.start_sampler()
        wait_for("the minimum pool (1 worker registered)",
                 lambda: (w := d.workers()) is not None and len(w) == 1, 120)
        log("broker up, autoscaler started its first worker")
        phase_scale_up_and_down(d)
        phase_docker_kill(d)
        phase_autoscaler_restart(d)
        phase_producer_profile(d)
        d.stop_sampler()
        phase_history_and_dashboard(d, d.source_dir)
        phase_down(d)
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        d.dump_logs()
    finally:
        d._sampling = False
        if not ok:
            d.compose("down", "-v", timeout=240, check_rc=False)
            for cid in d.docker("ps", "-aq", "--filter", f"label=fleet.pool={d.pool}").stdout.split():
                d.docker("rm", "-f", cid)
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
