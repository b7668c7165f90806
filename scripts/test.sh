#!/usr/bin/env bash
# The tests: unit, property and conformance tests on real libfabric providers (tcp;ofi_rxm and
# shm), one process and two; then the lints the project holds itself to.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --all-targets -- --test-threads=2
cargo test --workspace --doc
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
