#!/usr/bin/env python3
"""Medians of the device scripts' p50 rows (`provider mode p50_us`, `nan` for a failed run), in
the order the modes first came: each mode's median, its ratio over its provider's baseline (the
raw engine's: `raw`, or `await-raw` for the `await-` modes), its range and its count.
Usage: p50-medians.py FILE"""
import collections
import statistics as st
import sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, mode, v = line.split()
    runs[(p, mode)]
    if v != "nan":
        runs[(p, mode)].append(float(v))
for p in dict.fromkeys(p for p, _ in runs):
    med = {m: st.median(v) for (q, m), v in runs.items() if q == p and v}
    for (q, m), v in runs.items():
        if q != p or not v:
            continue
        base = med.get("await-raw" if m.startswith("await") else "raw")
        ratio = f" ({med[m] / base:.2f}x raw)" if base else ""
        print(f"{p} {m:18s} median {med[m]:.3f} us{ratio}  range {min(v):.3f}-{max(v):.3f}  n={len(v)}")
