#!/usr/bin/env python3
"""One `rdmalane-perf ... --json` run's last line (stdin) as a row: appends `group mode p50_us`
(`nan` where the run failed) to FILE for round-ratios.py, and prints p50, p99, the lend counts
and the steal time given.
Usage: run-line.py GROUP MODE STEAL FILE"""
import json
import sys

group, mode, steal, path = sys.argv[1:5]
with open(path, "a") as rows:
    try:
        j = json.load(sys.stdin)
    except ValueError:
        print(f"{group} {mode} nan", file=rows)
        print(f"{group} {mode} failed")
        sys.exit(0)
    print(f"{group} {mode} {j['p50_us']}", file=rows)
    print(
        f"{group:4s} {mode:14s} p50 {j['p50_us']:.3f} p99 {j['p99_us']:.3f} "
        f"asks {j.get('task_asks')} retakes {j.get('thread_retakes')} steal {steal}"
    )
