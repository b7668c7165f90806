#!/usr/bin/env bash
# On the GPU machine, with .gpu carried (scripts/test-gpu.sh prepare): the FI_HMEM path at 64 KiB
# (libfabric 2.1 with CUDA, shm, forced native), five interleaved rounds of raw `bw`, `pages`
# (default layout, express rail off, thread driver) and `bw`: the rounds the GPU chapter's
# medians come from (single runs at 64 KiB swing more than the gap they measure).
cd "$(dirname "$0")/../.."
source scripts/lib/lf2-cuda.sh
lf2_cuda
export LD_LIBRARY_PATH=$lf/lib RDMALANE_DEVICE_MEMORY=native
P=.gpu/rdmalane-perf
g() { timeout 100 $P "$@" --json 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["gbps"])' || echo 0; }
T=4294967296
B=(bw --provider shm --memory cuda --size 65536 --iters 40000 --window 16)
PG=(pages --provider shm --memory cuda --page-size 65536 --total $T --window 16 --imm)
for rep in 1 2 3 4 5; do
  echo "rep=$rep raw=$(g "${B[@]}" --engine raw) pages=$(g "${PG[@]}") pages_x0=$(RDMALANE_EXPRESS=0 g "${PG[@]}") bw=$(g "${B[@]}") pages_thread=$(g "${PG[@]}" --driver thread)"
done | tee "${OUT:-/tmp}/gpu-median.txt"
