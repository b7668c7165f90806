#!/usr/bin/env bash
# On the device machine, with .gpu carried: mixed in every layout and driver, then the heart
# check twice (.gpu/checks: a copy of ../shared/checks that prints figures when it fails).
cd "$(dirname "$0")/../.."
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
run() { local label=$1; shift; printf "%-30s " "$label"; timeout 120 "$@" --json 2>/dev/null | j p50_us p99_us small_alone_p99_us small_mixed_p99_us bulk_alone_gbps bulk_mixed_gbps task_asks thread_retakes cpu_pct server_cpu_pct || echo fail; }
P=.gpu/rdmalane-perf
for p in shm tcp; do for d in inline thread; do for l in tasks joined; do
  run "$p mixed $d $l" $P mixed --provider $p --scheduler fair --driver $d --layout $l
done; done; done
for i in 1 2; do echo "== heart $i"; RDMALANE_PERF=$P bash .gpu/checks/heart; done
