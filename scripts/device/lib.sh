# Shared by the device scripts (sourced):
# `field NAME` prints field NAME of the JSON object on its input's last line, or `nan`;
# `figure NAME CMD...` runs one rdmalane-perf measurement with `--json` and prints its field
# NAME, or `nan` where it failed or ran past 100 s; `p50 CMD...` is `figure p50_us CMD...`.
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1" 2>/dev/null || echo nan; }
figure() { local name=$1; shift; timeout 100 "$@" --json 2>/dev/null | field "$name"; }
p50() { figure p50_us "$@"; }
