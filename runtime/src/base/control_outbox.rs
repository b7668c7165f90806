//! A peer's control outbox: what the reactors have to tell the peer, on its way to the task
//! that writes the control connection. The reactors never wait, so it takes every message at
//! once; but a peer that holds the secret and reads slowly while asking questions (each
//! `Check` is answered, each offer answered `Done`) would make it grow without bound. It
//! counts what waits, and past [`BACKLOG`] it refuses: the reactor then gives up on the peer.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::control::Ctl;

/// Messages that may wait for one peer's connection. An honest peer keeps few waiting, and a
/// burst after a fault stays well below (4,096 offers, as many withdrawals and answers); this
/// many (some MiB) means it has stopped reading.
pub(crate) const BACKLOG: usize = 65_536;

/// The reactors' end (cloned for each reactor the peer has lanes on).
#[derive(Clone, Debug)]
pub(crate) struct OutboxTx {
    tx: UnboundedSender<Ctl>,
    waiting: Arc<AtomicUsize>,
}

/// The connection task's end.
#[derive(Debug)]
pub(crate) struct OutboxRx {
    rx: UnboundedReceiver<Ctl>,
    waiting: Arc<AtomicUsize>,
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The connection task is gone, and with it the peer.
    Closed,
    /// [`BACKLOG`] messages wait already: the peer does not read them.
    Backlog,
}

/// A new outbox, both ends.
pub(crate) fn outbox() -> (OutboxTx, OutboxRx) {
    let (tx, rx) = unbounded_channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    (OutboxTx { tx, waiting: waiting.clone() }, OutboxRx { rx, waiting })
}

impl OutboxTx {
    /// Queue `msg`. A goodbye is queued past the backlog: it says why the peer is dropped.
    pub(crate) fn send(&self, msg: Ctl) -> Result<(), Refused> {
        let goodbye = matches!(msg, Ctl::Goodbye { .. });
        if !goodbye && self.waiting.load(Ordering::Relaxed) >= BACKLOG {
            // A connection task that ended with a full outbox is not a slow reader.
            return Err(if self.tx.is_closed() { Refused::Closed } else { Refused::Backlog });
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.tx.send(msg).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            Refused::Closed
        })
    }
}

impl OutboxRx {
    /// The next message; `None` once every reactor let go of the peer.
    pub(crate) async fn recv(&mut self) -> Option<Ctl> {
        let msg = self.rx.recv().await?;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        Some(msg)
    }

    /// The next message if one waits (for tests that look at what was told).
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<Ctl> {
        let msg = self.rx.try_recv().ok()?;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_reads_nothing_is_refused_past_the_backlog_but_still_told_goodbye() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("tokio");
        let (tx, mut rx) = outbox();
        let other = tx.clone();
        for token in 0..BACKLOG as u32 {
            let sender = if token % 2 == 0 { &tx } else { &other };
            assert_eq!(sender.send(Ctl::Withdrawn { token }), Ok(()));
        }
        assert_eq!(tx.send(Ctl::Heartbeat), Err(Refused::Backlog), "clones share the count");
        assert_eq!(other.send(Ctl::Goodbye { reason: "slow".into() }), Ok(()));
        // Reading makes room again (the goodbye counts too).
        assert_eq!(rt.block_on(rx.recv()), Some(Ctl::Withdrawn { token: 0 }));
        assert_eq!(tx.send(Ctl::Heartbeat), Err(Refused::Backlog));
        assert_eq!(rt.block_on(rx.recv()), Some(Ctl::Withdrawn { token: 1 }));
        assert_eq!(tx.send(Ctl::Heartbeat), Ok(()));
        assert_eq!(tx.send(Ctl::Heartbeat), Err(Refused::Backlog));
        drop(rx);
        assert_eq!(tx.send(Ctl::Heartbeat), Err(Refused::Closed), "full, but nobody reads: closed");
        assert_eq!(tx.send(Ctl::Goodbye { reason: "gone".into() }), Err(Refused::Closed));
    }
}
