#!/usr/bin/env bash
# Installs what building and testing rdmalane needs on Debian 12 (as root): libfabric headers and
# tools (fi_info, fi_pingpong), rdma-core and perftest (the verbs backend and its baseline; the
# Soft-RoCE VM installs qemu itself), libclang for bindgen, pkg-config, valgrind, protoc (the
# etcd client's gRPC code is generated at build time), etcd (the membership tests start their
# own); and a Rust toolchain if none.
set -euo pipefail
pkgs=(libfabric-dev libfabric-bin libibverbs-dev librdmacm-dev ibverbs-providers rdma-core perftest
  clang libclang-dev pkg-config ca-certificates curl valgrind protobuf-compiler etcd-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt
fi
