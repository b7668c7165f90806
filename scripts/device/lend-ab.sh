#!/usr/bin/env bash
# On the device machine, from the repository root with .gpu carried: the lend A/B of the
# 2026-12-03 book section. .gpu/perf-prev, .gpu/perf-mid: earlier builds of rdmalane-perf
# copied there by hand (`cargo build --release -p rdmalane-perf --features cuda`, strip).
cd "$(dirname "$0")/../.."
lscpu | grep -E "Model name|Socket|NUMA node|^CPU\(s\)" ; nproc
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
run() { local label=$1; shift; printf "%-34s " "$label"; timeout 120 "$@" --json 2>/dev/null | j p50_us p99_us small_alone_p99_us small_mixed_p99_us bulk_alone_gbps bulk_mixed_gbps || echo fail; }
for rep in 1 2 3; do
for p in shm tcp; do
  run "$p raw lat" .gpu/rdmalane-perf lat --provider $p --iters 20000 --engine raw
  run "$p inline lat" .gpu/rdmalane-perf lat --provider $p --iters 20000 --driver inline
  for b in perf-prev perf-mid rdmalane-perf; do
    run "$p thread lat $b" .gpu/$b lat --provider $p --iters 20000 --driver thread
  done
  run "$p raw await" .gpu/rdmalane-perf lat --provider $p --iters 20000 --op write-await --engine raw
  for b in perf-prev perf-mid rdmalane-perf; do
    run "$p thread await $b" .gpu/$b lat --provider $p --iters 20000 --op write-await --driver thread
  done
done
done
for p in shm tcp; do for b in perf-prev perf-mid rdmalane-perf; do
  run "$p mixed thread $b" .gpu/$b mixed --provider $p --scheduler fair --driver thread
done; done
for p in shm tcp; do run "$p mixed inline" .gpu/rdmalane-perf mixed --provider $p --scheduler fair --driver inline; done
echo "== heart"
RDMALANE_PERF=.gpu/rdmalane-perf bash .gpu/checks/heart
