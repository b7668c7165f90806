#!/usr/bin/env bash
# On the device machine: A/A/B of two prebuilt rdmalane-perf binaries. BASE runs twice (as two
# copies, so the two A columns show the spread of one build) beside NEW, in an order rotated
# each round: 16 B `lat --driver thread` and `lat --op write-await --driver thread` on tcp and
# shm, each round with the raw engine's; then p50 and p99 medians over the raw engine's.
# Usage: scripts/device/aab.sh BASE NEW   (ROUNDS, default 9)
cd "$(dirname "$0")/../.."
dir=$(mktemp -d) out=$(mktemp)
cp "$1" "$dir/base" && cp "$1" "$dir/base2" && cp "$2" "$dir/new" || exit 1
row() { # TAG BIN ARGS...: "provider mode p50 p99"
  local tag=$1; shift
  timeout 60 "$@" --json 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["p50_us"], d["p99_us"])' 2>/dev/null |
    sed "s/^/$tag /" || echo "$tag nan nan"
}
bins=(base base2 new)
for rep in $(seq "${ROUNDS:-9}"); do
  k=$((rep % 3)); order=("${bins[@]:$k}" "${bins[@]:0:$k}")
  for p in tcp shm; do
    A=(--provider "$p" --size 16 --iters 20000)
    row "$p await-raw" "$dir/base" lat "${A[@]}" --op write-await --engine raw >>"$out"
    for b in "${order[@]}"; do row "$p await-$b" "$dir/$b" lat "${A[@]}" --op write-await --driver thread >>"$out"; done
    row "$p raw" "$dir/base" lat "${A[@]}" --engine raw >>"$out"
    for b in "${order[@]}"; do row "$p $b" "$dir/$b" lat "${A[@]}" --driver thread >>"$out"; done
  done
done
echo "== p50"; cut -d' ' -f1-3 "$out" >"$out.p50"; python3 scripts/device/p50-medians.py "$out.p50"
echo "== p99"; awk '{print $1, $2, $4}' "$out" >"$out.p99"; python3 scripts/device/p50-medians.py "$out.p99"
