//! How a task waits for the reactor thread: the hand-off of a completion. Woken the ordinary
//! way, a task costs a wake-up through its executor (a futex and a scheduler round trip, about
//! 5 to 10 µs, on tokio and on `block_on` alike); a latency-class op is usually done within a
//! few microseconds of being awaited, so its poll first watches the op's cell for a short while
//! (an `AwaitSpin`), which costs a cache line crossing when the completion comes in time.
//!
//! Spinning holds the polling thread, so it is bounded twice: by the budget per poll, and per
//! thread by a back-off: a spin that ends without the outcome (a receive waiting for a request
//! that is not coming) makes the thread's next spins skip, for a number of polls that doubles
//! with each miss (up to [`SKIP_MAX`]) and goes back to none with the first hit. A server with
//! a thousand idle receives thus pays for one spin, not a thousand.
//!
//! An op that spins to its outcome never makes its task wait, so a loop of them (a ping-pong
//! joined with a bulk stream in one task) would run without end inside one poll, starving what
//! it is joined with: measured on shm, the stream beside such a loop fell from 51 to 6 Gb/s.
//! So once a run of outcomes reached by spinning, with no wait in between, has lasted
//! [`RUN_SPAN`], the next op about to spin yields once first (it wakes its task and returns
//! pending, its op still out), as tokio's cooperative budget makes its own resources yield.
//! The yield comes before the wait, not after the outcome: its trip through the executor then
//! overlaps the op's own time on the wire instead of delaying the next op of a ping-pong (a
//! yield taken with the outcome in hand cost a shm ping some 0.3 µs every 20 µs), and the
//! run's looks at the clock come there too, off the path from an outcome to the next post.
//! An op that finished as it was posted (a small send the provider copies) never waited either:
//! it counts in the run, and where the run is due it yields right after its post, its outcome
//! kept for the next poll, which is off the message's path too. (A loop of nothing but such
//! sends otherwise never yielded under the thread driver: 3,000 in a row over tcp, the future
//! beside them unpolled and, under a keeping `block_on`, the reactor unturned.)
//! The run is bounded in time, not in outcomes: what it starves waits for a time, and a yield
//! is dear. Every 4th outcome, as it was, cost a receive loop over the null transport 100 to
//! 180 ns an op (`op_overhead`, thread driver), and a shm ping-pong about a tenth of a
//! microsecond of its p50 in one of two A/B calls on 16 cores.
//! A hit resets the back-off, so where a task's spins alternate between hits and misses (a
//! receive polled before the send it answers can go out) each round may spin its whole budget.
use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::driver::inline;
use crate::driver::lend::Lease;
use crate::reactor::cell::OpCell;

/// The most polls a thread skips spinning after misses.
pub(crate) const SKIP_MAX: u32 = 64;

/// How long a run of outcomes reached by spinning may last before the next yields instead of
/// being taken. What the run is joined with waits that long: runs of a shm ping-pong's 16
/// round trips (about 40 µs) kept a bulk stream joined with them at 0.74 to 1.00 of its rate
/// over several calls; runs of 20 µs kept it at 0.97 to 1.09 (`mixed --layout joined
/// --driver thread`, shm, 16 cores), as runs of 4 outcomes did (0.99 to 1.23).
pub(crate) const RUN_SPAN: Duration = Duration::from_micros(20);

/// Outcomes of a run before its first look at the clock (a look costs about what taking an
/// outcome over a null transport does).
const RUN_LOOK: u32 = 4;

/// The most outcomes between two later looks: each is spaced by the run's pace so far to come
/// about a quarter of [`RUN_SPAN`] after the last, so a run of cheap outcomes (a loop over
/// memory the provider copies at once) reads the clock seldom while slow ones (a tcp round
/// trip each) look at every one. The cap bounds what a run that slows down runs past its span.
const RUN_LOOK_MAX: u32 = 16;

/// The spin budget where the host has cores to spare (see `default_budget`).
pub(crate) const DEFAULT_BUDGET: Duration = Duration::from_micros(50);

/// Fewer cores than this, and no spin by default: the reactor thread busy-polls one of them,
/// and a spinning task would take the other from the peers and tasks that share it.
pub(crate) const MIN_CORES: usize = 4;

/// How long a latency-class op's poll may watch its cell before it parks, in nanoseconds (0:
/// not at all). Kept small: ops carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AwaitSpin(u32);

impl AwaitSpin {
    /// No spinning.
    pub(crate) const OFF: AwaitSpin = AwaitSpin(0);

    /// Spin up to `d` (at most about 4 s).
    pub(crate) fn new(d: Duration) -> AwaitSpin {
        AwaitSpin(d.as_nanos().min(u32::MAX as u128) as u32)
    }

    pub(crate) fn is_off(self) -> bool {
        self.0 == 0
    }

    /// The budget as a duration.
    pub(crate) fn budget(self) -> Duration {
        Duration::from_nanos(self.0 as u64)
    }
}

/// The default for a thread-driven runtime on a host of `cores` cores: [`DEFAULT_BUDGET`] with
/// cores to spare, none on a small machine.
pub(crate) fn default_budget(cores: usize) -> Duration {
    if cores >= MIN_CORES {
        DEFAULT_BUDGET
    } else {
        Duration::ZERO
    }
}

/// A thread's spin back-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Backoff {
    /// Polls still to skip.
    skip: u32,
    /// Polls to skip after the next miss.
    next: u32,
}

impl Backoff {
    /// May this poll spin? (Counts a skipped one.)
    fn allow(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    fn hit(&mut self) {
        *self = Backoff::default();
    }

    fn miss(&mut self) {
        self.next = (self.next * 2).clamp(1, SKIP_MAX);
        self.skip = self.next;
    }
}

thread_local! {
    static BACKOFF: Cell<Backoff> = const { Cell::new(Backoff { skip: 0, next: 0 }) };
    /// The run of outcomes taken by spinning (or at posting) since this thread's task last
    /// waited or yielded.
    static RUN: Cell<Run> = const { Cell::new(Run { taken: 0, since: None, look: 0 }) };
    /// The clock as the spin in progress last looked at it, for the run's bookkeeping after it
    /// (see [`run_clock`]); cleared as each spin starts.
    static LAST_LOOK: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The time for a run's bookkeeping before a spin: the last spin's own last look at the clock
/// where it made one (some turns old at most: eight of the lent reactor's, 64 looks at a cell),
/// else a fresh read (30-60 ns on the 16-core host). A run spans 20 µs, so a look a few turns
/// old times it closely enough.
fn run_clock() -> Instant {
    LAST_LOOK.take().unwrap_or_else(Instant::now)
}

/// A run of outcomes reached by spinning, with no wait in between.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    /// Outcomes taken in it.
    taken: u32,
    /// When it was first timed, at the spin after its first outcome (`None`: not yet).
    since: Option<Instant>,
    /// The count of outcomes at which it next looks at the clock.
    look: u32,
}

/// An op's poll took its outcome by spinning, or the op finished as it was posted: one more
/// in the run.
#[inline]
pub(crate) fn took() {
    let mut run = RUN.get();
    run.taken += 1;
    RUN.set(run);
}

/// An op is about to spin for its outcome: has the run of spun outcomes before it lasted
/// [`RUN_SPAN`]? Then the run ends, and the op's task should yield once first. Looks at the
/// clock as the run's first outcome is followed by a spin, after [`RUN_LOOK`] more, then at
/// the run's own pace (see [`RUN_LOOK_MAX`]).
pub(crate) fn yield_due() -> bool {
    let mut run = RUN.get();
    if run.taken == 0 || run.taken < run.look {
        return false;
    }
    let Some(since) = run.since else {
        RUN.set(Run { since: Some(run_clock()), look: run.taken + RUN_LOOK, ..run });
        return false;
    };
    let lasted = run_clock().saturating_duration_since(since);
    if lasted >= RUN_SPAN {
        RUN.set(Run::default());
        return true;
    }
    // The next look about a quarter of the span on, at the pace so far.
    let per = (lasted.as_nanos() as u64 / u64::from(run.taken)).max(1);
    let step = (RUN_SPAN.as_nanos() as u64 / 4 / per).clamp(1, u64::from(RUN_LOOK_MAX)) as u32;
    run.look = run.taken + step;
    RUN.set(run);
    false
}

/// The polling task is about to wait for a wake-up: its run of spun outcomes is over.
pub(crate) fn waits() {
    RUN.set(Run::default());
}

/// Watch `cell` for its outcome for up to `spin`, unless this thread is backing off; true if
/// the outcome is in. Where the reactor thread lends its reactor (`lease`, the poll's hold on
/// runtime `rt`'s), turn it meanwhile whenever it can be had.
pub(crate) fn spin_until_done(
    cell: &OpCell,
    spin: AwaitSpin,
    rt: u64,
    lease: Option<&mut Lease<'_>>,
) -> bool {
    if spin.is_off() {
        return false;
    }
    let mut b = BACKOFF.get();
    if !b.allow() {
        BACKOFF.set(b);
        return false;
    }
    LAST_LOOK.set(None);
    let done = match lease {
        Some(lease) => drive(cell, lease, rt, spin.budget()),
        None => watch(|| cell.is_done(), spin.budget()),
    };
    if done {
        b.hit();
    } else {
        b.miss();
    }
    BACKOFF.set(b);
    done
}

/// Turn runtime `rt`'s lent reactor whenever this thread can hold it (the hold is kept: the
/// poll puts it back as it returns), else watch, until
/// `cell` is done or `budget` has passed (looking at the clock every few turns: a turn may
/// cost a provider's progress call).
fn drive(cell: &OpCell, lease: &mut Lease<'_>, rt: u64, budget: Duration) -> bool {
    let mut start = Deadline::new(budget);
    loop {
        for _ in 0..8 {
            if cell.is_done() {
                break;
            }
            if lease.hold(true) {
                inline::turn_held(rt, |r| {
                    r.turn();
                });
            } else {
                std::hint::spin_loop();
            }
        }
        if cell.is_done() {
            break true;
        }
        if start.passed() {
            break cell.is_done();
        }
    }
}

/// Call `done` until it says so or `budget` has passed; looks at the clock every 64 calls.
fn watch(mut done: impl FnMut() -> bool, budget: Duration) -> bool {
    let mut start = Deadline::new(budget);
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.passed() {
            return done();
        }
    }
}

/// A spin's budget, timed from its first look at the clock: most spins end within their first
/// round of looks, and a clock read there was a tenth of a thread-driven op's cost (some 40 ns
/// of a 450 ns receive over a null transport, on a VM). The budget thus runs a round late.
struct Deadline {
    budget: Duration,
    start: Option<Instant>,
}

impl Deadline {
    fn new(budget: Duration) -> Deadline {
        Deadline { budget, start: None }
    }

    /// Has the budget passed since the first call? One read of the clock, kept for the run's
    /// bookkeeping after the spin (see [`run_clock`]).
    fn passed(&mut self) -> bool {
        let now = Instant::now();
        LAST_LOOK.set(Some(now));
        now.saturating_duration_since(*self.start.get_or_insert(now)) >= self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reactor::cell::Done;

    #[test]
    fn misses_back_off_doubling_to_the_cap_and_a_hit_resets() {
        let mut b = Backoff::default();
        assert!(b.allow(), "a fresh thread spins");
        let mut skipped = Vec::new();
        for _ in 0..9 {
            b.miss();
            let n = std::iter::from_fn(|| (!b.allow()).then_some(())).count();
            skipped.push(n as u32);
        }
        assert_eq!(skipped, vec![1, 2, 4, 8, 16, 32, 64, 64, 64]);
        b.miss();
        b.hit();
        assert!(b.allow(), "a hit ends the back-off");
    }

    #[test]
    fn a_spin_sees_an_outcome_that_is_in_and_gives_up_in_time_on_one_that_is_not() {
        let cell = OpCell::new();
        let t0 = Instant::now();
        assert!(!spin_until_done(&cell, AwaitSpin::new(Duration::from_millis(2)), 0, None));
        assert!(t0.elapsed() >= Duration::from_millis(2), "it spins its budget");
        assert!(t0.elapsed() < Duration::from_secs(1));
        // The miss makes the next poll skip at once.
        let t1 = Instant::now();
        assert!(!spin_until_done(&cell, AwaitSpin::new(Duration::from_secs(5)), 0, None));
        assert!(t1.elapsed() < Duration::from_millis(100), "a backed-off thread does not spin");
        cell.complete(Ok(Done { len: 1, imm: None }));
        assert!(spin_until_done(&cell, AwaitSpin::new(Duration::from_millis(1)), 0, None));
        assert!(!spin_until_done(&OpCell::new(), AwaitSpin::OFF, 0, None), "off never spins");
    }

    /// Take outcomes until a spin after one is due to yield (true), `most` at most.
    fn yields_within(most: u32) -> bool {
        (0..most).any(|_| {
            took();
            yield_due()
        })
    }

    #[test]
    fn a_run_of_spun_outcomes_yields_once_past_its_span_and_a_wait_starts_a_new_one() {
        waits();
        assert!(!yield_due(), "no run before its first outcome");
        // Between two looks at the clock the run goes on, however long it lasts.
        assert!(!yields_within(RUN_LOOK), "a run starts with takes");
        std::thread::sleep(RUN_SPAN * 2);
        assert!(yields_within(RUN_LOOK_MAX + 1), "a spin past the span yields");
        assert!(!yield_due(), "the yield ends the run");
        assert!(!yields_within(RUN_LOOK), "a new run starts after the yield");
        std::thread::sleep(RUN_SPAN * 2);
        waits();
        assert!(!yields_within(RUN_LOOK), "a wait starts a new run");
        waits();
    }

    #[test]
    fn a_run_looks_at_the_clock_at_its_own_pace() {
        let spin = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        };
        // Cheap outcomes: the look after the first comes the most outcomes on. (A thread
        // preempted meanwhile paces itself slower; only an unhindered run is judged.)
        waits();
        let t = Instant::now();
        let went_on = !yields_within(RUN_LOOK + 1);
        if went_on && t.elapsed() < RUN_SPAN / 64 {
            assert_eq!(RUN.get().look, 1 + RUN_LOOK + RUN_LOOK_MAX, "a cheap run looks seldom");
        }
        // Outcomes a tenth of the span apart: the next look comes within a few (or, preempted,
        // at once, or the run has lasted its span and yields).
        waits();
        for _ in 0..=RUN_LOOK {
            spin(RUN_SPAN / 10);
            if yields_within(1) {
                waits();
                return;
            }
        }
        let run = RUN.get();
        assert!(run.look - run.taken <= 3, "a slow run looks often: {run:?}");
        waits();
    }

    #[test]
    fn the_default_spins_only_with_cores_to_spare() {
        assert_eq!(default_budget(2), Duration::ZERO);
        assert_eq!(default_budget(16), DEFAULT_BUDGET);
    }
}
