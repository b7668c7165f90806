//! A clock cheap enough to read around every round trip, read as perftest reads it: the CPU's
//! time-stamp counter, calibrated once against the OS clock. Where the OS clock is expensive (a
//! VM whose kernel has no usable TSC clocksource reads HPET through a syscall: about 5 µs a read
//! under qemu's TCG) each `Instant::now()` would add that much to every latency sample.
use std::time::{Duration, Instant};

/// The time-stamp counter and its rate.
#[derive(Debug, Clone, Copy)]
pub struct Cycles {
    per_ns: f64,
}

impl Cycles {
    /// Calibrate the counter against the OS clock over `over` (busy-waiting).
    pub fn calibrate(over: Duration) -> Cycles {
        let (i0, t0) = (Instant::now(), ticks());
        while i0.elapsed() < over {
            std::hint::spin_loop();
        }
        let (ns, t) = (i0.elapsed().as_nanos() as f64, ticks().wrapping_sub(t0) as f64);
        Cycles { per_ns: if ns > 0.0 { t / ns } else { 0.0 } }
    }

    /// The counter now.
    pub fn now(&self) -> u64 {
        ticks()
    }

    /// How many ticks of the counter `d` lasts (0 where the counter could not be calibrated).
    pub fn ticks_in(&self, d: Duration) -> u64 {
        (d.as_nanos() as f64 * self.per_ns).ceil() as u64
    }

    /// `ticks` of the counter in nanoseconds.
    pub fn ns(&self, ticks: f64) -> f64 {
        if self.per_ns > 0.0 {
            ticks / self.per_ns
        } else {
            0.0
        }
    }

    /// Nanoseconds since `start` (a value of [`now`](Self::now)); `None` when the counter went
    /// back (the thread moved to a CPU whose counter is behind) or does not run.
    pub fn since(&self, start: u64) -> Option<u64> {
        let d = ticks().checked_sub(start)?;
        (self.per_ns > 0.0).then(|| (d as f64 / self.per_ns) as u64)
    }
}

/// The counter now (as [`Cycles::now`], for code that keeps no calibrated clock).
#[cfg(target_arch = "x86_64")]
pub fn ticks() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter; it has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The counter now: elsewhere, nanoseconds since the first read.
#[cfg(not(target_arch = "x86_64"))]
pub fn ticks() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
