//! A stream of received messages over a pool of buffers the runtime keeps posted (io_uring's
//! provided buffers with multishot receive): each message's buffer is re-posted when the
//! message is dropped.
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::stream::{FuturesUnordered, Stream, StreamExt};

use crate::base::error::{Error, OpKind, Result};
use crate::buf::RegisteredBuf;
use crate::endpoint::Endpoint;
use crate::op::Op;

/// The pool's buffers away from the stream: those the application's messages gave back, and
/// how many it still holds. Shared with every message, which gives its buffer back on drop.
#[derive(Default)]
struct Away {
    returned: Vec<RegisteredBuf>,
    /// Messages the application holds: their buffers come back, so the stream goes on.
    held: usize,
    /// The stream, waiting for a buffer to come back with every one held.
    waiting: Option<Waker>,
}

type Pool = Arc<Mutex<Away>>;

fn lock(pool: &Pool) -> std::sync::MutexGuard<'_, Away> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

/// Messages from one peer, received into a pool of posted buffers.
pub struct RecvStream<'a> {
    ep: &'a Endpoint,
    posted: FuturesUnordered<Op<RegisteredBuf>>,
    away: Pool,
}

/// One received message; dropping it re-posts its buffer.
pub struct RecvMsg {
    buf: Option<RegisteredBuf>,
    len: usize,
    home: Pool,
}

impl RecvMsg {
    /// The message length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for RecvMsg {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop")[..self.len]
    }
}

impl Drop for RecvMsg {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let waiting = {
                let mut away = lock(&self.home);
                away.returned.push(b);
                away.held -= 1;
                away.waiting.take()
            };
            if let Some(w) = waiting {
                w.wake();
            }
        }
    }
}

impl Endpoint {
    /// Keep `count` receives of `size` bytes posted for this peer and yield messages as they
    /// arrive.
    pub fn recv_stream(&self, count: usize, size: usize) -> Result<RecvStream<'_>> {
        if count == 0 {
            return Err(Error::invalid(OpKind::Recv, "a receive pool needs at least one buffer"));
        }
        let posted = FuturesUnordered::new();
        for _ in 0..count {
            posted.push(self.recv(self.runtime().alloc(size)?));
        }
        Ok(RecvStream { ep: self, posted, away: Arc::default() })
    }
}

impl Stream for RecvStream<'_> {
    type Item = Result<RecvMsg>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let back: Vec<RegisteredBuf> = std::mem::take(&mut lock(&self.away).returned);
        for b in back {
            let op = self.ep.recv(b);
            self.posted.push(op);
        }
        match self.posted.poll_next_unpin(cx) {
            Poll::Ready(Some((Ok(len), buf))) => {
                lock(&self.away).held += 1;
                Poll::Ready(Some(Ok(RecvMsg { buf: Some(buf), len, home: self.away.clone() })))
            }
            Poll::Ready(Some((Err(e), buf))) => {
                // Keep the pool whole unless the peer is gone.
                if !e.is_peer_lost() && !matches!(e, Error::Shutdown { .. }) {
                    lock(&self.away).returned.push(buf);
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                let mut away = lock(&self.away);
                if !away.returned.is_empty() {
                    // Given back since the look above: post it at the next poll, now.
                    drop(away);
                    cx.waker().wake_by_ref();
                    Poll::Pending
                } else if away.held > 0 {
                    // Every buffer is out with the application: the stream goes on once a
                    // message is dropped, which wakes it.
                    away.waiting = Some(cx.waker().clone());
                    Poll::Pending
                } else {
                    // None posted, none held, none to give back: the peer's loss took the pool.
                    Poll::Ready(None)
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
