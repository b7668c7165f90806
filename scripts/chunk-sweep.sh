#!/usr/bin/env bash
# The chunk-size trade-off: for each chunk size, `rdmalane-perf mixed --scheduler fair` on one
# provider; prints a markdown table (small p99 alone and mixed, bulk alone and mixed, CPU per GB)
# and writes the same as CSV for plotting.
# Usage: [RDMALANE_PERF=bin] [DRIVER=inline|thread] scripts/chunk-sweep.sh [provider] [csv-out]
# RDMALANE_PERF runs a prebuilt binary (the device machine has no Rust toolchain); DRIVER is
# passed as `--driver` (default: the benchmark's own, inline).
set -euo pipefail
cd "$(dirname "$0")/.."
prov=${1:-tcp}
csv=${2:-/dev/null}
if [ -n "${RDMALANE_PERF:-}" ]; then perf=$RDMALANE_PERF; else
  perf=target/release/rdmalane-perf
  [ -x "$perf" ] || cargo build --release -q -p rdmalane-perf
fi
driver=()
[ -n "${DRIVER:-}" ] && driver=(--driver "$DRIVER")
echo "chunk,small_alone_p99_us,small_mixed_p99_us,bulk_alone_gbps,bulk_mixed_gbps,cpu_s_per_gb" >"$csv"
echo "| chunk | small p99 alone (µs) | small p99 mixed (µs) | bulk alone (Gb/s) | bulk mixed (Gb/s) | CPU s per GB (both sides, mixed) |"
echo "|---|---|---|---|---|---|"
for c in 4096 16384 65536 262144 1048576; do
  lane=$((c * 4 > 262144 ? c * 4 : 262144))
  j=$(timeout 300 "$perf" mixed --provider "$prov" --scheduler fair --chunk-size "$c" --lane-bytes "$lane" --iters 5000 "${driver[@]}" --json 2>/dev/null | tail -1)
  python3 - "$c" "$j" "$csv" <<'PY'
import json, sys
c, j, csv = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
gbs = j["bulk_mixed_gbps"] / 8
cpu = (j["cpu_pct"] + j["server_cpu_pct"]) / 100 / gbs if gbs > 0 else float("nan")
row = [c, j["small_alone_p99_us"], j["small_mixed_p99_us"], j["bulk_alone_gbps"], j["bulk_mixed_gbps"], cpu]
print(f"| {c // 1024} KiB | {row[1]:.1f} | {row[2]:.1f} | {row[3]:.1f} | {row[4]:.1f} | {row[5]:.2f} |")
open(csv, "a").write(",".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row) + "\n")
PY
done
