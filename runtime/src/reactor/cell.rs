//! The cell an op's future and the reactor share. The reactor writes the outcome once and wakes
//! the future; the future reads it. A success travels in atomics, and an op awaited directly by
//! an inline driver waits without a waker (it parks), so the latency path takes no lock; a
//! waker, an error, and the buffer of a future dropped while its op is posted sit behind locks.
//! The buffer itself stays in the future while the future lives (tokio-uring's lifecycle): the
//! cell holds it only once the future is gone ("Ignored").
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use crate::base::error::Error;

/// What a finished op reports besides its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub len: usize,
    pub imm: Option<u64>,
}

/// The outcome, in the low bits of the state: not yet, success, success with an immediate value,
/// failure (the error is in `rare`).
const OUTCOME: u8 = 0b11;
const OK: u8 = 1;
const OK_IMM: u8 = 2;
const FAILED: u8 = 3;
/// A waker is registered: the completion wakes it.
const WAITING: u8 = 4;
/// Polled by the inline driver of this thread with its own waker: the completion bumps a kick
/// count the driver watches instead ([`LOCAL_KICKS`] on the parker's thread, [`DRIVER_KICKS`]
/// elsewhere), with no waker.
const PARKED: u8 = 8;
/// The future was dropped before the outcome: what is not posted may be withdrawn. (Only a
/// cell fanned out to several reactors needs it said; for the others the reactor sees it is
/// the cell's only holder.)
const ABANDONED: u8 = 16;

/// Bumped by each completion of an op parked by another thread's inline driver: a driver that
/// sees it change polls its future again.
static DRIVER_KICKS: AtomicU64 = AtomicU64::new(0);

/// Hands out [`THREAD_TOKEN`]s.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Completions of ops this thread's driver parked, completed on this thread (the common
    /// case: the driver turns the reactor itself), counted without an atomic.
    static LOCAL_KICKS: Cell<u64> = const { Cell::new(0) };
    /// This thread's name in a cell's `parker` (0: not yet given one).
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// This thread's token, given on first use.
fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| match t.get() {
        0 => {
            let v = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
            t.set(v);
            v
        }
        v => v,
    })
}

/// The count an inline driver compares between polls: it changes with every completion of an
/// op it parked (and now and then with another thread's).
pub(crate) fn driver_kicks() -> u64 {
    DRIVER_KICKS.load(Ordering::Acquire).wrapping_add(LOCAL_KICKS.get())
}

pub(crate) struct OpCell {
    state: AtomicU8,
    /// The [`thread_token`] of the driver that parked the op, if one did: a completion on that
    /// thread kicks it without an atomic.
    parker: AtomicU64,
    len: AtomicUsize,
    imm: AtomicU64,
    waker: Mutex<Option<Waker>>,
    rare: Mutex<Rare>,
    /// A part of an op fanned out over several reactors: its outcome goes to the whole.
    part: Option<Part>,
}

/// One reactor's share of an op that spans rail groups.
struct Part {
    whole: Arc<Fan>,
    /// The index of the part's first batch piece in the whole batch.
    first_piece: usize,
}

/// An op fanned out over several reactors: the user's cell, completed once every part is.
/// Each part holds it, so the cell, and a dropped future's buffer in it, live until the last
/// part is let go of by its reactor.
pub(crate) struct Fan {
    cell: Arc<OpCell>,
    left: AtomicUsize,
    len: AtomicUsize,
    /// The first failure (for a batch, the one of the lowest piece).
    error: Mutex<Option<Error>>,
}

#[derive(Default)]
struct Rare {
    error: Option<Error>,
    /// The buffer of a future dropped while its op was posted: freed with the cell, that is
    /// once the reactor has let go of the op (its completion arrived, or it was withdrawn).
    orphan: Option<Box<dyn Any + Send>>,
}

thread_local! {
    /// Cells of ops resolved on this thread, for the next ops: an op then allocates nothing.
    static FREE: RefCell<Vec<Arc<OpCell>>> = const { RefCell::new(Vec::new()) };
}

/// Cells kept per thread.
const FREE_MAX: usize = 64;

impl OpCell {
    pub(crate) fn new() -> Arc<OpCell> {
        FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten().unwrap_or_else(|| OpCell::fresh(None))
    }

    fn fresh(part: Option<Part>) -> Arc<OpCell> {
        Arc::new(OpCell {
            state: AtomicU8::new(0),
            parker: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            imm: AtomicU64::new(0),
            waker: Mutex::new(None),
            rare: Mutex::new(Rare::default()),
            part,
        })
    }

    /// Cells for `firsts.len()` parts of `whole`'s op, part `i` starting at batch piece
    /// `firsts[i]`: `whole` completes once they all have.
    pub(crate) fn fan_out(whole: &Arc<OpCell>, firsts: &[usize]) -> Vec<Arc<OpCell>> {
        let fan = Arc::new(Fan {
            cell: whole.clone(),
            left: AtomicUsize::new(firsts.len()),
            len: AtomicUsize::new(0),
            error: Mutex::new(None),
        });
        firsts
            .iter()
            .map(|&first_piece| OpCell::fresh(Some(Part { whole: fan.clone(), first_piece })))
            .collect()
    }

    /// Is the op's future gone with the op unfinished, so that what is not posted may be
    /// withdrawn? `holders`: the references the reactor holds itself.
    pub(crate) fn abandoned(self: &Arc<Self>, holders: usize) -> bool {
        match &self.part {
            Some(p) => p.whole.cell.state.load(Ordering::Acquire) & ABANDONED != 0,
            None => Arc::strong_count(self) == holders,
        }
    }

    /// The future is gone before the outcome (see [`ABANDONED`]).
    pub(crate) fn abandon(&self) {
        self.state.fetch_or(ABANDONED, Ordering::AcqRel);
    }

    /// The op is over and its outcome taken: keep the cell for the next op on this thread, if
    /// nobody else holds it any more (else it is freed by the last holder, as usual).
    pub(crate) fn recycle(mut cell: Arc<OpCell>) {
        // No weak reference to a cell is ever made, so a count of one means nobody else holds
        // it; the fence orders this after the reactor's release of it. Checked this way, not
        // with `Arc::get_mut`, which costs an atomic read-modify-write.
        if Arc::strong_count(&cell) != 1 || cell.part.is_some() {
            return;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let state = cell.state.load(Ordering::Relaxed);
        if state & WAITING == 0 && state & OUTCOME != FAILED {
            // Succeeded without a waker: there is nothing in the locks to clear.
            cell.state.store(0, Ordering::Relaxed);
        } else {
            let Some(c) = Arc::get_mut(&mut cell) else {
                return;
            };
            *c.state.get_mut() = 0;
            *c.waker.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
            let rare = c.rare.get_mut().unwrap_or_else(|p| p.into_inner());
            if rare.error.is_some() || rare.orphan.is_some() {
                return;
            }
        }
        let _ = FREE.try_with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < FREE_MAX {
                f.push(cell);
            }
        });
    }

    fn rare(&self) -> std::sync::MutexGuard<'_, Rare> {
        self.rare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record the outcome and wake the future: once, by the reactor (or by the submitting
    /// thread when the runtime refuses the op).
    pub(crate) fn complete(&self, res: Result<Done, Error>) {
        if let Some(p) = &self.part {
            p.done(res);
            return;
        }
        let state = match res {
            Ok(Done { len, imm }) => {
                self.len.store(len, Ordering::Relaxed);
                match imm {
                    Some(v) => {
                        self.imm.store(v, Ordering::Relaxed);
                        OK_IMM
                    }
                    None => OK,
                }
            }
            Err(e) => {
                self.rare().error = Some(e);
                FAILED
            }
        };
        // Release: whoever sees the outcome sees the fields written before it. One read-modify-
        // write orders this against the future's registering: either it sees the outcome, or
        // this sees how it waits.
        let prev = self.state.fetch_or(state, Ordering::AcqRel);
        debug_assert_eq!(prev & OUTCOME, 0, "an op completed twice");
        if prev & WAITING != 0 {
            let w = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = w {
                w.wake();
            }
        }
        if prev & PARKED != 0 {
            // The fetch_or above saw the park, so it sees the token stored before it.
            if self.parker.load(Ordering::Relaxed) == thread_token() {
                LOCAL_KICKS.set(LOCAL_KICKS.get().wrapping_add(1));
            } else {
                DRIVER_KICKS.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// The outcome, once there, as the op's future takes it: the bytes moved, or the error
    /// (read once: it moves out). Two words, so it comes back in registers (a larger value
    /// returned through memory stalls the read that copies it on store forwarding).
    pub(crate) fn taken(&self) -> Option<Result<usize, Box<Error>>> {
        match self.state.load(Ordering::Acquire) & OUTCOME {
            0 => None,
            OK | OK_IMM => Some(Ok(self.len.load(Ordering::Relaxed))),
            _ => Some(Err(Box::new(self.rare().error.take().expect("an op's outcome is read once")))),
        }
    }

    /// The whole outcome, once there, with the immediate value (read once: an error moves out):
    /// [`taken`](Self::taken)'s, with the value beside the length.
    #[cfg(test)]
    pub(crate) fn outcome(&self) -> Option<Result<Done, Error>> {
        let imm = (self.state.load(Ordering::Acquire) & OUTCOME == OK_IMM)
            .then(|| self.imm.load(Ordering::Relaxed));
        Some(self.taken()?.map(|len| Done { len, imm }).map_err(|e| *e))
    }

    /// Has the outcome been recorded?
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) & OUTCOME != 0
    }

    /// Wake `w` when the outcome is recorded; true if it already is.
    pub(crate) fn register(&self, w: &Waker) -> bool {
        {
            let mut slot = self.waker.lock().unwrap_or_else(|p| p.into_inner());
            match &mut *slot {
                Some(old) if old.will_wake(w) => {}
                slot => *slot = Some(w.clone()),
            }
        }
        self.state.fetch_or(WAITING, Ordering::AcqRel) & OUTCOME != 0
    }

    /// Let the completion bump a kick count rather than wake anyone: for an op polled by this
    /// thread's inline driver with its own waker. True if the outcome is already in.
    pub(crate) fn park(&self) -> bool {
        self.parker.store(thread_token(), Ordering::Relaxed);
        self.state.fetch_or(PARKED, Ordering::AcqRel) & OUTCOME != 0
    }

    /// Keep the buffer of a future dropped while its op is posted until the reactor lets go.
    pub(crate) fn orphan(&self, buf: Box<dyn Any + Send>) {
        self.rare().orphan = Some(buf);
    }
}

impl Part {
    /// This part is over: add it to the whole, and complete the whole with the last part.
    fn done(&self, res: Result<Done, Error>) {
        let fan = &self.whole;
        match res {
            Ok(d) => {
                fan.len.fetch_add(d.len, Ordering::Relaxed);
            }
            Err(e) => {
                let e = match e {
                    Error::Batch { piece, source } => {
                        Error::Batch { piece: piece + self.first_piece, source }
                    }
                    e => e,
                };
                let mut first = fan.error.lock().unwrap_or_else(|p| p.into_inner());
                let lower = match (&*first, &e) {
                    (None, _) => true,
                    (Some(Error::Batch { piece: a, .. }), Error::Batch { piece: b, .. }) => b < a,
                    _ => false,
                };
                if lower {
                    *first = Some(e);
                }
            }
        }
        let left = fan.left.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(left > 0, "a part completed twice");
        if left == 1 {
            let e = fan.error.lock().unwrap_or_else(|p| p.into_inner()).take();
            let res = match e {
                Some(e) => Err(e),
                None => Ok(Done { len: fan.len.load(Ordering::Relaxed), imm: None }),
            };
            fan.cell.complete(res);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::error::OpKind;

    #[test]
    fn a_fanned_out_op_completes_with_its_last_part_and_names_the_whole_batch_piece() {
        let whole = OpCell::new();
        let parts = OpCell::fan_out(&whole, &[0, 10, 25]);
        parts[0].complete(Ok(Done { len: 100, imm: None }));
        let fail = |piece| Error::Batch { piece, source: Box::new(Error::invalid(OpKind::Write, "x")) };
        parts[2].complete(Err(fail(4)));
        assert!(!whole.is_done(), "two parts of three are in");
        parts[1].complete(Err(fail(3)));
        match whole.outcome() {
            Some(Err(Error::Batch { piece, .. })) => {
                assert_eq!(piece, 13, "the lowest failed piece, of the whole")
            }
            other => panic!("{other:?}"),
        }
        let whole = OpCell::new();
        let parts = OpCell::fan_out(&whole, &[0, 0]);
        parts[1].complete(Ok(Done { len: 7, imm: None }));
        assert!(!parts[0].abandoned(1), "the future holds the whole");
        whole.abandon();
        assert!(parts[0].abandoned(1), "its drop is seen by every part");
        parts[0].complete(Ok(Done { len: 5, imm: None }));
        assert!(matches!(whole.outcome(), Some(Ok(Done { len: 12, imm: None }))), "lengths add up");
    }
}
