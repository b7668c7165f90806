#!/usr/bin/env bash
# Device memory on a real GPU, in two steps, because the GPU machine (the `device` tool's
# nvidia-h200: CUDA at /usr/local/cuda, its own libfabric 1.17 without CUDA, no Rust, no RDMA
# NIC) builds nothing of ours:
#
#   scripts/test-gpu.sh prepare      # here: fetch libfabric 2.1's source (autogen'd), build the
#                                    # cuda-feature test and bench binaries, strip them, into .gpu/
#   scripts/test-gpu.sh run          # there, from the repository root, with .gpu carried: build
#                                    # libfabric 2.1 with CUDA (shm, tcp, rxm), then the tests
#                                    # and benches on device memory twice: the staging path on
#                                    # the machine's libfabric, the FI_HMEM path on 2.1
#
# `run` writes its logs and one JSON line per bench to $OUT (or .gpu/out), and exits non-zero
# when a test fails or the FI_HMEM library offers no FI_HMEM.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-}
case "$step" in
prepare)
  export PATH="$HOME/.cargo/bin:$PATH"
  ./scripts/deps.sh
  mkdir -p .gpu
  [ -f .gpu/libfabric-src.tar.xz ] || {
    ./scripts/fetch-libfabric-src.sh .libfabric-src
    tar -C .libfabric-src --exclude=autom4te.cache --exclude=fabtests --exclude=.github -cJf .gpu/libfabric-src.tar.xz .
  }
  cargo build -q --release -p rdmalane-perf --features cuda
  cargo test -q --profile carry -p rdmalane-conformance --features cuda --test device_memory --no-run
  cp target/release/rdmalane-perf .gpu/rdmalane-perf
  cp "$(ls -t target/carry/deps/device_memory-* | grep -v '\.d$' | head -1)" .gpu/device_memory
  cp target/carry/device_peer .gpu/device_peer
  strip .gpu/rdmalane-perf .gpu/device_memory .gpu/device_peer
  du -sh .gpu/*
  ;;
run)
  out=${OUT:-.gpu/out}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
  # libfabric 2.1 with CUDA, built here in under a minute.
  source scripts/lib/lf2-cuda.sh
  lf2_cuda "$out"
  LD_LIBRARY_PATH=$lf/lib "$lf/bin/fi_info" -p shm -c FI_HMEM | head -3 | tee "$out/fi_info_hmem.txt"
  grep -q "provider: shm" "$out/fi_info_hmem.txt" || { echo "test-gpu: libfabric 2.1 lists no shm with FI_HMEM" >&2; exit 1; }
  fail=0
  bench() { # LABEL ARGS...: one bench, its JSON line kept
    local label=$1
    shift
    if line=$(timeout 120 .gpu/rdmalane-perf "$@" --json 2>>"$out/bench-$label.err" | tail -1); then
      echo "{\"label\":\"$label\",\"args\":\"$*\",\"result\":$line}" | tee -a "$out/bench.jsonl"
    else
      echo "test-gpu: bench $label ($*) failed" | tee -a "$out/bench.jsonl"
    fi
  }
  for lib in staged native; do
    if [ $lib = native ]; then export LD_LIBRARY_PATH=$lf/lib; else unset LD_LIBRARY_PATH; fi
    echo "== $lib: libfabric $(ldd .gpu/rdmalane-perf | awk '/libfabric/{print $3}')" | tee -a "$out/tests.log"
    RDMALANE_GPU=1 RDMALANE_TEST_PROVIDERS=shm,tcp RDMALANE_DEVICE_PEER=.gpu/device_peer \
      timeout 400 .gpu/device_memory --test-threads=1 >>"$out/tests.log" 2>&1 || { fail=1; echo "FAILED: $lib tests" | tee -a "$out/tests.log"; }
    if [ $lib = native ]; then
      # Under Auto, shm's FI_HMEM (whose CUDA IPC path completes before its copies land) is
      # staged: the run above. Forced native, the same suite on the FI_HMEM path itself.
      echo "== $lib, RDMALANE_DEVICE_MEMORY=native (shm's FI_HMEM)" >>"$out/tests.log"
      RDMALANE_DEVICE_MEMORY=native RDMALANE_GPU=1 RDMALANE_TEST_PROVIDERS=shm RDMALANE_DEVICE_PEER=.gpu/device_peer \
        timeout 200 .gpu/device_memory --test-threads=1 >>"$out/tests.log" 2>&1 || { fail=1; echo "FAILED: forced native tests" | tee -a "$out/tests.log"; }
      # The benches measure the FI_HMEM path itself.
      export RDMALANE_DEVICE_MEMORY=native
    else
      unset RDMALANE_DEVICE_MEMORY
    fi
    grep -E "^test |panicked at|^  left|^ right|FAILED|test result|^==|differ" "$out/tests.log" | tail -n 40
    for size in 1048576 67108864; do
      iters=$(( size > 1048576 ? 200 : 2000 ))
      bench "$lib-bw-cuda-$size" bw --provider shm --memory cuda --size "$size" --iters "$iters" --window 8
      [ $lib = native ] && bench "$lib-bw-cuda-raw-$size" bw --provider shm --memory cuda --engine raw --size "$size" --iters "$iters" --window 8
      bench "$lib-bw-host-$size" bw --provider shm --size "$size" --iters "$iters" --window 8
    done
    bench "$lib-pages-cuda-64k" pages --provider shm --memory cuda --page-size 65536 --total 4294967296 --window 16 --imm
    bench "$lib-pages-host-64k" pages --provider shm --page-size 65536 --total 4294967296 --window 16 --imm
    if [ $lib = native ]; then
      # Whole ops (fifo: no splitting) and one reactor (no express rail), beside the default.
      RDMALANE_SCHEDULER=fifo bench "$lib-bw-cuda-fifo-67108864" bw --provider shm --memory cuda --size 67108864 --iters 200 --window 8
      RDMALANE_SCHEDULER=fifo bench "$lib-bw-cuda-fifo-1048576" bw --provider shm --memory cuda --size 1048576 --iters 2000 --window 8
      RDMALANE_EXPRESS=0 bench "$lib-bw-cuda-noexpress-1048576" bw --provider shm --memory cuda --size 1048576 --iters 2000 --window 8
    fi
    [ $lib = native ] && bench "$lib-bw-cuda-raw-65536" bw --provider shm --memory cuda --engine raw --size 65536 --iters 20000 --window 16
    bench "$lib-bw-cuda-65536" bw --provider shm --memory cuda --size 65536 --iters 20000 --window 16
    bench "$lib-bw-host-65536" bw --provider shm --size 65536 --iters 20000 --window 16
  done
  # Everything in one file (the device tool brings back a few files only).
  tar -C "$out" -czf /tmp/gpu-out.tgz --exclude=gpu-out.tgz . && mv /tmp/gpu-out.tgz "$out/gpu-out.tgz"
  exit $fail
  ;;
*)
  echo "usage: scripts/test-gpu.sh prepare|run" >&2
  exit 2
  ;;
esac
