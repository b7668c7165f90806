#!/usr/bin/env bash
# On the device machine (16 cores), prebuilt rdmalane-perf binaries side by side: the single-op
# paths the heart check judges (`lat` raw / inline / thread, and write-await raw / thread) on
# shm and tcp, ROUNDS interleaved rounds (default 3), medians at the end, each binary named by
# its file name. PROVIDERS (default "shm tcp") picks the providers. Runs anywhere; on fewer than
# 4 cores the thread driver spins (and lends its reactor) only with RDMALANE_AWAIT_SPIN_US set.
# Usage: scripts/device/lat-ab.sh BIN [BIN...]
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
out=$(mktemp)
source scripts/device/lib.sh
for rep in $(seq "$rounds"); do
  for p in ${PROVIDERS:-shm tcp}; do
    L=(lat --provider $p --size 16 --iters 30000)
    for P in "$@"; do
      for mode in "raw:--engine raw" "inline:--driver inline" "thread:--driver thread" \
                  "await-raw:--op write-await --engine raw" "await-thread:--op write-await --driver thread"; do
        v=$(p50 "$P" "${L[@]}" ${mode#*:})
        echo "$p $(basename "$P") ${mode%%:*} $v" | tee -a "$out"
      done
    done
  done
done
echo "== medians of p50 (us), and over raw of the same binary and round's median"
python3 - "$out" "$@" <<'PY'
import sys, os, statistics as st, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, b, m, v = line.split()
    if v != "nan": d[(p, b, m)].append(float(v))
for p in os.environ.get("PROVIDERS", "shm tcp").split():
    for b in map(os.path.basename, sys.argv[2:]):
        med = {m: st.median(d[(p, b, m)]) for m in ("raw", "inline", "thread", "await-raw", "await-thread") if d[(p, b, m)]}
        r = lambda a, z: f"{med[a] / med[z]:.2f}" if a in med and z in med else "-"
        print(f"{p} {b:8s} " + " ".join(f"{m}={v:.3f}" for m, v in med.items())
              + f"  inline/raw={r('inline','raw')} thread/raw={r('thread','raw')} await={r('await-thread','await-raw')}")
PY
