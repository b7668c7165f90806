#!/usr/bin/env bash
# On the device machine (16 cores): whether the lending thread's naps cost the thread driver's
# 16 B p99 beside bulk on one Endpoint (the heart check's mixed figure). Per round, on PROVIDER
# (default shm): the raw engine's `lat` alone (its p99 is the check's divisor), then `mixed
# --scheduler fair` with the inline driver, the thread driver as it comes (the lending thread
# naps), and the thread driver with RDMALANE_LEND_NAP=0 (it spins: no wake-ups). Each mixed p99
# over the round's raw alone p99: median, range, and how many rounds read over 1.5.
# Usage: scripts/device/nap-mixed.sh BIN   (ROUNDS, default 3; PROVIDER)
cd "$(dirname "$0")/../.."
B=$(readlink -f "$1"); out=$(mktemp); p=${PROVIDER:-shm}
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1" 2>/dev/null || echo nan; }
mixed99() { # mixed99 DRIVER [VAR=VALUE...]
  local d=$1; shift
  timeout 120 env "$@" "$B" mixed --provider "$p" --scheduler fair --driver "$d" --json 2>/dev/null | field small_mixed_p99_us
}
for rep in $(seq "${ROUNDS:-3}"); do
  alone=$(timeout 100 "$B" lat --provider "$p" --size 16 --iters 20000 --engine raw --json 2>/dev/null | field p99_us)
  echo "inline $alone $(mixed99 inline)"
  echo "thread-nap $alone $(mixed99 thread)"
  echo "thread-spin $alone $(mixed99 thread RDMALANE_LEND_NAP=0)"
done | tee "$out"
python3 - "$out" <<'PY'
import collections, statistics, sys
seen = collections.defaultdict(list)
for line in open(sys.argv[1]):
    what, alone, val = line.split()
    try:
        seen[what].append(float(val) / float(alone))
    except (ValueError, ZeroDivisionError):
        pass
for what, v in sorted(seen.items()):
    v = [x for x in v if x == x]
    if v:
        print(f"{what:12s} p99 beside bulk over raw alone p99: median {statistics.median(v):.2f}, "
              f"range {min(v):.2f}-{max(v):.2f}, over 1.5 in {sum(x > 1.5 for x in v)} of {len(v)}")
PY
