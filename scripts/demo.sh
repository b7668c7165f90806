#!/usr/bin/env bash
# The main job: the write_remote example on the embedded default (libfabric on loopback: tcp,
# then shm), then rdmalane's latency next to the raw transport on both.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace --all-targets
for p in tcp shm; do
  cargo run --release -q --example write_remote -- --provider "$p"
done
for p in tcp shm; do
  for e in runtime raw; do
    target/release/rdmalane-perf lat --provider "$p" --size 16 --iters 20000 --engine "$e"
  done
done
