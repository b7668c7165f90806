# Shared by the device scripts (sourced): `p50 CMD...` runs one rdmalane-perf measurement with
# `--json` and prints its p50 in µs, or `nan` where it failed or ran past 100 s.
p50() { timeout 100 "$@" --json 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["p50_us"])' 2>/dev/null || echo nan; }
