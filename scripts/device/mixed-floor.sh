#!/usr/bin/env bash
# On the device machine (16 cores): the floor of the heart check's mixed figure (16 B p99 beside
# 8x1 MiB bulk over the raw engine's alone p99) on this host. Per round and provider: the raw
# engine's `lat` alone, then again while a raw `bw` stream of 1 MiB writes, 8 in flight, runs in
# a process pair of its own (no runtime, no shared reactor: what the host's memory and cores do
# to a ping beside bulk), then the runtime's `mixed --scheduler fair` with each driver. Every
# p99 over the round's raw alone p99 (round-ratios.py): median, range, rounds over 1.5.
# Usage: scripts/device/mixed-floor.sh BIN   (ROUNDS, default 3)
cd "$(dirname "$0")/../.."
source scripts/device/lib.sh
B=$(readlink -f "$1"); out=$(mktemp)
lat99() { figure p99_us "$B" lat --provider "$1" --size 16 --iters "$2" --engine raw; }
for rep in $(seq "${ROUNDS:-3}"); do for p in shm tcp; do
  # shm pings 20x faster than tcp: as many pings as keep each run about as long as the stream.
  n=$([ "$p" = shm ] && echo 200000 || echo 20000)
  echo "$p raw $(lat99 $p $n)"
  timeout 100 "$B" bw --provider $p --engine raw --size 1048576 --window 8 --iters 30000 --json >"$out.bw" 2>&1 &
  bw=$!
  sleep 1
  echo "$p raw-beside-bulk $(lat99 $p $n)"
  kill $bw 2>/dev/null; wait $bw 2>/dev/null
  for d in inline thread; do
    echo "$p mixed-$d $(timeout 120 "$B" mixed --provider $p --scheduler fair --driver $d --json 2>/dev/null | field small_mixed_p99_us)"
  done
done; done | tee "$out"
python3 scripts/device/round-ratios.py "$out" p99 1.5
