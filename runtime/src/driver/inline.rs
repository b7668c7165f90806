//! The inline driver's hold on its reactor. The reactor of a runtime built with
//! `Driver::Inline` waits in a [`Slot`] of the runtime; a thread running `block_on` takes it
//! out into a thread-local hold for as long as it drives, so that its turns, and the ops its
//! future posts, reach the reactor with no lock (a lock taken and released per op and per
//! turn sat on a ping-pong's latency path). Another thread finds the slot empty and sends its
//! ops through the submission queue, which the holder takes in; a stop from another thread
//! waits for the holder to see it. A thread may hold several runtimes' reactors (a `block_on`
//! nested in another runtime's): its driving loop turns them all.
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll, Wake, Waker};

use crate::reactor::cell::driver_kicks;
use crate::reactor::{Idle, Reactor, SHUTDOWN_LIMIT};

/// Where an inline reactor waits while no `block_on` holds it.
pub(crate) struct Slot(Mutex<Option<Box<Reactor>>>);

/// A reactor this thread holds, and the runtime it belongs to.
struct Held {
    rt: u64,
    reactor: Box<Reactor>,
}

thread_local! {
    /// Reactors this thread holds (one, mostly). Reached with `try_with`: a runtime kept in
    /// another thread-local may be dropped, and stopped, after this one is gone.
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on runtime `rt`'s reactor, handing it `v`, if this thread holds the reactor (and is
/// not inside a turn of one already); else give `v` back.
pub(crate) fn with_held<V, R>(rt: u64, v: V, f: impl FnOnce(&mut Reactor, V) -> R) -> Result<R, V> {
    let mut v = Some(v);
    let done = HELD.try_with(|h| {
        let mut h = h.try_borrow_mut().ok()?;
        let held = h.iter_mut().find(|held| held.rt == rt)?;
        Some(f(&mut held.reactor, v.take()?))
    });
    match (done, v) {
        (Ok(Some(r)), _) => Ok(r),
        (_, Some(v)) => Err(v),
        (_, None) => unreachable!("the value goes to `f` only when it runs"),
    }
}

/// One turn of each reactor this thread holds, runtime `rt`'s through `f`; false when this
/// thread does not hold `rt`'s.
pub(crate) fn turn_held(rt: u64, f: impl FnOnce(&mut Reactor)) -> bool {
    HELD.try_with(|h| {
        let Ok(mut h) = h.try_borrow_mut() else { return false };
        let (mut f, mut mine) = (Some(f), false);
        for held in h.iter_mut() {
            match (held.rt == rt, f.take()) {
                (true, Some(f)) => {
                    f(&mut held.reactor);
                    mine = true;
                }
                (_, back) => {
                    f = back;
                    held.reactor.turn();
                }
            }
        }
        mine
    })
    .unwrap_or(false)
}

/// Does this thread hold runtime `rt`'s reactor?
pub(crate) fn holds(rt: u64) -> bool {
    HELD.try_with(|h| h.try_borrow().is_ok_and(|h| h.iter().any(|held| held.rt == rt))).unwrap_or(false)
}

/// Hold `reactor`, runtime `rt`'s, on this thread (a lent reactor, see `lend`); it comes back
/// where this thread is inside a turn of a held reactor.
pub(crate) fn hold_taken(rt: u64, reactor: Box<Reactor>) -> Result<(), Box<Reactor>> {
    let mut reactor = Some(reactor);
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            if let Some(r) = reactor.take() {
                h.push(Held { rt, reactor: r });
            }
        }
    });
    match reactor {
        None => Ok(()),
        Some(r) => Err(r),
    }
}

/// Stop holding runtime `rt`'s reactor on this thread, and hand it over.
pub(crate) fn unhold(rt: u64) -> Option<Box<Reactor>> {
    HELD.try_with(|h| {
        let mut h = h.try_borrow_mut().ok()?;
        let i = h.iter().position(|held| held.rt == rt)?;
        Some(h.swap_remove(i).reactor)
    })
    .ok()
    .flatten()
}

impl Slot {
    pub(crate) fn new(reactor: Reactor) -> Slot {
        Slot(Mutex::new(Some(Box::new(reactor))))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Box<Reactor>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on runtime `rt`'s reactor where this thread can reach it now: held by this
    /// thread, or waiting in the slot. `None` while another thread holds it (or has the slot
    /// locked for a moment).
    pub(crate) fn with<R>(&self, rt: u64, f: impl FnOnce(&mut Reactor) -> R) -> Option<R> {
        let f = match with_held(rt, f, |r, f| f(r)) {
            Ok(r) => return Some(r),
            Err(f) => f,
        };
        let mut slot = match self.0.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        slot.as_deref_mut().map(f)
    }

    /// Hold runtime `rt`'s reactor on this thread for a `block_on`, if it is in the slot (a
    /// nested `block_on` finds it held already). Dropping the hold puts back what it took.
    pub(crate) fn hold(&self, rt: u64) -> Hold<'_> {
        let mut hold = Hold { slot: self, rt, took: false };
        hold.retake();
        hold
    }
}

/// A `block_on`'s hold on its runtime's reactor (see [`Slot::hold`]).
pub(crate) struct Hold<'a> {
    slot: &'a Slot,
    rt: u64,
    /// This hold took the reactor from the slot, and puts it back.
    took: bool,
}

impl Hold<'_> {
    /// Take the reactor if it is back in the slot (another thread's `block_on` held it);
    /// true if this thread holds it now.
    pub(crate) fn retake(&mut self) -> bool {
        if holds(self.rt) {
            return true;
        }
        let Some(reactor) = self.slot.lock().take() else { return false };
        let mut reactor = Some(reactor);
        let kept = HELD.try_with(|h| {
            let Ok(mut h) = h.try_borrow_mut() else { return false };
            if let Some(reactor) = reactor.take() {
                h.push(Held { rt: self.rt, reactor });
            }
            true
        });
        self.took |= kept == Ok(true);
        // Not held after all (the hold is taken outside any turn, so this is not expected):
        // the reactor goes back rather than be lost.
        if let Some(reactor) = reactor {
            *self.slot.lock() = Some(reactor);
        }
        kept == Ok(true)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if !self.took {
            return;
        }
        let held = HELD.try_with(|h| {
            let mut h = h.try_borrow_mut().ok()?;
            let i = h.iter().position(|held| held.rt == self.rt)?;
            Some(h.swap_remove(i))
        });
        if let Ok(Some(held)) = held {
            *self.slot.lock() = Some(held.reactor);
        }
    }
}

thread_local! {
    /// This thread is inside an inline driver's `block_on`.
    static DRIVING: Cell<bool> = const { Cell::new(false) };
    /// The runtime this thread drives inline right now, and its driver's waker.
    static DRIVER: RefCell<Option<(u64, Waker)>> = const { RefCell::new(None) };
    /// An op polled now may still turn the reactor in this poll of the driver's future.
    static REAP_IN_POLL: Cell<bool> = const { Cell::new(false) };
    /// Op polls left to the driver's future in this poll (see `coop_proceed`).
    static BUDGET: Cell<u32> = const { Cell::new(POLL_BUDGET) };
}

/// Op polls per poll of an inline driver's future before ops start to yield (tokio's budget).
const POLL_BUDGET: u32 = 128;

/// What `block_on` found in the thread's driver state, put back when it returns or unwinds.
pub(crate) struct Driving {
    outer: bool,
    outer_driver: Option<(u64, Waker)>,
    /// An outer driver's poll in progress keeps its reap and budget.
    reap: bool,
    budget: u32,
}

impl Driving {
    /// Not an inline driver's poll: no reactor of ours is driven by this thread's loop, so
    /// no inline budget is spent here.
    pub(crate) fn elsewhere() -> Driving {
        Driving::enter(false, None)
    }

    /// Set this thread's driver state (`driver`: the runtime id and waker of an inline driver
    /// now polling); the guard restores the outer state when dropped.
    fn enter(driving: bool, driver: Option<(u64, Waker)>) -> Driving {
        Driving {
            outer: DRIVING.replace(driving),
            outer_driver: DRIVER.replace(driver),
            reap: REAP_IN_POLL.get(),
            budget: BUDGET.get(),
        }
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        DRIVING.set(self.outer);
        DRIVER.set(self.outer_driver.take());
        REAP_IN_POLL.set(self.reap);
        BUDGET.set(self.budget);
    }
}

/// The inline driver's waker: marks the future as worth polling again.
struct Flag(AtomicBool);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// Run `fut` to completion on this thread, driving the reactor in `slot` (of runtime `id`,
/// whose flags are `idle`) between its polls, busy-polling.
pub(crate) fn block_on<F: Future>(slot: &Slot, id: u64, idle: &Idle, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    // Restores the thread's driver state however this returns, a panic included.
    let _driving = Driving::enter(true, Some((id, waker.clone())));
    // The reactor stays on this thread until this returns (see `inline`).
    let mut hold = slot.hold(id);
    let mut kicks = driver_kicks();
    loop {
        // Poll only when woken, or when a parked op completed (the count is this thread's
        // plus one all threads share, so an extra poll now and then): between those the
        // loop is the reactor's alone.
        let now = driver_kicks();
        let woken = flag.0.load(Ordering::Relaxed) && flag.0.swap(false, Ordering::Acquire);
        if woken || now != kicks {
            kicks = now;
            REAP_IN_POLL.set(true);
            BUDGET.set(POLL_BUDGET);
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
        }
        // Every reactor this thread holds turns (an outer `block_on`'s too, should this
        // one be nested in another runtime's).
        let turned = turn_held(id, |r| {
            if idle.shutdown.load(Ordering::Relaxed) {
                // A stop from another thread waits for this (it finds the slot empty).
                r.shutdown(SHUTDOWN_LIMIT);
            }
            r.turn();
        });
        // Another thread's `block_on` holds it: take it once it is back.
        if !turned && !hold.retake() {
            std::hint::spin_loop();
        }
    }
}

/// Run `fut` to completion on this thread, parked until woken: no reactor of ours is driven
/// here, even nested in an inline driver's poll, so that driver's budget must not be spent
/// (and, spent, make every op yield) where it never resets.
pub(crate) fn block_on_elsewhere<F: Future>(fut: F) -> F::Output {
    let _outer = Driving::elsewhere();
    futures::executor::block_on(fut)
}

/// An op posted now may turn the reactor in this poll of the driver's future: true once per
/// poll (see [`turn_inline`]).
pub(crate) fn take_reap() -> bool {
    REAP_IN_POLL.replace(false)
}

/// On the thread inside this runtime's inline `block_on`, with nobody else turning: one
/// turn of the reactor now, at most once per poll of the driver's future. False where that
/// is not the case.
/// (`rt`: the runtime's id.)
pub(crate) fn turn_inline(rt: u64) -> bool {
    // Once per poll: a future looping over ops that keep completing as they are polled
    // would otherwise never return, starving whatever it is joined with.
    REAP_IN_POLL.replace(false) && with_held(rt, (), |r, ()| r.turn()).is_ok()
}

/// Is `cx` the waker of runtime `rt`'s inline driver on this thread? An op polled with it
/// needs no waker of its own: the driver polls again when a parked op completes.
pub(crate) fn drives_here(rt: u64, cx: &Context<'_>) -> bool {
    DRIVER.with_borrow(|d| matches!(d, Some((id, w)) if *id == rt && cx.waker().will_wake(w)))
}

/// Inside an inline driver's `block_on`: spend one unit of the budget of op polls the
/// driver's future gets per poll; false when it is spent (the op then yields, so a future
/// looping over ops that complete at once still lets what it is joined with run).
pub(crate) fn coop_proceed() -> bool {
    if !DRIVING.get() {
        return true;
    }
    let left = BUDGET.get();
    BUDGET.set(left.saturating_sub(1));
    left > 0
}
