//! A stream of received messages over a pool of buffers the runtime keeps posted (io_uring's
//! provided buffers with multishot receive): each message's buffer is re-posted when the
//! message is dropped.
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::stream::{FuturesUnordered, Stream, StreamExt};

use crate::base::error::{Error, OpKind, Result};
use crate::buf::RegisteredBuf;
use crate::endpoint::Endpoint;
use crate::op::Op;

type Returned = Arc<Mutex<Vec<RegisteredBuf>>>;

/// Messages from one peer, received into a pool of posted buffers.
pub struct RecvStream<'a> {
    ep: &'a Endpoint,
    posted: FuturesUnordered<Op<RegisteredBuf>>,
    returned: Returned,
}

/// One received message; dropping it re-posts its buffer.
pub struct RecvMsg {
    buf: Option<RegisteredBuf>,
    len: usize,
    home: Returned,
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
            self.home.lock().unwrap_or_else(|p| p.into_inner()).push(b);
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
        Ok(RecvStream { ep: self, posted, returned: Arc::default() })
    }
}

impl Stream for RecvStream<'_> {
    type Item = Result<RecvMsg>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let back: Vec<RegisteredBuf> =
            std::mem::take(&mut *self.returned.lock().unwrap_or_else(|p| p.into_inner()));
        for b in back {
            let op = self.ep.recv(b);
            self.posted.push(op);
        }
        match self.posted.poll_next_unpin(cx) {
            Poll::Ready(Some((Ok(len), buf))) => {
                Poll::Ready(Some(Ok(RecvMsg { buf: Some(buf), len, home: self.returned.clone() })))
            }
            Poll::Ready(Some((Err(e), buf))) => {
                // Keep the pool whole unless the peer is gone.
                if !e.is_peer_lost() && !matches!(e, Error::Shutdown { .. }) {
                    self.returned.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
                }
                Poll::Ready(Some(Err(e)))
            }
            // Every buffer is out with the application; they come back on drop.
            Poll::Ready(None) => {
                if self.returned.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                    Poll::Ready(None)
                } else {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
