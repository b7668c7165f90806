//! Immediate-data events: what a peer's `write_with_imm` (or a batch's pieces) raise here. They
//! are read one by one in arrival order (`next_imm`) or counted by value (`wait_imm`), which is
//! how a receiver learns that `n` pieces landed when nothing orders them.
//!
//! A waiter is woken only when what it waits for is there: a counted wait for `n` pages is
//! woken once, not once a page (a wake from the reactor thread is a futex call each, and at
//! 64 KiB pages that cost the reactor a fifth of its time).
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::base::wake::wake_guarded;

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
    /// Parked futures: each with its id, what it waits for and its waker.
    waiters: Vec<Waiter>,
    next_id: u64,
}

/// What a parked future waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Any event (`next_imm`).
    Any,
    /// `n` untaken events of value `tag` (`wait_imm`).
    Count { tag: u64, n: u64 },
}

struct Waiter {
    id: WaiterId,
    want: Want,
    waker: Waker,
}

/// A parked future's place among the waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WaiterId(u64);

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

    /// Park (or re-park) the future holding `id` until `want` is met; returns its id.
    fn park(&mut self, id: Option<WaiterId>, want: Want, w: &Waker) -> WaiterId {
        if let Some(x) = id.and_then(|id| self.waiters.iter_mut().find(|x| x.id == id)) {
            if !x.waker.will_wake(w) {
                x.waker = w.clone();
            }
            x.want = want;
            return x.id;
        }
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        self.waiters.push(Waiter { id, want, waker: w.clone() });
        id
    }

    fn unpark(&mut self, id: Option<WaiterId>) {
        if let Some(id) = id {
            self.waiters.retain(|x| x.id != id);
        }
    }

    fn met(&self, want: Want) -> bool {
        match want {
            Want::Any => !self.events.is_empty(),
            Want::Count { tag, n } => self.counts.get(&tag).copied().unwrap_or(0) >= n,
        }
    }

    /// The wakers of the waiters whose want is now met, taken out of the list (a woken future
    /// that still waits parks again).
    fn take_met(&mut self) -> Vec<Waker> {
        let mut woken = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            if self.met(self.waiters[i].want) {
                woken.push(self.waiters.swap_remove(i).waker);
            } else {
                i += 1;
            }
        }
        woken
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
            if s.waiters.is_empty() {
                return;
            }
            s.take_met()
        };
        wakers.into_iter().for_each(wake_guarded);
    }

    pub(crate) fn try_pop(&self) -> Option<ImmEvent> {
        self.lock().pop()
    }

    /// Events with value `tag` arrived and not yet taken.
    pub(crate) fn count(&self, tag: u64) -> u64 {
        self.lock().counts.get(&tag).copied().unwrap_or(0)
    }
}

/// A future's hold on the queue: where it is parked, if it is. Dropping it leaves the list.
struct Waiting {
    q: Arc<ImmQueue>,
    parked: Option<WaiterId>,
}

impl Waiting {
    fn new(q: Arc<ImmQueue>) -> Self {
        Waiting { q, parked: None }
    }

    /// `take` what the future waits for; where nothing is there yet, park until `want` is met.
    fn poll<T>(
        &mut self,
        want: Want,
        cx: &Context<'_>,
        take: impl FnOnce(&mut State) -> Option<T>,
    ) -> Poll<T> {
        let mut s = self.q.lock();
        match take(&mut s) {
            Some(v) => {
                s.unpark(self.parked.take());
                Poll::Ready(v)
            }
            None => {
                self.parked = Some(s.park(self.parked, want, cx.waker()));
                Poll::Pending
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.parked.is_some() {
            self.q.lock().unpark(self.parked.take());
        }
    }
}

/// Resolves to the next immediate event (see `Runtime::next_imm`).
pub struct NextImm {
    w: Waiting,
}

impl NextImm {
    pub(crate) fn new(q: Arc<ImmQueue>) -> Self {
        NextImm { w: Waiting::new(q) }
    }
}

impl Future for NextImm {
    type Output = ImmEvent;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ImmEvent> {
        self.w.poll(Want::Any, cx, State::pop)
    }
}

/// Resolves once `n` events carrying one value have arrived, and takes them (see
/// `Runtime::wait_imm`). Dropping it takes nothing.
pub struct WaitImm {
    w: Waiting,
    tag: u64,
    n: u64,
}

impl WaitImm {
    pub(crate) fn new(q: Arc<ImmQueue>, tag: u64, n: u64) -> Self {
        WaitImm { w: Waiting::new(q), tag, n }
    }
}

impl Future for WaitImm {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (tag, n) = (self.tag, self.n);
        self.w.poll(Want::Count { tag, n }, cx, |s| s.take_counted(tag, n).then_some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(Default::default()));
        (c.clone(), Waker::from(c))
    }

    fn wakes(c: &Count) -> usize {
        c.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn a_counted_wait_is_woken_once_when_its_count_is_there() {
        let q = Arc::new(ImmQueue::default());
        let (c, w) = counting();
        let mut cx = Context::from_waker(&w);
        let mut wait = WaitImm::new(q.clone(), 7, 100);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_pending());
        for i in 0..99 {
            q.push(if i % 2 == 0 { 7 } else { 8 }, 0);
        }
        for _ in 0..49 {
            q.push(7, 0);
        }
        assert_eq!(wakes(&c), 0, "99 of 100 events of the value: not yet");
        q.push(7, 0);
        assert_eq!(wakes(&c), 1);
        assert!(Pin::new(&mut wait).poll(&mut cx).is_ready());
        assert!(q.lock().waiters.is_empty());
        assert_eq!(q.count(7), 0);
        assert_eq!(q.count(8), 49);
    }

    #[test]
    fn next_imm_is_woken_by_any_event_and_dropped_waiters_leave_nothing() {
        let q = Arc::new(ImmQueue::default());
        let (c, w) = counting();
        let mut cx = Context::from_waker(&w);
        let mut next = NextImm::new(q.clone());
        assert!(Pin::new(&mut next).poll(&mut cx).is_pending());
        let mut counted = WaitImm::new(q.clone(), 1, 5);
        assert!(Pin::new(&mut counted).poll(&mut cx).is_pending());
        assert_eq!(q.lock().waiters.len(), 2);
        q.push(9, 16);
        assert_eq!(wakes(&c), 1, "next_imm's waiter only");
        assert_eq!(Pin::new(&mut next).poll(&mut cx), Poll::Ready(ImmEvent { imm: 9, len: 16 }));
        // Polled again while still waiting: one entry, not two.
        assert!(Pin::new(&mut counted).poll(&mut cx).is_pending());
        assert_eq!(q.lock().waiters.len(), 1);
        drop(counted);
        assert!(q.lock().waiters.is_empty());
        for _ in 0..5 {
            q.push(1, 0);
        }
        assert_eq!(wakes(&c), 1, "the dropped wait is not woken");
        assert_eq!(q.count(1), 5, "and took nothing");
    }

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
