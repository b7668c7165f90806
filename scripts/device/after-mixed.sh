#!/usr/bin/env bash
# On the device machine (16 cores): does a `mixed` run slow the `lat` runs after it? The heart
# check measures shm's raw engine first and the thread driver after three `mixed` runs; this
# runs two of each (16 B p50) before, between and 5 s after those runs, in the check's order,
# ROUNDS times (default 2).
# Usage: scripts/device/after-mixed.sh BIN
cd "$(dirname "$0")/../.."
B=$1
source scripts/device/lib.sh
L=(lat --provider shm --size 16 --iters 20000)
pair() {
  echo "$1 raw=$(p50 "$B" "${L[@]}" --engine raw) thread=$(p50 "$B" "${L[@]}" --driver thread)" \
    "raw=$(p50 "$B" "${L[@]}" --engine raw) thread=$(p50 "$B" "${L[@]}" --driver thread)"
}
for r in $(seq "${ROUNDS:-2}"); do
  pair "r$r start"
  timeout 100 "$B" mixed --provider shm --scheduler fair --driver inline --json >/dev/null 2>&1
  pair "r$r after-mixed-inline"
  timeout 100 "$B" mixed --provider shm --scheduler fair --driver thread --json >/dev/null 2>&1
  pair "r$r after-mixed-thread"
  timeout 100 "$B" mixed --provider shm --scheduler fifo --json >/dev/null 2>&1
  pair "r$r after-fifo"
  sleep 5
  pair "r$r 5s-later"
done
