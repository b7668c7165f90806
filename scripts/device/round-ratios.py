#!/usr/bin/env python3
"""Per-round ratios of the device scripts' interleaved p50 rows (`group mode p50_us`, `nan` for a
failed run; each group's `raw` rows are its baseline, one per round, in round order): for each
group the raw engine's median and range, then for each other mode, in the order the modes first
came, its p50 median and each round's figure over that round's raw run: their median, range,
how many a single-run judge at BAR (default 1.3) would fail, and every round's. FIGURE (default
p50) names what the rows hold, in µs.
Usage: round-ratios.py FILE [FIGURE [BAR]]"""
import collections
import math
import statistics as st
import sys

fig = sys.argv[2] if len(sys.argv) > 2 else "p50"
bar = float(sys.argv[3]) if len(sys.argv) > 3 else 1.3
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    group, mode, v = line.split()
    runs[(group, mode)].append(float(v))
for group in dict.fromkeys(g for g, _ in runs):
    raw = runs[(group, "raw")]
    ok = [x for x in raw if not math.isnan(x)]
    if not ok:
        print(f"{group}: every raw engine run failed; no ratios")
        continue
    print(f"{group} raw engine {fig} median {st.median(ok):.3f} us, range {min(ok):.3f}-{max(ok):.3f}")
    for (g, mode), v in runs.items():
        if g != group or mode == "raw":
            continue
        r = [a / b for a, b in zip(v, raw) if not (math.isnan(a) or math.isnan(b))]
        p = [x for x in v if not math.isnan(x)]
        if r:
            print(f"{group} {mode:9s} {fig} median {st.median(p):.3f} us; over the round's raw run: median "
                  f"{st.median(r):.2f}, range {min(r):.2f}-{max(r):.2f}, over {bar:g} in {sum(x > bar for x in r)} "
                  f"of {len(r)} ({' '.join(f'{x:.2f}' for x in r)})")
