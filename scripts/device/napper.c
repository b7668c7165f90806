// Threads that do nothing but wake: N threads, each parking US microseconds at a time on a
// futex (as a lending thread naps while a task has its reactor), or spinning with a third
// argument. For `neighbours.sh`: what such threads cost a ping-pong on other cores.
// Usage: napper N US [spin]   (runs until killed)
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int us, spin;
static int word;

static void *run(void *arg) {
  (void)arg;
  struct timespec ts = {0, us * 1000L};
  for (;;) {
    if (spin) {
      for (volatile int i = 0; i < 1000; i++) {
      }
      continue;
    }
    syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int n = atoi(argv[1]);
  us = atoi(argv[2]);
  spin = argc > 3;
  pthread_t t;
  for (int i = 0; i < n; i++) pthread_create(&t, NULL, run, NULL);
  pause();
  return 0;
}
