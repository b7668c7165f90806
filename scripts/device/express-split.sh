#!/usr/bin/env bash
# On the device machine: shm `lat` with the express rail on one side at a time (the server
# started on its own, each side with its own RDMALANE_EXPRESS), both drivers, three rounds.
# Usage: scripts/device/express-split.sh [PERF]     (default .gpu/rdmalane-perf)
cd "$(dirname "$0")/../.."
P=${1:-.gpu/rdmalane-perf}
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]:.2f}" if isinstance(d[k],float) else f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
L=(lat --provider shm --size 16 --iters 50000)
split() { # SERVER_X CLIENT_X DRIVER [ENV...]
  local se=$1 ce=$2 drv=$3 f=/tmp/srv.$$
  shift 3
  env "$@" RDMALANE_EXPRESS=$se timeout 60 $P "${L[@]}" --driver $drv --server --once --listen 127.0.0.1:0 >"$f" 2>/dev/null &
  local pid=$! addr=""
  for _ in $(seq 100); do addr=$(sed -n 's/^LISTENING //p' "$f"); [ -n "$addr" ] && break; sleep 0.05; done
  printf "%-34s " "srv x$se cli x$ce $drv $*"
  env "$@" RDMALANE_EXPRESS=$ce timeout 60 $P "${L[@]}" --driver $drv --connect "$addr" --json 2>/dev/null | j p50_us p99_us p999_us || echo fail
  wait $pid
}
for rep in 1 2 3; do
  for d in inline thread; do
    split 0 0 $d; split 1 1 $d; split 1 0 $d; split 0 1 $d
  done
done
