#!/usr/bin/env bash
# On the device machine (16 cores): the floor of the heart check's mixed figure (16 B p99 beside
# 8x1 MiB bulk over the raw engine's alone p99) on this host. Per round and provider: the raw
# engine's `lat` alone, then again while a raw `bw` stream of 1 MiB writes, 8 in flight, runs in
# a process pair of its own (no runtime, no shared reactor: what the host's memory and cores do
# to a ping beside bulk), then the runtime's `mixed --scheduler fair` with each driver. Every
# p99 over the round's raw alone p99: median, range, and how many rounds read over 1.5.
# Usage: scripts/device/mixed-floor.sh BIN   (ROUNDS, default 3)
cd "$(dirname "$0")/../.."
B=$(readlink -f "$1"); out=$(mktemp)
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1" 2>/dev/null || echo nan; }
lat99() { timeout 100 "$B" lat --provider "$1" --size 16 --iters "$2" --engine raw --json 2>/dev/null | field p99_us; }
for rep in $(seq "${ROUNDS:-3}"); do for p in shm tcp; do
  # shm pings 20x faster than tcp: as many pings as keep each run about as long as the stream.
  n=$([ "$p" = shm ] && echo 200000 || echo 20000)
  alone=$(lat99 $p $n)
  timeout 100 "$B" bw --provider $p --engine raw --size 1048576 --window 8 --iters 30000 --json >"$out.bw" 2>&1 &
  bw=$!
  sleep 1
  beside=$(lat99 $p $n)
  kill $bw 2>/dev/null; wait $bw 2>/dev/null
  echo "$p raw_beside_raw_bulk $alone $beside"
  for d in inline thread; do
    m=$(timeout 120 "$B" mixed --provider $p --scheduler fair --driver $d --json 2>/dev/null | field small_mixed_p99_us)
    echo "$p mixed_$d $alone $m"
  done
done; done | tee "$out"
python3 - "$out" <<'PY'
import collections, statistics, sys
seen = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, what, alone, val = line.split()
    try:
        seen[(p, what)].append(float(val) / float(alone))
    except (ValueError, ZeroDivisionError):
        pass
for (p, what), v in sorted(seen.items()):
    v = [x for x in v if x == x]
    if v:
        print(f"{p} {what:20s} p99 over raw alone: median {statistics.median(v):.2f}, range "
              f"{min(v):.2f}-{max(v):.2f}, over 1.5 in {sum(x > 1.5 for x in v)} of {len(v)}")
PY
