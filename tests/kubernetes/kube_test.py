#!/usr/bin/env python3
"""The Kubernetes launcher against a real API server.

Starts a real etcd and a real kube-apiserver (scripts/kube-apiserver.sh
builds both from the Go module proxy) on 127.0.0.1, with TLS from a CA made
here, a token file for the admin, service-account keys and RBAC. There is no
scheduler and no kubelet: a small stand-in here ("kubelet") binds each worker
pod to a node, runs the command the pod asks for (fleet-worker from the build)
as a local process, reports it Running, and when the pod is deleted sends
SIGTERM and reports how it ended, as a kubelet does. Then:

  0. every manifest under deploy/kubernetes/ is checked by the API server
     itself (dry run, strict field validation; the ServiceMonitor and
     PodMonitor against their CRDs' names and versions), and the worker pod
     template in the ConfigMap as a Pod;
  1. RBAC: the autoscaler runs as deploy/kubernetes/rbac.yaml's service
     account (a token from the TokenRequest API, in a kubeconfig); asked for
     another namespace it refuses to start, naming the verb;
  2. 0 -> 3 -> 0 with fleet-autoscaler --launcher kubernetes: pods made from
     the ConfigMap's template with the owner reference to the autoscaler's
     pod, every batch ok; the autoscaler is killed mid-burst (SIGKILL) and a
     new one adopts the running pods (never more than 3); idle, every pod is
     deleted after its worker drained (each worker exited 0: none was
     killed), nothing left;
  3. a pod that never becomes ready (the stand-in leaves it Pending as
     Unschedulable): the autoscaler says why, deletes it after
     --start-timeout-seconds and counts a failed start.

Exits 0 when everything held. Usage: kube_test.py --bin-dir BUILD/bin
--kube-bin DIR_WITH_kube-apiserver_AND_etcd --source-dir SRC
"""

import argparse
import base64
import json
import os
import random
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "docker"))
from compose_test import Failure, check, check_all_ok, free_port, log, wait_for  # noqa: E402

NS = "fleet"


def run(*cmd, timeout=60):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)


class Cluster:
    """etcd + kube-apiserver, and a small client for its API."""

    def __init__(self, kube_bin, tmp):
        self.bin = kube_bin
        self.tmp = tmp
        self.procs = []
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.admin = "admin-" + base64.b16encode(os.urandom(8)).decode().lower()

    def start(self):
        t = self.tmp
        ca, ca_key = f"{t}/ca.crt", f"{t}/ca.key"
        steps = [
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out",
             ca, "-days", "1", "-subj", "/CN=fleet test cluster CA"],
            ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{t}/server.key",
             "-out", f"{t}/server.csr", "-subj", "/CN=kube-apiserver"],
            ["openssl", "x509", "-req", "-in", f"{t}/server.csr", "-CA", ca, "-CAkey", ca_key,
             "-CAcreateserial", "-days", "1", "-extfile", f"{t}/server.ext", "-out",
             f"{t}/server.crt"],
            ["openssl", "genrsa", "-out", f"{t}/sa.key", "2048"],
            ["openssl", "rsa", "-in", f"{t}/sa.key", "-pubout", "-out", f"{t}/sa.pub"],
        ]
        with open(f"{t}/server.ext", "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        for cmd in steps:
            r = run(*cmd)
            check(r.returncode == 0, f"{' '.join(cmd[:2])}: {r.stderr[-300:]}")
        with open(f"{t}/tokens.csv", "w") as f:
            f.write(f"{self.admin},admin,admin-uid,system:masters\n")
        self.ca = ca
        self.ssl = ssl.create_default_context(cafile=ca)
        etcd_port, peer_port = free_port(), free_port()
        self.start_proc("etcd", [f"{self.bin}/etcd", "-data-dir", f"{t}/etcd",
                                 "-listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                                 "-listen-peer-urls", f"http://127.0.0.1:{peer_port}"])
        self.start_proc("kube-apiserver", [
            f"{self.bin}/kube-apiserver", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--tls-cert-file={t}/server.crt",
            f"--tls-private-key-file={t}/server.key", f"--token-auth-file={t}/tokens.csv",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={t}/sa.pub",
            f"--service-account-signing-key-file={t}/sa.key",
            "--service-cluster-ip-range=10.96.0.0/16", f"--cert-dir={t}/certs"])
        wait_for("the API server to be ready",
                 lambda: self.call("GET", "/readyz", raw=True)[0] == 200, 90, interval=0.5)

    def start_proc(self, name, cmd):
        out = open(os.path.join(self.tmp, name + ".log"), "w")
        self.procs.append((name, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)))

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()

    def call(self, method, path, body=None, token=None, raw=False,
             content_type="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + (token or self.admin))
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=10) as r:
                text = r.read().decode()
                return (r.status, text) if raw else (r.status, json.loads(text or "null"))
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            if raw:
                return e.code, text
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"message": text}
        except (urllib.error.URLError, OSError) as e:
            return 0, {"message": str(e)}

    def ok(self, method, path, body=None, **kw):
        status, j = self.call(method, path, body, **kw)
        check(200 <= status < 300, f"{method} {path}: HTTP {status}: {j}")
        return j


PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ServiceMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors",
    "PodMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors",
}


def monitoring_crds(c):
    """The Prometheus Operator's two CRDs, by name and version only (their
    schemas are the operator's; a dry run checks apiVersion, kind, metadata)."""
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors")):
        c.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}]}})
    wait_for("the monitoring CRDs to be served",
             lambda: c.call("GET", f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors")[0]
             == 200, 30, interval=0.5)


def apply(c, doc, dry_run):
    path = PATHS[doc["kind"]].format(ns=doc.get("metadata", {}).get("namespace", NS))
    q = "?fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
    status, j = c.call("POST", path + q, doc)
    check(status in (200, 201), f"{doc['kind']} {doc['metadata'].get('name')}: HTTP {status}: "
          f"{j.get('message', j)}")
    return j


def phase_manifests(c, source_dir):
    log("phase 0: deploy/kubernetes/ checked by the API server (dry run, strict fields)")
    monitoring_crds(c)
    d = os.path.join(source_dir, "deploy", "kubernetes")
    docs = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".yaml"):
            with open(os.path.join(d, name)) as f:
                docs += [(name, x) for x in yaml.safe_load_all(f) if x]
    kinds = sorted({x["kind"] for _, x in docs})
    for want in ("Deployment", "Service", "Role", "RoleBinding", "ServiceAccount",
                 "ServiceMonitor", "ConfigMap"):
        check(want in kinds, f"deploy/kubernetes/ has no {want}")
    # The namespace first, for real: the rest is checked inside it.
    for _, x in docs:
        if x["kind"] == "Namespace":
            apply(c, x, dry_run=False)
    for name, x in docs:
        if x["kind"] != "Namespace":
            apply(c, x, dry_run=True)
    # Roles and service accounts for real: the autoscaler and workers run as them.
    for _, x in docs:
        if x["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            apply(c, x, dry_run=False)
    for name, x in docs:
        if x["kind"] == "ConfigMap" and "worker-pod.yaml" in x.get("data", {}):
            pod = yaml.safe_load(x["data"]["worker-pod.yaml"])
            pod.setdefault("metadata", {})["name"] = "template-check"
            pod["spec"]["containers"][0].setdefault("command", ["fleet-worker"])
            apply(c, pod, dry_run=True)
    # No controller-manager: the namespace's default service account is ours to make.
    c.ok("POST", f"/api/v1/namespaces/{NS}/serviceaccounts",
         {"metadata": {"name": "default"}})
    log(f"{len(docs)} objects valid: {', '.join(kinds)}")
    for _, x in docs:
        if x["kind"] == "ConfigMap":
            return x["data"]["worker-pod.yaml"]
    raise Failure("no worker pod template")


class Kubelet:
    """Stands in for a node: runs each bound pod's command as a process."""

    def __init__(self, c, pool, bin_dir, tmp, pending_pool=None):
        self.c = c
        self.pool = pool
        self.pending_pool = pending_pool
        self.bin = bin_dir
        self.tmp = tmp
        self.procs = {}        # pod name -> Popen
        self.exits = {}        # pod name -> exit code
        self.seen = {}         # pod name -> the pod as first seen
        self.max_pods = 0
        self.max_running = 0
        self._stop = False
        self._thread = threading.Thread(target=self.loop, daemon=True)
        c.ok("POST", "/api/v1/nodes", {"metadata": {"name": "fake-node"}})

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop = True
        self._thread.join()
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()

    def status(self, name, status):
        self.c.call("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": status},
                    content_type="application/merge-patch+json")

    def loop(self):
        while not self._stop:
            try:
                self.tick()
            except Exception as e:  # keep going: the test's checks say what broke
                log(f"kubelet stand-in: {e}")
            time.sleep(0.2)

    def tick(self):
        status, pods = self.c.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=fleet.role%3Dworker")
        if status != 200:
            return
        names = set()
        for pod in pods["items"]:
            name = pod["metadata"]["name"]
            pool = pod["metadata"]["labels"].get("fleet.pool")
            names.add(name)
            self.seen.setdefault(name, pod)
            if pool == self.pending_pool:
                if not pod["status"].get("conditions"):
                    self.status(name, {"phase": "Pending", "conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/1 nodes are available: 1 Insufficient cpu."}]})
                continue
            if pool != self.pool:
                continue
            deleting = pod["metadata"].get("deletionTimestamp") is not None
            if name not in self.procs and not deleting:
                self.c.call("POST", f"/api/v1/namespaces/{NS}/pods/{name}/binding", {
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "fake-node"}})
                cmd = pod["spec"]["containers"][0]["command"]
                env = dict(os.environ, PATH=self.bin + ":" + os.environ["PATH"])
                out = open(os.path.join(self.tmp, name + ".log"), "w")
                self.procs[name] = subprocess.Popen(cmd, env=env, stdout=out,
                                                    stderr=subprocess.STDOUT)
                self.status(name, {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"}]})
            p = self.procs.get(name)
            if p is None:
                continue
            if deleting and p.poll() is None and not getattr(p, "termed", False):
                p.send_signal(signal.SIGTERM)
                p.termed = True
            if p.poll() is not None and name not in self.exits:
                self.exits[name] = p.returncode
                self.status(name, {"phase": "Succeeded" if p.returncode == 0 else "Failed",
                                   "containerStatuses": [{
                                       "name": "worker", "ready": False, "restartCount": 0,
                                       "image": "fleet:latest", "imageID": "",
                                       "state": {"terminated": {"exitCode": p.returncode}}}]})
            if deleting and p.poll() is not None:
                # The kubelet's last word on a pod that ended.
                self.c.call("DELETE",
                            f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
        ours = [n for n in names if n.startswith(self.pool + "-")]
        self.max_pods = max(self.max_pods, len(ours))
        self.max_running = max(self.max_running,
                               len([n for n in ours if n in self.procs
                                    and self.procs[n].poll() is None]))


class Fleet:
    def __init__(self, bin_dir, tmp):
        self.bin = bin_dir
        self.tmp = tmp
        self.procs = {}

    def start(self, name, cmd):
        out = open(os.path.join(self.tmp, name + ".log"), "a")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def text(self, name):
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()

    def broker(self):
        ready = os.path.join(self.tmp, "broker.ready")
        self.start("broker", [f"{self.bin}/fleet-broker", "--frontend", "tcp://127.0.0.1:*",
                              "--backend", "tcp://127.0.0.1:*", "--control", "tcp://127.0.0.1:*",
                              "--metrics", "127.0.0.1:0", "--retire-linger-ms", "100",
                              "--ready-file", ready])
        wait_for("the broker", lambda: os.path.exists(ready)
                 and "metrics=" in open(ready).read(), 30)
        kv = dict(l.split("=", 1) for l in open(ready).read().split())
        self.frontend, self.backend, self.control = kv["frontend"], kv["backend"], kv["control"]
        self.metrics = kv["metrics"]

    def autoscaler_cmd(self, kubeconfig, pool, template, owner, *extra, namespace=NS):
        return [f"{self.bin}/fleet-autoscaler", "--control", self.control,
                "--metrics-source", self.metrics, "--launcher", "kubernetes",
                "--kubeconfig", kubeconfig, "--kube-namespace", namespace,
                "--kube-pod-template", template, "--kube-owner-pod", owner,
                "--docker-pool", pool, "--docker-worker-metrics-port", "0",
                "--worker-args", f"--broker {self.backend} --handler sleep --concurrency 2",
                "--target-per-worker", "2", "--idle-seconds", "2", "--cooldown-seconds", "0",
                "--stabilization-seconds", "0", "--poll-ms", "300", "--grace-seconds", "10",
                "--metrics", "127.0.0.1:0", *extra]

    def submit(self, count, ms):
        return subprocess.Popen([f"{self.bin}/fleet-submit", "--broker", self.frontend,
                                 "--count", str(count), "--payload", str(ms), "--inflight",
                                 str(count), "--timeout-seconds", "240",
                                 "--resend-after-seconds", "120"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def workers(self):
        r = run(f"{self.bin}/fleet-ctl", "--control", self.control, "--json", "workers")
        return None if r.returncode != 0 else json.loads(r.stdout)["workers"]

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()


def summary(proc, count):
    out, _ = proc.communicate(timeout=300)
    log("fleet-submit: " + check_all_ok(out, proc.returncode, count))


def pods(c, pool):
    status, j = c.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector="
                       + urllib.parse.quote(f"fleet.pool={pool}"))
    check(status == 200, f"listing pods: {j}")
    return j["items"]


def service_account_kubeconfig(c, tmp):
    tok = c.ok("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/fleet-autoscaler/token",
               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600}})["status"]["token"]
    with open(os.path.join(tmp, "token"), "w") as f:
        f.write(tok)
    path = os.path.join(tmp, "kubeconfig")
    with open(path, "w") as f:
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fleet",
            "clusters": [{"name": "test", "cluster": {
                "server": c.server,
                "certificate-authority-data": base64.b64encode(open(c.ca, "rb").read()).decode()}}],
            "users": [{"name": "fleet-autoscaler", "user": {"tokenFile": "token"}}],
            "contexts": [{"name": "fleet", "context": {"cluster": "test", "user": "fleet-autoscaler",
                                                       "namespace": NS}}]}, f)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--kube-bin", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    tmp = tempfile.mkdtemp(prefix="fleet-kube-")
    c = Cluster(os.path.abspath(args.kube_bin), tmp)
    f = Fleet(bin_dir, tmp)
    pool = f"k{random.randrange(10000)}"
    kubelet = None
    ok = False
    try:
        log("starting etcd and kube-apiserver (TLS, RBAC, service-account keys)")
        c.start()
        template_text = phase_manifests(c, args.source_dir)
        template = os.path.join(tmp, "worker-pod.yaml")
        with open(template, "w") as fh:
            fh.write(template_text)
        kubeconfig = service_account_kubeconfig(c, tmp)
        # The autoscaler's own pod (never running here: it only owns).
        owner = c.ok("POST", f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": "fleet-autoscaler-test"},
            "spec": {"containers": [{"name": "a", "image": "fleet:latest"}]}})
        f.broker()

        log("phase 1: RBAC: another namespace is refused at start, naming the verb")
        c.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "elsewhere"}})
        r = run(*f.autoscaler_cmd(kubeconfig, pool, template, "fleet-autoscaler-test",
                                  namespace="elsewhere"), timeout=60)
        check(r.returncode == 1 and "may not list pods in namespace elsewhere" in r.stdout + r.stderr,
              f"the autoscaler did not refuse another namespace: rc {r.returncode}\n"
              f"{(r.stdout + r.stderr)[-1500:]}")
        log("refused: " + [l for l in (r.stdout + r.stderr).splitlines()
                           if "may not" in l][0].split("kubernetes launcher: ")[-1][:110])

        log("phase 2: 0 -> 3 -> 0, the autoscaler killed mid-burst and adopting its pods")
        kubelet = Kubelet(c, pool, bin_dir, tmp, pending_pool=pool + "p")
        kubelet.start()
        scaler = f.autoscaler_cmd(kubeconfig, pool, template, "fleet-autoscaler-test",
                                  "--min", "0", "--max", "3")
        f.start("autoscaler", scaler)
        p = f.submit(400, 150)
        wait_for("3 worker pods running", lambda: kubelet.max_running == 3, 90, interval=0.3)
        first = {x["metadata"]["name"] for x in pods(c, pool)}
        f.procs["autoscaler"].kill()
        f.procs["autoscaler"].wait()
        f.start("autoscaler", scaler)
        wait_for("the new autoscaler to adopt the running pods",
                 lambda: f.text("autoscaler").count("adopted running pod") >= 3, 60, interval=0.3)
        summary(p, 400)
        check(kubelet.max_pods == 3, f"{kubelet.max_pods} pods at once, not 3 (--max 3)")
        adopted = set(re.findall(r"adopted running pod (\S+)", f.text("autoscaler")))
        check(adopted <= first, f"adopted pods that were not the first autoscaler's: {adopted}")
        log(f"3 pods, the new autoscaler adopted {sorted(adopted)}")
        wait_for("the pool back to 0, no pod left",
                 lambda: f.workers() == [] and not pods(c, pool), 120, interval=0.5)
        made = [n for n in kubelet.seen if n.startswith(pool + "-")]
        for name in made:
            pod = kubelet.seen[name]
            refs = pod["metadata"].get("ownerReferences", [])
            check(refs and refs[0]["uid"] == owner["metadata"]["uid"]
                  and refs[0]["kind"] == "Pod", f"pod {name} has no owner reference: {refs}")
            spec = pod["spec"]
            check(spec["restartPolicy"] == "Never"
                  and spec["serviceAccountName"] == "fleet-worker"
                  and pod["metadata"]["labels"]["app.kubernetes.io/name"] == "fleet-worker",
                  f"pod {name} is not made from the template: {spec}")
        codes = {n: kubelet.exits.get(n) for n in made}
        check(all(code == 0 for code in codes.values()),
              f"a worker did not drain and exit 0 (killed?): {codes}")
        log(f"{len(made)} pods, each owned by the autoscaler's pod, each worker exited 0 "
            "after its drain, none left")

        log("phase 3: a pod that never becomes ready is a failed start")
        f.procs["autoscaler"].terminate()
        f.procs["autoscaler"].wait(timeout=60)
        f.start("autoscaler-pending", f.autoscaler_cmd(
            kubeconfig, pool + "p", template, "fleet-autoscaler-test", "--min", "1", "--max", "1",
            "--start-timeout-seconds", "2"))
        wait_for("two start failures of the pending pod",
                 lambda: f.text("autoscaler-pending").count("did not register within") >= 2, 60,
                 interval=0.3)
        text = f.text("autoscaler-pending")
        check("Unschedulable: 0/1 nodes are available" in text,
              f"the autoscaler did not say why the pod is pending:\n{text[-1500:]}")
        pending_made = [n for n in kubelet.seen if n.startswith(pool + "p-")]
        check(len(pending_made) >= 2, f"no second attempt: {pending_made}")
        f.procs["autoscaler-pending"].terminate()
        f.procs["autoscaler-pending"].wait(timeout=60)
        wait_for("the pending pods deleted", lambda: not pods(c, pool + "p"), 30, interval=0.3)
        log(f"said why ({'Unschedulable'}), deleted it after the start timeout, tried again "
            f"({len(pending_made)} pods), none left")
        ok = True
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        for name in list(f.procs) + ["kube-apiserver"]:
            try:
                lines = open(os.path.join(tmp, name + ".log")).read().splitlines()
                print(f"----- {name} (last 30 lines) -----\n" + "\n".join(lines[-30:]),
                      flush=True)
            except OSError:
                pass
    finally:
        f.stop_all()
        if kubelet is not None:
            kubelet.stop()
        c.stop()
        if args.keep:
            log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
