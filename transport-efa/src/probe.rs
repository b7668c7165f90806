//! Where a ping-pong's time goes in this backend (feature `probe`): the provider's own calls
//! (reading the completion queue, posting) and what its caller spends between reading a
//! completion and posting the reply to it, in time-stamp counter ticks, counted per thread.
//! Both of `rdmalane-perf`'s engines post through this backend, so the runtime's turnaround
//! and the raw engine's compare directly. Without the feature every hook is empty and
//! [`snapshot`] reports nothing.
use std::cell::Cell;

/// Calls of one kind: their ticks and how many.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Tally {
    /// Ticks spent, summed.
    pub ticks: u64,
    /// Calls counted.
    pub count: u64,
}

impl Tally {
    /// Mean ticks per call; `None` before any.
    #[cfg_attr(not(feature = "probe"), allow(dead_code))]
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.ticks as f64 / self.count as f64)
    }

    fn add(&mut self, ticks: u64) {
        self.ticks += ticks;
        self.count += 1;
    }
}

/// What this thread measured.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Probe {
    /// `fi_cq_read` calls that returned completions.
    pub cq_hit: Tally,
    /// `fi_cq_read` calls that found none.
    pub cq_empty: Tally,
    /// Sends and writes posted (`fi_inject`, `fi_sendmsg`, `fi_writemsg`).
    pub post: Tally,
    /// From the end of a read that returned completions to the start of the next send or
    /// write: the caller's turnaround, a ping-pong's reply.
    pub turnaround: Tally,
    /// From a send or write posted to the next read of the completion queue: what the caller
    /// does before it looks for the answer (on a ping-pong's client, on its latency path when
    /// the answer comes sooner).
    pub lookout: Tally,
}

thread_local! {
    static PROBE: Cell<Probe> = const { Cell::new(Probe {
        cq_hit: Tally { ticks: 0, count: 0 },
        cq_empty: Tally { ticks: 0, count: 0 },
        post: Tally { ticks: 0, count: 0 },
        turnaround: Tally { ticks: 0, count: 0 },
        lookout: Tally { ticks: 0, count: 0 },
    }) };
    /// When the last send or write was posted (0: a read followed it).
    static LAST_POST: Cell<u64> = const { Cell::new(0) };
    /// When the last read that returned completions ended (0: a send or write followed it).
    static LAST_HIT: Cell<u64> = const { Cell::new(0) };
}

const ON: bool = cfg!(feature = "probe");

/// This thread's measurements; `None` when built without the feature.
#[cfg_attr(not(feature = "probe"), allow(dead_code))]
pub fn snapshot() -> Option<Probe> {
    ON.then(|| PROBE.get())
}

fn update(f: impl FnOnce(&mut Probe)) {
    let mut p = PROBE.get();
    f(&mut p);
    PROBE.set(p);
}

/// The counter before a timed call (0 without the feature).
#[inline(always)]
pub(crate) fn start() -> u64 {
    if ON {
        rdmalane_wake::ticks()
    } else {
        0
    }
}

/// A completion queue read that began at `t0` returned `found` completions.
#[inline(always)]
pub(crate) fn cq_read(t0: u64, found: bool) {
    if !ON {
        return;
    }
    let now = rdmalane_wake::ticks();
    let d = now.saturating_sub(t0);
    let posted = LAST_POST.replace(0);
    if posted != 0 {
        update(|p| p.lookout.add(t0.saturating_sub(posted)));
    }
    if found {
        LAST_HIT.set(now);
        update(|p| p.cq_hit.add(d));
    } else {
        update(|p| p.cq_empty.add(d));
    }
}

/// A send or write is about to be posted (at `t0`): it ends a turnaround if a read that
/// returned completions came before it.
#[inline(always)]
pub(crate) fn reply(t0: u64) {
    if !ON {
        return;
    }
    let last = LAST_HIT.replace(0);
    if last != 0 {
        update(|p| p.turnaround.add(t0.saturating_sub(last)));
    }
}

/// A send or write posted at `t0` returned.
#[inline(always)]
pub(crate) fn posted(t0: u64) {
    if ON {
        let now = rdmalane_wake::ticks();
        LAST_POST.set(now);
        update(|p| p.post.add(now.saturating_sub(t0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turnaround_runs_from_a_completion_to_the_next_reply_only() {
        cq_read(start(), true);
        let t = start();
        reply(t);
        posted(t);
        // A second send without a completion in between is no turnaround.
        reply(start());
        cq_read(start(), false);
        assert_eq!(snapshot().is_some(), ON, "only the feature reports");
        if let Some(p) = snapshot() {
            assert_eq!((p.cq_hit.count, p.cq_empty.count), (1, 1));
            assert_eq!(p.turnaround.count, 1, "{p:?}");
            assert_eq!(p.post.count, 1);
            assert_eq!(p.lookout.count, 1, "one read after the post: {p:?}");
        }
    }
}
