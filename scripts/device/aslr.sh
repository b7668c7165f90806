#!/usr/bin/env bash
# On the device machine (16 cores): does the address layout a process pair draws set its run's
# figure? ROUNDS interleaved rounds (default 6) of 16 B shm `lat` p50: the raw engine, the
# inline and the thread driver, each as usual (`shm`) and with address-space randomization off
# for both processes (`setarch -R`, group `shm-fixed`: every run then draws the same layout).
# Where the runtime's rounds spread wide as usual but narrow with the layout fixed, the layout
# is what moves them.
# Usage: scripts/device/aslr.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
L=(lat --provider shm --size 16 --iters 20000)
for rep in $(seq "${ROUNDS:-6}"); do
  for m in raw inline thread raw-again; do
    case $m in raw | raw-again) f=(--engine raw) ;; *) f=(--driver "$m") ;; esac
    echo "shm $m $(p50 "$B" "${L[@]}" "${f[@]}")" >>"$out"
    echo "shm-fixed $m $(p50 setarch -R "$B" "${L[@]}" "${f[@]}")" >>"$out"
  done
done
python3 scripts/device/round-ratios.py "$out"
echo "--- every run"; cat "$out"
