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
use crate::base::wake::wake_guarded;

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
    /// Cells kept with both references, the future's and the reactor's (see [`OpCell::pair`]).
    static PAIRS: RefCell<Vec<(Arc<OpCell>, Arc<OpCell>)>> = const { RefCell::new(Vec::new()) };
    /// The cell of the op whose future this thread is polling right now (its address; 0:
    /// none), set by [`Polling`].
    static POLLING: Cell<usize> = const { Cell::new(0) };
    /// The reactor's reference to the cell of the op polled here, let go of by a turn inside
    /// that poll (see [`OpCell::let_go`]): the future takes it back with its own.
    static HANDED: RefCell<Option<Arc<OpCell>>> = const { RefCell::new(None) };
}

/// Cells kept per thread, and pairs.
const FREE_MAX: usize = 64;

/// Put `item` in this thread's `pool` for the next op, up to [`FREE_MAX`] (past it, or as the
/// thread ends, it is merely dropped).
fn keep<T: 'static>(pool: &'static std::thread::LocalKey<RefCell<Vec<T>>>, item: T) {
    let _ = pool.try_with(move |p| {
        let mut p = p.borrow_mut();
        if p.len() < FREE_MAX {
            p.push(item);
        }
    });
}

/// While it lives, this thread is polling the future of the op whose cell it names: a turn of
/// the reactor inside that poll (an op that spins for its outcome turns the lent reactor
/// itself) completes the cell with a plain store and hands the reactor's reference back
/// instead of dropping it. Nothing else can write the cell's state meanwhile: the future,
/// the only other party, is borrowed by that very poll. On a ping-pong's path that spares
/// each receive three locked instructions: the reactor's clone, the outcome's read-modify-
/// write and the release.
pub(crate) struct Polling(usize);

impl Polling {
    pub(crate) fn enter(cell: &OpCell) -> Polling {
        Polling(POLLING.replace(cell.addr()))
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        // The outer poll's, where a waker woken inside a turn polled another op here.
        POLLING.set(self.0);
    }
}

impl OpCell {
    pub(crate) fn new() -> Arc<OpCell> {
        FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten().unwrap_or_else(|| OpCell::fresh(None))
    }

    /// A cell and a second reference to it: the reactor's and the future's. Taken from the
    /// pairs an op polled here gave back whole (no reference count touched), else made.
    pub(crate) fn pair() -> (Arc<OpCell>, Arc<OpCell>) {
        PAIRS.try_with(|p| p.borrow_mut().pop()).ok().flatten().unwrap_or_else(|| {
            let c = OpCell::new();
            (c.clone(), c)
        })
    }

    fn addr(&self) -> usize {
        self as *const OpCell as usize
    }

    /// Is this the cell of the op this thread is polling now (see [`Polling`])?
    fn polled_here(&self) -> bool {
        POLLING.get() == self.addr()
    }

    /// The reactor is done with `cell` (its outcome recorded, or the op withdrawn). Inside
    /// the poll of the op's own future on this thread, the reference goes to that future
    /// (see [`Polling`]), else it is dropped.
    pub(crate) fn let_go(cell: Arc<OpCell>) {
        if cell.part.is_none() && cell.polled_here() && cell.is_done() {
            // A reference another op's turn left behind (its poll ended otherwise) is dropped.
            let _ = HANDED.try_with(|h| h.replace(Some(cell)));
        }
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
        if let Some(reactors) = OpCell::handed_back(&cell) {
            // Both references in hand and no other (none is ever weak): kept as a pair, for an
            // op that takes both again. Only a clean success, whose locks hold nothing.
            if Arc::strong_count(&cell) == 2 {
                // As below: ordered after whatever other holder let go of it last.
                std::sync::atomic::fence(Ordering::Acquire);
                if cell.reset_if_clean() {
                    keep(&PAIRS, (reactors, cell));
                    return;
                }
            }
        }
        // No weak reference to a cell is ever made, so a count of one means nobody else holds
        // it; the fence orders this after the reactor's release of it. Checked this way, not
        // with `Arc::get_mut`, which costs an atomic read-modify-write.
        if Arc::strong_count(&cell) != 1 || cell.part.is_some() {
            return;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if !cell.reset_if_clean() {
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
        keep(&FREE, cell);
    }

    /// Clear the state of a cell that succeeded without a waker (nothing in its locks to
    /// clear) for its next op; false, touching nothing, for any other.
    fn reset_if_clean(&self) -> bool {
        let state = self.state.load(Ordering::Relaxed);
        let clean = state & WAITING == 0 && state & OUTCOME != FAILED;
        if clean {
            self.state.store(0, Ordering::Relaxed);
        }
        clean
    }

    /// The reactor's reference to `cell`, where it was handed to this thread's poll (see
    /// [`let_go`](Self::let_go)); another cell's stays where it is.
    fn handed_back(cell: &Arc<OpCell>) -> Option<Arc<OpCell>> {
        HANDED
            .try_with(|h| {
                let mut h = h.borrow_mut();
                match &*h {
                    Some(r) if Arc::ptr_eq(r, cell) => h.take(),
                    _ => None,
                }
            })
            .ok()
            .flatten()
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
        // this sees how it waits. Inside the poll of the op's own future on this thread
        // nothing registers meanwhile (see `Polling`): a plain store does.
        let prev = if self.polled_here() {
            let prev = self.state.load(Ordering::Relaxed);
            self.state.store(prev | state, Ordering::Release);
            prev
        } else {
            self.state.fetch_or(state, Ordering::AcqRel)
        };
        debug_assert_eq!(prev & OUTCOME, 0, "an op completed twice");
        if prev & WAITING != 0 {
            let w = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = w {
                wake_guarded(w);
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

    fn ok(len: usize) -> Result<Done, Error> {
        Ok(Done { len, imm: None })
    }

    #[test]
    fn a_cell_completed_inside_its_own_poll_comes_back_whole_as_a_pair() {
        let (reactors, mine) = OpCell::pair();
        assert_eq!(Arc::strong_count(&mine), 2);
        {
            let _polling = Polling::enter(&mine);
            reactors.complete(ok(16));
            OpCell::let_go(reactors);
        }
        assert_eq!(mine.taken().map(|r| r.ok()), Some(Some(16)));
        assert_eq!(Arc::strong_count(&mine), 2, "the reactor's reference waits in this thread");
        let at = Arc::as_ptr(&mine);
        OpCell::recycle(mine);
        let (a, b) = OpCell::pair();
        assert!(std::ptr::eq(Arc::as_ptr(&a), at) && Arc::ptr_eq(&a, &b), "the same cell, both references");
        assert_eq!(Arc::strong_count(&a), 2);
        assert!(!a.is_done(), "fresh for the next op");
    }

    #[test]
    fn a_cell_completed_outside_its_poll_is_let_go_of_and_recycled_alone() {
        let (reactors, mine) = OpCell::pair();
        let other = OpCell::new();
        {
            // Another op's poll: this cell is not the one polled here.
            let _polling = Polling::enter(&other);
            reactors.complete(ok(8));
            OpCell::let_go(reactors);
        }
        assert_eq!(Arc::strong_count(&mine), 1, "the reactor's reference is dropped");
        assert_eq!(mine.taken().map(|r| r.ok()), Some(Some(8)));
        let at = Arc::as_ptr(&mine);
        OpCell::recycle(mine);
        assert!(std::ptr::eq(Arc::as_ptr(&OpCell::new()), at), "kept as a single cell");
    }

    #[test]
    fn a_waker_registered_in_an_earlier_poll_is_woken_by_a_completion_inside_the_next() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(std::sync::atomic::AtomicBool::new(false)));
        let (reactors, mine) = OpCell::pair();
        assert!(!mine.register(&Waker::from(flag.clone())));
        {
            let _polling = Polling::enter(&mine);
            reactors.complete(ok(4));
            OpCell::let_go(reactors);
        }
        assert!(flag.0.load(Ordering::SeqCst), "the registered waker is woken");
        assert_eq!(mine.taken().map(|r| r.ok()), Some(Some(4)));
        // Its lock held a waker: not kept as a pair, and the reactor's reference goes.
        OpCell::recycle(mine);
        assert!(HANDED.with_borrow(Option::is_none));
    }

    #[test]
    fn a_waker_that_panics_does_not_unwind_into_the_reactor_and_the_outcome_stands() {
        struct Bad;
        impl std::task::Wake for Bad {
            fn wake(self: Arc<Self>) {
                panic!("an executor with a bug");
            }
        }
        let (reactors, mine) = OpCell::pair();
        assert!(!mine.register(&Waker::from(Arc::new(Bad))));
        reactors.complete(ok(9));
        OpCell::let_go(reactors);
        assert_eq!(mine.taken().map(|r| r.ok()), Some(Some(9)));
    }

    #[test]
    fn polls_nested_in_a_turn_give_the_outer_poll_its_cell_back() {
        let (outer, inner) = (OpCell::new(), OpCell::new());
        let _o = Polling::enter(&outer);
        {
            let _i = Polling::enter(&inner);
            assert!(inner.polled_here() && !outer.polled_here());
        }
        assert!(outer.polled_here());
    }

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
