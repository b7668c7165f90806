# Shared by the device scripts (sourced):
# `field NAME` prints field NAME of the JSON object on its input's last line, or `nan`;
# `p50 CMD...` runs one rdmalane-perf measurement with `--json` and prints its p50 in µs, or
# `nan` where it failed or ran past 100 s.
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1" 2>/dev/null || echo nan; }
p50() { timeout 100 "$@" --json 2>/dev/null | field p50_us; }
