//! The op lifecycle (tokio-uring's, across threads): a cell shared by the future and the
//! reactor. The cell holds the buffer; whoever drops the cell last frees it. If the future is
//! dropped first, the reactor's reference keeps the buffer alive until the completion arrives
//! (io_uring's "Ignored" state); if the op was never posted, the reactor sees it is the only
//! holder and withdraws it.
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::error::{BufResult, Error};
use crate::reactor::cmd::OpReq;
use crate::runtime::Runtime;
use crate::sched::{Class, TenantId};

/// What a finished op reports besides its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub len: usize,
    pub imm: Option<u64>,
}

/// The reactor's view of an op cell.
pub(crate) trait Complete: Send + Sync {
    fn complete(&self, res: Result<Done, Error>);
}

struct State<B> {
    waker: Option<Waker>,
    result: Option<Result<Done, Error>>,
    buf: Option<B>,
}

pub(crate) struct OpCell<B> {
    state: Mutex<State<B>>,
}

impl<B: Send> OpCell<B> {
    pub(crate) fn new(buf: B) -> Arc<OpCell<B>> {
        Arc::new(OpCell { state: Mutex::new(State { waker: None, result: None, buf: Some(buf) }) })
    }
}

impl<B> OpCell<B> {
    /// The result and the buffer, once the op has completed.
    fn take(&self) -> Option<(Result<Done, Error>, B)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let res = s.result.take()?;
        Some((res, s.buf.take().expect("Op polled after completion")))
    }
}

impl<B: Send> Complete for OpCell<B> {
    fn complete(&self, res: Result<Done, Error>) {
        let waker = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.result = Some(res);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

enum Inner<B> {
    Ready(Option<(Result<Done, Error>, B)>),
    /// Built, not yet handed to the reactor: nothing happens before the first poll.
    Unsubmitted(Runtime, Option<OpReq>, Arc<OpCell<B>>),
    /// Handed to the reactor; the runtime is kept to turn an inline driver's reactor from here.
    Pending(Runtime, Arc<OpCell<B>>),
}

/// An operation. Nothing happens until it is first polled (then it is handed to the reactor);
/// it resolves to the result and the buffer. Dropping it at any point is safe: before posting it
/// is withdrawn, after posting the reactor keeps the buffer until the completion arrives.
/// `.class(..)` and `.tenant(..)` set how the fair-share scheduler serves it.
#[must_use = "an op does nothing useful unless awaited (dropping it cancels what is not posted)"]
pub struct Op<B, T = usize> {
    inner: Inner<B>,
    map: fn(Done) -> T,
}

// The buffer is never pinned: it moves in and out by value.
impl<B, T> Unpin for Op<B, T> {}

pub(crate) fn len_of(d: Done) -> usize {
    d.len
}

impl<B: Send, T> Op<B, T> {
    pub(crate) fn new(rt: Runtime, req: OpReq, cell: Arc<OpCell<B>>, map: fn(Done) -> T) -> Op<B, T> {
        Op { inner: Inner::Unsubmitted(rt, Some(req), cell), map }
    }

    /// Serve this op in `class` instead of the class its size gives it.
    pub fn class(mut self, class: Class) -> Self {
        if let Inner::Unsubmitted(_, Some(req), _) = &mut self.inner {
            req.class = Some(class);
        }
        self
    }

    /// Count this op against `tenant`'s share (default 0).
    pub fn tenant(mut self, tenant: TenantId) -> Self {
        if let Inner::Unsubmitted(_, Some(req), _) = &mut self.inner {
            req.tenant = tenant;
        }
        self
    }

    /// Hand the op to the reactor now, before it is awaited: how to pre-post a receive, or
    /// start a transfer while preparing the next. (Otherwise the first poll does this.)
    pub fn start(mut self) -> Self {
        self.submit();
        self
    }

    fn submit(&mut self) {
        if !matches!(self.inner, Inner::Unsubmitted(..)) {
            return;
        }
        // Moved out, not cloned: each Arc clone and drop is an atomic on the hot path.
        if let Inner::Unsubmitted(rt, Some(req), cell) =
            std::mem::replace(&mut self.inner, Inner::Ready(None))
        {
            rt.submit(req);
            self.inner = Inner::Pending(rt, cell);
        }
    }

    pub(crate) fn failed(err: Error, buf: B, map: fn(Done) -> T) -> Op<B, T> {
        Op { inner: Inner::Ready(Some((Err(err), buf))), map }
    }
}

impl<B: Send, T> Future for Op<B, T> {
    type Output = BufResult<T, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let map = this.map;
        this.submit();
        match &mut this.inner {
            Inner::Ready(r) => {
                let (res, buf) = r.take().expect("Op polled after completion");
                Poll::Ready((res.map(map), buf))
            }
            Inner::Unsubmitted(..) => unreachable!("submitted above"),
            Inner::Pending(rt, cell) => {
                if !Runtime::coop_proceed() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // A result already there is taken. Otherwise, on the thread driving the
                // reactor inline, reap here: a completion already in the queue then resolves
                // this poll instead of a wake-up and a second trip through the caller's
                // futures. (Not before the first look: a turn can cost a provider's progress
                // call, which an op completed at posting does not need.)
                if let Some(done) = cell.take() {
                    return Poll::Ready((done.0.map(map), done.1));
                }
                if rt.turn_inline() {
                    if let Some(done) = cell.take() {
                        return Poll::Ready((done.0.map(map), done.1));
                    }
                }
                let mut s = cell.state.lock().unwrap_or_else(|p| p.into_inner());
                match s.result.take() {
                    Some(res) => {
                        let buf = s.buf.take().expect("Op polled after completion");
                        Poll::Ready((res.map(map), buf))
                    }
                    None => {
                        match &mut s.waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            w => *w = Some(cx.waker().clone()),
                        }
                        Poll::Pending
                    }
                }
            }
        }
    }
}
