#!/usr/bin/env bash
# On the device machine (16 cores): how often the heart check holds as it comes and with each
# setting VAR=VALUE in its environment, ROUNDS interleaved rounds (default 3) of
# scripts/device/heart-figures.sh each (about a minute a run). Prints each run's absolute
# figures and verdict, then per case: runs held, and each figure that fell short with how often.
# Usage: RDMALANE_PERF=BIN CHECKS=DIR scripts/device/heart-vars.sh [VAR=VALUE...]
#   e.g. RDMALANE_CQ_WAIT=0
cd "$(dirname "$0")/../.."
[ -n "${RDMALANE_PERF:-}" ] || { echo "set RDMALANE_PERF to a prebuilt rdmalane-perf"; exit 1; }
RDMALANE_PERF=$(readlink -f "$RDMALANE_PERF"); export RDMALANE_PERF
out=$(mktemp)
for rep in $(seq "${ROUNDS:-3}"); do
  for v in default "$@"; do
    echo "=== round $rep: $v"
    set=X_DEFAULT=1
    [ "$v" = default ] || set=$v
    env "$set" timeout 200 bash scripts/device/heart-figures.sh 2>&1 | grep -v '^figures' |
      tee /dev/stderr | sed -n "s/^heart on .* cores \(holds\|falls short\)\(.*\)/$v \1\2/p" >>"$out"
  done
done 2>&1
echo "=== summary"
python3 - "$out" <<'PY'
import collections, re, sys
held, runs, short = collections.Counter(), collections.Counter(), collections.defaultdict(list)
for line in open(sys.argv[1]):
    case, rest = line.split(" ", 1)
    runs[case] += 1
    if rest.startswith("holds"):
        held[case] += 1
    for name, value in re.findall(r"(\w+)=([\d.]+) \(goal", rest):
        short[(case, name)].append(value)
for case in runs:
    misses = ", ".join(f"{n} {len(v)}x ({' '.join(v)})" for (c, n), v in short.items() if c == case)
    print(f"{case}: held {held[case]} of {runs[case]}" + (f"; short: {misses}" if misses else ""))
PY
