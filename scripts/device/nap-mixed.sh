#!/usr/bin/env bash
# On the device machine (16 cores): whether the lending thread's naps cost the thread driver's
# 16 B p99 beside bulk on one Endpoint (the heart check's mixed figure). Per round, on PROVIDER
# (default shm): the raw engine's `lat` alone (its p99 is the check's divisor), then `mixed
# --scheduler fair` with the inline driver, the thread driver as it comes (the lending thread
# naps), and the thread driver with RDMALANE_LEND_NAP=0 (it spins: no wake-ups). Each mixed p99
# over the round's raw alone p99 (round-ratios.py): median, range, rounds over 1.5.
# Usage: scripts/device/nap-mixed.sh BIN   (ROUNDS, default 3; PROVIDER)
cd "$(dirname "$0")/../.."
source scripts/device/lib.sh
B=$(readlink -f "$1"); out=$(mktemp); p=${PROVIDER:-shm}
mixed99() { # mixed99 DRIVER [VAR=VALUE...]
  local d=$1; shift
  timeout 120 env "$@" "$B" mixed --provider "$p" --scheduler fair --driver "$d" --json 2>/dev/null | field small_mixed_p99_us
}
for rep in $(seq "${ROUNDS:-3}"); do
  echo "$p raw $(timeout 100 "$B" lat --provider "$p" --size 16 --iters 20000 --engine raw --json 2>/dev/null | field p99_us)"
  echo "$p inline $(mixed99 inline)"
  echo "$p thread-nap $(mixed99 thread)"
  echo "$p thread-spin $(mixed99 thread RDMALANE_LEND_NAP=0)"
done | tee "$out"
python3 scripts/device/round-ratios.py "$out" p99 1.5
