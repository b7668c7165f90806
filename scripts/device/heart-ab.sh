#!/usr/bin/env bash
# On the device machine (16 cores): two prebuilt rdmalane-perf binaries A and B, the heart check
# with each, interleaved twice, then the cases a completion-queue wait object is for (tcp,
# thread driver): busy ping-pong, sporadic pings 1 ms apart, awaited writes to a serve-only
# target, back to back and 1 ms apart; p50, p99, kicks and CPU of each.
# Usage: scripts/device/heart-ab.sh BIN_A BIN_B   (from the repository root, checks at
# ${CHECKS:-../shared/checks})
cd "$(dirname "$0")/../.."
checks=${CHECKS:-../shared/checks}
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
r() { local label=$1; shift; printf "%-40s " "$label"; timeout 60 "$@" --json 2>/dev/null | j p50_us p99_us kicks cpu_pct server_cpu_pct || echo fail; }
for b in "$1" "$2" "$1" "$2"; do
  echo "== heart $(basename "$b")"
  RDMALANE_PERF=$b timeout 300 bash "$checks/heart"
done
for rep in 1 2; do for B in "$1" "$2"; do
  n=$(basename "$B")
  r "$n tcp lat raw" "$B" lat --provider tcp --iters 20000 --engine raw
  r "$n tcp lat thread" "$B" lat --provider tcp --iters 20000 --driver thread
  r "$n tcp lat thread gap 1ms" "$B" lat --provider tcp --iters 1500 --driver thread --gap-us 1000
  r "$n tcp await thread" "$B" lat --provider tcp --iters 20000 --op write-await --driver thread
  r "$n tcp await thread gap 1ms" "$B" lat --provider tcp --iters 1500 --op write-await --driver thread --gap-us 1000
done; done
