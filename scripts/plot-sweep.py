#!/usr/bin/env python3
"""Draw the chunk-size sweep (CSV files from scripts/chunk-sweep.sh) as an SVG: small-message
p99 under load and bulk throughput under load, against chunk size, one line per provider.
Usage: scripts/plot-sweep.py OUT.svg tcp=/tmp/sweep-tcp.csv shm=/tmp/sweep-shm.csv"""
import csv, math, sys

out, series = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
data = {name: list(csv.DictReader(open(path))) for name, path in series}
colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
W, H, M = 360, 260, 50

def panel(x0, title, key, log_y):
    pts = [(float(r["chunk"]), float(r[key])) for rows in data.values() for r in rows]
    xs = [math.log2(x) for x, _ in pts]
    ys = [math.log10(y) if log_y else y for _, y in pts]
    xmin, xmax = min(xs), max(xs)
    ymin, ymax = (min(ys), max(ys)) if log_y else (0, max(ys) * 1.1)
    sx = lambda x: x0 + M + (math.log2(x) - xmin) / (xmax - xmin) * (W - 2 * M)
    sy = lambda y: H - M - ((math.log10(y) if log_y else y) - ymin) / ((ymax - ymin) or 1) * (H - 2 * M)
    g = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>',
         f'<line x1="{x0 + M}" y1="{H - M}" x2="{x0 + W - M}" y2="{H - M}" stroke="black"/>',
         f'<line x1="{x0 + M}" y1="{M}" x2="{x0 + M}" y2="{H - M}" stroke="black"/>']
    for r in next(iter(data.values())):
        c = float(r["chunk"])
        g.append(f'<text x="{sx(c)}" y="{H - M + 15}" text-anchor="middle" font-size="10">{int(c) // 1024}K</text>')
    for v in ([10 ** k for k in range(math.floor(ymin), math.ceil(ymax) + 1)] if log_y else
              [ymax * k / 4 for k in range(5)]):
        if (math.log10(v) if log_y else v) < ymin - 1e-9 or (math.log10(v) if log_y else v) > ymax + 1e-9:
            continue
        g.append(f'<text x="{x0 + M - 5}" y="{sy(v) + 3}" text-anchor="end" font-size="10">{(f"{v:g}" if log_y else f"{v:.0f}")}</text>')
    for i, (name, rows) in enumerate(data.items()):
        line = " ".join(f"{sx(float(r['chunk'])):.1f},{sy(float(r[key])):.1f}" for r in rows)
        g.append(f'<polyline points="{line}" fill="none" stroke="{colors[i]}" stroke-width="2"/>')
        g.append(f'<text x="{x0 + W - M}" y="{M + 14 * i}" text-anchor="end" font-size="11" fill="{colors[i]}">{name}</text>')
    g.append(f'<text x="{x0 + W / 2}" y="{H - 8}" text-anchor="middle" font-size="11">chunk size</text>')
    return g

body = panel(0, "16 B p99 under load (µs, log)", "small_mixed_p99_us", True) + \
       panel(W, "bulk under load (Gb/s)", "bulk_mixed_gbps", False)
open(out, "w").write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" '
                      f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
                      + "".join(body) + "</svg>\n")
