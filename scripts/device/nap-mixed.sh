#!/usr/bin/env bash
# On the device machine (16 cores): whether the lending thread's naps cost the thread driver's
# 16 B p99 beside bulk on one Endpoint (the heart check's mixed figure). Per round, on PROVIDER
# (default shm): the raw engine's `lat` alone (its p99 is the check's divisor), then `mixed
# --scheduler fair` with the inline driver, the thread driver as it comes (the lending thread
# naps), and the thread driver with RDMALANE_LEND_NAP=0 (it spins: no wake-ups); for scale, the
# thread driver without the express rail (RDMALANE_EXPRESS=0) and without the tasks' spin
# (RDMALANE_AWAIT_SPIN_US=0). Each mixed p99 over the round's raw alone p99 (round-ratios.py):
# median, range, rounds over 1.5; then (group PROVIDER-alone) each run's ping p99 before the
# bulk started, over the same raw p99: what the runtime's own tail puts in the figure.
# Usage: scripts/device/nap-mixed.sh BIN   (ROUNDS, default 3; PROVIDER)
cd "$(dirname "$0")/../.."
source scripts/device/lib.sh
B=$(readlink -f "$1"); out=$(mktemp); p=${PROVIDER:-shm}
mixed99() { # mixed99 TAG DRIVER [VAR=VALUE...]: the p99 beside bulk, and the runtime's alone
  local tag=$1 d=$2 j; shift 2
  j=$(timeout 120 env "$@" "$B" mixed --provider "$p" --scheduler fair --driver "$d" --json 2>/dev/null | tail -1)
  echo "$p $tag $(field small_mixed_p99_us <<<"$j")"
  echo "$p-alone $tag $(field small_alone_p99_us <<<"$j")"
}
for rep in $(seq "${ROUNDS:-3}"); do
  raw=$(figure p99_us "$B" lat --provider "$p" --size 16 --iters 20000 --engine raw)
  echo "$p raw $raw"
  echo "$p-alone raw $raw"
  mixed99 inline inline
  mixed99 thread-nap thread
  mixed99 thread-spin thread RDMALANE_LEND_NAP=0
  mixed99 thread-noexpress thread RDMALANE_EXPRESS=0
  mixed99 thread-nospin thread RDMALANE_AWAIT_SPIN_US=0
done | tee "$out"
python3 scripts/device/round-ratios.py "$out" p99 1.5
