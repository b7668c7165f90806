//! The reactor thread lends its reactor to a task that spins for an op's outcome. Watching a
//! cell the reactor thread completes costs two hand-offs per round trip on the latency path:
//! the op's command crosses to the reactor thread, its completion crosses back (on 16 cores,
//! shm: a 16 B one-way 2.1 µs against the raw engine's 0.65). A task that is going to spin
//! anyway can turn the reactor itself instead: post its op and reap its completion on its own
//! thread, as the inline driver does, with no crossing but the hold's.
//!
//! The first rail group's reactor of a thread-driven runtime then moves between its thread and
//! such tasks through a [`Slot`]:
//! - a spinning task takes it from the slot if it is there; if the thread holds it, the task
//!   raises `want` and keeps watching its cell meanwhile (the thread still completes it);
//! - the thread, between turns, sees `want` and puts the reactor in the slot;
//! - a task holds it for one poll at most (its spin budget), then puts it back. A task whose op
//!   finished is likely back soon (a ping-pong's next op), so the thread leaves the reactor in
//!   the slot until no task has taken it for [`REHOLD`], or until a command waits in its queue;
//!   a task that gives up and parks says so, and the thread takes the reactor back at once;
//! - on shutdown the thread takes the reactor back to shut it down; should a task's turn be the
//!   one stopping the runtime (its last handle dropped by a completion), the thread gives up
//!   waiting after [`SHUTDOWN_WAIT`] and the task shuts the reactor down when it puts it back.
//!
//! On [`Lease`]: this thread holds the reactor through the inline driver's thread-local hold,
//! so the paths that post at once and turn where the reactor is held serve it unchanged.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::transport::Notify;
use crate::driver::inline::{self, Slot};
use crate::reactor::{Idle, Reactor, SHUTDOWN_LIMIT};

/// How long the reactor stays in the slot after a task put it back with its op done, before
/// the thread takes it back: longer than the gap between a ping-pong's ops, short enough that
/// an op sent through the queue meanwhile (which brings it back at once anyway) or a peer's
/// one-sided op waiting on this side's progress barely notices.
pub(crate) const REHOLD: Duration = Duration::from_micros(10);

/// How long a stopping thread waits for a task to put the reactor back.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(200);

/// The first group's reactor as its thread and spinning tasks share it.
pub(crate) struct Lend {
    /// The runtime's id (the thread-local hold names reactors by it).
    rt: u64,
    slot: Slot,
    /// A task waits for the reactor the thread holds.
    want: AtomicBool,
    /// Bumped by each task that puts the reactor back: the thread retakes it once this stops
    /// moving for [`REHOLD`].
    released: AtomicU64,
    /// A task put the reactor back with its op still out (it parks): retake it now.
    urgent: AtomicBool,
    /// The stopping thread gave up waiting: whoever puts the reactor back shuts it down.
    orphaned: AtomicBool,
    idle: Arc<Idle>,
    notifier: Arc<dyn Notify>,
}

impl Lend {
    /// The lending side of runtime `rt`'s first group, whose flags are `idle`.
    pub(crate) fn new(rt: u64, idle: Arc<Idle>, notifier: Arc<dyn Notify>) -> Lend {
        Lend {
            rt,
            slot: Slot::empty(),
            want: AtomicBool::new(false),
            released: AtomicU64::new(0),
            urgent: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            idle,
            notifier,
        }
    }

    /// The thread's side: a task wants the reactor? (SeqCst: about to sleep, the thread sets
    /// its sleeping flag and then looks here, while the task raises `want` and then looks at
    /// that flag.)
    pub(crate) fn wanted(&self) -> bool {
        self.want.load(Ordering::SeqCst)
    }

    /// The thread's side: put `reactor` in the slot and wait until it is due back (see the
    /// module's doc); `None` when stopping and a task still holds it.
    pub(crate) fn lend_out(&self, reactor: Box<Reactor>) -> Option<Box<Reactor>> {
        self.urgent.store(false, Ordering::Relaxed);
        self.slot.put(reactor);
        let mut seen = self.released.load(Ordering::Acquire);
        let mut quiet = Instant::now();
        loop {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if self.idle.shutdown.load(Ordering::Acquire) {
                return self.retake_to_stop();
            }
            let now = self.released.load(Ordering::Acquire);
            if now != seen {
                seen = now;
                quiet = Instant::now();
            }
            let due = self.urgent.load(Ordering::Acquire)
                || self.idle.commands.load(Ordering::Acquire) > 0
                || quiet.elapsed() >= REHOLD;
            if due && !self.wanted() {
                if let Some(r) = self.slot.try_take() {
                    return Some(r);
                }
            }
        }
    }

    /// Take the reactor back to stop it, waiting a while for a task to put it back.
    fn retake_to_stop(&self) -> Option<Box<Reactor>> {
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while Instant::now() < deadline {
            if let Some(r) = self.slot.try_take() {
                return Some(r);
            }
            std::thread::yield_now();
        }
        self.orphaned.store(true, Ordering::SeqCst);
        self.slot.try_take()
    }

    /// Holds tasks have taken so far.
    pub(crate) fn holds(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// A task's hold, not yet taken.
    pub(crate) fn lease(&self) -> Lease<'_> {
        Lease { lend: self, state: LeaseState::Free }
    }
}

/// How a task stands with the reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    /// Not held, not asked for.
    Free,
    /// Asked for (`want` raised), not yet had.
    Asked,
    /// Held by this lease: put back on drop.
    Held,
    /// This thread held it already (a nested poll): nothing to put back.
    Nested,
}

/// A task's hold on the lent reactor for (part of) one poll; puts it back when dropped.
pub(crate) struct Lease<'a> {
    lend: &'a Lend,
    state: LeaseState,
}

impl Lease<'_> {
    /// Hold the reactor if it is in the slot; where the thread has it and `ask`, ask for it
    /// (a later call may then find it). True while this thread holds it.
    pub(crate) fn hold(&mut self, ask: bool) -> bool {
        match self.state {
            LeaseState::Held | LeaseState::Nested => return true,
            _ if inline::holds(self.lend.rt) => {
                self.state = LeaseState::Nested;
                return true;
            }
            _ => {}
        }
        if let Some(r) = self.lend.slot.try_take() {
            return match inline::hold_taken(self.lend.rt, r) {
                Ok(()) => {
                    if self.state == LeaseState::Asked {
                        self.lend.want.store(false, Ordering::Relaxed);
                    }
                    self.state = LeaseState::Held;
                    true
                }
                // Inside a turn of a reactor this thread holds: not here.
                Err(r) => {
                    self.lend.slot.put(r);
                    false
                }
            };
        }
        if ask && self.state == LeaseState::Free {
            self.lend.want.store(true, Ordering::SeqCst);
            if self.lend.idle.sleeping.load(Ordering::SeqCst) {
                self.lend.notifier.notify();
            }
            self.state = LeaseState::Asked;
        }
        false
    }

    /// Put the reactor back (or withdraw the ask); `done`: the op this poll was for has its
    /// outcome (else its task parks, and the thread takes the reactor back at once).
    pub(crate) fn release(&mut self, done: bool) {
        match std::mem::replace(&mut self.state, LeaseState::Free) {
            LeaseState::Held => {}
            LeaseState::Asked => {
                self.lend.want.store(false, Ordering::Relaxed);
                return;
            }
            LeaseState::Free | LeaseState::Nested => return,
        }
        let Some(r) = inline::unhold(self.lend.rt) else { return };
        let lend = self.lend;
        if !done {
            lend.urgent.store(true, Ordering::Release);
        }
        lend.slot.put(r);
        lend.released.fetch_add(1, Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        if lend.orphaned.load(Ordering::SeqCst) {
            // The thread stopped without it: stop it here.
            if let Some(mut r) = lend.slot.try_take() {
                r.shutdown(SHUTDOWN_LIMIT);
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // An unwinding poll put the reactor back too; its op's outcome is unknown here.
        self.release(false);
    }
}
