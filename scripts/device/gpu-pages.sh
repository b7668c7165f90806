#!/usr/bin/env bash
# On the GPU machine, with .gpu carried (scripts/test-gpu.sh prepare): `pages` on device memory
# in a few shapes, beside the raw engine's 64 KiB writes, on both paths: the staging path on the
# machine's libfabric, the FI_HMEM path on libfabric 2.1 built with CUDA (as test-gpu.sh builds it).
cd "$(dirname "$0")/../.."
source scripts/lib/lf2-cuda.sh
lf2_cuda
j() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(f"{k}={d[k]:.1f}" if isinstance(d[k],float) else f"{k}={d[k]}" for k in sys.argv[1:] if k in d))' "$@"; }
run() { local label=$1; shift; printf "%-34s " "$label"; timeout 120 .gpu/rdmalane-perf "$@" --json 2>/dev/null | j gbps path cpu_pct server_cpu_pct || echo fail; }
T=4294967296
for lib in native staged; do
  if [ $lib = native ]; then export LD_LIBRARY_PATH=$lf/lib RDMALANE_DEVICE_MEMORY=native; else unset LD_LIBRARY_PATH RDMALANE_DEVICE_MEMORY; fi
  echo "== $lib"
  for rep in 1 2; do
    run "raw bw 64k w16" bw --provider shm --memory cuda --engine raw --size 65536 --iters 20000 --window 16
    run "raw bw 64k w128" bw --provider shm --memory cuda --engine raw --size 65536 --iters 20000 --window 128
    run "bw 64k w16" bw --provider shm --memory cuda --size 65536 --iters 20000 --window 16
    run "bw 64k w16 thread" bw --provider shm --memory cuda --size 65536 --iters 20000 --window 16 --driver thread
    run "pages default" pages --provider shm --memory cuda --page-size 65536 --total $T --window 16 --imm
    run "pages thread" pages --provider shm --memory cuda --page-size 65536 --total $T --window 16 --imm --driver thread
    run "pages w2" pages --provider shm --memory cuda --page-size 65536 --total $T --window 2 --imm
    run "pages pool64M" pages --provider shm --memory cuda --page-size 65536 --total $T --window 16 --imm --pool-bytes 67108864
    run "pages pool64M w2" pages --provider shm --memory cuda --page-size 65536 --total $T --window 2 --imm --pool-bytes 67108864
    run "pages noimm" pages --provider shm --memory cuda --page-size 65536 --total $T --window 16
    RDMALANE_EXPRESS=0 run "pages express=0" pages --provider shm --memory cuda --page-size 65536 --total $T --window 16 --imm
    run "pages host" pages --provider shm --page-size 65536 --total $T --window 16 --imm
  done
done
