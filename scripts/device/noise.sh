#!/usr/bin/env bash
# On the device machine (16 cores): how far one run's ratio strays on this host, which is what
# the heart check judges (one process pair per figure). ROUNDS rounds (default 8) of 16 B `lat`
# p50 on shm and tcp: the raw engine, the thread driver, the raw engine again and the inline
# driver; each round's figure over that round's first raw run, their median, and how many
# rounds a single-run judge at 1.3x would fail. The raw engine's second run is the floor: what
# the spread alone does to a ratio whose true value is 1.
# Usage: scripts/device/noise.sh BIN
cd "$(dirname "$0")/../.."
B=$1; out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "${ROUNDS:-8}"); do for p in shm tcp; do
  L=(lat --provider "$p" --size 16 --iters 20000)
  echo "$p raw $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p thread $(p50 "$B" "${L[@]}" --driver thread)" >>"$out"
  echo "$p raw-again $(p50 "$B" "${L[@]}" --engine raw)" >>"$out"
  echo "$p inline $(p50 "$B" "${L[@]}" --driver inline)" >>"$out"
done; done
python3 - "$out" <<'PY'
import collections, math, statistics as st, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, mode, v = line.split()
    runs[(p, mode)].append(float(v))
for p in dict.fromkeys(p for p, _ in runs):
    raw = runs[(p, "raw")]
    ok = [x for x in raw if not math.isnan(x)]
    if not ok:
        print(f"{p}: every raw engine run failed; no ratios")
        continue
    print(f"{p} raw engine p50 median {st.median(ok):.3f} us, range {min(ok):.3f}-{max(ok):.3f}")
    for mode in ("raw-again", "thread", "inline"):
        r = [a / b for a, b in zip(runs[(p, mode)], raw) if not (math.isnan(a) or math.isnan(b))]
        if r:
            print(f"{p} {mode:9s} over the round's raw run: median {st.median(r):.2f}, "
                  f"range {min(r):.2f}-{max(r):.2f}, over 1.3 in {sum(x > 1.3 for x in r)} of {len(r)}")
PY
