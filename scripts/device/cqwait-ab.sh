#!/usr/bin/env bash
# On the device machine (16 cores): what the thread driver's tcp reactors' wait object
# (FI_WAIT_FD) costs on the busy path, and what going without it costs sporadic traffic. One
# prebuilt rdmalane-perf; ROUNDS interleaved rounds (default 5) of 16 B `lat` and
# `lat --op write-await` p50 with the raw engine, the thread driver as it comes, and the thread
# driver with RDMALANE_CQ_WAIT=0; then GAP_ROUNDS rounds (default 2) of the same with 200 µs
# between ops (2000 each). Each figure over its round's raw run: median, range, every round.
# Usage: scripts/device/cqwait-ab.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
round() { # NAME ARGS...: one round of the three
  local name=$1; shift
  echo "$name raw $(p50 "$B" "$@" --engine raw)" >>"$out"
  echo "$name wait $(p50 "$B" "$@" --driver thread)" >>"$out"
  echo "$name nowait $(RDMALANE_CQ_WAIT=0 p50 "$B" "$@" --driver thread)" >>"$out"
}
for rep in $(seq "${ROUNDS:-5}"); do
  round tcp-lat lat --provider tcp --size 16 --iters 20000
  round tcp-write-await lat --provider tcp --size 16 --iters 20000 --op write-await
done
for rep in $(seq "${GAP_ROUNDS:-2}"); do
  round tcp-lat-gap200 lat --provider tcp --size 16 --iters 2000 --gap-us 200
  round tcp-write-await-gap200 lat --provider tcp --size 16 --iters 2000 --gap-us 200 --op write-await
done
python3 scripts/device/round-ratios.py "$out"
