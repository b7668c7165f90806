//! Where the runtime's part of a reply goes (feature `probe`): the time between the stages an
//! op's completion and the next op's post pass through on one thread, from the reap that
//! returned a completion to the transport's post of the reply. `rdmalane-perf lat`, built with
//! `--features probe`, prints them beside the transport's own probe (its turnaround is the sum
//! of these, plus the provider's read returning and the post's own prologue). Without the
//! feature every mark is empty and [`stages`] reports nothing.
//!
//! A stage is reached only straight after the one before it, on the same thread: a chain begins
//! at each reap that returned completions, and a mark out of turn (an idle turn's end, a
//! receive posted ahead after the reply) neither counts nor goes on with it. So each figure is
//! a step of the path from a completion to the first post after it.
use std::cell::Cell;

/// The marks, in the order a reply passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Stage {
    /// A reap returned completions from the transport.
    Reaped,
    /// The reap's completions are settled (ops' cells completed).
    Settled,
    /// The reactor's turn returned.
    TurnDone,
    /// An op's future resolved (its poll returns the result).
    OpReady,
    /// An op is handed to the runtime (its first poll, or `start`).
    Submitted,
    /// The reactor takes it to post at once.
    AtReactor,
    /// The transport's post is called.
    Posting,
}

/// Every stage, in order.
pub const STAGES: [Stage; 7] = [
    Stage::Reaped,
    Stage::Settled,
    Stage::TurnDone,
    Stage::OpReady,
    Stage::Submitted,
    Stage::AtReactor,
    Stage::Posting,
];

/// The time from the previous stage to one stage, over the chains that passed both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageTally {
    /// The stage reached.
    pub stage: Stage,
    /// Clock ticks from the previous stage, summed.
    pub ticks: u64,
    /// Chains counted.
    pub count: u64,
}

const N: usize = STAGES.len();

struct Marks {
    /// When each stage was last marked on this thread (0: not since the next one).
    at: [Cell<u64>; N],
    ticks: [Cell<u64>; N],
    count: [Cell<u64>; N],
}

impl Marks {
    const fn new() -> Marks {
        Marks {
            at: [const { Cell::new(0) }; N],
            ticks: [const { Cell::new(0) }; N],
            count: [const { Cell::new(0) }; N],
        }
    }
}

thread_local! {
    static MARKS: Marks = const { Marks::new() };
}

/// The clock the marks read: set by whoever reports them (the runtime has no cycle counter of
/// its own; `rdmalane-perf` gives the one its round trips are timed with).
static CLOCK: std::sync::OnceLock<fn() -> u64> = std::sync::OnceLock::new();

const ON: bool = cfg!(feature = "probe");

/// Read the marks' time from `clock` (the first call wins); marks before it count nothing.
pub fn set_clock(clock: fn() -> u64) {
    let _ = CLOCK.set(clock);
}

/// This thread reached `stage`.
#[inline(always)]
pub(crate) fn mark(stage: Stage) {
    if !ON {
        return;
    }
    let Some(&clock) = CLOCK.get() else { return };
    let _ = MARKS.try_with(|m| mark_in(m, stage as usize, clock));
}

#[inline(always)]
fn mark_in(m: &Marks, i: usize, clock: fn() -> u64) {
    let now = clock();
    if i > 0 {
        let before = m.at[i - 1].replace(0);
        if before == 0 {
            return;
        }
        m.ticks[i].set(m.ticks[i].get() + now.saturating_sub(before));
        m.count[i].set(m.count[i].get() + 1);
    }
    m.at[i].set(now);
}

/// What one mark costs on this thread, in clock ticks: each figure of [`stages`] holds one
/// (the end of the mark before it and the start of its own), which a reader takes off. Timed
/// over a chain of marks on a set of their own; `None` without the feature or a clock.
pub fn mark_ticks() -> Option<f64> {
    const ROUNDS: usize = 4096;
    thread_local! {
        static SPARE: Marks = const { Marks::new() };
    }
    let &clock = CLOCK.get().filter(|_| ON)?;
    SPARE.with(|m| {
        let t0 = clock();
        for r in 0..ROUNDS {
            mark_in(m, r % N, clock);
        }
        Some(clock().saturating_sub(t0) as f64 / ROUNDS as f64)
    })
}

/// This thread's figures, a stage each past the first (which starts the chain); `None` when
/// built without the feature.
pub fn stages() -> Option<Vec<StageTally>> {
    ON.then(|| {
        MARKS.with(|m| {
            STAGES[1..]
                .iter()
                .map(|&s| StageTally {
                    stage: s,
                    ticks: m.ticks[s as usize].get(),
                    count: m.count[s as usize].get(),
                })
                .collect()
        })
    })
}

#[cfg(all(test, feature = "probe"))]
mod tests {
    use super::*;

    #[test]
    fn a_stage_counts_only_straight_after_the_one_before_it() {
        // Ten ticks a read, counted per thread: marks other tests make meanwhile on their own
        // threads move no clock of this one's.
        thread_local! {
            static T: Cell<u64> = const { Cell::new(100) };
        }
        set_clock(|| T.with(|t| t.replace(t.get() + 10)));
        std::thread::spawn(|| {
            mark(Stage::Reaped);
            mark(Stage::Settled);
            // Out of turn: no figure for `OpReady` (`TurnDone` was not marked), nor for the
            // `Submitted` after it.
            mark(Stage::OpReady);
            mark(Stage::Submitted);
            mark(Stage::Reaped);
            mark(Stage::Settled);
            let s = stages().expect("built with the probe");
            assert_eq!(s[0].stage, Stage::Settled);
            assert_eq!((s[0].ticks, s[0].count), (20, 2), "{s:?}");
            assert_eq!((s[2].count, s[3].count), (0, 0), "{s:?}");
            // A mark reads the clock once: ten ticks of this one.
            let own = mark_ticks().expect("a clock is set");
            assert!((10.0..10.1).contains(&own), "{own}");
            assert_eq!(
                stages().expect("built with the probe")[0].count,
                2,
                "timing a mark marks nothing here"
            );
        })
        .join()
        .expect("the probe's thread");
    }
}
