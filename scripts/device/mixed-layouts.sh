#!/usr/bin/env bash
# On the device machine, with .gpu carried: lat with the lend counters, mixed by layout
# (.gpu/perf-c6: an earlier build, copied by hand), then the heart check.
cd "$(dirname "$0")/../.."
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
run() { local label=$1; shift; printf "%-30s " "$label"; timeout 120 "$@" --json 2>/dev/null | j p50_us p99_us small_alone_p99_us small_mixed_p99_us bulk_alone_gbps bulk_mixed_gbps task_holds task_asks thread_retakes || echo fail; }
P=.gpu/rdmalane-perf
for rep in 1 2 3; do
  run "raw" $P lat --provider shm --iters 20000 --engine raw
  run "thread" $P lat --provider shm --iters 20000 --driver thread
  run "thread await" $P lat --provider shm --iters 20000 --driver thread --op write-await
done
for rep in 1 2 3; do
  run "mixed thread c6 joined" .gpu/perf-c6 mixed --provider shm --scheduler fair --driver thread
  run "mixed thread joined" $P mixed --provider shm --scheduler fair --driver thread --layout joined
  run "mixed thread tasks" $P mixed --provider shm --scheduler fair --driver thread
done
for rep in 1 2; do
  run "tcp mixed thread tasks" $P mixed --provider tcp --scheduler fair --driver thread
  run "shm mixed inline tasks" $P mixed --provider shm --scheduler fair --driver inline
  run "shm mixed inline joined" $P mixed --provider shm --scheduler fair --driver inline --layout joined
done
echo "== heart"
RDMALANE_PERF=.gpu/rdmalane-perf bash .gpu/checks/heart
