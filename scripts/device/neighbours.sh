#!/usr/bin/env bash
# On the device machine (16 cores): what threads that only wake cost the raw engine's 16 B
# ping-pong on other cores. ROUNDS interleaved rounds (default 8) per provider of `lat --engine
# raw` alone, beside two threads parking 10 µs at a time (as the thread driver's lending
# threads nap, one a side), and beside two parking 160 µs; medians of each round's ratio to the
# round's plain run at the end (round-ratios.py, the plain run as `raw`). Needs gcc (napper.c).
# Usage: scripts/device/neighbours.sh BIN
cd "$(dirname "$0")/../.."
B=$1 out=$(mktemp) napper=$(mktemp)
trap 'rm -f "$out" "$napper"' EXIT
gcc -O2 -pthread -o "$napper" scripts/device/napper.c || exit 1
source scripts/device/lib.sh
for r in $(seq "${ROUNDS:-8}"); do
  for p in ${PROVIDERS:-shm tcp}; do
    L=("$B" lat --provider "$p" --size 16 --iters 20000 --engine raw)
    echo "$p raw $(p50 "${L[@]}")" | tee -a "$out"
    for us in 10 160; do
      "$napper" 2 "$us" & n=$!
      sleep 0.1
      echo "$p nap$us $(p50 "${L[@]}")" | tee -a "$out"
      kill "$n"; wait "$n" 2>/dev/null
    done
  done
done
python3 scripts/device/round-ratios.py "$out"
