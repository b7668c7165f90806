#!/usr/bin/env bash
# On the device machine (16 cores): where single process pairs of `lat` land. For each prebuilt
# rdmalane-perf BIN, 16 B `lat` on shm and tcp with the raw engine (first BIN's), the thread
# driver, the inline driver and, for the first BIN, the thread driver with its lending thread
# spinning (RDMALANE_LEND_NAP=0); ROUNDS interleaved rounds (default 6). Each run prints its p50
# and, from RDMALANE_PERF_PLACEMENT, the CPU each side's threads ran on last and their lend
# counts; medians over the raw engine's at the end. PROVIDERS (default "shm tcp").
# Usage: scripts/device/placement.sh BIN [BIN...]
cd "$(dirname "$0")/../.."
out=$(mktemp)
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA|L3"
one() { # label bin args...
  local l=$1 b=$2; shift 2
  local o p50
  o=$(RDMALANE_PERF_PLACEMENT=1 timeout 60 "$b" "$@" --json 2>&1)
  p50=$(echo "$o" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["p50_us"])' 2>/dev/null || echo nan)
  echo "$l $p50" >>"$out"
  echo "$l $p50 | $(echo "$o" | grep PLACEMENT | sed 's/PLACEMENT //' | tr '\n' '|')"
}
for rep in $(seq "${ROUNDS:-6}"); do for p in ${PROVIDERS:-shm tcp}; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  one "$p raw" "$1" "${L[@]}" --engine raw
  for b in "$@"; do
    n=$(basename "$b")
    one "$p thread-$n" "$b" "${L[@]}" --driver thread
    one "$p inline-$n" "$b" "${L[@]}" --driver inline
  done
  RDMALANE_LEND_NAP=0 one "$p thread-spin-$(basename "$1")" "$1" "${L[@]}" --driver thread
done; done
python3 scripts/device/p50-medians.py "$out"
