#!/usr/bin/env bash
# On the device machine (16 cores): when the slow round trips of a 16 B shm `lat` come. ROUNDS
# interleaved rounds (default 3) of the raw engine, the inline and the thread driver (each also
# with RDMALANE_EXPRESS=0), every sample kept (RDMALANE_PERF_SAMPLES) under OUT/samples, then
# scripts/slow-samples.py over them. The device tool brings back a few files only: tar OUT.
# Usage: scripts/device/tails.sh BIN OUT
cd "$(dirname "$0")/../.."
B=$1 out=$2
for r in $(seq "${ROUNDS:-3}"); do
  for m in "raw:--engine raw" "inline:--driver inline" "thread:--driver thread" \
           "inline-noexp:--driver inline" "thread-noexp:--driver thread"; do
    d=$out/samples/$r-${m%%:*}; mkdir -p "$d"
    env=(); [[ $m == *noexp* ]] && env=(RDMALANE_EXPRESS=0)
    env "${env[@]}" RDMALANE_PERF_SAMPLES="$d" timeout 60 "$B" lat --provider shm --size 16 \
      --iters 20000 ${m#*:} --json 2>/dev/null | tail -1 >"$d/out.json"
  done
done
python3 scripts/slow-samples.py "$out"/samples/*
