#!/usr/bin/python3
"""Checks a bench/run.py --smoke result file: every benchmark ran and gave
its figures (not how good they are: tests never judge time).

Usage: smoke_check.py LATEST_JSON
"""
import json
import sys


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    problems = list(doc.get("errors", []))
    results = doc.get("results", [])

    def find(**want):
        return [r for r in results if all(r.get(k) == v for k, v in want.items())]

    wanted = [
        ("fleet throughput", dict(system="fleet", bench="throughput"), "batches_per_s"),
        ("fleet sleep", dict(system="fleet", bench="sleep"), "efficiency"),
        ("fleet latency", dict(system="fleet", bench="latency"), "p99_us"),
        ("ceiling throughput", dict(system="ceiling", bench="throughput"), "batches_per_s"),
        ("ceiling latency", dict(system="ceiling", bench="latency"), "p99_us"),
        ("celery throughput", dict(system="celery", bench="throughput"), "batches_per_s"),
        ("celery latency", dict(system="celery", bench="latency"), "p99_us"),
        ("durable throughput", dict(system="fleet-durable", bench="throughput"),
         "batches_per_s"),
        ("memory", dict(system="fleet", bench="memory"), "bytes_per_batch_beyond_payload"),
        ("decision", dict(system="fleet", bench="decision"), "p50_us"),
        ("scaling", dict(bench="scaling"), "runs"),
        ("process handler throughput", dict(system="fleet", handler="process"), "batches_per_s"),
        ("exec handler throughput", dict(system="fleet", handler="exec"), "batches_per_s"),
    ]
    for name, where, key in wanted:
        rows = find(**where)
        if not rows:
            problems.append(f"no {name} result")
        elif not all(r.get(key) for r in rows):
            problems.append(f"{name}: a result without {key}: {rows[0]}")
    for r in find(bench="latency"):
        if r.get("lost"):
            problems.append(f"{r.get('label')}: {r['lost']} batches lost")
    scaling = find(bench="scaling")
    if scaling:
        names = {run.get("name") for run in scaling[0].get("runs", [])}
        for n in ("backlog", "throughput", "fixed"):
            if n not in names:
                problems.append(f"scaling: no {n} run")
    if not doc.get("targets"):
        problems.append("no targets reported")
    if "Targets (issue 6)" not in doc.get("table", ""):
        problems.append("the table has no targets section")
    for row in ("process, Python", "process, C++, depth 16", "process, Python, depth 16"):
        if row not in doc.get("table", ""):
            problems.append(f"the table has no \"{row}\" row")
    for p in problems:
        print(f"smoke_check: {p}", file=sys.stderr)
    print(f"smoke_check: {len(results)} results, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
