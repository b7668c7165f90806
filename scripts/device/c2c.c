// On the device machine: how long a cache line takes to cross between two CPUs, for pairs of
// this VM's vCPUs (rows from every fifth CPU to each other one), twice over. Two threads pinned
// to the pair bounce one flag; the figure is half a round trip, in ns. What it shows there:
// most pairs read 60-125 ns, a few 33-46 ns (likely hyperthreads of one host core, which the
// guest does not see), and which pairs those are changes between the two passes.
// Usage: gcc -O2 -pthread -o /tmp/c2c scripts/device/c2c.c && /tmp/c2c $(nproc)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(128) atomic_int flag;
enum { ROUNDS = 200000 };

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
    pin(*(int *)arg);
    for (int i = 0; i < ROUNDS; i++) {
        while (atomic_load_explicit(&flag, memory_order_acquire) != 1) {
        }
        atomic_store_explicit(&flag, 0, memory_order_release);
    }
    return 0;
}

static double one_way_ns(int a, int b) {
    pthread_t t;
    atomic_store(&flag, 0);
    pthread_create(&t, 0, pong, &b);
    pin(a);
    struct timespec s, e;
    clock_gettime(CLOCK_MONOTONIC, &s);
    for (int i = 0; i < ROUNDS; i++) {
        atomic_store_explicit(&flag, 1, memory_order_release);
        while (atomic_load_explicit(&flag, memory_order_acquire) != 0) {
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &e);
    pthread_join(t, 0);
    return ((e.tv_sec - s.tv_sec) * 1e9 + (e.tv_nsec - s.tv_nsec)) / ROUNDS / 2;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    for (int pass = 0; pass < 2; pass++) {
        for (int a = 0; a < n; a += 5) {
            printf("from %2d:", a);
            for (int b = 0; b < n; b++) {
                if (a == b)
                    printf("    -");
                else
                    printf(" %4.0f", one_way_ns(a, b));
            }
            printf("\n");
        }
    }
    return 0;
}
