//! Immediate-data events: what a peer's `write_with_imm` (or a batch's pieces) raise here. They
//! are read one by one in arrival order (`next_imm`) or counted by value (`wait_imm`), which is
//! how a receiver learns that `n` pieces landed when nothing orders them.
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A peer wrote into memory this runtime exposed and attached a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmEvent {
    /// The immediate value.
    pub imm: u64,
    /// Bytes the write carried, where the provider reports it (0 otherwise).
    pub len: usize,
}

#[derive(Default)]
struct State {
    /// Arrived events in order, including some already taken by counting (see `skip`).
    events: VecDeque<ImmEvent>,
    /// Events per value not yet taken.
    counts: HashMap<u64, u64>,
    /// Events per value taken by `wait_imm` but still in `events`: the oldest that many of that
    /// value are skipped by `next_imm`.
    skip: HashMap<u64, u64>,
    skipped: usize,
    wakers: Vec<Waker>,
}

impl State {
    fn pop(&mut self) -> Option<ImmEvent> {
        while let Some(e) = self.events.pop_front() {
            if let Some(s) = self.skip.get_mut(&e.imm) {
                *s -= 1;
                self.skipped -= 1;
                if *s == 0 {
                    self.skip.remove(&e.imm);
                }
                continue;
            }
            take(&mut self.counts, e.imm, 1);
            return Some(e);
        }
        None
    }

    fn take_counted(&mut self, tag: u64, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        if self.counts.get(&tag).copied().unwrap_or(0) < n {
            return false;
        }
        take(&mut self.counts, tag, n);
        *self.skip.entry(tag).or_default() += n;
        self.skipped += n as usize;
        // Keep the queue from growing when events are only ever counted.
        if self.skipped > 64 && self.skipped * 2 > self.events.len() {
            let mut skip = std::mem::take(&mut self.skip);
            self.events.retain(|e| match skip.get_mut(&e.imm) {
                Some(s) if *s > 0 => {
                    *s -= 1;
                    false
                }
                _ => true,
            });
            self.skipped = 0;
        }
        true
    }

    fn park(&mut self, w: &Waker) {
        if !self.wakers.iter().any(|x| x.will_wake(w)) {
            self.wakers.push(w.clone());
        }
    }
}

fn take(counts: &mut HashMap<u64, u64>, tag: u64, n: u64) {
    if let Some(c) = counts.get_mut(&tag) {
        *c -= n.min(*c);
        if *c == 0 {
            counts.remove(&tag);
        }
    }
}

/// The runtime's queue of arrived immediate events.
#[derive(Default)]
pub(crate) struct ImmQueue {
    state: Mutex<State>,
}

impl ImmQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, imm: u64, len: usize) {
        let wakers = {
            let mut s = self.lock();
            s.events.push_back(ImmEvent { imm, len });
            *s.counts.entry(imm).or_default() += 1;
            std::mem::take(&mut s.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    pub(crate) fn try_pop(&self) -> Option<ImmEvent> {
        self.lock().pop()
    }

    /// Events with value `tag` arrived and not yet taken.
    pub(crate) fn count(&self, tag: u64) -> u64 {
        self.lock().counts.get(&tag).copied().unwrap_or(0)
    }
}

/// Resolves to the next immediate event (see `Runtime::next_imm`).
pub struct NextImm {
    pub(crate) q: Arc<ImmQueue>,
}

impl Future for NextImm {
    type Output = ImmEvent;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ImmEvent> {
        let mut s = self.q.lock();
        match s.pop() {
            Some(e) => Poll::Ready(e),
            None => {
                s.park(cx.waker());
                Poll::Pending
            }
        }
    }
}

/// Resolves once `n` events carrying one value have arrived, and takes them (see
/// `Runtime::wait_imm`). Dropping it takes nothing.
pub struct WaitImm {
    pub(crate) q: Arc<ImmQueue>,
    pub(crate) tag: u64,
    pub(crate) n: u64,
}

impl Future for WaitImm {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.q.lock();
        if s.take_counted(self.tag, self.n) {
            Poll::Ready(())
        } else {
            s.park(cx.waker());
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Counted and ordered reads together take every event exactly once, whatever order
        /// the events arrive in.
        #[test]
        fn counts_under_reordering(order in Just((0..300u64).collect::<Vec<_>>()).prop_shuffle(), split in 0usize..300) {
            let q = Arc::new(ImmQueue::default());
            // Values 0..3 as tags: 100 events each, arriving shuffled.
            for (i, &k) in order.iter().enumerate() {
                q.push(k % 3, i);
                if i == split {
                    // Halfway, a counted wait for what is there of tag 0.
                    let have = q.count(0);
                    assert!(q.lock().take_counted(0, have));
                }
            }
            let taken0 = 100 - q.count(0);
            prop_assert!(q.lock().take_counted(1, 100));
            prop_assert!(!q.lock().take_counted(1, 1));
            let mut rest = Vec::new();
            while let Some(e) = q.try_pop() {
                rest.push(e.imm);
            }
            prop_assert_eq!(rest.iter().filter(|&&t| t == 0).count() as u64, 100 - taken0);
            prop_assert_eq!(rest.iter().filter(|&&t| t == 2).count(), 100);
            prop_assert!(!rest.contains(&1));
        }
    }
}
