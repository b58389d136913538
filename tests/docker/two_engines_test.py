#!/usr/bin/env python3
"""The docker launcher over two Docker engines on this machine: the system's
and a second dockerd this test starts (its own socket, data root, exec root,
containerd and bridge; no iptables rules), with fleet:latest loaded into it.
The autoscaler reaches the second engine over TCP with TLS client
certificates (tcp://127.0.0.1:PORT, --docker-tls-dir; a CA, server and
client certificate made here with openssl), the way a remote engine is
reached.

fleet-broker and fleet-autoscaler run on this host (--launcher docker, two
--docker-engine, --min 0 --max 4; the workers use the host network and reach
the broker on 127.0.0.1). Then:

  1. a burst of batches: the pool grows to 4, two workers on each engine
     (fewest first), every batch ok;
  2. a second burst, and the second engine is stopped in the middle of it:
     its workers drain (dockerd stops its containers with SIGTERM) and are
     replaced on the first engine; every batch ok, none lost;
  3. the second engine starts again: a third burst puts workers on it again;
  4. idle, the pool goes back to 0 and no container is left on either engine.

Exits 0 when everything held. Needs root, dockerd and fleet:latest.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compose_test import Failure, check, check_all_ok, log, wait_for  # noqa: E402

SYSTEM = "/var/run/docker.sock"


def run(*cmd, timeout=120, **kw):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)


class SecondEngine:
    """A dockerd of its own under `root`."""

    def __init__(self, root):
        self.root = root
        self.socket = os.path.join(root, "docker.sock")
        self.port = random.randrange(20000, 30000)
        self.tcp = f"tcp://127.0.0.1:{self.port}"
        self.tls = os.path.join(root, "server-tls")
        self.client_tls = os.path.join(root, "client-tls")
        self.bridge = f"fltbr{os.getpid() % 100000}"
        self.proc = None
        os.makedirs(root, exist_ok=True)
        # Not the system daemon's settings (its data root), but its storage
        # driver: what works for it on this machine's file systems.
        driver = run("docker", "info", "--format", "{{.Driver}}").stdout.strip()
        with open(os.path.join(root, "daemon.json"), "w") as f:
            f.write(json.dumps({"storage-driver": driver} if driver else {}) + "\n")
        self.make_certificates()

    def make_certificates(self):
        """A CA, the engine's certificate for 127.0.0.1 and a client's."""
        os.makedirs(self.tls)
        os.makedirs(self.client_tls)
        ca, ca_key = os.path.join(self.tls, "ca.pem"), os.path.join(self.tls, "ca-key.pem")
        steps = [["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key,
                  "-out", ca, "-days", "1", "-subj", "/CN=fleet test CA"]]
        for who, usage, alt in (("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"),
                                ("client", "clientAuth", "")):
            d = self.tls if who == "server" else self.client_tls
            ext = os.path.join(self.root, who + ".ext")
            with open(ext, "w") as f:
                f.write(f"{alt}extendedKeyUsage={usage}\n")
            steps += [["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                       os.path.join(d, "key.pem"), "-out", os.path.join(self.root, who + ".csr"),
                       "-subj", f"/CN=fleet test {who}"],
                      ["openssl", "x509", "-req", "-in", os.path.join(self.root, who + ".csr"),
                       "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
                       "-extfile", ext, "-out", os.path.join(d, "cert.pem")]]
        for cmd in steps:
            r = run(*cmd)
            check(r.returncode == 0, f"{' '.join(cmd[:3])}: {r.stderr[-500:]}")
        shutil.copy(ca, os.path.join(self.client_tls, "ca.pem"))

    def start(self):
        if run("ip", "link", "show", self.bridge).returncode != 0:
            for cmd in (["ip", "link", "add", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", f"10.213.{random.randrange(1, 250)}.1/24", "dev",
                         self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
                r = run(*cmd)
                check(r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}")
        self.log = open(os.path.join(self.root, "dockerd.log"), "a")
        self.proc = subprocess.Popen(
            ["dockerd", "--config-file", os.path.join(self.root, "daemon.json"),
             "--host", "unix://" + self.socket, "--host", self.tcp, "--tlsverify",
             "--tlscacert", os.path.join(self.tls, "ca.pem"),
             "--tlscert", os.path.join(self.tls, "cert.pem"),
             "--tlskey", os.path.join(self.tls, "key.pem"),
             "--data-root", os.path.join(self.root, "data"),
             "--exec-root", os.path.join(self.root, "exec"),
             "--pidfile", os.path.join(self.root, "docker.pid"), "--bridge", self.bridge,
             "--iptables=false", "--ip-masq=false"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("the second dockerd to answer",
                 lambda: self.proc.poll() is None and self.docker("version").returncode == 0
                 or self.proc.poll() is not None, 60)
        check(self.proc.poll() is None, f"the second dockerd exited: {self.tail()}")

    def docker(self, *args, timeout=120):
        return run("docker", "-H", "unix://" + self.socket, *args, timeout=timeout)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # stops its containers (SIGTERM), then exits
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def remove(self):
        self.stop()
        run("ip", "link", "del", self.bridge)
        # dockerd unmounts its layers on the way out, but not its network
        # namespace files: whatever is still mounted below the root goes.
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(self.root)]
        for m in sorted(mounts, key=len, reverse=True):
            run("umount", "-l", m)
        shutil.rmtree(self.root, ignore_errors=True)

    def tail(self):
        with open(os.path.join(self.root, "dockerd.log")) as f:
            return "".join(f.readlines()[-20:])


class Fleet:
    def __init__(self, bin_dir, tmp, second):
        self.bin = bin_dir
        self.tmp = tmp
        self.second = second
        self.pool = f"fleet2e{os.getpid() % 100000}"
        self.procs = []
        self.max_on = {SYSTEM: 0, second.socket: 0}
        self.total_max = 0
        self._sampling = False

    def start(self, name, cmd):
        out = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append((name, p))
        return p

    def broker(self):
        ready = os.path.join(self.tmp, "broker.ready")
        self.start("broker", [os.path.join(self.bin, "fleet-broker"),
                              "--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                              "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0",
                              "--retire-linger-ms", "100", "--ready-file", ready])
        wait_for("the broker's ready file",
                 lambda: os.path.exists(ready) and "metrics=" in open(ready).read(), 30)
        kv = dict(line.split("=", 1) for line in open(ready).read().split())
        self.frontend, self.backend, self.control = kv["frontend"], kv["backend"], kv["control"]
        self.metrics = kv["metrics"]

    def autoscaler(self):
        metrics = self.metrics if self.metrics.startswith("http") else \
            f"http://{self.metrics}/metrics"
        self.start("autoscaler", [
            os.path.join(self.bin, "fleet-autoscaler"), "--control", self.control,
            "--metrics-source", metrics, "--launcher", "docker",
            "--docker-engine", SYSTEM, "--docker-engine", self.second.tcp,
            "--docker-tls-dir", self.second.client_tls,
            "--docker-image", "fleet:latest", "--docker-network", "host",
            "--docker-worker-metrics-port", "0", "--docker-pool", self.pool,
            "--worker-args", f"--broker {self.backend} --handler sleep --concurrency 2",
            "--min", "0", "--max", "4", "--target-per-worker", "2", "--idle-seconds", "2",
            "--cooldown-seconds", "0", "--stabilization-seconds", "0", "--poll-ms", "300",
            "--grace-seconds", "10", "--metrics", "127.0.0.1:0"])

    def containers(self, engine):
        """Names of this pool's running containers on one engine (None if it
        does not answer)."""
        r = run("docker", "-H", "unix://" + engine, "ps", "-q", "--filter",
                f"label=fleet.pool={self.pool}", timeout=30)
        return None if r.returncode != 0 else r.stdout.split()

    def all_containers(self, engine):
        r = run("docker", "-H", "unix://" + engine, "ps", "-aq", "--filter",
                f"label=fleet.pool={self.pool}", timeout=30)
        return None if r.returncode != 0 else r.stdout.split()

    def start_sampler(self):
        self._sampling = True

        def loop():
            while self._sampling:
                total = 0
                for engine in self.max_on:
                    c = self.containers(engine)
                    if c is not None:
                        self.max_on[engine] = max(self.max_on[engine], len(c))
                        total += len(c)
                self.total_max = max(self.total_max, total)
                time.sleep(0.3)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def reset_sample(self):
        for engine in self.max_on:
            self.max_on[engine] = 0

    def stop_sampler(self):
        self._sampling = False
        self._thread.join()

    def submit(self, count, ms):
        return subprocess.Popen(
            [os.path.join(self.bin, "fleet-submit"), "--broker", self.frontend, "--count",
             str(count), "--payload", str(ms), "--inflight", str(count), "--timeout-seconds",
             "240", "--resend-after-seconds", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def summary(proc, count):
        out, _ = proc.communicate(timeout=300)
        log("fleet-submit: " + check_all_ok(out, proc.returncode, count))

    def workers(self):
        r = run(os.path.join(self.bin, "fleet-ctl"), "--control", self.control, "--json",
                "workers", timeout=30)
        return None if r.returncode != 0 else json.loads(r.stdout)["workers"]

    def stop_all(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def dump(self):
        for name, _ in self.procs:
            with open(os.path.join(self.tmp, name + ".log")) as f:
                lines = f.readlines()
            print(f"----- {name} (last 40 lines) -----\n{''.join(lines[-40:])}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        print("FAIL: needs root and dockerd")
        return 1
    tmp = tempfile.mkdtemp(prefix="fleet-2engines-")
    second = SecondEngine(os.path.join(tmp, "engine2"))
    f = Fleet(os.path.abspath(args.bin_dir), tmp, second)
    ok = False
    try:
        log("starting a second dockerd (own socket, data root, containerd and bridge)")
        second.start()
        r = subprocess.run("docker save fleet:latest | docker -H unix://%s load -q" % second.socket,
                           shell=True, capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"loading fleet:latest into the second engine: {r.stderr}")
        log("fleet:latest loaded into it; broker and autoscaler (two engines) on this host")
        f.broker()
        f.autoscaler()
        f.start_sampler()

        log("phase 1: 240 batches of 150 ms: the pool spreads over both engines")
        f.summary(f.submit(240, 150), 240)
        log(f"most containers seen: {f.max_on[SYSTEM]} on the system engine, "
            f"{f.max_on[second.socket]} on the second")
        check(f.max_on[SYSTEM] >= 2 and f.max_on[second.socket] >= 2,
              f"the workers were not spread over both engines: {f.max_on}")
        check(f.total_max <= 4, f"more than --max 4 containers at once: {f.total_max}")

        log("phase 2: the second engine stops in the middle of 300 batches")
        f.reset_sample()
        p = f.submit(300, 150)
        wait_for("a worker on the second engine to run", lambda: f.max_on[second.socket] > 0, 60,
                 interval=0.2)
        time.sleep(1)
        second.stop()
        log("second dockerd stopped")
        f.reset_sample()
        f.summary(p, 300)
        check(f.max_on[SYSTEM] >= 3, "the first engine did not take over the second's share "
              f"(at most {f.max_on[SYSTEM]} workers on it after the stop)")
        log(f"after the stop the system engine ran up to {f.max_on[SYSTEM]} workers")

        log("phase 3: the second engine starts again and gets workers again")
        second.start()
        wait_for("the pool to go back to 0", lambda: f.workers() == [], 120, interval=0.5)
        f.reset_sample()
        f.summary(f.submit(240, 150), 240)
        check(f.max_on[second.socket] >= 1,
              f"no worker on the second engine after it came back: {f.max_on}")
        log(f"workers on both again: {f.max_on}")

        log("phase 4: idle, back to 0 with nothing left on either engine")

        def empty():
            return (f.workers() == [] and f.all_containers(SYSTEM) == []
                    and f.all_containers(second.socket) == [])
        wait_for("no worker and no container of the pool on either engine", empty, 120,
                 interval=0.5)
        f.stop_sampler()
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        f.dump()
        if second.proc is not None:
            print(f"----- second dockerd -----\n{second.tail()}", flush=True)
    finally:
        f._sampling = False
        f.stop_all()
        for engine in (SYSTEM, second.socket):
            for c in f.all_containers(engine) or []:
                run("docker", "-H", "unix://" + engine, "rm", "-f", c)
        second.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
