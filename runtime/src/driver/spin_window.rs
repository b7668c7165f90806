//! How long an idle reactor thread spins before it sleeps. A reactor that only serves its
//! peers' one-sided ops sees no completion for them (tcp raises none), so in a steady stream of
//! such ops it still falls asleep at the end of each spin window, and the next op pays the
//! wake-up (tcp, 16 B awaited writes on 16 cores: one write in ~17 took the wake's 10-20 µs).
//! A sleep that traffic ends almost at once says the window was too short for the stream: the
//! window doubles, up to [`MAX_FACTOR`] times the configured one; a sleep that lasts (the
//! stream ended, or ops come seconds apart) puts it back.
use std::time::Duration;

/// The longest window, as a multiple of the configured one.
pub(crate) const MAX_FACTOR: u32 = 8;

/// A sleep ended by traffic sooner than this says the stream goes on.
pub(crate) const STREAK: Duration = Duration::from_micros(25);

/// The idle spin window of one reactor thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpinWindow {
    base: Duration,
    now: Duration,
}

impl SpinWindow {
    /// A window of `base` to start with, and to come back to.
    pub(crate) fn new(base: Duration) -> SpinWindow {
        SpinWindow { base, now: base }
    }

    /// How long to spin idle now.
    pub(crate) fn get(&self) -> Duration {
        self.now
    }

    /// A sleep ended after `slept`; `by_traffic`: the transport's wait object ended it, not
    /// the time.
    pub(crate) fn slept(&mut self, slept: Duration, by_traffic: bool) {
        self.now =
            if by_traffic && slept < STREAK { (self.now * 2).min(self.base * MAX_FACTOR) } else { self.base };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_wakes_each_sleep_at_once_widens_the_window_up_to_its_cap() {
        let base = Duration::from_micros(200);
        let mut w = SpinWindow::new(base);
        let widths: Vec<u128> = (0..5)
            .map(|_| {
                w.slept(Duration::from_micros(12), true);
                w.get().as_micros()
            })
            .collect();
        assert_eq!(widths, vec![400, 800, 1600, 1600, 1600]);
    }

    #[test]
    fn a_sleep_that_lasts_or_runs_out_puts_the_window_back() {
        let base = Duration::from_micros(200);
        let mut w = SpinWindow::new(base);
        w.slept(Duration::from_micros(5), true);
        assert_eq!(w.get(), base * 2);
        w.slept(Duration::from_micros(800), true);
        assert_eq!(w.get(), base, "sporadic traffic: the window it was given");
        w.slept(Duration::from_micros(5), true);
        w.slept(Duration::from_micros(5), false);
        assert_eq!(w.get(), base, "a timed-out nap is no stream");
    }

    #[test]
    fn a_zero_window_stays_zero() {
        let mut w = SpinWindow::new(Duration::ZERO);
        w.slept(Duration::from_micros(1), true);
        assert_eq!(w.get(), Duration::ZERO);
    }
}
