#!/usr/bin/env bash
# On the device machine: two prebuilt rdmalane-perf binaries BASE and NEW, interleaved rounds
# (ROUNDS, default 4) of the thread driver's 16 B `lat` and `lat --op write-await` (p50 and p99)
# beside the raw engine's, and its `mixed` p99 beside bulk and alone, over the raw engine's alone
# p99; shm and tcp; medians at the end. Usage: scripts/device/thread-ab.sh BASE NEW
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: $0 BASE NEW"; exit 2; }
declare -A bin=([base]=$1 [new]=$2)
out=$(mktemp)
j() { timeout 100 "$@" --json 2>/dev/null | tail -1; }
f() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(*[d.get(k,"nan") for k in sys.argv[2:]])' "$1" "${@:2}" 2>/dev/null || echo nan nan; }
for r in $(seq ${ROUNDS:-4}); do
  for p in shm tcp; do
    L="lat --provider $p --size 16 --iters 20000"
    echo "$p raw lat $(f "$(j "${bin[base]}" $L --engine raw)" p50_us p99_us)" >>$out
    echo "$p raw await $(f "$(j "${bin[base]}" $L --op write-await --engine raw)" p50_us p99_us)" >>$out
    for b in base new; do
      echo "$p $b lat $(f "$(j "${bin[$b]}" $L --driver thread)" p50_us p99_us)" >>$out
      echo "$p $b await $(f "$(j "${bin[$b]}" $L --op write-await --driver thread)" p50_us p99_us)" >>$out
      echo "$p $b mixed $(f "$(j "${bin[$b]}" mixed --provider $p --scheduler fair --driver thread)" small_mixed_p99_us small_alone_p99_us)" >>$out
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
