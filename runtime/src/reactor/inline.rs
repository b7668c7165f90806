//! The inline driver's hold on its reactor. The reactor of a runtime built with
//! `Driver::Inline` waits in a [`Slot`] of the runtime; a thread running `block_on` takes it
//! out into a thread-local hold for as long as it drives, so that its turns, and the ops its
//! future posts, reach the reactor with no lock (a lock taken and released per op and per
//! turn sat on a ping-pong's latency path). Another thread finds the slot empty and sends its
//! ops through the submission queue, which the holder takes in; a stop from another thread
//! waits for the holder to see it. A thread may hold several runtimes' reactors (a `block_on`
//! nested in another runtime's): its driving loop turns them all.
use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, TryLockError};

use super::Reactor;

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
fn holds(rt: u64) -> bool {
    HELD.try_with(|h| h.try_borrow().is_ok_and(|h| h.iter().any(|held| held.rt == rt))).unwrap_or(false)
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
