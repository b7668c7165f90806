#!/usr/bin/env bash
# On the device machine (16 cores): does where a process pair lands set a single run's ratio?
# The single-op runs the heart check judges (16 B `lat` and `lat --op write-await`, the raw
# engine and the thread driver), each process pair left to the OS ("free") and pinned with
# `taskset` to the same two CPUs a side for both engines (each PIN is CLIENT_CPUS/SERVER_CPUS),
# ROUNDS interleaved rounds (default 5); per-round ratios over the same placement's raw run at
# the end (round-ratios.py), then how far the raw engine strays from itself: each raw run over
# the one before it in the same round (the placements run seconds apart). PROVIDERS (default
# "shm tcp").
# Usage: scripts/device/pin-spread.sh BIN [PIN...]   e.g. ... BIN 2,3/10,11 5,6/12,13
cd "$(dirname "$0")/../.."
source scripts/device/lib.sh
bin=$1
shift
pins=("${@:-2,3/10,11}")
out=$(mktemp)
# run PIN ARGS...: one measurement's p50, its two processes placed as PIN says ("free": not).
run() {
  local pin=$1
  shift
  if [ "$pin" = free ]; then
    p50 "$bin" "$@"
    return
  fi
  # A port of its own (each run is a subshell: a counter here would not move).
  local port=$((47100 + RANDOM % 1000)) said
  said=$(mktemp)
  timeout 120 taskset -c "${pin#*/}" "$bin" "$@" --server --once --listen "127.0.0.1:$port" >"$said" 2>&1 &
  local server=$! i
  # The client connects once the server listens (it does not retry a refused connection).
  for i in $(seq 200); do grep -q LISTENING "$said" && break; sleep 0.05; done
  p50 taskset -c "${pin%/*}" "$bin" "$@" --connect "127.0.0.1:$port"
  for i in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.05; done
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  rm -f "$said"
}
for rep in $(seq "${ROUNDS:-5}"); do
  for p in ${PROVIDERS:-shm tcp}; do
    L=(lat --provider "$p" --size 16 --iters 20000)
    for pin in free "${pins[@]}"; do
      for m in "lat raw --engine raw" "lat thread --driver thread" \
               "await raw --op write-await --engine raw" "await thread --op write-await --driver thread"; do
        set -- $m
        v=$(run "$pin" "${L[@]}" "${@:3}")
        echo "$p-$1-$pin $2 $v" | tee -a "$out"
      done
    done
  done
done
python3 scripts/device/round-ratios.py "$out"
echo "== each raw run over the one before it in its round"
python3 - "$out" "$(( ${#pins[@]} + 1 ))" <<'PY'
import collections, math, sys
per_round = int(sys.argv[2])
raw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    group, mode, v = line.split()
    if mode == "raw":
        provider, kind, _ = group.split("-", 2)
        raw[(provider, kind)].append(float(v))
for (provider, kind), v in raw.items():
    r = [b / a for i in range(0, len(v), per_round) for a, b in zip(v[i:i + per_round], v[i + 1:i + per_round])
         if not (math.isnan(a) or math.isnan(b))]
    if r:
        print(f"{provider} {kind}: {min(r):.2f}-{max(r):.2f}, over 1.3 in {sum(x > 1.3 for x in r)} of {len(r)},"
              f" under 1/1.3 in {sum(x < 1 / 1.3 for x in r)}: " + " ".join(f"{x:.2f}" for x in r))
PY
