#!/usr/bin/env bash
# On the device machine (16 cores): the heart check's single-op verdicts against their noise
# floor. Runs the check RUNS times (default 3) with the raw engine standing in for the runtime's
# single-op runs (raw-twin.sh: the raw engine judged against itself), each followed by a real
# run of BIN, then counts per single-op figure how often each kind read over 1.3. A figure the
# twin misses as often as the runtime is one the check cannot judge on that host. The mixed
# figures, the runtime's in both kinds of run, are counted over all runs against 1.5.
# CHECKS names the checks' folder (see heart-figures.sh). Each run's whole output is kept in
# OUTDIR (default a temporary folder, named at the end).
# Usage: scripts/device/noise-floor.sh BIN [OUTDIR]
cd "$(dirname "$0")/../.."
bin=$(readlink -f "$1")
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
for i in $(seq "${RUNS:-3}"); do
  RAW_TWIN_BIN=$bin RDMALANE_PERF=scripts/device/raw-twin.sh scripts/device/heart-figures.sh >"$dir/twin-$i" 2>&1
  RDMALANE_PERF=$bin scripts/device/heart-figures.sh >"$dir/real-$i" 2>&1
done
echo "runs in $dir"
python3 - "$dir" <<'PY'
import collections, os, re, sys
d = sys.argv[1]
seen = collections.defaultdict(list)
for f in sorted(os.listdir(d)):
    kind = f.split("-")[0]
    # The line that lists every judged figure once: the verdict's, or heart-figures.sh's own.
    lines = [l for l in open(os.path.join(d, f)) if l.startswith("figures:") or " holds: " in l or "(goals judged" in l]
    for k, v in re.findall(r"\b((?:lat_thread|await)_\w+?_x)=([0-9.]+)", lines[-1] if lines else ""):
        seen[(k, kind)].append(float(v))
    # The mixed figures are the runtime's in either kind of run (the twin stands in for `lat`
    # alone): pooled.
    for k, v in re.findall(r"\b(mixed_\w+?_p99_over_raw)=([0-9.]+)", lines[-1] if lines else ""):
        seen[(k, "both")].append(float(v))
for k in sorted({k for k, _ in seen}):
    for kind, bar in (("twin", 1.3), ("real", 1.3), ("both", 1.5)):
        v = seen.get((k, kind))
        if v:
            print(f"{k:30s} {kind}: over {bar} in {sum(x > bar for x in v)} of {len(v)}: " + " ".join(f"{x:.2f}" for x in v))
PY
