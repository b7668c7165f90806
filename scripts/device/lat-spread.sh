#!/usr/bin/env bash
# On the device machine (16 cores): one prebuilt rdmalane-perf, 16 B `lat` p50 on shm and tcp
# with the raw engine, the inline driver and the thread driver as it comes, without the express
# rail, with a spinning lending thread and without the wait object; ROUNDS interleaved rounds
# (default 7), then each one's median over the raw engine's, and its range.
# Usage: scripts/device/lat-spread.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "${ROUNDS:-7}"); do for p in shm tcp; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  echo "$p raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p inline $(p50 "$B" "${L[@]}" --driver inline)" >>"$out"
  echo "$p thread $(p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  echo "$p thread-noexpress $(RDMALANE_EXPRESS=0 p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  echo "$p thread-spinlend $(RDMALANE_LEND_NAP=0 p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  echo "$p thread-nowait $(RDMALANE_CQ_WAIT=0 p50 "$B" "${L[@]}" --driver thread)" >>"$out"
done; done
python3 scripts/device/p50-medians.py "$out"
