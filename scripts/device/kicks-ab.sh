#!/usr/bin/env bash
# On the device machine (16 cores), two prebuilt rdmalane-perf binaries side by side on shm:
# `lat` (inline, thread, write-await) and `mixed` (both drivers), three interleaved rounds, then
# each binary's threads' CPU while a long ping-pong runs (which reactor spins, which naps).
# Usage: scripts/device/kicks-ab.sh BEFORE AFTER     (the book's "kicks" tables)
cd "$(dirname "$0")/../.."
old=$1 new=$2
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]:.2f}" if isinstance(d[k],float) else f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
run() { local label=$1; shift; printf "%-24s " "$label"; timeout 100 "$@" --json 2>/dev/null | j p50_us p99_us p999_us kicks cpu_pct server_cpu_pct small_alone_p99_us small_mixed_p99_us bulk_alone_gbps bulk_mixed_gbps mixed_cores server_cores bulk_mixed_cpu_s_per_gb || echo fail; }
L=(lat --provider shm --size 16 --iters 50000)
for rep in 1 2 3; do
  for b in before after; do
    P=$new; [ $b = before ] && P=$old
    run "$b raw" $P "${L[@]}" --engine raw
    run "$b inline" $P "${L[@]}" --driver inline
    run "$b thread" $P "${L[@]}" --driver thread
    run "$b await thread" $P "${L[@]}" --op write-await --driver thread
    run "$b mixed thread" $P mixed --provider shm --scheduler fair --driver thread
    run "$b mixed inline" $P mixed --provider shm --scheduler fair --driver inline
  done
done
# CPU ticks (1/100 s) per thread over one second of a 16 B ping-pong.
for b in before after; do
  P=$new; [ $b = before ] && P=$old
  for d in inline thread; do
    echo "== $b, driver $d: ticks per thread in 1 s"
    timeout 60 $P lat --provider shm --size 16 --iters 3000000 --driver $d --json >/dev/null 2>&1 &
    sleep 1.5
    pids=$(pgrep -f "$(basename "$P") lat" | grep -v "^$!$")
    for pid in $pids; do for t in /proc/$pid/task/*; do echo "$pid $(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done; done >/tmp/a.$$
    sleep 1
    for pid in $pids; do for t in /proc/$pid/task/*; do echo "$pid $(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done; done >/tmp/b.$$
    paste /tmp/a.$$ /tmp/b.$$ | awk '{d=$6-$3; if (d>0) print "   pid", $1, $2, d}'
    wait
  done
done
