#!/usr/bin/env bash
# The heart check with its absolute figures printed too: ../shared/checks/heart, copied and
# patched to print, per provider, the raw engine's p50 and p99, each driver's mixed p99, the
# thread-driven `lat` p50 and both engines' awaited-write p50 (lines starting `abs`), and every
# judged figure even where the check falls short. Its verdict and exit status are the check's.
# CHECKS names the checks' folder (default ../shared/checks; on the device machine, carry a
# copy of it). Usage: RDMALANE_PERF=BIN scripts/device/heart-figures.sh
cd "$(dirname "$0")/../.."
src=${CHECKS:-../shared/checks}
[ -f "$src/heart" ] || { echo "no heart check under $src (set CHECKS)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$src/heart" "$src/lib.sh" "$dir/"
python3 - "$dir/heart" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
edits = [
    ('echo "heart on $cores cores falls short: ${fails[*]}"',
     'echo "heart on $cores cores falls short: ${fails[*]}"; echo "figures: ${figs[*]}"'),
    ('  for d in inline thread; do', '  echo "abs $p raw p50=$raw p99=$raw99"\n  for d in inline thread; do'),
    ('  if [ -n "$raw" ] && [ -n "$thr" ]', '  echo "abs $p lat thread p50=$thr"\n  if [ -n "$raw" ] && [ -n "$thr" ]'),
    ('  if [ -n "$rawa" ] && [ -n "$ours" ]', '  echo "abs $p await raw=$rawa ours=$ours"\n  if [ -n "$rawa" ] && [ -n "$ours" ]'),
    ('    judge "mixed_${p}_${d}_p99_over_raw"',
     '    echo "abs $p mixed $d p99=$(echo "$m" | jfield small_mixed_p99_us)"\n    judge "mixed_${p}_${d}_p99_over_raw"'),
]
for old, new in edits:
    if old not in s:
        sys.exit(f"the heart check changed; cannot patch: {old!r}")
    s = s.replace(old, new)
open(p, "w").write(s)
PY
bash "$dir/heart"
