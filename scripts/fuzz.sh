#!/usr/bin/env bash
# Fuzz the decoders a peer's bytes reach (cargo fuzz, libFuzzer with AddressSanitizer): the
# handshake hello and the whole handshake state machine, descriptors, verbs lane addresses,
# control-connection messages. Each target
# runs RDMALANE_FUZZ_SECS (default 30) from the seeds in fuzz/seeds/, with memory and time limits
# per input: a crash, a leak, an input taking over 5 s or an allocation over 64 MiB fails the run.
#   scripts/fuzz.sh [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
secs=${RDMALANE_FUZZ_SECS:-30}
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked -q cargo-fuzz
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(hello handshake descriptor lane_address control)
cd fuzz
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  rc=0
  cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=1024 -malloc_limit_mb=64 -timeout=5 -print_final_stats=1 \
    >"/tmp/fuzz-$t.log" 2>&1 || rc=$?
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)" "/tmp/fuzz-$t.log" || true
  if [ $rc -ne 0 ]; then
    tail -40 "/tmp/fuzz-$t.log" >&2
    echo "fuzz: $t failed (rc $rc); inputs in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  echo "fuzz: $t ran ${secs}s clean"
done
