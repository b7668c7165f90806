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
//!
//! While the reactor is out, the thread naps by default (`Builder::lend_nap`): it parks for
//! [`REHOLD`] at a time between its looks, and a task that parks with its op out, a command,
//! and a stop each unpark it (through [`LendWake`], the group's notifier, and the `sleeping`
//! flag the thread raises while it naps); a reactor left idle in the slot is taken back one or
//! two naps after its last put instead of one `REHOLD`. Asked to spin instead, it watches on a
//! core of its own. On 16 cores the two read the same single-op latencies within their
//! run-to-run spread (`scripts/device/spinners.sh`, and the heart check with each), so the
//! nap, which gives a task's driving a core instead of two, is the default.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::atomic::AtomicCell;
use crossbeam_utils::CachePadded;

use crate::base::transport::Notify;
use crate::driver::inline;
use crate::reactor::{Idle, Reactor, SHUTDOWN_LIMIT};

/// How long the reactor stays in the slot after a task put it back with its op done, before
/// the thread takes it back: longer than the gap between a ping-pong's ops, short enough that
/// an op sent through the queue meanwhile (which brings it back at once anyway) or a peer's
/// one-sided op waiting on this side's progress barely notices.
pub(crate) const REHOLD: Duration = Duration::from_micros(10);

/// How long a stopping thread waits for a task to put the reactor back.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(200);

/// What a task writes at every hold: the slot and the count of holds. On a cache line of its
/// own, which the lending thread reads once per [`REHOLD`]: a line it polled would cross
/// between the cores at every take and put (on 16 cores, shm, that cost about a third of a
/// 16 B ping-pong's round trip).
struct SlotLine {
    /// The reactor, while nobody holds it. Taking it and putting it back are one atomic swap
    /// each (a lock would be two): a ping-pong takes it three times a round trip per side.
    slot: AtomicCell<Option<Box<Reactor>>>,
    /// Bumped by each task that puts the reactor back (by the holder alone, so a store): the
    /// thread retakes it once this stops moving for [`REHOLD`].
    released: AtomicU64,
}

/// What the lending thread polls: written seldom (an ask, a park, a stop).
struct Flags {
    /// A task waits for the reactor the thread holds.
    want: AtomicBool,
    /// A task put the reactor back with its op still out (it parks): retake it now.
    urgent: AtomicBool,
    /// The stopping thread gave up waiting: whoever puts the reactor back shuts it down.
    orphaned: AtomicBool,
    /// Asks so far (a task's, rare on the fast path).
    asks: AtomicU64,
    /// Retakes so far (the thread's).
    retakes: AtomicU64,
}

/// The first group's reactor as its thread and spinning tasks share it.
pub(crate) struct Lend {
    line: CachePadded<SlotLine>,
    flags: CachePadded<Flags>,
    /// The runtime's id (the thread-local hold names reactors by it).
    rt: u64,
    idle: Arc<Idle>,
    notifier: Arc<dyn Notify>,
    /// The thread parks between its looks while the reactor is out (see the module's doc).
    nap: bool,
    /// The lending thread, to unpark; set as it starts.
    thread: std::sync::OnceLock<std::thread::Thread>,
}

/// The notifier of a lending group whose thread naps: the transport's, and the thread's unpark
/// for while it naps with the reactor lent out (it has no transport to wait on then).
pub(crate) struct LendWake {
    pub transport: Arc<dyn Notify>,
    pub lend: Arc<Lend>,
}

impl Notify for LendWake {
    fn notify(&self) {
        self.transport.notify();
        self.lend.wake();
    }
}

impl Lend {
    /// The lending side of runtime `rt`'s first group, whose flags are `idle`.
    /// `nap`: park between looks while the reactor is out, instead of spinning.
    pub(crate) fn new(rt: u64, idle: Arc<Idle>, notifier: Arc<dyn Notify>, nap: bool) -> Lend {
        Lend {
            line: CachePadded::new(SlotLine { slot: AtomicCell::new(None), released: AtomicU64::new(0) }),
            flags: CachePadded::new(Flags {
                want: AtomicBool::new(false),
                urgent: AtomicBool::new(false),
                orphaned: AtomicBool::new(false),
                asks: AtomicU64::new(0),
                retakes: AtomicU64::new(0),
            }),
            rt,
            idle,
            notifier,
            nap,
            thread: std::sync::OnceLock::new(),
        }
    }

    /// The lending thread names itself, for [`wake`](Self::wake).
    pub(crate) fn set_thread(&self, t: std::thread::Thread) {
        let _ = self.thread.set(t);
    }

    /// Does the thread nap while the reactor is out?
    pub(crate) fn naps(&self) -> bool {
        self.nap
    }

    /// Unpark a napping thread (where it naps at all: an unpark of a thread not parked leaves
    /// it a token, and its next nap ends at once).
    pub(crate) fn wake(&self) {
        if self.nap {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// The thread's wait between two looks while the reactor is out: a spin, or a nap that
    /// whatever needs the thread ends early.
    fn pause(&self) {
        if !self.nap {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            return;
        }
        let (idle, flags) = (&*self.idle, &*self.flags);
        // Raised first, then looked past once more: a submitter either sees it and notifies
        // (which unparks), or its command is counted already (both sides order their store
        // before their look). It stays raised from nap to nap, and `lend_out` lowers it as it
        // returns: `sleeping` shares its line with `commands` and `shutdown`, which a task
        // turning the lent reactor reads at every turn, and two stores a nap would take that
        // line from the task's core every `REHOLD`.
        if !idle.sleeping.load(Ordering::Relaxed) {
            idle.sleeping.store(true, Ordering::SeqCst);
        }
        let due = flags.urgent.load(Ordering::SeqCst)
            || idle.commands.load(Ordering::SeqCst) > 0
            || idle.shutdown.load(Ordering::SeqCst);
        if !due {
            std::thread::park_timeout(REHOLD);
        }
    }

    /// The thread's side: a task wants the reactor? (SeqCst: about to sleep, the thread sets
    /// its sleeping flag and then looks here, while the task raises `want` and then looks at
    /// that flag.)
    pub(crate) fn wanted(&self) -> bool {
        self.flags.want.load(Ordering::SeqCst)
    }

    /// The thread's side: put `reactor` in the slot and wait until it is due back (see the
    /// module's doc); `None` when stopping and a task still holds it.
    pub(crate) fn lend_out(&self, reactor: Box<Reactor>) -> Option<Box<Reactor>> {
        let back = self.lent(reactor);
        if self.nap {
            // Raised by `pause` for the whole lend: the thread is awake from here.
            self.idle.sleeping.store(false, Ordering::SeqCst);
        }
        back
    }

    /// `lend_out`'s wait, with `sleeping` left as its naps raised it.
    fn lent(&self, reactor: Box<Reactor>) -> Option<Box<Reactor>> {
        let (idle, flags, line) = (&*self.idle, &*self.flags, &*self.line);
        flags.urgent.store(false, Ordering::Relaxed);
        line.slot.store(Some(reactor));
        let mut seen = line.released.load(Ordering::Acquire);
        // When `released` was last seen to move (or the slot last found empty).
        let mut quiet = Instant::now();
        loop {
            self.pause();
            if idle.shutdown.load(Ordering::Acquire) {
                return self.retake_to_stop();
            }
            let now = Instant::now();
            let at_once = flags.urgent.load(Ordering::Acquire) || idle.commands.load(Ordering::Acquire) > 0;
            if !at_once {
                // The tasks' line, looked at once per window only.
                if now.duration_since(quiet) < REHOLD {
                    continue;
                }
                let moved = line.released.load(Ordering::Acquire);
                if moved != seen {
                    (seen, quiet) = (moved, now);
                    continue;
                }
            }
            if !self.wanted() {
                match line.slot.take() {
                    Some(r) => {
                        flags.retakes.fetch_add(1, Ordering::Relaxed);
                        return Some(r);
                    }
                    // A task has it: look again a window later (or when it parks).
                    None => quiet = now,
                }
            }
        }
    }

    /// Take the reactor back to stop it, waiting a while for a task to put it back.
    fn retake_to_stop(&self) -> Option<Box<Reactor>> {
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while Instant::now() < deadline {
            if let Some(r) = self.line.slot.take() {
                return Some(r);
            }
            std::thread::yield_now();
        }
        // Before the swap below: a task's put that swaps after it sees the flag (see `release`).
        self.flags.orphaned.store(true, Ordering::Relaxed);
        self.line.slot.take()
    }

    /// Is the runtime stopping? (Its thread then wants the reactor back to stop it.)
    pub(crate) fn stopping(&self) -> bool {
        self.idle.shutdown.load(Ordering::Acquire)
    }

    /// Put `r` in the slot, as the thread lends it out (tests without a lending thread).
    #[cfg(test)]
    pub(crate) fn put_for_test(&self, r: Box<Reactor>) {
        self.line.slot.store(Some(r));
    }

    /// Take the reactor out of the slot, if it is there (tests without a lending thread).
    #[cfg(test)]
    pub(crate) fn take_for_test(&self) -> Option<Box<Reactor>> {
        self.line.slot.take()
    }

    /// Holds tasks have taken so far.
    pub(crate) fn holds(&self) -> u64 {
        self.line.released.load(Ordering::Relaxed)
    }

    /// Asks tasks have made so far.
    pub(crate) fn asks(&self) -> u64 {
        self.flags.asks.load(Ordering::Relaxed)
    }

    /// Times the thread took the reactor back so far.
    pub(crate) fn retakes(&self) -> u64 {
        self.flags.retakes.load(Ordering::Relaxed)
    }

    /// A task's hold, not yet taken.
    pub(crate) fn lease(&self) -> Lease<'_> {
        Lease { lend: self, state: LeaseState::Free }
    }

    /// A lease that goes on from `standing`, which a lease on this same `Lend` left off (see
    /// [`Lease::detach`]).
    pub(crate) fn lease_at(&self, standing: Standing) -> Lease<'_> {
        debug_assert!(
            standing.0 == LeaseState::Free || std::ptr::eq(standing.1, self),
            "a standing goes on only on the lend it was taken on"
        );
        Lease { lend: self, state: standing.0 }
    }
}

/// Where a detached [`Lease`] left off, to go on in another lease on the same [`Lend`]: an op's
/// first poll holds the reactor through the runtime's reference to the lend, and goes on
/// through the op's own once it is pending (a clone made only then: a small send that
/// finishes as it is posted touches no reference count).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Standing(LeaseState, *const Lend);

impl Standing {
    /// Neither held nor asked for.
    pub(crate) const FREE: Standing = Standing(LeaseState::Free, std::ptr::null());

    /// Neither held nor asked for: nothing to go on with.
    pub(crate) fn is_free(self) -> bool {
        self.0 == LeaseState::Free
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
    /// End this lease without putting anything back: what it holds or asked for goes on in
    /// the lease [`Lend::lease_at`] makes of the standing returned. (Dropped instead, a
    /// standing that holds the reactor would keep it from its thread for good.)
    pub(crate) fn detach(mut self) -> Standing {
        let state = std::mem::replace(&mut self.state, LeaseState::Free);
        Standing(state, self.lend)
    }

    /// Does this lease hold the reactor (or sit in a hold of this thread's)? For a hold kept
    /// across other code's polls (a `block_on`'s): an op that parked inside it put the reactor
    /// back (see [`release`](Self::release)), and the lease is then free again.
    pub(crate) fn held(&mut self) -> bool {
        if matches!(self.state, LeaseState::Held | LeaseState::Nested) && !inline::holds(self.lend.rt) {
            self.state = LeaseState::Free;
        }
        matches!(self.state, LeaseState::Held | LeaseState::Nested)
    }

    /// Does this lease sit in a hold of this thread's it did not take (a keeping `block_on`'s)?
    pub(crate) fn is_nested(&self) -> bool {
        self.state == LeaseState::Nested
    }

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
        if let Some(r) = self.lend.line.slot.take() {
            return match inline::hold_taken(self.lend.rt, r) {
                Ok(()) => {
                    if self.state == LeaseState::Asked {
                        self.lend.flags.want.store(false, Ordering::Relaxed);
                    }
                    self.state = LeaseState::Held;
                    true
                }
                // Inside a turn of a reactor this thread holds: not here.
                Err(r) => {
                    self.lend.line.slot.store(Some(r));
                    false
                }
            };
        }
        // `want` is one flag for every asking task, and the first to take the reactor lowers
        // it: a task still asking raises it again, or the thread, once it took the reactor
        // back, would never hear of it.
        let asking = match self.state {
            LeaseState::Free => true,
            LeaseState::Asked => !self.lend.flags.want.load(Ordering::Relaxed),
            _ => false,
        };
        if ask && asking {
            self.lend.flags.want.store(true, Ordering::SeqCst);
            self.lend.flags.asks.fetch_add(1, Ordering::Relaxed);
            if self.lend.idle.sleeping.load(Ordering::SeqCst) {
                self.lend.notifier.notify();
            }
            self.state = LeaseState::Asked;
        }
        false
    }

    /// Put the reactor back (or withdraw the ask); `done`: the op this poll was for has its
    /// outcome (else its task parks, and the thread takes the reactor back at once).
    ///
    /// A nested lease (inside a hold a `block_on` keeps across its future's polls) puts the
    /// reactor back too where `done` is false: its op's poll says so when whatever polled it
    /// may park this thread (another executor's `block_on` nested in ours), which would leave
    /// the reactor unturned with the op's completion in it.
    pub(crate) fn release(&mut self, done: bool) {
        match std::mem::replace(&mut self.state, LeaseState::Free) {
            LeaseState::Held => {}
            LeaseState::Nested if !done => {}
            LeaseState::Asked => {
                self.lend.flags.want.store(false, Ordering::Relaxed);
                return;
            }
            LeaseState::Free | LeaseState::Nested => return,
        }
        let Some(r) = inline::unhold(self.lend.rt) else { return };
        let lend = self.lend;
        if !done {
            lend.flags.urgent.store(true, Ordering::SeqCst);
        }
        let n = lend.line.released.load(Ordering::Relaxed);
        lend.line.released.store(n + 1, Ordering::Release);
        // A swap (acquire and release): should the stopping thread's last take, a swap too,
        // come before it, this one reads what that wrote, and so sees the flag set before it.
        lend.line.slot.store(Some(r));
        if !done {
            // Its task parks: the thread turns the reactor from now on.
            lend.wake();
        }
        if lend.flags.orphaned.load(Ordering::Relaxed) {
            // The thread stopped without it: stop it here.
            if let Some(mut r) = lend.line.slot.take() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_is_one_atomic_word() {
        // Else AtomicCell falls back to a lock, and a take and a put cost four atomics again.
        assert!(AtomicCell::<Option<Box<Reactor>>>::is_lock_free());
    }

    struct Quiet;
    impl Notify for Quiet {
        fn notify(&self) {}
    }

    #[test]
    fn a_detached_hold_goes_on_in_the_lease_made_of_it_and_goes_back_once() {
        use crate::reactor::tests::{rig, split_config};
        let rig = rig(split_config(8), 1);
        let (rt, idle) = (u64::MAX - 7, rig.idle.clone());
        let lend = Lend::new(rt, idle, Arc::new(Quiet), false);
        lend.line.slot.store(Some(Box::new(rig.r)));
        let mut first = lend.lease();
        assert!(first.hold(false), "the reactor was in the slot");
        let standing = first.detach();
        assert!(inline::holds(rt), "detaching puts nothing back");
        assert_eq!(lend.holds(), 0);
        let mut next = lend.lease_at(standing);
        assert!(next.hold(false), "the hold goes on");
        next.release(true);
        assert!(!inline::holds(rt));
        assert_eq!(lend.holds(), 1, "put back once");
        drop(next);
        assert_eq!(lend.holds(), 1, "a released lease puts back nothing more");
        let free = lend.lease_at(Standing::FREE);
        drop(free);
        let reactor = lend.line.slot.take().expect("the reactor is back in the slot");
        drop((reactor, rig.script, rig.told, rig.mem, rig.tx));
    }

    #[test]
    fn a_task_still_asking_asks_again_once_another_took_the_reactor_and_lowered_the_flag() {
        use crate::reactor::tests::{rig, split_config};
        let rig = rig(split_config(8), 1);
        let rt = u64::MAX - 9;
        let lend = Lend::new(rt, rig.idle.clone(), Arc::new(Quiet), false);
        // The thread holds the reactor; two tasks ask for it.
        let (mut a, mut b) = (lend.lease(), lend.lease());
        assert!(!a.hold(true) && !b.hold(true));
        assert!(lend.wanted());
        assert_eq!(lend.asks(), 2);
        // The thread lends it out; the first task takes it, lowering the flag, and puts it back.
        lend.line.slot.store(Some(Box::new(rig.r)));
        assert!(a.hold(true));
        assert!(!lend.wanted());
        a.release(true);
        // The thread takes it back before the second task looks: that task asks again.
        let r = lend.line.slot.take().expect("put back");
        assert!(!b.hold(true));
        assert!(lend.wanted(), "the task still asking raised the flag again");
        assert_eq!(lend.asks(), 3);
        b.release(true);
        assert!(!lend.wanted(), "a withdrawn ask lowers it");
        drop((r, rig.script, rig.told, rig.mem, rig.tx));
    }

    #[test]
    fn a_napping_thread_takes_its_reactor_back_when_the_task_parks_and_when_it_lies_idle() {
        use crate::reactor::tests::{rig, split_config};
        use std::sync::mpsc;
        let rig = rig(split_config(8), 1);
        let rt = u64::MAX - 8;
        let lend = Arc::new(Lend::new(rt, rig.idle.clone(), Arc::new(Quiet), true));
        // The lending thread: lends the reactor out twice, each time a task asks for it (as
        // the reactor thread does: a reactor put out unasked would be taken back after one
        // nap, before a test thread slowed by a loaded host gets to it), saying when each
        // lend ends.
        let (back_tx, back) = mpsc::channel();
        let thread = {
            let lend = lend.clone();
            std::thread::spawn(move || {
                lend.set_thread(std::thread::current());
                let mut r = Box::new(rig.r);
                for _ in 0..2 {
                    let t0 = Instant::now();
                    while !lend.wanted() {
                        assert!(t0.elapsed() < Duration::from_secs(5), "a task asks for the reactor");
                        std::thread::yield_now();
                    }
                    r = lend.lend_out(r).expect("not stopping");
                    back_tx.send(Instant::now()).expect("the test listens");
                }
                drop(r);
            })
        };
        let within = Duration::from_secs(5);
        // A task's hold, once the thread has put the reactor out.
        let take = || {
            let (t0, mut lease) = (Instant::now(), lend.lease());
            while !lease.hold(true) {
                assert!(t0.elapsed() < within, "the reactor came out");
                std::thread::yield_now();
            }
            lease
        };
        // A task takes it, holds it while the thread naps, and parks with its op out.
        let mut lease = take();
        std::thread::sleep(Duration::from_millis(30));
        assert!(back.try_recv().is_err(), "the thread waits while a task holds it");
        let parked = Instant::now();
        lease.release(false);
        let retaken = back.recv_timeout(within).expect("the thread took it back");
        assert!(retaken >= parked);
        // Out again, taken and put back done, then left idle in the slot: taken back after a
        // nap or two.
        let mut lease = take();
        lease.release(true);
        drop(lease);
        back.recv_timeout(within).expect("the idle reactor was taken back");
        thread.join().expect("the lending thread ends");
        assert_eq!(lend.holds(), 2);
        drop((rig.script, rig.told, rig.mem, rig.tx));
    }
}
