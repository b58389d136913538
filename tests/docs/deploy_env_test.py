#!/usr/bin/python3
"""The deployment files' FLEET_* settings against the programs that read them.

Every FLEET_<FLAG> variable that docker-compose.yml (and its CURVE
override), docker-stack.yml and deploy/kubernetes/*.yaml give a fleet
program must be one that program's --help (or fleet-ctl's, which runs in
every container) lists ("Env:FLEET_..."): a misspelt or removed setting would be
ignored in silence by the program, and no schema check sees it. The
programs are taken from each service's or container's command.

Usage: deploy_env_test.py --bin-dir build/bin --source-dir SRC
Exit 0 when every setting is known, 1 with the unknown ones listed.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

PROGRAMS = ["fleet-broker", "fleet-worker", "fleet-autoscaler", "fleet-submit", "fleet-ctl"]
ENV_OF_HELP = re.compile(r"\(Env:(FLEET_[A-Z0-9_]+)\)")


def known_env(bin_dir):
    out = {}
    for p in PROGRAMS:
        r = subprocess.run([os.path.join(bin_dir, p), "--help"], capture_output=True, text=True,
                           timeout=30)
        out[p] = set(ENV_OF_HELP.findall(r.stdout + r.stderr))
        if not out[p]:
            sys.exit(f"{p} --help lists no FLEET_ variables: is {bin_dir} a build?")
    return out


def program_of(command):
    words = command if isinstance(command, list) else str(command or "").split()
    for w in words:
        if os.path.basename(str(w)) in PROGRAMS:
            return os.path.basename(str(w))
    return None


def compose_settings(path):
    """(where, program, variable) of a compose or stack file's services."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    for name, svc in (doc.get("services") or {}).items():
        prog = program_of(svc.get("command")) or ("fleet-broker" if name == "broker" else None)
        env = svc.get("environment") or {}
        names = env.keys() if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
        for var in names:
            if var.startswith("FLEET_") and prog:
                yield f"{os.path.basename(path)}: {name}", prog, var


def kubernetes_settings(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in spec.get("containers", []):
            prog = program_of(c.get("command")) or program_of(c.get("args"))
            for e in c.get("env", []):
                if e["name"].startswith("FLEET_") and prog:
                    yield f"{os.path.basename(path)}: {d['metadata']['name']}", prog, e["name"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    known = known_env(args.bin_dir)
    settings = []
    for f in ("docker-compose.yml", "docker-compose.curve.yml", "docker-stack.yml"):
        settings += list(compose_settings(os.path.join(args.source_dir, f)))
    kdir = os.path.join(args.source_dir, "deploy", "kubernetes")
    for f in sorted(os.listdir(kdir)):
        if f.endswith(".yaml"):
            settings += list(kubernetes_settings(os.path.join(kdir, f)))
    # fleet-ctl runs in every fleet container too (the image's health check,
    # `docker-compose exec broker fleet-ctl workers`): its settings may sit
    # beside another program's.
    unknown = [(w, p, v) for w, p, v in settings if v not in known[p] | known["fleet-ctl"]]
    programs = sorted({p for _, p, _ in settings})
    if len(settings) < 20 or "fleet-autoscaler" not in programs:
        print(f"FAIL: found only {len(settings)} settings ({programs}): the files' layout "
              "changed under this test")
        return 1
    for w, p, v in unknown:
        print(f"FAIL: {w}: {v} is not a setting of {p} (its --help lists no Env:{v})")
    if unknown:
        return 1
    print(f"ok: {len(settings)} FLEET_ settings in the deployment files, all known to "
          f"{', '.join(programs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
