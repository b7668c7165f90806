#!/usr/bin/env bash
# The foundation numbers, side by side in one run: rdmalane-perf lat (16 B) against the raw
# engine and Debian's fi_pingpong, and bw (1 MiB) against the raw engine, on tcp and shm.
# Medians of 3 interleaved runs. Usage: scripts/bench-foundation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p rdmalane-perf
perf=target/release/rdmalane-perf
field() { python3 -c "import json,sys; print(json.loads([l for l in sys.stdin.read().splitlines() if l.strip()][-1])['$1'])"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
pingpong() { # provider -> one-way usec/xfer
  local port=$((40000 + RANDOM % 20000))
  timeout 60 fi_pingpong -p "$1" -e rdm -I 20000 -S 16 -B "$port" >/dev/null 2>&1 &
  sleep 0.5
  timeout 60 fi_pingpong -p "$1" -e rdm -I 20000 -S 16 -P "$port" 127.0.0.1 2>/dev/null | awk '/^[0-9]/{print $7}'
  wait
}
echo "| provider | lat rdmalane (µs) | lat raw engine (µs) | fi_pingpong (µs) | ratio vs fi_pingpong | bw rdmalane (Gb/s) | bw raw (Gb/s) | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for p in tcp shm; do
  prov=$([ "$p" = tcp ] && echo "tcp;ofi_rxm" || echo shm)
  lr=() lw=() fp=() br=() bw=()
  for i in 1 2 3; do
    fp+=("$(pingpong "$prov")")
    lr+=("$($perf lat --provider $p --size 16 --iters 20000 --json | field mean_us)")
    lw+=("$($perf lat --provider $p --size 16 --iters 20000 --engine raw --json | field mean_us)")
    br+=("$($perf bw --provider $p --size 1048576 --iters 2000 --json | field gbps)")
    bw+=("$($perf bw --provider $p --size 1048576 --iters 2000 --engine raw --json | field gbps)")
  done
  python3 - "$prov" "$(median "${lr[@]}")" "$(median "${lw[@]}")" "$(median "${fp[@]}")" "$(median "${br[@]}")" "$(median "${bw[@]}")" <<'PY'
import sys
p, lr, lw, fp, br, bw = sys.argv[1], *map(float, sys.argv[2:])
print(f"| {p} | {lr:.2f} | {lw:.2f} | {fp:.2f} | {lr/fp:.2f} | {br:.1f} | {bw:.1f} | {br/bw:.2f} |")
PY
done
