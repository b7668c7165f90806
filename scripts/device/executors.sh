#!/usr/bin/env bash
# On the device machine (16 cores): one prebuilt rdmalane-perf, what an application's executor
# gets. 16 B `lat` (send/recv, one-way) and `lat --op write-await` p50 on shm and tcp under the
# thread driver with each executor running the client's future (`Runtime::block_on`, a
# current-thread and a multi-thread tokio runtime), beside the raw engine and the inline
# driver; ROUNDS interleaved rounds (default 3), then each one's median over the raw engine's
# and its range. PROVIDERS (default "shm tcp") picks the providers.
# Usage: scripts/device/executors.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "${ROUNDS:-3}"); do for p in ${PROVIDERS:-shm tcp}; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  echo "$p raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p inline $(p50 "$B" "${L[@]}" --driver inline)" >>"$out"
  echo "$p await-raw $(p50 "$B" "${L[@]}" --op write-await --engine raw)" >>"$out"
  for e in block-on tokio-current tokio-multi; do
    echo "$p thread-$e $(p50 "$B" "${L[@]}" --driver thread --executor $e)" >>"$out"
    echo "$p await-thread-$e $(p50 "$B" "${L[@]}" --op write-await --driver thread --executor $e)" >>"$out"
  done
done; done
python3 scripts/device/p50-medians.py "$out"
