#!/usr/bin/env bash
# On the device machine: shm `lat --op write-await` with each side's driver set apart (the
# server started on its own), beside the raw engine, three rounds.
# Usage: scripts/device/await-split.sh [PERF]     (default .gpu/rdmalane-perf)
cd "$(dirname "$0")/../.."
P=${1:-.gpu/rdmalane-perf}
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]:.2f}" if isinstance(d[k],float) else f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
L=(lat --provider shm --size 16 --iters 50000 --op write-await)
split() { # SERVER_DRIVER CLIENT_DRIVER [ENV...]
  local sd=$1 cd=$2 f=/tmp/srv.$$
  shift 2
  env "$@" timeout 60 $P "${L[@]}" --driver $sd --server --once --listen 127.0.0.1:0 >"$f" 2>/dev/null &
  local pid=$! addr=""
  for _ in $(seq 100); do addr=$(sed -n 's/^LISTENING //p' "$f"); [ -n "$addr" ] && break; sleep 0.05; done
  printf "%-40s " "srv $sd cli $cd $*"
  env "$@" timeout 60 $P "${L[@]}" --driver $cd --connect "$addr" --json 2>/dev/null | j p50_us p99_us || echo fail
  wait $pid
}
for rep in 1 2 3; do
  printf "%-40s " "raw"; timeout 60 $P "${L[@]}" --engine raw --json 2>/dev/null | j p50_us p99_us
  split inline inline; split thread thread; split inline thread; split thread inline
  split thread thread RDMALANE_EXPRESS=0
  split inline thread RDMALANE_AWAIT_DRIVE=0
done
