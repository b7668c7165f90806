#!/usr/bin/env bash
# On the device machine: two prebuilt rdmalane-perf binaries BASE and NEW, interleaved rounds
# (ROUNDS, default 4) of the thread driver's 16 B `lat` and `lat --op write-await` (p50 and p99)
# beside the raw engine's, and its `mixed` p99 beside bulk and alone, over the raw engine's alone
# p99; shm and tcp; medians at the end. Usage: scripts/device/thread-ab.sh BASE NEW
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: $0 BASE NEW"; exit 2; }
declare -A bin=([base]=$1 [new]=$2)
source scripts/device/lib.sh
out=$(mktemp)
# `two A B CMD...`: fields A and B of one measurement's JSON (`nan` where it failed).
two() { local x; x=$(timeout 100 "${@:3}" --json 2>/dev/null); echo "$(field "$1" <<<"$x") $(field "$2" <<<"$x")"; }
for r in $(seq ${ROUNDS:-4}); do
  for p in shm tcp; do
    L="lat --provider $p --size 16 --iters 20000"
    echo "$p raw lat $(two p50_us p99_us "${bin[base]}" $L --engine raw)" >>$out
    echo "$p raw await $(two p50_us p99_us "${bin[base]}" $L --op write-await --engine raw)" >>$out
    for b in base new; do
      echo "$p $b lat $(two p50_us p99_us "${bin[$b]}" $L --driver thread)" >>$out
      echo "$p $b await $(two p50_us p99_us "${bin[$b]}" $L --op write-await --driver thread)" >>$out
      echo "$p $b mixed $(two small_mixed_p99_us small_alone_p99_us "${bin[$b]}" mixed --provider $p --scheduler fair --driver thread)" >>$out
    done
  done
done
python3 - $out <<'PY'
import sys,collections,statistics as st
rows=[l.split() for l in open(sys.argv[1])]
d=collections.defaultdict(list)
for p,b,m,x,y in rows:
    try: d[(p,b,m)].append((float(x),float(y)))
    except: pass
for p in ("shm","tcp"):
    for m in ("lat","await","mixed"):
        rawk=(p,"raw","await" if m=="await" else "lat")
        if not d[rawk]: continue
        r50=st.median(v[0] for v in d[rawk]); r99=st.median(v[1] for v in d[rawk])
        for b in ("base","new"):
            v=d[(p,b,m)]
            if not v: continue
            a=st.median(x[0] for x in v); c=st.median(x[1] for x in v)
            if m=="mixed": print(f"{p} {m:6s} {b:5s} mixed p99 {a:.3f} ({a/r99:.2f}x raw alone p99 {r99:.3f}); alone p99 {c:.3f} ({c/r99:.2f}x) n={len(v)}")
            else: print(f"{p} {m:6s} {b:5s} p50 {a:.3f} ({a/r50:.2f}x raw {r50:.3f})  p99 {c:.3f} ({c/r99:.2f}x raw {r99:.3f}) n={len(v)}")
PY
