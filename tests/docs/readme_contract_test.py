#!/usr/bin/python3
"""The README's configuration and metric tables against the real programs.

Flags: for every program, each long flag its --help lists (fleet-ctl: also
each subcommand's --help) must be in a flag table of the README: the
program's own section ("### fleet-broker", ...) or the table of flags every
program shares; and each flag in a program's own table must exist in that
program's --help. A flag added without documentation, or documented and
gone, fails here.

Metrics: a real broker (in memory with a worker, fleet-submit traffic and
an autoscaler; then durable with CURVE on, so the journal and CURVE series
exist), a worker with --metrics and the autoscaler serve their pages; every
metric family on them (its "# TYPE" line) must be named in the README's
"## Metrics" tables, and every name in those tables must be served by one
of the programs.

Usage: readme_contract_test.py --bin-dir build/bin --readme README.md
Exit 0 when both directions hold, 1 with the differences listed.
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PROGRAMS = ["fleet-broker", "fleet-worker", "fleet-autoscaler", "fleet-submit", "fleet-ctl",
            "fleet-autoscaler-sim"]
CTL_SUBCOMMANDS = ["workers", "stats", "retire", "unretire", "keygen"]
SHARED_SECTION = "Flags of every program"

# An option line of CLI11's help: two spaces, an optional short name, the long name.
HELP_OPTION = re.compile(r"^  (?:-\w,)?(--[a-z0-9][a-z0-9-]*)")
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
METRIC = re.compile(r"\b((?:fleet|exposer)_[a-z0-9_]+)")


def help_flags(bin_dir, argv):
    out = subprocess.run([os.path.join(bin_dir, argv[0])] + argv[1:] + ["--help"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} --help exited {out.returncode}: {out.stderr}")
    return {m.group(1) for line in out.stdout.splitlines() if (m := HELP_OPTION.match(line))}


def sections(readme):
    """Heading text -> the lines under it, up to the next heading of any level."""
    out, name = {}, None
    for line in readme.splitlines():
        h = re.match(r"^#{2,4} (.+)$", line)
        if h:
            name = h.group(1).strip()
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def table_first_cells(lines):
    """The first cell of each table row (header and separator rows skipped)."""
    cells = []
    for line in lines:
        if not line.startswith("|"):
            continue
        first = line.strip("|").split("|")[0].strip()
        if set(first) <= set("- :") or first in ("flag", "name", "variable", "file"):
            continue
        cells.append(first)
    return cells


def readme_flags(secs, heading):
    if heading not in secs:
        return None
    flags = set()
    for cell in table_first_cells(secs[heading]):
        flags.update(FLAG.findall(cell))
    return flags


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def families(url):
    page = urllib.request.urlopen(url, timeout=5).read().decode()
    return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}


def ready(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    kv = dict(l.split("=", 1) for l in text.splitlines() if "=" in l)
    return kv if "metrics" in kv else None


def served_metrics(bin_dir, tmp):
    procs = []

    def start(name, args, log):
        p = subprocess.Popen([os.path.join(bin_dir, name)] + args,
                             stdout=open(os.path.join(tmp, log), "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    names = {}
    try:
        # In memory, with a worker, traffic and an autoscaler.
        start("fleet-broker", ["--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                               "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0",
                               "--ready-file", os.path.join(tmp, "b1.ready")], "b1.log")
        b1 = wait_for("the broker", lambda: ready(os.path.join(tmp, "b1.ready")))
        worker_metrics = f"127.0.0.1:{free_port()}"
        start("fleet-worker", ["--broker", b1["backend"], "--id", "doc-w", "--metrics",
                               worker_metrics], "w.log")
        scaler_metrics = f"127.0.0.1:{free_port()}"
        start("fleet-autoscaler", ["--control", b1["control"], "--metrics-source", b1["metrics"],
                                   "--metrics", scaler_metrics, "--max", "1", "--poll-ms", "100"],
              "a.log")
        r = subprocess.run([os.path.join(bin_dir, "fleet-submit"), "--broker", b1["frontend"],
                            "--count", "20", "--timeout-seconds", "60"],
                           capture_output=True, text=True, timeout=90)
        if r.returncode != 0:
            raise RuntimeError(f"fleet-submit failed: {r.stdout}{r.stderr}")
        names["fleet-broker"] = wait_for(
            "the broker's per-worker series",
            lambda: (f := families(b1["metrics"])) and "fleet_worker_idle_seconds" in f and f)
        names["fleet-worker"] = wait_for("the worker's page",
                                         lambda: families(f"http://{worker_metrics}/metrics"))
        names["fleet-autoscaler"] = wait_for(
            "the autoscaler's page", lambda: families(f"http://{scaler_metrics}/metrics"))

        # Durable and with CURVE: the journal's and CURVE's series.
        keys = os.path.join(tmp, "keys")
        os.mkdir(keys)
        for k in ("broker", "client"):
            subprocess.run([os.path.join(bin_dir, "fleet-ctl"), "keygen", os.path.join(keys, k)],
                           check=True, capture_output=True, timeout=30)
        pub = os.path.join(keys, "client.pub")
        start("fleet-broker", ["--frontend", "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                               "--control", "tcp://127.0.0.1:*", "--metrics", "127.0.0.1:0",
                               "--data-dir", os.path.join(tmp, "data"),
                               "--curve-secret-key", os.path.join(keys, "broker.key"),
                               "--curve-producers", pub, "--curve-workers", pub,
                               "--curve-control", pub,
                               "--ready-file", os.path.join(tmp, "b2.ready")], "b2.log")
        b2 = wait_for("the durable CURVE broker", lambda: ready(os.path.join(tmp, "b2.ready")))
        names["fleet-broker"] |= wait_for(
            "the journal and CURVE series",
            lambda: (f := families(b2["metrics"])) and "fleet_curve_refused_total" in f and f)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--readme", required=True)
    args = ap.parse_args()
    secs = sections(open(args.readme).read())
    problems = []

    shared = readme_flags(secs, SHARED_SECTION)
    if shared is None:
        problems.append(f'README has no section "{SHARED_SECTION}"')
        shared = set()
    all_help = set()
    for program in PROGRAMS:
        documented = readme_flags(secs, program)
        if documented is None:
            problems.append(f'README has no section "### {program}"')
            continue
        flags = help_flags(args.bin_dir, [program])
        if program == "fleet-ctl":
            for sub in CTL_SUBCOMMANDS:
                flags |= help_flags(args.bin_dir, ["fleet-ctl", sub])
        all_help |= flags
        for f in sorted(flags - documented - shared):
            problems.append(f"{program} {f}: in --help, not in the README's tables")
        for f in sorted(documented - flags):
            problems.append(f"{program} {f}: in the README's table, not in --help")
    for f in sorted(shared - all_help):
        problems.append(f"{f}: in the README's shared flags table, in no program's --help")

    metric_lines = []
    for heading, lines in secs.items():
        if heading == "Metrics" or heading.startswith("Metrics of "):
            metric_lines += lines
    documented_metrics = set()
    for cell in table_first_cells(metric_lines):
        documented_metrics.update(METRIC.findall(cell))
    if not documented_metrics:
        problems.append('README has no metric tables under "## Metrics"')
    with tempfile.TemporaryDirectory(prefix="fleet-readme-") as tmp:
        served = served_metrics(args.bin_dir, tmp)
    every = set().union(*served.values())
    for program, names in sorted(served.items()):
        for name in sorted(names - documented_metrics):
            problems.append(f"{program} serves {name}, which the README's metric tables lack")
    for name in sorted(documented_metrics - every):
        problems.append(f"the README's metric tables name {name}, which no program serves")

    if problems:
        print("README and programs disagree:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"README matches: {len(all_help)} flags of {len(PROGRAMS)} programs, "
          f"{len(every)} metric families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
