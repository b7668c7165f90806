#!/usr/bin/env bash
# On the device machine (16 cores): what in the thread driver's path costs where it sits over
# the inline driver. 16 B `lat` p50 on PROVIDERS (default "shm tcp"), ROUNDS interleaved rounds
# (default 4): the raw engine, the inline driver, the thread driver as the heart check runs it
# (a multi-thread tokio runtime, the lending thread napping), then with one thing changed each:
# `Runtime::block_on` instead of tokio, the lending thread spinning (RDMALANE_LEND_NAP=0), the
# reactor threads pinned to core 1 instead of the last core, and the raw engine again. Each run
# also prints its lend counts and the host's steal time over it (from /proc/stat, in 10 ms
# ticks summed over the CPUs): a host that takes the guest's CPUs away shows it there.
# Usage: scripts/device/thread-gap.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node0|L3"
uname -r
steal() { awk '/^cpu /{print $9}' /proc/stat; }
one() { # group mode env... -- args...
  local g=$1 m=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local s0 s1 o
  s0=$(steal)
  o=$(env "${envs[@]}" timeout 100 "$B" "$@" --json 2>/dev/null | tail -1)
  s1=$(steal)
  echo "$o" | python3 scripts/device/run-line.py "$g" "$m" "$((s1 - s0))" "$out"
}
for rep in $(seq "${ROUNDS:-4}"); do for p in ${PROVIDERS:-shm tcp}; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  one "$p" raw -- "${L[@]}" --engine raw
  one "$p" inline -- "${L[@]}" --driver inline
  one "$p" thread -- "${L[@]}" --driver thread
  one "$p" thread-blockon -- "${L[@]}" --driver thread --executor block-on
  one "$p" thread-spin RDMALANE_LEND_NAP=0 -- "${L[@]}" --driver thread
  one "$p" thread-core1 RDMALANE_CORE=1 -- "${L[@]}" --driver thread
  one "$p" raw-again -- "${L[@]}" --engine raw
done; done
python3 scripts/device/round-ratios.py "$out"
