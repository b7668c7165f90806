//! How long an idle reactor thread spins before it sleeps. A reactor that only serves its
//! peers' one-sided ops sees no completion for them (tcp raises none), so in a steady stream of
//! such ops it still falls asleep at the end of a spin window now and then, and the next op
//! pays the wake-up (tcp, 16 B awaited writes on 16 cores: 380-520 sleeps a second, one write
//! in 150-200).
//! A sleep that peers' traffic ends almost at once says the window was too short for the
//! stream: the window doubles, up to [`MAX_FACTOR`] times the configured one. It goes back to
//! the configured one after a sleep that lasts (the stream ended), and when work comes after
//! an idle spell longer than the configured window: traffic that raises completions in such
//! gaps (sporadic pings 1 ms apart) would keep a widened window spinning for good, a core
//! burnt where the configured window sleeps (98% of a core against 33% for such pings).
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
    /// The idle spell under way has outlasted the configured window.
    long: bool,
}

impl SpinWindow {
    /// A window of `base` to start with, and to come back to.
    pub(crate) fn new(base: Duration) -> SpinWindow {
        SpinWindow { base, now: base, long: false }
    }

    /// How long to spin idle now.
    #[cfg(test)]
    pub(crate) fn get(&self) -> Duration {
        self.now
    }

    /// An idle spell begins.
    pub(crate) fn begin(&mut self) {
        self.long = false;
    }

    /// Idle for `elapsed` so far: spin on?
    pub(crate) fn spin_on(&mut self, elapsed: Duration) -> bool {
        self.long |= elapsed >= self.base;
        elapsed < self.now
    }

    /// Work came (a completion, an op of our own) after an idle spell.
    pub(crate) fn work(&mut self) {
        if std::mem::take(&mut self.long) {
            self.now = self.base;
        }
    }

    /// A sleep ended after `slept`; `by_peers`: the transport's wait object ended it (peers'
    /// traffic), not the time or a local submitter.
    pub(crate) fn slept(&mut self, slept: Duration, by_peers: bool) {
        self.long = false;
        self.now =
            if by_peers && slept < STREAK { (self.now * 2).min(self.base * MAX_FACTOR) } else { self.base };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(200);

    #[test]
    fn a_stream_that_wakes_each_sleep_at_once_widens_the_window_up_to_its_cap() {
        let mut w = SpinWindow::new(BASE);
        let widths: Vec<u128> = (0..5)
            .map(|_| {
                // A serve-only stream: no completion, so no work, only sleeps that end at once.
                w.begin();
                assert!(!w.spin_on(w.get()));
                w.slept(Duration::from_micros(12), true);
                w.get().as_micros()
            })
            .collect();
        assert_eq!(widths, vec![400, 800, 1600, 1600, 1600]);
    }

    #[test]
    fn a_sleep_that_lasts_or_runs_out_puts_the_window_back() {
        let mut w = SpinWindow::new(BASE);
        w.slept(Duration::from_micros(5), true);
        assert_eq!(w.get(), BASE * 2);
        w.slept(Duration::from_micros(800), true);
        assert_eq!(w.get(), BASE, "sporadic traffic: the window it was given");
        w.slept(Duration::from_micros(5), true);
        w.slept(Duration::from_micros(5), false);
        assert_eq!(w.get(), BASE, "a timed-out nap, or a local submitter's wake, is no stream");
    }

    #[test]
    fn work_after_a_spell_longer_than_the_set_window_puts_it_back() {
        let mut w = SpinWindow::new(BASE);
        w.slept(Duration::from_micros(5), true);
        w.slept(Duration::from_micros(5), true);
        assert_eq!(w.get(), BASE * 4);
        // Work within the set window keeps the width (a busy stretch between idle spells).
        w.begin();
        assert!(w.spin_on(Duration::from_micros(150)));
        w.work();
        assert_eq!(w.get(), BASE * 4);
        // Pings 700 µs apart: the widened window spins through the gap, and the ping's work
        // after it says the set window would have slept.
        w.begin();
        assert!(w.spin_on(Duration::from_micros(700)));
        w.work();
        assert_eq!(w.get(), BASE);
        w.begin();
        assert!(!w.spin_on(Duration::from_micros(700)), "back to sleeping through such gaps");
    }

    #[test]
    fn a_zero_window_stays_zero() {
        let mut w = SpinWindow::new(Duration::ZERO);
        w.slept(Duration::from_micros(1), true);
        assert_eq!(w.get(), Duration::ZERO);
        assert!(!w.spin_on(Duration::ZERO));
    }
}
