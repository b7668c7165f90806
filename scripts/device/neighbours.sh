#!/usr/bin/env bash
# On the device machine (16 cores): what threads that only wake cost the raw engine's 16 B
# ping-pong on other cores. ROUNDS interleaved rounds (default 8) per provider of `lat --engine
# raw` alone, beside two threads parking 10 µs at a time (as the thread driver's lending
# threads nap, one a side), and beside two parking 160 µs; medians of each round's ratio to the
# round's plain run at the end. Needs gcc (for napper.c).
# Usage: scripts/device/neighbours.sh BIN
cd "$(dirname "$0")/../.."
B=$1 out=$(mktemp) napper=$(mktemp)
trap 'rm -f "$out" "$napper"' EXIT
gcc -O2 -pthread -o "$napper" scripts/device/napper.c || exit 1
source scripts/device/lib.sh
for r in $(seq "${ROUNDS:-8}"); do
  for p in ${PROVIDERS:-shm tcp}; do
    L=("$B" lat --provider "$p" --size 16 --iters 20000 --engine raw)
    echo "$r $p alone $(p50 "${L[@]}")" | tee -a "$out"
    for us in 10 160; do
      "$napper" 2 "$us" & n=$!
      sleep 0.1
      echo "$r $p nap$us $(p50 "${L[@]}")" | tee -a "$out"
      kill "$n"; wait "$n" 2>/dev/null
    done
  done
done
python3 - "$out" <<'PY'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, p, k, v = line.split()
    if v != "nan":
        d[(p, k)][r] = float(v)
for p in sorted({p for p, _ in d}):
    alone = d[(p, "alone")]
    for k in ("nap10", "nap160"):
        rat = [v / alone[r] for r, v in d[(p, k)].items() if r in alone]
        if rat:
            print(f"{p} {k}: p50 over the round's plain run, median {st.median(rat):.3f} over {len(rat)} rounds")
PY
