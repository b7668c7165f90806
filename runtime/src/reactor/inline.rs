//! The inline driver's hold on its reactor. The reactor of a runtime built with
//! `Driver::Inline` waits in a [`Slot`] of the runtime; a thread running `block_on` takes it
//! out into a thread-local hold for as long as it drives, so that its turns, and the ops its
//! future posts, reach the reactor with no lock (a lock taken and released per op and per
//! turn sat on a ping-pong's latency path). Another thread finds the slot empty and sends its
//! ops through the submission queue, which the holder takes in; a stop from another thread
//! waits for the holder to see it.
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
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Run `f` on runtime `rt`'s reactor, handing it `v`, if this thread holds the reactor (and is
/// not inside a turn of it already); else give `v` back.
pub(crate) fn with_held<V, R>(rt: u64, v: V, f: impl FnOnce(&mut Reactor, V) -> R) -> Result<R, V> {
    HELD.with(|h| {
        let Ok(mut h) = h.try_borrow_mut() else { return Err(v) };
        match h.as_mut() {
            Some(held) if held.rt == rt => Ok(f(&mut held.reactor, v)),
            _ => Err(v),
        }
    })
}

/// Does this thread hold runtime `rt`'s reactor?
fn holds(rt: u64) -> bool {
    HELD.with(|h| h.try_borrow().is_ok_and(|h| h.as_ref().is_some_and(|held| held.rt == rt)))
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
    /// nested `block_on` finds it held already). Dropping the hold puts back what it took, and
    /// what this thread held before: the reactor of another runtime whose `block_on` this one
    /// is nested in, which nobody turns meanwhile.
    pub(crate) fn hold(&self, rt: u64) -> Hold<'_> {
        let mut hold = Hold { slot: self, rt, took: false, outer: None };
        if !holds(rt) {
            hold.outer = HELD.with(|h| h.try_borrow_mut().ok().and_then(|mut h| h.take()));
            hold.retake();
        }
        hold
    }
}

/// A `block_on`'s hold on its runtime's reactor (see [`Slot::hold`]).
pub(crate) struct Hold<'a> {
    slot: &'a Slot,
    rt: u64,
    /// This hold took the reactor from the slot, and puts it back.
    took: bool,
    outer: Option<Held>,
}

impl Hold<'_> {
    /// Take the reactor if it is back in the slot (another thread's `block_on` held it);
    /// true if this thread holds it now.
    pub(crate) fn retake(&mut self) -> bool {
        if holds(self.rt) {
            return true;
        }
        let Some(reactor) = self.slot.lock().take() else { return false };
        HELD.with(|h| match h.try_borrow_mut() {
            Ok(mut h) if h.is_none() => {
                *h = Some(Held { rt: self.rt, reactor });
                self.took = true;
                true
            }
            // Not reachable: the hold is taken outside any turn, with the outer reactor set
            // aside. Should it be, the reactor goes back rather than be lost.
            _ => {
                *self.slot.lock() = Some(reactor);
                false
            }
        })
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        HELD.with(|h| {
            let Ok(mut h) = h.try_borrow_mut() else { return };
            if self.took && h.as_ref().is_some_and(|held| held.rt == self.rt) {
                if let Some(held) = h.take() {
                    *self.slot.lock() = Some(held.reactor);
                }
            }
            if let Some(outer) = self.outer.take() {
                *h = Some(outer);
            }
        });
    }
}
