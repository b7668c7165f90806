//! The op lifecycle (tokio-uring's, across threads). The future keeps its buffer; the reactor
//! holds the op's [`cell`] from submission until the completion arrives. If the future is
//! dropped while the op is posted, the buffer moves into the cell, which the reactor keeps until
//! the completion (io_uring's "Ignored" state); if the op was never posted, the reactor sees it
//! is the cell's only holder and withdraws it.
pub(crate) mod cell;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::{BufResult, Error};
use crate::reactor::cmd::OpReq;
use crate::runtime::Runtime;
use crate::sched::{Class, TenantId};
pub(crate) use cell::{Done, OpCell};

enum Inner {
    /// The outcome; taken when the op resolves.
    Ready(Option<Result<Done, Error>>),
    /// Built, not yet handed to the reactor: nothing happens before the first poll.
    Unsubmitted(Runtime, Option<OpReq>),
    /// Handed to the reactor. Only the runtime's id is kept (to turn its reactor from here
    /// where this thread's inline driver holds it): the handle went with the request, let go
    /// of once the op was posted, off the latency path. (The op's buffer keeps the runtime
    /// alive where it is a registered buffer.)
    Pending(u64, Arc<OpCell>),
}

/// An operation. Nothing happens until it is first polled (then it is handed to the reactor);
/// it resolves to the result and the buffer. Dropping it at any point is safe: before posting it
/// is withdrawn, after posting the reactor keeps the buffer until the completion arrives.
/// `.class(..)` and `.tenant(..)` set how the fair-share scheduler serves it. Once handed to
/// the reactor an op holds no handle on the runtime: its buffer keeps the runtime alive where
/// it is registered memory, and otherwise the runtime's last handle going fails it with
/// `Error::Shutdown`, as `Runtime::shutdown` does.
#[must_use = "an op does nothing useful unless awaited (dropping it cancels what is not posted)"]
pub struct Op<B: Send + 'static, T = usize> {
    inner: Inner,
    /// The op's buffer: here while the future lives, given back when it resolves.
    buf: Option<B>,
    map: fn(Done) -> T,
}

// The buffer is never pinned: it moves in and out by value.
impl<B: Send + 'static, T> Unpin for Op<B, T> {}

pub(crate) fn len_of(d: Done) -> usize {
    d.len
}

impl<B: Send + 'static, T> Op<B, T> {
    pub(crate) fn new(rt: Runtime, req: OpReq, buf: B, map: fn(Done) -> T) -> Op<B, T> {
        Op { inner: Inner::Unsubmitted(rt, Some(req)), buf: Some(buf), map }
    }

    /// Serve this op in `class` instead of the class its size gives it.
    pub fn class(mut self, class: Class) -> Self {
        if let Inner::Unsubmitted(_, Some(req)) = &mut self.inner {
            req.class = Some(class);
        }
        self
    }

    /// Count this op against `tenant`'s share (default 0).
    pub fn tenant(mut self, tenant: TenantId) -> Self {
        if let Inner::Unsubmitted(_, Some(req)) = &mut self.inner {
            req.tenant = tenant;
        }
        self
    }

    /// Hand the op to the reactor now, before it is awaited: how to pre-post a receive, or
    /// start a transfer while preparing the next. (Otherwise the first poll does this.)
    pub fn start(mut self) -> Self {
        self.submit(false);
        self
    }

    /// `polled`: called from `poll`, which may reap right after posting.
    fn submit(&mut self, polled: bool) {
        if !matches!(self.inner, Inner::Unsubmitted(..)) {
            return;
        }
        // Moved out, not cloned: each Arc clone and drop is an atomic on the hot path.
        if let Inner::Unsubmitted(rt, Some(req)) = std::mem::replace(&mut self.inner, Inner::Ready(None)) {
            // Pending before the reactor sees it: should anything in `submit` (another op's
            // waker, say) unwind through here, the drop then keeps the buffer for the NIC.
            self.inner = Inner::Pending(rt.id(), req.cell.clone());
            if let Inner::Pending(_, cell) = &self.inner {
                rt.submit(req, polled.then_some(&**cell));
            }
        }
    }

    pub(crate) fn failed(err: Error, buf: B, map: fn(Done) -> T) -> Op<B, T> {
        Op { inner: Inner::Ready(Some(Err(err))), buf: Some(buf), map }
    }

    /// The outcome of a submitted op, if it is in: looked at before an inline turn, after it,
    /// and when registering how to be woken (a completion may land in between).
    fn outcome(cell: &OpCell, rt: u64, cx: &mut Context<'_>) -> Option<Result<Done, Error>> {
        if let Some(o) = cell.outcome() {
            return Some(o);
        }
        // On the thread driving the reactor inline, reap here: a completion already in the
        // queue then resolves this poll instead of a wake-up and a second trip through the
        // caller's futures. (Not before the first look: a turn can cost a provider's progress
        // call, which an op completed at posting does not need.)
        if Runtime::turn_inline(rt) {
            if let Some(o) = cell.outcome() {
                return Some(o);
            }
        }
        // Awaited directly by the inline driver of this thread: it polls again when a parked
        // op completes, so no waker is stored or woken.
        let done = if Runtime::drives_here(rt, cx) { cell.park() } else { cell.register(cx.waker()) };
        if done {
            cell.outcome()
        } else {
            None
        }
    }
}

impl<B: Send + 'static, T> Future for Op<B, T> {
    type Output = BufResult<T, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.submit(true);
        let out = match &mut this.inner {
            Inner::Ready(r) => r.take().expect("Op polled after completion"),
            Inner::Unsubmitted(..) => unreachable!("submitted above"),
            Inner::Pending(rt, cell) => {
                if !Runtime::coop_proceed() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                match Self::outcome(cell, *rt, cx) {
                    Some(o) => o,
                    None => return Poll::Pending,
                }
            }
        };
        // Let go of the cell and the runtime now: the op is over.
        if let Inner::Pending(_, cell) = std::mem::replace(&mut this.inner, Inner::Ready(None)) {
            OpCell::recycle(cell);
        }
        let buf = this.buf.take().expect("Op polled after completion");
        Poll::Ready((out.map(this.map), buf))
    }
}

impl<B: Send + 'static, T> Drop for Op<B, T> {
    fn drop(&mut self) {
        // Posted and not completed: the memory may still be in the NIC's hands. The reactor's
        // reference keeps the cell, and now the buffer with it, until the completion arrives.
        if let (Inner::Pending(_, cell), Some(buf)) = (&self.inner, self.buf.take()) {
            if !cell.is_done() {
                cell.orphan(Box::new(buf));
                cell.abandon();
            }
        }
    }
}
