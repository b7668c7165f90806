#!/usr/bin/env bash
# The conformance suite on verbs: the test binaries are built here, then run inside one
# throw-away Soft-RoCE VM (scripts/softroce-vm.sh) against rxe0, with the same assertions as on
# tcp and shm (RDMALANE_TEST_PROVIDERS=verbs), plus the verbs-only tests. Each binary is bounded;
# a hang is a failure.
#   scripts/test-verbs.sh [TEST ...]    (default: every conformance test, then every example)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
tests=("$@")
examples=""
if [ ${#tests[@]} -eq 0 ]; then
  tests=(one_process two_process batch mr_cache idle faults drop_storm soak verbs hostile)
  # The examples too, unchanged, with --provider verbs.
  examples="write_remote rpc_echo kv_pages block_store mixed_tenants"
  cargo build -q -p rdmalane-examples --examples
fi
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
# The paths of the test binaries, from cargo's own report.
mapfile -t bins < <(cargo test -p rdmalane-conformance "${args[@]}" --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])')
[ ${#bins[@]} -eq ${#tests[@]} ] || { echo "test-verbs: expected ${#tests[@]} test binaries, cargo built ${#bins[@]}" >&2; exit 1; }
# Under TCG the VM is slow (emulated CPUs, and busy-polling reactors compete with the heartbeat
# threads): the soak is shortened and peers get 8 s of silence; timeouts are generous but bounded.
# A real client's connect beside hostile ones is bounded at 1 s natively; under TCG a verbs
# connect alone (QP setup through rxe in an emulated kernel) takes a good part of that. The drop
# storm's four rounds register 40,000 buffers, 3-4 ms each there: 218 s in one run, three rounds in
# 244 s in another, against its native bound of 240 s.
inner='set -u; export RDMALANE_TEST_PROVIDERS=verbs RDMALANE_SOAK_SECS=${RDMALANE_SOAK_SECS:-30}
  export RDMALANE_TEST_CONNECT_BOUND_MS=${RDMALANE_TEST_CONNECT_BOUND_MS:-5000}
  export RDMALANE_PEER_TIMEOUT_MS=${RDMALANE_PEER_TIMEOUT_MS:-8000}
  export RDMALANE_STORM_LIMIT_S=${RDMALANE_STORM_LIMIT_S:-600}; fails=0
for b in "$@"; do
  name=$(basename "$b"); name=${name%-*}
  start=$(date +%s)
  if timeout 900 "$b" --test-threads=1 >"/tmp/$name.log" 2>&1; then r=ok; else r="FAILED (rc $?)"; fails=$((fails+1)); fi
  echo "verbs: $name: $r in $(( $(date +%s) - start )) s: $(grep -E "^test result" "/tmp/$name.log" | tail -1)"
  [ "$r" = ok ] || grep -vE "^ +[0-9]+: |^ +at " "/tmp/$name.log" | tail -40
done
for ex in ${EXAMPLES:-}; do
  start=$(date +%s)
  if timeout 600 "target/debug/examples/$ex" --provider verbs >"/tmp/$ex.log" 2>&1; then r=ok; else r="FAILED (rc $?)"; fails=$((fails+1)); fi
  echo "verbs: example $ex: $r in $(( $(date +%s) - start )) s"
  [ "$r" = ok ] || tail -20 "/tmp/$ex.log"
done
exit $fails'
EXAMPLES="$examples" scripts/softroce-vm.sh -T 3000 -- bash -c "$inner" verbs-suite "${bins[@]}"
