//! Immediate-data events: what a peer's `write_with_imm` raises here.
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A peer wrote into memory this runtime exposed and attached a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmEvent {
    /// The immediate value.
    pub imm: u64,
    /// Bytes the write carried, where the provider reports it (0 otherwise).
    pub len: usize,
}

#[derive(Default)]
struct State {
    events: VecDeque<ImmEvent>,
    wakers: Vec<Waker>,
}

/// The runtime's queue of arrived immediate events.
#[derive(Default)]
pub(crate) struct ImmQueue {
    state: Mutex<State>,
}

impl ImmQueue {
    pub(crate) fn push(&self, imm: u64, len: usize) {
        let wakers = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.events.push_back(ImmEvent { imm, len });
            std::mem::take(&mut s.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    pub(crate) fn try_pop(&self) -> Option<ImmEvent> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).events.pop_front()
    }
}

/// Resolves to the next immediate event (see `Runtime::next_imm`).
pub struct NextImm {
    pub(crate) q: Arc<ImmQueue>,
}

impl Future for NextImm {
    type Output = ImmEvent;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ImmEvent> {
        let mut s = self.q.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.events.pop_front() {
            Some(e) => Poll::Ready(e),
            None => {
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    s.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}
