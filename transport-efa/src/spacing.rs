//! Spacing between completion-queue reads that find nothing. On shm a read takes the
//! endpoint's region lock, and a peer's send takes that same lock to post into the region: a
//! reader polling back to back keeps pulling the lock's cache line away from the sender, so
//! both the sender's post and the reader's own read of the message slow down. Leaving a little
//! time after an empty read (a poll within it returns at once, without calling the provider)
//! cut a 16 B shm ping-pong's one-way latency on the project's test host by about 10%, on the
//! raw engine as on the runtime (the book's "Spacing empty reads"); on tcp it helped a little.
//! Elsewhere (efa: the NIC writes the completions, and no peer takes our locks) it is off
//! unless asked for.
use std::sync::OnceLock;
use std::time::Duration;

use rdmalane_wake::{ticks, Cycles};

/// The spacing where it is on by default (shm, tcp): the middle of the range that helped
/// (50 to 100 ns; at 125 ns the wait began to show).
pub const DEFAULT: Duration = Duration::from_nanos(80);

/// The longest spacing taken: a longer one is cut to this (reads seconds apart would stall
/// drains and heartbeats).
pub const MAX: Duration = Duration::from_millis(1);

/// How much further reads are spaced while the reactor only serves its peers (see
/// `Transport::serving`): a shm target reading every 80 ns slowed the 16 B writes into it
/// (awaited, 16 cores) by 0.2-0.35 µs against reads 250 or 600 ns apart; the reader's own
/// round trips lost a little at 250 and more at 600, so three times the spacing.
pub const SERVING_FACTOR: u32 = 3;

/// The spacing a provider gets when none is asked for.
pub fn default_for(provider: &str) -> Duration {
    if provider == "shm" || provider.starts_with("tcp") {
        DEFAULT
    } else {
        Duration::ZERO
    }
}

/// When the last empty read began, and how long to leave after it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spacing {
    /// In counter ticks, as now (the base, or the serving spacing); 0: off.
    ticks: u64,
    /// The base spacing in ticks.
    base: u64,
    /// The counter when the last read that found nothing began (0: none did).
    last_empty: u64,
}

impl Spacing {
    /// Leave `every` (at most [`MAX`]) after a read that found nothing; zero: never wait.
    pub fn new(every: Duration) -> Spacing {
        let ticks = if every.is_zero() { 0 } else { clock().ticks_in(every.min(MAX)).max(1) };
        Spacing { ticks, base: ticks, last_empty: 0 }
    }

    /// While `on`, leave [`SERVING_FACTOR`] times the spacing (off stays off).
    pub fn serving(&mut self, on: bool) {
        self.ticks = if on { self.base * SERVING_FACTOR as u64 } else { self.base };
    }

    /// The counter now if a read may begin (0 when spacing is off, which needs no clock);
    /// `None` while the last read found nothing less than the spacing ago.
    #[inline]
    pub fn ready(&self) -> Option<u64> {
        if self.ticks == 0 {
            return Some(0);
        }
        let now = ticks();
        self.ready_at(now).then_some(now)
    }

    /// May a read begin at counter value `now`? (A counter behind the last empty read, as on
    /// another core, lets it: spacing never holds a read back for long.)
    #[inline]
    fn ready_at(&self, now: u64) -> bool {
        self.last_empty == 0 || now.wrapping_sub(self.last_empty) >= self.ticks
    }

    /// The read that began at `started` (from [`ready`](Self::ready)) found nothing.
    #[inline]
    pub fn found_nothing(&mut self, started: u64) {
        self.last_empty = started;
    }
}

/// The counter's rate, measured once per process (over 200 µs, at the first transport that
/// spaces): a spacing need not be exact.
fn clock() -> Cycles {
    static CLOCK: OnceLock<Cycles> = OnceLock::new();
    *CLOCK.get_or_init(|| Cycles::calibrate(Duration::from_micros(200)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_waits_out_the_spacing_after_an_empty_one_only() {
        let mut s = Spacing { ticks: 100, base: 100, last_empty: 0 };
        assert!(s.ready_at(5), "nothing was empty yet");
        s.found_nothing(1_000);
        assert!(!s.ready_at(1_000));
        assert!(!s.ready_at(1_099));
        assert!(s.ready_at(1_100));
        assert!(s.ready_at(999), "a counter behind (another core's) does not hold the read back");
        let mut serving = Spacing { ticks: 100, base: 100, last_empty: 0 };
        serving.serving(true);
        serving.found_nothing(1_000);
        assert!(!serving.ready_at(1_299), "serving: three times the spacing");
        assert!(serving.ready_at(1_300));
        serving.serving(false);
        assert!(serving.ready_at(1_100), "back to the spacing");
        let mut off = Spacing::new(Duration::ZERO);
        off.serving(true);
        assert_eq!(off.ready(), Some(0), "serving leaves spacing off");
        let off = Spacing::new(Duration::ZERO);
        assert_eq!(off.ready(), Some(0), "off: every poll reads, with no clock read");
        assert!(Spacing::new(Duration::from_nanos(1)).ticks >= 1);
        let longest = Spacing::new(MAX).ticks;
        assert_eq!(Spacing::new(Duration::MAX).ticks, longest, "a longer spacing is cut to MAX");
    }

    #[test]
    fn only_shm_and_tcp_space_by_default() {
        assert_eq!(default_for("shm"), DEFAULT);
        assert_eq!(default_for("tcp;ofi_rxm"), DEFAULT);
        assert_eq!(default_for("efa"), Duration::ZERO);
        assert_eq!(default_for("verbs;ofi_rxm"), Duration::ZERO);
    }
}
