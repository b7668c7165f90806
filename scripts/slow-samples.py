#!/usr/bin/env python3
"""When a run's slow round trips came: for each sample file `rdmalane-perf` wrote under DIR
(`RDMALANE_PERF_SAMPLES=DIR`, one sample in ns per line, in the order taken), the one-way p50
and p99, the p99 without the first SKIP samples, and how many samples were over p50 + EXTRA ns
in each millisecond of the run (the run's time rebuilt from the samples themselves).

Usage: scripts/slow-samples.py [--extra NS] [--skip N] DIR...
"""
import argparse
import glob
import os


def quantile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", type=int, default=3000, help="slow: over p50 by this many ns")
    ap.add_argument("--skip", type=int, default=1800, help="samples left out for the second p99")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    for d in a.dirs:
        for f in sorted(glob.glob(os.path.join(d, "samples-*.txt"))):
            xs = [int(x) for x in open(f)]
            if len(xs) < 2 * a.skip:
                continue
            p50 = quantile(xs, 0.5)
            per_ms, t = {}, 0
            for x in xs:
                if x > p50 + a.extra:
                    per_ms[t // 1_000_000] = per_ms.get(t // 1_000_000, 0) + 1
                t += x
            ms = [per_ms.get(i, 0) for i in range(t // 1_000_000 + 1)]
            print(
                f"{f}: {len(xs)} samples, one-way p50 {p50 / 2000:.3f} µs, p99 {quantile(xs, 0.99) / 2000:.3f}"
                f" ({quantile(xs[a.skip:], 0.99) / 2000:.3f} without the first {a.skip});"
                f" slow per ms: {ms}"
            )


if __name__ == "__main__":
    main()
