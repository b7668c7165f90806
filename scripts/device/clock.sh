#!/usr/bin/env bash
# On the device machine: what a clock read costs on this host. The kernel's clocksource (a
# guest whose TSC was marked unstable reads kvm-clock or worse, and without a stable pvclock
# every clock_gettime is a system call), the boot log's clocksource lines, and the mean cost
# of clock_gettime(CLOCK_MONOTONIC) and of rdtsc over a few million reads.
# Usage: scripts/device/clock.sh
cs=/sys/devices/system/clocksource/clocksource0
echo "clocksource $(cat $cs/current_clocksource) (available: $(cat $cs/available_clocksource))"
dmesg 2>/dev/null | grep -iE "clocksource|tsc" | grep -ivE "mask:|refined-jiffies" | head -8
d=$(mktemp -d)
cat > "$d/clk.c" <<'C'
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(void) {
  const int n = 2000000;
  struct timespec t; volatile long sink = 0;
  double a = now();
  for (int i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &t); sink += t.tv_nsec; }
  double b = now();
  for (int i = 0; i < n; i++) sink += __rdtsc();
  double c = now();
  printf("clock_gettime %.1f ns, rdtsc %.1f ns\n", (b - a) / n, (c - b) / n);
  return 0;
}
C
gcc -O2 -o "$d/clk" "$d/clk.c" && "$d/clk"
