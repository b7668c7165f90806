#!/usr/bin/env bash
# On the device machine: `lat --op write-await` (16 B) with each side's driver and settings set
# apart (the server started on its own), beside the raw engine, interleaved rounds; then each
# case's p50 median over the raw engine's and its range. On tcp it also takes the completion
# queues' wait object off one side at a time (RDMALANE_CQ_WAIT=0), to show where its price lands.
# Usage: scripts/device/await-split.sh [PERF]   (default .gpu/rdmalane-perf; PROVIDER=shm|tcp,
# default shm; ROUNDS, default 3; ITERS, default 50000; OP=send splits the send/recv ping-pong
# instead, default write-await)
cd "$(dirname "$0")/../.."
P=${1:-.gpu/rdmalane-perf}
prov=${PROVIDER:-shm}
L=(lat --provider "$prov" --size 16 --iters "${ITERS:-50000}" --op "${OP:-write-await}")
out=$(mktemp)
p50() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["p50_us"])' 2>/dev/null || echo nan; }
split() { # SERVER_DRIVER CLIENT_DRIVER [SERVER_ENV] [CLIENT_ENV]   ("-": none)
  local sd=$1 cd=$2 se=${3:--} ce=${4:--} f=/tmp/srv.$$
  [ "$se" = - ] && se=X_NONE=1
  [ "$ce" = - ] && ce=X_NONE=1
  env "$se" timeout 60 "$P" "${L[@]}" --driver "$sd" --server --once --listen 127.0.0.1:0 >"$f" 2>/dev/null &
  local pid=$! addr=""
  for _ in $(seq 100); do addr=$(sed -n 's/^LISTENING //p' "$f"); [ -n "$addr" ] && break; sleep 0.05; done
  local tag="srv-$sd${3:+,${3#RDMALANE_}}/cli-$cd${4:+,${4#RDMALANE_}}"
  echo "$prov ${tag//,-/} $(env "$ce" timeout 60 "$P" "${L[@]}" --driver "$cd" --connect "$addr" --json 2>/dev/null | p50)" >>"$out"
  wait $pid
}
for _ in $(seq "${ROUNDS:-3}"); do
  echo "$prov raw $(timeout 60 "$P" "${L[@]}" --engine raw --json 2>/dev/null | p50)" >>"$out"
  split inline inline; split thread thread; split inline thread; split thread inline
  split thread thread RDMALANE_EXPRESS=0 RDMALANE_EXPRESS=0
  split inline thread RDMALANE_AWAIT_DRIVE=0 RDMALANE_AWAIT_DRIVE=0
  if [ "$prov" = tcp ]; then
    split thread thread RDMALANE_CQ_WAIT=0 RDMALANE_CQ_WAIT=0
    split thread thread - RDMALANE_CQ_WAIT=0
    split thread thread RDMALANE_CQ_WAIT=0 -
  fi
done
python3 scripts/device/p50-medians.py "$out"
