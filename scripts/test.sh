#!/usr/bin/env bash
# The tests: unit, property and conformance tests on real libfabric providers (tcp;ofi_rxm and
# shm), one process and two; the same conformance suite on verbs (Soft-RoCE in a throw-away VM);
# then the lints the project holds itself to.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --lib --bins --tests --examples -- --test-threads=2
# The criterion benches run once each, as tests (they take no test-harness flags).
cargo test --workspace --benches
cargo test --workspace --doc
# Every example runs on loopback, on both providers, and checks its own results.
for ex in write_remote rpc_echo kv_pages block_store mixed_tenants; do
  for p in tcp shm; do
    timeout 180 cargo run -q -p rdmalane-examples --example "$ex" -- --provider "$p" >/dev/null
  done
done
timeout 180 cargo run -q -p rdmalane-examples --example kv_pages -- --provider tcp --rails 2 >/dev/null
# Members that find each other through etcd while they join, leave and crash: against an etcd
# started here, on a port the system picks, in a temporary folder.
./scripts/with-etcd.sh sh -c 'timeout 300 cargo run -q -p rdmalane-examples --example cluster -- --etcd "$RDMALANE_ETCD"'
# The conformance suite again on verbs: rxe0 inside a qemu VM (this kernel has no RDMA).
./scripts/test-verbs.sh
# The libfabric backend also compiles against libfabric 2.x headers (Debian trixie's).
./scripts/check-libfabric2.sh
# Device memory: the cuda feature builds (no CUDA toolkit needed: the driver loads at run
# time), and with no GPU here a CUDA buffer is a typed error; the staging path's logic ran in
# the suite above on the emulated device. On a GPU: scripts/test-gpu.sh (see the book's GPU
# chapter).
cargo test -p rdmalane-conformance --features cuda --test device_memory -- --test-threads=2
cargo clippy -p rdmalane -p rdmalane-perf -p rdmalane-conformance --all-targets --features rdmalane/cuda,rdmalane-perf/cuda,rdmalane-conformance/cuda -- -D warnings
# Fuzz the decoders a peer's bytes reach (handshake, descriptors, verbs lane addresses): a
# bounded cargo-fuzz run of each target under AddressSanitizer.
./scripts/fuzz.sh
# The drop storms again under valgrind: no use-after-free or invalid access while 10,000 ops
# (1,500 split across two rail groups' reactors) are dropped at random points and the runtime
# shuts down with ops in flight; shm on its checked
# path, then on its fast path (trust_local_peers). valgrind runs one thread at a time, and its
# default lock hands the CPU back to whichever thread asks first, so a spinning reactor can
# starve the others for minutes (one CI run lost a peer's heartbeats for 120 s); --fair-sched
# takes turns (85-120 s and 35-40 s here, against 230 s for the fast path alone without it).
for trust in 0 1; do
  RDMALANE_UNDER_VALGRIND=1 RDMALANE_PEER_TIMEOUT_MS=120000 RDMALANE_TRUST_LOCAL_PEERS=$trust \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind --fair-sched=yes --error-exitcode=99 -q" \
    cargo test -p rdmalane-conformance --test drop_storm --test drop_storm_groups
done
# The reactor moving between its thread and spinning tasks (`driver::lend`), ops dropped
# while tasks hold it, and a stop while threads keep taking it: under valgrind too (70 s here).
RDMALANE_UNDER_VALGRIND=1 RDMALANE_PEER_TIMEOUT_MS=120000 \
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind --fair-sched=yes --error-exitcode=99 -q" \
  cargo test -p rdmalane-conformance --test await_drive
# The book builds.
command -v mdbook >/dev/null 2>&1 || cargo install --locked -q mdbook
mdbook build book
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The latency probe (off by default) still builds, and its hooks count what they should.
cargo clippy -p rdmalane -p rdmalane-efa -p rdmalane-perf --all-targets --features probe -- -D warnings
cargo test -p rdmalane-efa --features probe --lib probe
cargo test -p rdmalane --features probe --lib probe
