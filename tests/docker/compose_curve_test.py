#!/usr/bin/env python3
"""End-to-end test of the compose deployment with CURVE on
(docker-compose.yml + docker-compose.curve.yml), as the README tells a user
to run it:

  1. scripts/curve-keys.sh makes the keys: owners and modes as documented,
     and a second run refuses to overwrite anything;
  2. keys made on the host with `fleet-ctl keygen` are added the README's way
     (a producer to producers.allow, an operator to control.allow);
  3. broker, autoscaler and Prometheus come up; the minimum worker, whose key
     the autoscaler mounted into its container, registers;
  4. while the producer profile's service (its key a compose secret) and the
     added host producer submit, and the pool grows past 1 with every
     container a registered worker, intruders try: fleet-submit from the host
     with no key, with an unlisted key, and with a key listed for control
     only; and a worker container without a key on the internal network.
     None gets anything through within the wait: their batches are reported
     lost, the intruder never registers, and the broker's submitted and
     completed counters moved by exactly the legitimate batches;
  5. the broker's healthcheck (fleet-ctl with the broker's own key) says
     healthy, and `docker-compose exec broker fleet-ctl workers` works;
  6. `docker-compose down -v` leaves no container, network or volume.

Shares the deployment helpers of compose_test.py. Needs the images from
docker/build-images.sh (the docker_images fixture).
"""

import argparse
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compose_test as ct  # noqa: E402
from compose_test import Failure, check, log, wait_for  # noqa: E402

# The producer profile's service: 200 ms each, 10 s of work for the first
# worker alone, so the pool has time to grow.
PRODUCER_COUNT = 200
HOST_COUNT = 20       # the producer added to producers.allow
INTRUDER_COUNT = 7    # each intruding fleet-submit
INTRUDER_WAIT = 8     # seconds each intruder waits for results


class CurveDeployment(ct.Deployment):
    MAX = 4

    def __init__(self, source_dir, bin_dir, tmp):
        super().__init__(source_dir, bin_dir, tmp)
        self.keys = os.path.join(tmp, "keys")
        self.env["FLEET_CURVE_DIR"] = self.keys
        self.intruder = f"{self.project}-intruder"

    def key(self, name):
        return os.path.join(self.keys, name)

    def compose(self, *args, timeout=300, check_rc=True):
        r = subprocess.run(["docker-compose",
                            "-f", os.path.join(self.source_dir, "docker-compose.yml"),
                            "-f", os.path.join(self.source_dir, "docker-compose.curve.yml"),
                            "-p", self.project, *args],
                           cwd=self.source_dir, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check_rc and r.returncode != 0:
            raise Failure(f"docker-compose {' '.join(args)} failed ({r.returncode}):\n"
                          f"{r.stdout}{r.stderr}")
        return r

    def curve_flags(self, key_file):
        return ["--curve-server-key", self.key("broker.pub"), "--curve-key", key_file]

    def ctl(self, *args):
        # As the operator whose key was added to control.allow.
        r = subprocess.run([os.path.join(self.bin_dir, "fleet-ctl"), "--control",
                            f"tcp://127.0.0.1:{self.control_port}", "--timeout-ms", "3000",
                            *self.curve_flags(os.path.join(self.tmp, "ops.key")),
                            "--json", *args],
                           capture_output=True, text=True, timeout=30, env=self.cli_env)
        if r.returncode != 0:
            return None
        try:
            return ct.json.loads(r.stdout)
        except ValueError:
            return None

    def submit_as(self, curve, count, payload, timeout_s):
        cmd = [os.path.join(self.bin_dir, "fleet-submit"), "--broker",
               f"tcp://127.0.0.1:{self.frontend_port}", "--count", str(count), "--payload",
               payload, "--inflight", str(count), "--timeout-seconds", str(timeout_s), *curve]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.cli_env)


def phase_keys(d):
    log("phase 1: scripts/curve-keys.sh")
    script = os.path.join(d.source_dir, "scripts/curve-keys.sh")
    r = subprocess.run(["bash", script, d.keys], capture_output=True, text=True, timeout=120,
                       env=d.env)
    check(r.returncode == 0, f"curve-keys.sh failed:\n{r.stdout}{r.stderr}")
    control_uid = int(d.env.get("FLEET_DOCKER_USER", "0:0").split(":")[0])
    expected = {"broker.key": (0o600, 10001), "worker.key": (0o600, 10001),
                "producer.key": (0o600, 10001), "control.key": (0o600, control_uid)}
    for name in ("broker", "worker", "producer", "control"):
        expected[f"{name}.pub"] = (0o644, os.getuid())
    for name in ("producers", "workers", "control"):
        expected[f"{name}.allow"] = (0o644, os.getuid())
    for name, (mode, uid) in expected.items():
        st = os.stat(d.key(name))
        check((stat.S_IMODE(st.st_mode), st.st_uid) == (mode, uid),
              f"{name}: mode {stat.S_IMODE(st.st_mode):o} owner {st.st_uid}, "
              f"expected {mode:o} owner {uid}")
    with open(d.key("broker.pub")) as f:
        broker_pub = f.read()
    again = subprocess.run(["bash", script, d.keys], capture_output=True, text=True, timeout=120,
                           env=d.env)
    check(again.returncode != 0 and "refusing to overwrite" in again.stderr,
          f"a second run did not refuse:\n{again.stdout}{again.stderr}")
    with open(d.key("broker.pub")) as f:
        check(f.read() == broker_pub, "a second run changed broker.pub")
    log("keys written with their owners and modes; a second run refused to overwrite")

    # The README's way to let in one more producer and one more operator.
    ctl = os.path.join(d.bin_dir, "fleet-ctl")
    for name, allow in (("alice", "producers.allow"), ("ops", "control.allow"),
                        ("stranger", None)):
        r = subprocess.run([ctl, "keygen", os.path.join(d.tmp, name)], capture_output=True,
                           text=True, timeout=30, env=d.cli_env)
        check(r.returncode == 0, f"fleet-ctl keygen {name}: {r.stdout}{r.stderr}")
        if allow:
            with open(os.path.join(d.tmp, f"{name}.pub")) as src, open(d.key(allow), "a") as dst:
                dst.write(src.read())


def phase_up(d):
    log(f"phase 2: project {d.project}: up broker, autoscaler, prometheus with CURVE")
    d.compose("up", "-d", "broker", "autoscaler", "prometheus", timeout=300)
    d.start_sampler()
    wait_for("the minimum pool (1 worker registered with the worker key)",
             lambda: (w := d.workers()) is not None and len(w) == 1, 90)
    logs = d.compose("logs", "--no-color", "broker", check_rc=False).stdout
    check("an unknown key was refused on every endpoint" in logs,
          "the broker did not report CURVE with its self-check")
    log("broker up with CURVE; the first worker registered")


def frontend_refusals(d):
    logs = d.compose("logs", "--no-color", "broker", check_rc=False).stdout
    return logs.count("refused a CURVE client on the producers endpoint")


def phase_traffic_and_intruders(d):
    log("phase 3: legitimate producers, and intruders at the same time")
    before = wait_for("the broker's stats", lambda: d.ctl("stats"), 15)["values"]
    # The broker's start-up self-check is refused on every endpoint, quietly:
    # it is no intruder and must not read like one in the log.
    refusals_before = frontend_refusals(d)
    check(refusals_before == 0,
          f"the broker logged {refusals_before} refusals before any intruder came (its own "
          "self-check must not be logged as one)")
    registered = {"max": 0, "ids": set()}
    sampling = True

    def sample():
        while sampling:
            w = d.workers() or []
            registered["max"] = max(registered["max"], len(w))
            registered["ids"].update(x["id"] for x in w)
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    intruder = d.docker("run", "-d", "--name", d.intruder, "--network",
                        d.env["FLEET_NETWORK"], "--read-only", "--cap-drop", "ALL",
                        "--no-healthcheck", d.env.get("FLEET_IMAGE", "fleet:latest"),
                        "fleet-worker", "--broker", "tcp://broker:5556", "--id", "intruder",
                        "--handler", "echo")
    check(intruder.returncode == 0, f"could not start the keyless worker: {intruder.stderr}")
    intruders = {
        "no key": d.submit_as([], INTRUDER_COUNT, "1", INTRUDER_WAIT),
        "unlisted key": d.submit_as(d.curve_flags(os.path.join(d.tmp, "stranger.key")),
                                    INTRUDER_COUNT, "1", INTRUDER_WAIT),
        "control key on the frontend": d.submit_as(d.curve_flags(os.path.join(d.tmp, "ops.key")),
                                                   INTRUDER_COUNT, "1", INTRUDER_WAIT),
    }
    host = d.submit_as(d.curve_flags(os.path.join(d.tmp, "alice.key")), HOST_COUNT, "100", 120)
    d.env["FLEET_PRODUCER_COUNT"] = str(PRODUCER_COUNT)
    d.env["FLEET_PRODUCER_PAYLOAD"] = "200"
    r = d.compose("--profile", "producer", "run", "--rm", "producer", timeout=180)
    lines = [l for l in r.stdout.splitlines() if l.startswith("submitted=")]
    check(lines and f"ok={PRODUCER_COUNT} " in lines[-1] and "lost=0" in lines[-1],
          f"the producer service did not get {PRODUCER_COUNT} ok results:\n{r.stdout}{r.stderr}")
    log(f"producer service (its key a compose secret): {lines[-1]}")
    s, text = d.summary(host, timeout=150)
    check(s["ok"] == str(HOST_COUNT) and s["lost"] == "0",
          f"the added host producer did not get its results: {text}")
    log(f"host producer added to producers.allow: {text.strip().splitlines()[-1]}")

    for what, proc in intruders.items():
        s, text = d.summary(proc, timeout=INTRUDER_WAIT + 30)
        check(proc.returncode != 0 and s["ok"] == "0" and s["lost"] == str(INTRUDER_COUNT),
              f"fleet-submit with {what} got something through: {text}")
        log(f"fleet-submit with {what}: {text.strip().splitlines()[-1]}")

    # Scaled, and every running worker container is a worker the broker let in.
    wait_for("the broker's workers and the running containers to match",
             lambda: (w := d.workers()) is not None and
             {x["id"] for x in w} == {d.worker_id(n) for n in d.running()}, 30)
    sampling = False
    sampler.join()
    check(d.max_running > 1, f"the pool never grew past 1 (max {d.max_running})")
    check(registered["max"] > 1, f"never more than {registered['max']} registered workers")
    check("intruder" not in registered["ids"], "the keyless worker registered")
    # It tried (the broker logged it) and was told: it exits 3 with
    # "authentication failed" instead of waiting in silence.
    def exited():
        s = d.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                     d.intruder).stdout.strip()
        return s if s.startswith("exited") else None

    state = wait_for("the keyless worker to exit", exited, 60)
    intruder_log = d.docker("logs", d.intruder)
    check(state.startswith("exited") and state.endswith(" 3"),
          f"the keyless worker did not exit 3 (state {state!r})")
    check("authentication failed" in intruder_log.stdout + intruder_log.stderr,
          f"the keyless worker did not say why: {intruder_log.stdout}{intruder_log.stderr}")
    d.docker("rm", "-f", d.intruder)
    log(f"pool grew to {d.max_running} containers, {registered['max']} registered at once; "
        "the keyless worker never registered and exited 3: authentication failed")

    after = wait_for("the broker's stats", lambda: d.ctl("stats"), 15)["values"]
    legit = PRODUCER_COUNT + HOST_COUNT
    for counter in ("submitted", "completed_ok"):
        delta = after[counter] - before[counter]
        check(delta == legit, f"broker counter {counter} moved by {delta:.0f}, expected {legit} "
              "(only the legitimate producers' batches)")
    refusals = frontend_refusals(d) - refusals_before
    check(refusals > 0,
          "the broker logged no refusal on the producers endpoint for the intruders' keys")
    log(f"broker: submitted and completed_ok moved by exactly {legit}; refusals logged")


def phase_health(d):
    log("phase 4: the broker's healthcheck and fleet-ctl inside its container")
    cid = d.compose("ps", "-q", "broker").stdout.strip()
    wait_for("the broker container to be healthy",
             lambda: d.docker("inspect", "--format", "{{.State.Health.Status}}",
                              cid).stdout.strip() == "healthy", 40)
    r = d.compose("exec", "-T", "broker", "fleet-ctl", "workers", timeout=60)
    check(r.returncode == 0, f"docker-compose exec broker fleet-ctl workers: {r.stderr}")
    log("broker healthy; docker-compose exec broker fleet-ctl workers works")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--bin-dir", required=True, help="where fleet-submit and fleet-ctl are")
    args = ap.parse_args()
    if shutil.which("docker-compose") is None:
        print("docker-compose not found", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="fleet-compose-curve-")
    d = CurveDeployment(os.path.abspath(args.source_dir), os.path.abspath(args.bin_dir), tmp)
    ok = False
    try:
        phase_keys(d)
        phase_up(d)
        phase_traffic_and_intruders(d)
        d.stop_sampler()
        phase_health(d)
        ct.phase_down(d)
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        d.dump_logs()
    finally:
        d._sampling = False
        d.docker("rm", "-f", d.intruder)
        if not ok:
            d.compose("down", "-v", timeout=240, check_rc=False)
            left = d.docker("ps", "-aq", "--filter", f"label=fleet.pool={d.pool}").stdout
            for cid in left.split():
                d.docker("rm", "-f", cid)
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
