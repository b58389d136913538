#!/usr/bin/env python3
"""End-to-end test of the swarm deployment (docker-stack.yml, --launcher
swarm) on a one-node swarm made from this machine's Docker engine.

  1. `docker swarm init --advertise-addr 127.0.0.1` (unless the engine is in
     a swarm already; then that swarm is used and left as it was);
  2. `docker stack deploy` of docker-stack.yml under a stack name of its own
     (broker, autoscaler with the swarm launcher at --min 0 --max 3,
     Prometheus; Grafana at 0 replicas: its image cannot be pulled here);
  3. from a container on the stack's attachable overlay network, pushes
     batches with fleet-submit: the pool grows from 0 to 3 worker services;
     the autoscaler's container is killed (SIGKILL) and the swarm's new one
     adopts the running services by their labels; every batch comes back ok
     (none lost), and never more than 3 services;
  4. idle, the pool goes back to 0: every worker service removed, none left
     at the broker; Prometheus found the worker tasks on the overlay network
     (dockerswarm_sd_configs) while they ran;
  5. `docker stack rm`, no service, config or network of the run left, and
     `docker swarm leave --force` when the test made the swarm.

Exits 0 when everything held, 77 (skipped, with the reason) only when the
engine cannot run swarm mode. Needs the images from docker/build-images.sh.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compose_test import Failure, check, check_all_ok, log, wait_for  # noqa: E402

SKIP = 77
MAX = 3


def docker(*args, timeout=120, check_rc=False):
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check_rc and r.returncode != 0:
        raise Failure(f"docker {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


class Stack:
    def __init__(self, source_dir, tmp):
        self.source_dir = source_dir
        self.name = f"fst{os.getpid() % 10000}{random.randrange(1000)}"
        self.pool = self.name
        self.network = f"{self.name}_internal"
        with open(os.path.join(source_dir, "docker/prometheus/fleet-swarm.yml")) as f:
            config = f.read()
        for old, new in (('"fleet.pool=fleet"', f'"fleet.pool={self.pool}"'),
                         ("regex: fleet_internal", f"regex: {self.network}")):
            check(old in config, f"fleet-swarm.yml no longer has {old}")
            config = config.replace(old, new)
        self.prometheus_config = os.path.join(tmp, "prometheus.yml")
        with open(self.prometheus_config, "w") as f:
            f.write(config)
        self.image = os.environ.get("FLEET_IMAGE", "fleet:latest")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        self.env.update({
            "FLEET_IMAGE": self.image,
            "FLEET_WORKER_IMAGE": self.image,
            "FLEET_NETWORK": self.network,
            "FLEET_POOL": self.pool,
            "FLEET_PROMETHEUS_IMAGE": os.environ.get("FLEET_PROMETHEUS_LOCAL_IMAGE",
                                                     "fleet-prometheus:local"),
            "FLEET_PROMETHEUS_CONFIG": self.prometheus_config,
            "FLEET_GRAFANA_REPLICAS": "0",
            # Published in host mode on this node: ports of their own.
            "FLEET_FRONTEND_PORT": str(random.randrange(30000, 40000)),
            "FLEET_GRAFANA_PORT": str(random.randrange(40000, 50000)),
            "FLEET_MIN": "0",
            "FLEET_MAX": str(MAX),
            "FLEET_TARGET_PER_WORKER": "4",
            "FLEET_IDLE_SECONDS": "3",
            "FLEET_COOLDOWN_SECONDS": "1",
            "FLEET_STABILIZATION_SECONDS": "2",
            "FLEET_POLL_MS": "500",
            "FLEET_GRACE_SECONDS": "10",
            "FLEET_WORKER_CONCURRENCY": "4",
            "FLEET_WORKER_HANDLER": "sleep",
            "FLEET_WORKER_MEMORY": "128m",
        })
        self.max_services = 0
        self.seen = set()
        self._sampling = False

    def deploy(self):
        r = subprocess.run(["docker", "stack", "deploy", "--resolve-image", "never", "-c",
                            os.path.join(self.source_dir, "docker-stack.yml"), self.name],
                           cwd=self.source_dir, env=self.env, capture_output=True, text=True,
                           timeout=180)
        if r.returncode != 0:
            raise Failure(f"docker stack deploy failed ({r.returncode}):\n{r.stdout}{r.stderr}")

    def run_on_network(self, *cmd, timeout=60):
        """A fleet program in a container on the stack's overlay network."""
        return subprocess.run(["docker", "run", "--rm", "--network", self.network,
                               "--read-only", "--cap-drop", "ALL", self.image, *cmd],
                              capture_output=True, text=True, timeout=timeout)

    def workers(self):
        r = self.run_on_network("fleet-ctl", "--control", "tcp://broker:5557",
                                "--timeout-ms", "3000", "--json", "workers")
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)["workers"]
        except (ValueError, KeyError):
            return None

    def services(self):
        """{name: replicas text} of this run's worker services."""
        r = docker("service", "ls", "--filter", f"label=fleet.pool={self.pool}",
                   "--format", "{{.Name}} {{.Replicas}}")
        out = {}
        for line in r.stdout.splitlines():
            if line.strip():
                name, _, replicas = line.partition(" ")
                out[name] = replicas
        return out

    def start_sampler(self):
        self._sampling = True

        def run():
            while self._sampling:
                names = self.services()
                self.max_services = max(self.max_services, len(names))
                self.seen.update(names)
                time.sleep(0.3)

        self._sampler = threading.Thread(target=run, daemon=True)
        self._sampler.start()

    def stop_sampler(self):
        self._sampling = False
        self._sampler.join()

    def prometheus_query(self, expr):
        """A query through promtool inside the Prometheus task's container."""
        r = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.name}_prometheus")
        ids = r.stdout.split()
        if not ids:
            return None
        q = docker("exec", ids[0], "promtool", "query", "instant", "-o", "json",
                   "http://127.0.0.1:9090", expr)
        if q.returncode != 0:
            return None
        try:
            return json.loads(q.stdout)
        except ValueError:
            return None

    def kill_autoscaler(self):
        """SIGKILL to the autoscaler's container (its swarm restarts it)."""
        r = docker("ps", "-q", "--filter",
                   f"label=com.docker.swarm.service.name={self.name}_autoscaler")
        ids = r.stdout.split()
        check(len(ids) == 1, f"expected one autoscaler container, found {ids}")
        docker("kill", "--signal", "KILL", ids[0], check_rc=True)
        return ids[0]

    def adopted(self):
        """Services the autoscaler's log says it adopted."""
        r = docker("service", "logs", "--raw", f"{self.name}_autoscaler")
        return sorted(set(re.findall(r"adopted running service (\S+)", r.stdout + r.stderr)))

    def dump_logs(self):
        for service in ("autoscaler", "broker", "prometheus"):
            r = docker("service", "logs", "--raw", "--tail", "60", f"{self.name}_{service}")
            print(f"----- {service} (last 60 lines) -----\n{r.stdout}{r.stderr}", flush=True)

    def remove(self):
        docker("stack", "rm", self.name, timeout=120)
        # Worker services are the autoscaler's: gone with the pool at 0, but
        # a failed run may leave some.
        for name in self.services():
            docker("service", "rm", name)

        def gone():
            left = docker("service", "ls", "-q", "--filter",
                          f"label=com.docker.stack.namespace={self.name}").stdout.split()
            nets = docker("network", "ls", "-q", "--filter", f"name={self.name}_").stdout.split()
            if nets and not left:
                for n in nets:
                    docker("network", "rm", n)
            return not left and not nets and not self.services()
        wait_for("the stack's services and networks to go", gone, 120, interval=1)


def swarm_state():
    r = docker("info", "--format", "{{.Swarm.LocalNodeState}}")
    return r.stdout.strip()


def phase_zero_to_three(s):
    log("phase 1: 400 batches of 250 ms from a container on the overlay network; the "
        "autoscaler is killed (SIGKILL) once the pool is at 3")
    submit = subprocess.Popen(
        ["docker", "run", "--rm", "--network", s.network, "--read-only", "--cap-drop", "ALL",
         s.image, "fleet-submit", "--broker", "tcp://broker:5555", "--count", "400",
         "--payload", "250", "--inflight", "400", "--timeout-seconds", "240",
         "--resend-after-seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for("3 worker services", lambda: s.max_services == MAX, 120, interval=0.3)
    first = set(s.services())
    killed = s.kill_autoscaler()
    log(f"killed the autoscaler's container {killed[:12]}; the swarm starts another")
    out, _ = submit.communicate(timeout=300)
    log("fleet-submit: " + check_all_ok(out, submit.returncode, 400))
    check(s.max_services == MAX, f"the pool reached {s.max_services} services, not {MAX}")
    adopted = wait_for("the new autoscaler to say it adopted the services",
                       lambda: s.adopted(), 60, interval=1)
    check(set(adopted) <= first and len(adopted) >= 1,
          f"adopted {adopted}, the first autoscaler's services were {sorted(first)}")
    log(f"the pool grew from 0 to {s.max_services} worker services, never more; the new "
        f"autoscaler adopted {sorted(adopted)}")


def phase_back_to_zero(s):
    log("phase 2: idle, back to zero")

    def zero():
        w = s.workers()
        return w is not None and w == [] and not s.services()
    wait_for("the pool to go back to 0 (no worker at the broker, no worker service)", zero, 120,
             interval=1)
    log("no worker at the broker and every worker service removed")


def phase_prometheus(s):
    log("phase 3: Prometheus scraped the worker tasks (dockerswarm_sd_configs)")
    res = s.prometheus_query('count by (worker) (count_over_time(up{job="workers"}[10m]))')
    check(res is not None, "could not query Prometheus with promtool")
    workers = {r["metric"].get("worker") for r in res}
    log(f"Prometheus scraped {len(workers)} workers: {sorted(workers)}")
    check(len(workers) >= 1, f"Prometheus found no worker task: {res}")
    up = s.prometheus_query('max_over_time(up{job="workers"}[10m])')
    check(up and all(float(r["value"][1]) == 1 for r in up),
          f"a worker target was never up: {up}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    state = swarm_state()
    made_swarm = False
    if state != "active":
        r = docker("swarm", "init", "--advertise-addr", "127.0.0.1")
        if r.returncode != 0:
            print(f"SKIP: this Docker engine cannot run swarm mode: {r.stderr.strip()}")
            return SKIP
        made_swarm = True
        log("made a one-node swarm (docker swarm init --advertise-addr 127.0.0.1)")
    else:
        log("the engine is in a swarm already: using it, leaving it as it is")
    tmp = tempfile.mkdtemp(prefix="fleet-swarm-")
    ok = False
    s = None
    try:
        s = Stack(os.path.abspath(args.source_dir), tmp)
        log(f"stack {s.name}: deploy broker, autoscaler (swarm launcher), prometheus")
        s.deploy()
        wait_for("the broker to answer on the overlay network",
                 lambda: s.workers() is not None, 120, interval=1)
        check(s.workers() == [] and not s.services(), "the pool did not start at 0")
        log("broker up, pool at 0")
        s.start_sampler()
        phase_zero_to_three(s)
        phase_back_to_zero(s)
        s.stop_sampler()
        phase_prometheus(s)
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        if s is not None:
            s.dump_logs()
    finally:
        if s is not None:
            s._sampling = False
            try:
                s.remove()
                log("stack removed: no service, network or worker left")
            except Failure as e:
                print(f"FAIL: {e}", flush=True)
                ok = False
        if made_swarm:
            r = docker("swarm", "leave", "--force")
            if r.returncode != 0:
                print(f"FAIL: docker swarm leave --force: {r.stderr.strip()}", flush=True)
                ok = False
            else:
                log("left the swarm (docker swarm leave --force)")
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
