//! A peer's control inbox: the messages its control connection's reader has handed to the
//! reactors and they have not handled yet. A reactor's command queue takes everything at once
//! (nobody waits to hand a reactor work), so a peer flooding its connection with messages that
//! each cost a command (offers and withdrawals, say) would grow that queue without bound and
//! keep the reactor from everyone's ops. Each message handed on holds a [`Credit`] until it is
//! handled; with [`INBOX`] of them out, the reader waits for the reactors to catch up, and the
//! peer's socket fills instead (its writer then gives up on us after its timeout).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Messages one peer may have waiting for the reactors. An honest peer has a few at a time;
/// a burst after a fault (its answers to our questions, its offers) stays far below.
pub(crate) const INBOX: usize = 1024;

/// One peer's count of messages handed on and not yet handled.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    queued: AtomicUsize,
    drained: Notify,
}

/// A message's place in its peer's inbox, given back when dropped: once a reactor handled the
/// message, or dropped it unhandled (a reactor that stopped).
#[derive(Debug)]
pub(crate) struct Credit(Arc<Inbox>);

impl Inbox {
    pub(crate) fn new() -> Arc<Inbox> {
        Arc::new(Inbox::default())
    }

    /// A credit for the next message, once fewer than [`INBOX`] are waiting. (One reader per
    /// inbox: only it adds, so the look and the add need no lock.)
    pub(crate) async fn credit(self: &Arc<Self>) -> Credit {
        loop {
            // Made before the look: a credit given back in between leaves a permit behind.
            let drained = self.drained.notified();
            if self.queued.load(Ordering::Acquire) < INBOX {
                break;
            }
            drained.await;
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        Credit(self.clone())
    }

    /// Messages waiting now.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        if self.0.queued.fetch_sub(1, Ordering::AcqRel) == INBOX {
            self.0.drained.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_inbox_holds_the_reader_until_a_message_is_handled() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("tokio");
        rt.block_on(async {
            let inbox = Inbox::new();
            let mut held = Vec::new();
            for _ in 0..INBOX {
                held.push(inbox.credit().await);
            }
            assert_eq!(inbox.queued(), INBOX);
            let next = inbox.credit();
            tokio::pin!(next);
            let waited = tokio::time::timeout(std::time::Duration::from_millis(50), &mut next).await;
            assert!(waited.is_err(), "the reader waits while the inbox is full");
            drop(held.pop());
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), next).await;
            assert!(got.is_ok(), "one handled message lets the next in");
            assert_eq!(inbox.queued(), INBOX);
            held.clear();
            drop(got);
            assert_eq!(inbox.queued(), 0);
        });
    }
}
