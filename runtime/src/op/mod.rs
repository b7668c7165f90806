//! The op lifecycle (tokio-uring's, across threads). The future keeps its buffer; the reactor
//! holds the op's [`cell`] from submission until the completion arrives. If the future is
//! dropped while the op is posted, the buffer moves into the cell, which the reactor keeps until
//! the completion (io_uring's "Ignored" state); if the op was never posted, the reactor sees it
//! is the cell's only holder and withdraws it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::base::error::{BufResult, Error};
use crate::base::probe::{self, Stage};
use crate::base::sched::{Class, TenantId};
use crate::buf::IoBuf;
use crate::driver::handoff::{self, AwaitSpin};
use crate::driver::inline;
use crate::driver::lend::{Lease, Lend, Standing};
use crate::driver::lent_block_on;
use crate::reactor::cell::{OpCell, Polling};
use crate::reactor::cmd::Draft;
use crate::reactor::AtOnce;
use crate::runtime::Runtime;

mod staged;

use staged::StagedOp;

/// Kept small (an op moves by value through the caller's futures, and up to 128 bytes moves
/// without a call to `memcpy`): the request's memory and cell are added when it is submitted,
/// and an error waits boxed.
enum Inner {
    /// The outcome; taken when the op resolves.
    Ready(Option<Result<usize, Box<Error>>>),
    /// Built, not yet handed to the reactor: nothing happens before the first poll. The
    /// runtime's handle, where the buffer holds none itself (`None`: the buffer's, which
    /// spares a small op the reference count's two locked instructions).
    Unsubmitted(Option<Runtime>, Draft),
    /// Handed to the reactor. Only the runtime's id is kept (to turn its reactor from here
    /// where this thread's inline driver holds it): the handle went with the request, let go
    /// of once the op was posted, off the latency path. (The op's buffer keeps the runtime
    /// alive where it is a registered buffer.) With how long a poll may watch for the outcome
    /// before parking (`driver::handoff`), and the reactor it may turn meanwhile
    /// (`driver::lend`).
    Pending(u64, Arc<OpCell>, AwaitSpin, Option<Arc<Lend>>),
    /// A device buffer's op on the staging path: copies and transfers of its mirror.
    Staged(Box<StagedOp>),
}

/// An operation. Nothing happens until it is first polled (then it is handed to the reactor,
/// unless the inline driver's poll budget is spent: then at its next poll) or started;
/// it resolves to the result (the bytes moved) and the buffer. Dropping it at any point is
/// safe: before posting it is withdrawn, after posting the reactor keeps the buffer until the
/// completion arrives. `.class(..)` and `.tenant(..)` set how the fair-share scheduler serves
/// it. Once handed to the reactor an op holds no handle on the runtime: its buffer keeps the
/// runtime alive where it is registered memory, and otherwise the runtime's last handle going
/// fails it with `Error::Shutdown`, as `Runtime::shutdown` does.
#[must_use = "an op does nothing useful unless awaited (dropping it cancels what is not posted)"]
pub struct Op<B: IoBuf> {
    inner: Inner,
    /// The op's buffer: here while the future lives, given back when it resolves.
    buf: Option<B>,
}

// The buffer is never pinned: it moves in and out by value.
impl<B: IoBuf> Unpin for Op<B> {}

impl<B: IoBuf> Op<B> {
    #[inline]
    pub(crate) fn new(rt: &Runtime, draft: Draft, buf: B) -> Op<B> {
        let own = match buf.runtime() {
            Some(r) if r.id() == rt.id() => None,
            _ => Some(rt.clone()),
        };
        Op { inner: Inner::Unsubmitted(own, draft), buf: Some(buf) }
    }

    /// The runtime of an unsubmitted op: its own handle, or its buffer's.
    fn runtime_of<'a>(own: &'a Option<Runtime>, buf: &'a Option<B>) -> Option<&'a Runtime> {
        own.as_ref().or_else(|| buf.as_ref().and_then(IoBuf::runtime))
    }

    /// An op on a device buffer on the staging path (`buf.staging()` is `view`): `locals` are
    /// a batch's local ranges.
    pub(crate) fn staged(
        rt: Runtime,
        draft: Draft,
        buf: B,
        view: crate::buf::StagedView,
        locals: Option<Vec<std::ops::Range<usize>>>,
    ) -> Op<B> {
        Op { inner: Inner::Staged(Box::new(StagedOp::new(rt, draft, view, locals))), buf: Some(buf) }
    }

    /// Serve this op in `class` instead of the class its size gives it.
    pub fn class(mut self, class: Class) -> Self {
        match &mut self.inner {
            Inner::Unsubmitted(_, d) => d.class = Some(class),
            Inner::Staged(s) => s.template_mut().class = Some(class),
            _ => {}
        }
        self
    }

    /// Count this op against `tenant`'s share (default 0).
    pub fn tenant(mut self, tenant: TenantId) -> Self {
        match &mut self.inner {
            Inner::Unsubmitted(_, d) => d.tenant = tenant,
            Inner::Staged(s) => s.template_mut().tenant = tenant,
            _ => {}
        }
        self
    }

    /// Hand the op to the reactor now, before it is awaited: how to pre-post a receive, or
    /// start a transfer while preparing the next. (Otherwise the first poll does this.)
    pub fn start(mut self) -> Self {
        let (standing, own) = self.submit(false);
        match &self.inner {
            Inner::Pending(_, _, _, Some(lend)) => lend.lease_at(standing).release(true),
            _ => debug_assert!(standing.is_free(), "a hold goes on only in a pending op's lend"),
        }
        drop(own);
        self
    }

    /// The reactor this op's poll may turn itself (`driver::lend`): a pending, spinning op's,
    /// where its runtime's reactor thread lends its reactor. Moved out for the poll and back
    /// in by [`keep_lend`](Self::keep_lend).
    fn take_lend(&mut self) -> Option<Arc<Lend>> {
        match &mut self.inner {
            Inner::Pending(_, _, _, lend) => lend.take(),
            _ => None,
        }
    }

    /// Put back what [`take_lend`](Self::take_lend) took, where the op is still pending.
    fn keep_lend(&mut self, lend: Option<Arc<Lend>>) {
        if let Inner::Pending(_, _, _, slot) = &mut self.inner {
            *slot = lend;
        }
    }

    /// Hand an unsubmitted op to the reactor (`polled`: from `poll`, which may reap right
    /// after posting). A spinning op's task posts it itself where the reactor thread lends its
    /// reactor, holding it for that: where the op is then pending, the hold goes on in the
    /// standing returned, for the op's own lease ([`Standing::FREE`] otherwise). Also returned:
    /// the op's own handle on its runtime where it still holds the reactor, for the caller to
    /// let go of once the hold is put back. It may be the runtime's last (the endpoint and the
    /// runtime dropped before the op's first poll): its drop stops the runtime, whose thread
    /// then waits for the reactor this very thread holds.
    fn submit(&mut self, polled: bool) -> (Standing, Option<Runtime>) {
        const NOTHING: (Standing, Option<Runtime>) = (Standing::FREE, None);
        if !matches!(self.inner, Inner::Unsubmitted(..)) {
            return NOTHING;
        }
        probe::mark(Stage::Submitted);
        let Some(seg) = self.buf.as_ref().map(IoBuf::seg) else { return NOTHING };
        let Inner::Unsubmitted(own, draft) = &self.inner else { return NOTHING };
        let Some(rt) = Self::runtime_of(own, &self.buf) else { return NOTHING };
        let spin = rt.await_spin_for(draft.class, seg.len);
        // Through the runtime's reference: an op that finishes as it is posted takes no clone.
        let lend = rt.lend().filter(|_| !spin.is_off());
        let mut lease = lend.map(|l| l.lease());
        if let Some(l) = lease.as_mut() {
            l.hold(false);
        }
        // On the thread holding the reactor, an op it would post straight away is posted now,
        // with no cell unless it stays in flight (a small send usually finishes as it is
        // posted). The draft stays where it is meanwhile: moving the op's state out and back
        // costs more than the post (stores of its fields, read back whole at once, stall).
        match rt.post_at_once(draft, seg) {
            Some(AtOnce::Finished(res)) => {
                // Nothing of the op is with the NIC: should putting the reactor back unwind
                // (a stop it finishes wakes other ops), this op is merely dropped.
                if let Some(l) = lease.as_mut() {
                    l.release(true);
                }
                drop(lease);
                self.inner = Inner::Ready(Some(res));
                // An op that never waited, as a spun one: one more of the run (`handoff`).
                if !spin.is_off() {
                    handoff::took();
                }
                NOTHING
            }
            Some(AtOnce::InFlight(cell)) => {
                let (id, keep) = (rt.id(), lend.cloned());
                let standing = lease.map_or(Standing::FREE, Lease::detach);
                // Set before anything that could unwind: the drop then keeps the buffer for
                // the NIC.
                match std::mem::replace(&mut self.inner, Inner::Pending(id, cell, spin, keep)) {
                    Inner::Unsubmitted(own, _) => (standing, own),
                    _ => (standing, None),
                }
            }
            None => {
                let keep = lend.cloned();
                let standing = lease.map_or(Standing::FREE, Lease::detach);
                // Put back should the submission unwind.
                let lease = keep.as_deref().map(|l| l.lease_at(standing));
                let mut kept = None;
                if let Inner::Unsubmitted(own, draft) = std::mem::replace(&mut self.inner, Inner::Ready(None))
                {
                    // Pending before the reactor sees it: should anything in `submit` (another
                    // op's waker, say) unwind through here, the drop then keeps the buffer for
                    // the NIC.
                    let cell = OpCell::new();
                    if let Some(rt) = Self::runtime_of(&own, &self.buf) {
                        self.inner = Inner::Pending(rt.id(), cell.clone(), spin, None);
                        if let Inner::Pending(_, mine, ..) = &self.inner {
                            rt.submit(draft.into_req(seg, cell), polled.then_some(&**mine));
                        }
                    }
                    kept = own;
                }
                let standing = lease.map_or(Standing::FREE, Lease::detach);
                self.keep_lend(keep);
                (standing, kept)
            }
        }
    }

    pub(crate) fn failed(err: Error, buf: B) -> Op<B> {
        Op { inner: Inner::Ready(Some(Err(Box::new(err)))), buf: Some(buf) }
    }

    /// The outcome of a submitted op, if it is in: looked at before an inline turn, after it,
    /// and when registering how to be woken (a completion may land in between). `yielded`:
    /// set where the poll yields with the op still out, its task back at once.
    fn outcome(
        cell: &OpCell,
        rt: u64,
        spin: AwaitSpin,
        lease: Option<&mut Lease<'_>>,
        cx: &mut Context<'_>,
        yielded: &mut bool,
    ) -> Option<Result<usize, Box<Error>>> {
        if let Some(o) = cell.taken() {
            return Some(o);
        }
        // A turn from here on completes the cell as its future's own poll (see `Polling`).
        let _polling = Polling::enter(cell);
        // On the thread driving the reactor inline, reap here: a completion already in the
        // queue then resolves this poll instead of a wake-up and a second trip through the
        // caller's futures. (Not before the first look: a turn can cost a provider's progress
        // call, which an op completed at posting does not need.)
        if inline::turn_inline(rt) {
            if let Some(o) = cell.taken() {
                return Some(o);
            }
        }
        // Awaited directly by the inline driver of this thread: it polls again when a parked
        // op completes, so no waker is stored or woken.
        if inline::drives_here(rt, cx) {
            return if cell.park() { cell.taken() } else { None };
        }
        // A long run of ops that never waited: let what the task is joined with run, now,
        // while this op's outcome is on its way (see `handoff`).
        if !spin.is_off() && handoff::yield_due() {
            *yielded = true;
            cx.waker().wake_by_ref();
            return None;
        }
        // A reactor thread completes it: a latency-class op watches for that a little before
        // its task parks (see `handoff`).
        if handoff::spin_until_done(cell, spin, rt, lease) {
            handoff::took();
            return cell.taken();
        }
        if !spin.is_off() {
            handoff::waits();
        }
        let done = cell.register(cx.waker());
        if done {
            cell.taken()
        } else {
            None
        }
    }
}

impl<B: IoBuf> Future for Op<B> {
    type Output = BufResult<usize, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        lent_block_on::op_polled();
        // Under the inline driver every poll spends the budget, the first before submitting: an
        // op that finishes as it is posted (a small send the provider copies, now or at
        // `start`) is never pending, so the budget alone makes a loop of them yield to what it
        // is joined with. Elsewhere the run's span does (below).
        if !inline::coop_proceed() {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // The poll's hold on the lent reactor: taken by the submission or the spin, put back
        // when the poll returns (at once where its task parks, see `driver::lend`).
        let fresh = matches!(this.inner, Inner::Unsubmitted(..));
        let (standing, own) = this.submit(true);
        // Finished as it was posted (a small send the provider copies): a loop of such ops
        // never waits, nor spins, so its run of outcomes yields here once it has lasted its
        // span, after the post, with the outcome kept for the next poll (see `handoff`).
        // Without it, the inline driver's poll budget aside, nothing would make the loop let
        // what it is joined with run, and a keeping `block_on` would turn no reactor meanwhile.
        if fresh && matches!(this.inner, Inner::Ready(_)) && handoff::yield_due() {
            debug_assert!(standing.is_free(), "an op that finished at once holds nothing");
            drop(own);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let lend = this.take_lend();
        debug_assert!(lend.is_some() || standing.is_free(), "a hold goes on only in a pending op's lend");
        let mut lease = lend.as_deref().map(|l| l.lease_at(standing));
        let out = this.poll_held(lease.as_mut(), cx);
        drop(lease);
        this.keep_lend(lend);
        drop(own);
        // The outcome was two words up to here (an error boxed): the result is written once,
        // into the caller's slot.
        match out {
            Poll::Ready(res) => {
                probe::mark(Stage::OpReady);
                let buf = this.buf.take().expect("Op polled after completion");
                Poll::Ready((res.map_err(|e| *e), buf))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<B: IoBuf> Op<B> {
    /// The poll, with its hold on the lent reactor (if any), which it puts back before it
    /// returns; the buffer stays in the op.
    fn poll_held(
        &mut self,
        mut lease: Option<&mut Lease<'_>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<usize, Box<Error>>> {
        let out = match &mut self.inner {
            Inner::Ready(r) => r.take().expect("Op polled after completion"),
            Inner::Unsubmitted(..) => unreachable!("submitted above"),
            Inner::Pending(rt, cell, spin, _) => {
                let mut yielded = false;
                match Self::outcome(cell, *rt, *spin, lease.as_deref_mut(), cx, &mut yielded) {
                    Some(o) => o,
                    None => {
                        // Yielding (a long run of spun ops), the task is back at once: the
                        // reactor stays in the slot, as it does where the outcome came in
                        // meanwhile. Else the task parks, and the thread takes the reactor
                        // back now, unless a keeping `block_on` polled this op itself and
                        // holds it (it turns it until the wake).
                        if let Some(l) = lease {
                            let kept = l.is_nested() && lent_block_on::keeps_for(*rt, cx);
                            l.release(yielded || cell.is_done() || kept);
                        }
                        return Poll::Pending;
                    }
                }
            }
            Inner::Staged(s) => match s.poll(cx) {
                Poll::Ready(r) => r.map_err(Box::new),
                Poll::Pending => return Poll::Pending,
            },
        };
        // Let go of the cell now: the op is over. (Looked at before it is moved out: an op
        // that finished as it was posted has none, and is left as it is.)
        if matches!(self.inner, Inner::Pending(..)) {
            if let Inner::Pending(_, cell, ..) = std::mem::replace(&mut self.inner, Inner::Ready(None)) {
                OpCell::recycle(cell);
            }
        }
        if let Some(l) = lease {
            l.release(true);
        }
        Poll::Ready(out)
    }
}

impl<B: IoBuf> Drop for Op<B> {
    fn drop(&mut self) {
        // Posted and not completed: the memory may still be in the NIC's hands. The reactor's
        // reference keeps the cell, and now the buffer with it, until the completion arrives.
        if let (Inner::Pending(_, cell, ..), Some(buf)) = (&self.inner, self.buf.take()) {
            if !cell.is_done() {
                cell.orphan(Box::new(buf));
                cell.abandon();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_op_moves_without_a_memcpy_call() {
        // Ops move by value through the caller's futures; up to 128 bytes moves inline.
        let size = std::mem::size_of::<super::Op<crate::RegisteredBuf>>();
        assert!(size <= 128, "an op is {size} bytes");
    }
}
