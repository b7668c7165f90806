#!/usr/bin/env bash
# rdmalane-perf on verbs against perftest on the same rxe device, side by side in ONE Soft-RoCE
# VM boot (scripts/softroce-vm.sh): 16 B latency (ib_write_lat, ib_send_lat; rdmalane lat and the
# raw engine on the verbs transport, write and send ping-pongs), bandwidth at 64 KiB and 1 MiB (ib_write_bw; rdmalane bw
# and raw, 128 writes in flight like perftest's default tx depth), and mixed traffic fifo vs fair. Medians of RUNS (default 3) interleaved runs.
#   scripts/bench-verbs.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p rdmalane-perf
runs=${1:-3}
inner='set -u
perf=target/release/rdmalane-perf
field() { python3 -c "import json,sys; print(json.loads([l for l in sys.stdin.read().splitlines() if l.strip()][-1])[\"$1\"])"; }
# FIELD of the JSON a command prints, parsed once it has exited: a python started beside it
# would take one of the two vCPUs while it runs (a quarter of rxe bandwidth under TCG).
j() { local f=$1 o; shift; o=$(timeout 120 "$@" --json 2>/dev/null); echo "$o" | field "$f"; }
pt() { # perftest binary, extra args -> the figure on the size line (lat: t_typical, bw: BW average)
  local bin=$1; shift
  timeout 120 $bin -d rxe0 -x 1 "$@" >/dev/null 2>&1 & sleep 2
  local out=""
  for try in 1 2 3; do
    out=$(timeout 120 $bin -d rxe0 -x 1 "$@" 127.0.0.1 2>/dev/null) && break; sleep 1
  done
  wait
  case $bin in *lat) echo "$out" | awk "/^ *[0-9]+ +[0-9]+ /{print \$5; exit}" ;; *) echo "$out" | awk "/^ *[0-9]+ +[0-9]+ /{print \$4; exit}" ;; esac
}
for i in $(seq '"$runs"'); do
  echo "ib_write_lat $(pt ib_write_lat -s 16 -n 2000)"
  echo "ib_send_lat $(pt ib_send_lat -s 16 -n 2000)"
  echo "rt_lat $(j p50_us $perf lat --provider verbs --size 16 --iters 2000)"
  echo "rt_lat_send $(j p50_us $perf lat --provider verbs --op send --size 16 --iters 2000)"
  echo "raw_lat $(j p50_us $perf lat --provider verbs --engine raw --op write --size 16 --iters 2000)"
  echo "raw_lat_send $(j p50_us $perf lat --provider verbs --engine raw --op send --size 16 --iters 2000)"
  for s in 65536 1048576; do
    n=$(( s == 65536 ? 2000 : 200 ))
    echo "ib_write_bw_$s $(pt ib_write_bw -s $s -n $n --report_gbits)"
    echo "rt_bw_$s $(j gbps $perf bw --provider verbs --window 128 --size $s --iters $n)"
    echo "raw_bw_$s $(j gbps $perf bw --provider verbs --window 128 --engine raw --size $s --iters $n)"
  done
done
for m in fifo fair; do
  echo "mixed_$m $(timeout 600 $perf mixed --provider verbs --scheduler $m --iters 300 --json 2>/dev/null | tail -1)"
done'
out=$(scripts/softroce-vm.sh -T 2400 -- bash -c "$inner")
echo "$out" > target/bench-verbs.raw
python3 - "$out" <<'PY'
import json, statistics, sys
vals, mixed = {}, {}
for line in sys.argv[1].splitlines():
    k, _, v = line.partition(" ")
    if k.startswith("mixed_"):
        try: mixed[k[6:]] = json.loads(v)
        except ValueError: pass
        continue
    try: vals.setdefault(k, []).append(float(v))
    except ValueError: pass
med = {k: statistics.median(v) for k, v in vals.items() if v}
g = lambda k: med.get(k, float("nan"))
print("| 16 B latency (µs, p50 / t_typical) | value | ratio to ib_write_lat | ratio to ib_send_lat |")
print("|---|---|---|---|")
for k, name in [("ib_write_lat", "perftest ib_write_lat"), ("ib_send_lat", "perftest ib_send_lat"), ("raw_lat", "raw engine on rdmalane-verbs, write ping-pong"), ("rt_lat", "rdmalane lat (write ping-pong, the default on verbs)"), ("raw_lat_send", "raw engine on rdmalane-verbs, send/recv"), ("rt_lat_send", "rdmalane lat --op send")]:
    print(f"| {name} | {g(k):.2f} | {g(k)/g('ib_write_lat'):.2f} | {g(k)/g('ib_send_lat'):.2f} |")
print()
print("| bandwidth (Gb/s) | ib_write_bw | raw engine | rdmalane | rdmalane / ib_write_bw |")
print("|---|---|---|---|---|")
for s in ("65536", "1048576"):
    print(f"| {int(s)//1024} KiB | {g('ib_write_bw_'+s):.3f} | {g('raw_bw_'+s):.3f} | {g('rt_bw_'+s):.3f} | {g('rt_bw_'+s)/g('ib_write_bw_'+s):.2f} |")
print()
print("| mixed on rxe | small p99 alone (µs) | small p99 mixed (µs) | x | bulk alone (Gb/s) | bulk mixed (Gb/s) | kept |")
print("|---|---|---|---|---|---|---|")
for m, j in mixed.items():
    a, b = j["small_alone_p99_us"], j["small_mixed_p99_us"]
    ba, bm = j["bulk_alone_gbps"], j["bulk_mixed_gbps"]
    print(f"| {m} | {a:.1f} | {b:.1f} | {b/a:.1f} | {ba:.3f} | {bm:.3f} | {bm/ba:.2f} |")
print(f"\n(medians of {len(vals.get('rt_lat', []))} interleaved runs in one VM boot; raw lines in target/bench-verbs.raw)")
print("(the raw engine's bandwidth starts its clock after posting its first window: with 128 in flight and few iterations it reads high)")
PY
