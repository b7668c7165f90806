#!/usr/bin/env bash
# On the device machine (16 cores, a KVM guest): does a core spinning beside a ping-pong slow
# it? The thread driver's lending thread spins while a task turns its reactor, so a thread-driven
# `lat` runs four busy cores where the raw engine and the inline driver run two. Measured here:
# the raw engine alone and beside 2 and 6 pause-spinning threads, then the inline driver and the
# thread driver with its lending thread spinning (RDMALANE_LEND_NAP=0, the default) and napping
# (=1), on shm and tcp, `lat` and write-await, ROUNDS interleaved rounds (default 3), medians.
# Usage: scripts/device/spinners.sh BIN (a prebuilt rdmalane-perf)
cd "$(dirname "$0")/../.."
bin=$1 rounds=${ROUNDS:-3}
spin=$(mktemp -d)/spin
cat > "$spin.c" <<'C'
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static volatile int stop;
static void *f(void *a) { while (!stop) __builtin_ia32_pause(); return a; }
int main(int c, char **v) {
  int n = atoi(v[1]); pthread_t t[64];
  for (int i = 0; i < n && i < 64; i++) pthread_create(&t[i], 0, f, 0);
  sleep(atoi(v[2])); stop = 1;
  for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], 0);
  return 0;
}
C
gcc -O2 -pthread -o "$spin" "$spin.c" || exit 1
out=$(mktemp)
source scripts/device/lib.sh
beside() { # beside N CMD...: CMD's p50 with N spinners running
  local n=$1; shift
  "$spin" "$n" 20 & local sp=$!
  sleep 0.2
  p50 "$@"
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null
}
for rep in $(seq "$rounds"); do
  for p in shm tcp; do
    L=(lat --provider $p --size 16 --iters 30000)
    W=(--op write-await)
    echo "$p raw $(p50 "$bin" "${L[@]}" --engine raw)" | tee -a "$out"
    echo "$p raw+2 $(beside 2 "$bin" "${L[@]}" --engine raw)" | tee -a "$out"
    echo "$p raw+6 $(beside 6 "$bin" "${L[@]}" --engine raw)" | tee -a "$out"
    echo "$p inline $(p50 "$bin" "${L[@]}" --driver inline)" | tee -a "$out"
    echo "$p thread $(RDMALANE_LEND_NAP=0 p50 "$bin" "${L[@]}" --driver thread)" | tee -a "$out"
    echo "$p thread-nap $(RDMALANE_LEND_NAP=1 p50 "$bin" "${L[@]}" --driver thread)" | tee -a "$out"
    echo "$p await-raw $(p50 "$bin" "${L[@]}" "${W[@]}" --engine raw)" | tee -a "$out"
    echo "$p await-thread $(RDMALANE_LEND_NAP=0 p50 "$bin" "${L[@]}" "${W[@]}" --driver thread)" | tee -a "$out"
    echo "$p await-thread-nap $(RDMALANE_LEND_NAP=1 p50 "$bin" "${L[@]}" "${W[@]}" --driver thread)" | tee -a "$out"
  done
done
echo "== medians of p50 (us), and over the raw engine's alone"
python3 scripts/device/p50-medians.py "$out"
