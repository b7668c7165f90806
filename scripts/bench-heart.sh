#!/usr/bin/env bash
# Small requests first, as applications run it: the heart table in one run, on tcp and shm, both
# drivers, each figure beside the raw engine's on the same stack. Writes every run's JSON line
# and the table's ratios to OUT/heart.json and a bar chart of the ratios to OUT/heart.svg.
#   scripts/bench-heart.sh [OUT]          builds rdmalane-perf here (release) and runs it
#   RDMALANE_PERF=path scripts/bench-heart.sh [OUT]
#                                         runs a prebuilt binary (e.g. on a machine with more
#                                         cores and no Rust toolchain; needs bash and python3)
# Figures (goals of issue 20 on >= 8 cores; on fewer the table only reports):
#   mixed_<p>_<driver>_p99_over_raw  16 B p99 beside 8 x 1 MiB bulk / the raw engine's alone p99   <= 1.5
#   mixed_<p>_<driver>_bulk          bulk rate beside the pings / bulk alone                        >= 0.90
#   fifo_<p>_p99x                    the same p99 with the fifo scheduler / its own alone p99       >= 5
#   lat_<driver>_<p>_x               lat 16 B p50 / the raw engine's                   <= 1.3 thread, 1.1 inline
#   await_<driver>_<p>_x             lat --op write-await p50 / the raw engine's                   <= 1.3
#   tenants_<p>_<driver>_b_over_a    tenant B's rate / tenant A's                                  0.9-1.1
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/heart}
mkdir -p "$out"
if [ -n "${RDMALANE_PERF:-}" ]; then perf=$RDMALANE_PERF; else
  cargo build --release -q -p rdmalane-perf
  perf=target/release/rdmalane-perf
fi
runs="$out/runs.jsonl"
: >"$runs"
# run NAME ARGS...: one rdmalane-perf run; its JSON line, tagged with NAME, goes to runs.jsonl.
run() {
  local name=$1 line
  shift
  if line=$(timeout 180 "$perf" "$@" --json 2>/dev/null | tail -1) && [ -n "$line" ]; then
    printf '{"run":"%s","result":%s}\n' "$name" "$line" >>"$runs"
  else
    printf '{"run":"%s","failed":true}\n' "$name" >>"$runs"
    echo "failed: $name ($*)" >&2
  fi
}
for p in tcp shm; do
  run "lat_raw_$p" lat --provider $p --size 16 --iters 20000 --engine raw
  run "await_raw_$p" lat --provider $p --size 16 --iters 20000 --op write-await --engine raw
  for d in inline thread; do
    run "mixed_${p}_$d" mixed --provider $p --scheduler fair --driver $d
    run "lat_${d}_$p" lat --provider $p --size 16 --iters 20000 --driver $d
    run "await_${d}_$p" lat --provider $p --size 16 --iters 20000 --op write-await --driver $d
    run "tenants_${p}_$d" tenants --provider $p --driver $d
  done
  run "fifo_$p" mixed --provider $p --scheduler fifo
done
python3 - "$runs" "$out" "$(nproc)" <<'PY'
import json, sys
runs_path, out, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {}
for line in open(runs_path):
    try:
        r = json.loads(line)
    except ValueError:
        continue  # a run whose last line was not its JSON: counted as failed below
    runs[r["run"]] = r.get("result")
def get(run, key):
    r = runs.get(run)
    return None if r is None else r.get(key)
def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b
figs = []  # (name, value, op, goal)
for p in ("tcp", "shm"):
    raw99 = get(f"lat_raw_{p}", "p99_us")
    for d in ("inline", "thread"):
        m = f"mixed_{p}_{d}"
        figs.append((f"{m}_p99_over_raw", ratio(get(m, "small_mixed_p99_us"), raw99), "le", 1.5))
        figs.append((f"{m}_bulk", ratio(get(m, "bulk_mixed_gbps"), get(m, "bulk_alone_gbps")), "ge", 0.90))
        figs.append((f"lat_{d}_{p}_x", ratio(get(f"lat_{d}_{p}", "p50_us"), get(f"lat_raw_{p}", "p50_us")),
                     "le", 1.3 if d == "thread" else 1.1))
        figs.append((f"await_{d}_{p}_x", ratio(get(f"await_{d}_{p}", "p50_us"), get(f"await_raw_{p}", "p50_us")),
                     "le", 1.3))
        t = f"tenants_{p}_{d}"
        figs.append((f"{t}_b_over_a", get(t, "b_over_a"), "in", (0.9, 1.1)))
    figs.append((f"fifo_{p}_p99x", ratio(get(f"fifo_{p}", "small_mixed_p99_us"), get(f"fifo_{p}", "small_alone_p99_us")),
                 "ge", 5))
def holds(v, op, goal):
    if v is None:
        return None
    if op == "le":
        return v <= goal
    if op == "ge":
        return v >= goal
    return goal[0] <= v <= goal[1]
judged = cores >= 8
table = [{"figure": n, "value": v, "goal": f"{op} {g}", "holds": holds(v, op, g) if judged else None}
         for n, v, op, g in figs]
json.dump({"cores": cores, "figures": table, "runs": runs}, open(f"{out}/heart.json", "w"), indent=1)
print(f"heart on {cores} cores ({'goals judged' if cores >= 8 else 'reported only: fewer than 8 cores'})")
print("| figure | value | goal | holds |")
print("|---|---|---|---|")
for t in table:
    v = "failed" if t["value"] is None else f'{t["value"]:.3f}'
    print(f'| {t["figure"]} | {v} | {t["goal"]} | {t["holds"]} |')
# What it cost: cores busy per side, and CPU-seconds per GB of bulk (mixed), from the same runs.
print()
print("| run | client cores | server cores | client CPU-s/GB bulk (alone / beside pings) | server CPU-s/GB bulk |")
print("|---|---|---|---|---|")
for name, r in runs.items():
    if not r or r.get("bench") not in ("mixed", "lat"):
        continue
    f = lambda k, d=2: "" if r.get(k) is None else f"{r[k]:.{d}f}"
    if r["bench"] == "mixed":
        print(f'| {name} | {f("mixed_cores")} | {f("server_cores")} | {f("bulk_alone_cpu_s_per_gb", 3)} / {f("bulk_mixed_cpu_s_per_gb", 3)} | {f("server_cpu_s_per_gb", 3)} |')
    else:
        cores_c = "" if r.get("cpu_pct") is None else f'{r["cpu_pct"] / 100:.2f}'
        cores_s = "" if r.get("server_cpu_pct") is None else f'{r["server_cpu_pct"] / 100:.2f}'
        print(f"| {name} | {cores_c} | {cores_s} | | |")
# A bar per figure: its value over its goal (1.0 = at the goal; green where it holds).
W, row, left = 760, 18, 260
shown = [t for t in table if t["value"] is not None]
H = 40 + row * len(shown)
scale = lambda x: left + min(x, 3.0) / 3.0 * (W - left - 60)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">heart: each figure over its goal ({cores} cores)</text>',
       f'<line x1="{scale(1)}" y1="24" x2="{scale(1)}" y2="{H-6}" stroke="black" stroke-dasharray="3,3"/>']
for i, t in enumerate(shown):
    op, g = t["goal"].split(" ", 1)
    goal = 1.0 if op == "in" else float(g)
    y = 28 + i * row
    color = {True: "#2ca02c", False: "#d62728", None: "#7f7f7f"}[t["holds"]]
    svg.append(f'<text x="{left-6}" y="{y+11}" text-anchor="end">{t["figure"]}</text>')
    svg.append(f'<rect x="{left}" y="{y}" width="{scale(t["value"]/goal)-left:.1f}" height="{row-5}" fill="{color}"/>')
    svg.append(f'<text x="{scale(t["value"]/goal)+4:.1f}" y="{y+11}">{t["value"]:.2f} ({t["goal"]})</text>')
svg.append("</svg>")
open(f"{out}/heart.svg", "w").write("\n".join(svg))
print(f"wrote {out}/heart.json and {out}/heart.svg")
PY
