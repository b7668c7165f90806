#!/usr/bin/env bash
# On the device machine (16 cores): does the unmeasured start of a `lat` run set its figure?
# ROUNDS interleaved rounds (default 5) of 16 B `lat` p50, the raw engine and the thread
# driver, with 200 (the default), 5,000 and 20,000 warm-up round trips before the 20,000
# measured, on shm and tcp; and shm over 200,000 measured (`shm-long`): the steady state.
# Usage: scripts/device/warmup.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "${ROUNDS:-5}"); do
  for p in shm tcp; do for w in 200 5000 20000; do
    L=(lat --provider "$p" --size 16 --iters 20000 --warmup "$w")
    echo "$p-w$w raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
    echo "$p-w$w thread $(p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  done; done
  L=(lat --provider shm --size 16 --iters 200000)
  echo "shm-long raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "shm-long thread $(p50 "$B" "${L[@]}" --driver thread)" >>"$out"
done
python3 scripts/device/round-ratios.py "$out"
