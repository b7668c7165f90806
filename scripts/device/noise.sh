#!/usr/bin/env bash
# On the device machine (16 cores): how far one run's ratio strays on this host, which is what
# the heart check judges (one process pair per figure). ROUNDS rounds (default 8) of 16 B `lat`
# p50 on shm and tcp: the raw engine, the thread driver, the raw engine again and the inline
# driver; each round's figure over that round's first raw run, their median, and how many
# rounds a single-run judge at 1.3x would fail. The raw engine's second run is the floor: what
# the spread alone does to a ratio whose true value is 1.
# Usage: scripts/device/noise.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "${ROUNDS:-8}"); do for p in shm tcp; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  echo "$p raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p thread $(p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  echo "$p raw-again $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p inline $(p50 "$B" "${L[@]}" --driver inline)" >>"$out"
done; done
python3 scripts/device/round-ratios.py "$out"
