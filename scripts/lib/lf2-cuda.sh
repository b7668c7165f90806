# Sourced on the GPU machine, from the repository root with .gpu carried: libfabric 2.1 built
# with CUDA (shm, tcp, rxm; dlopen'd CUDA) into /tmp/lf2, once per machine, from the source
# `scripts/test-gpu.sh prepare` packed. Sets `lf`; `lf2_cuda [LOGDIR]` keeps configure's and
# make's output there (else drops it).
lf=/tmp/lf2
lf2_cuda() {
  local logs=${1:-}
  [ -x "$lf/bin/fi_info" ] && return 0
  rm -rf /tmp/lf2-src && mkdir -p /tmp/lf2-src
  tar -xf .gpu/libfabric-src.tar.xz -C /tmp/lf2-src
  (cd /tmp/lf2-src && ./configure -q --prefix="$lf" --with-cuda=/usr/local/cuda --enable-cuda-dlopen \
    --enable-shm --enable-tcp --enable-rxm --disable-verbs --disable-efa --disable-psm2 --disable-psm3 \
    --disable-opx --disable-usnic --disable-ucx --disable-lpp --disable-cxi >"${logs:-/tmp}/lf2-configure.log" 2>&1 &&
    make -j"$(nproc)" install >"${logs:-/tmp}/lf2-make.log" 2>&1)
}
