//! What the reactor's side machines (the audit, the rendezvous) ask of it. They own their state
//! and never reach into the reactor: each of their steps returns actions, which the reactor
//! carries out in order with [`Reactor::apply`]. That keeps them testable on their own (feed
//! inputs, look at the actions) and keeps the reactor the one place that touches the transport,
//! the peers and the op cells.
use std::sync::Arc;

use super::cmd::{OpReq, PeerSlot};
use super::{settle_cell, Reactor};
use crate::base::control::Ctl;
use crate::base::error::Error;
use crate::base::transport::WrId;
use crate::reactor::cell::{Done, OpCell};

/// One thing a side machine wants done.
pub(super) enum Action {
    /// Send a message on the peer's control connection.
    Tell(PeerSlot, Ctl),
    /// The audit is done with the op (its verdict is in, or will never come): finish it past
    /// the audit (see [`Reactor::settle`]).
    Settle(Arc<OpCell>, Result<Done, Error>),
    /// Complete the op's cell: no side machine has a stake in it any more.
    Complete(Arc<OpCell>, Result<Done, Error>),
    /// Give up on a peer that misbehaved (it is told why, then lost).
    DropPeer(PeerSlot, String),
    /// The target refused request `id`, which the provider will never complete: fail it and
    /// lose the peer (only that makes sure nothing touches its memory).
    FailSilent { slot: PeerSlot, id: WrId, why: &'static str },
    /// Read an offered message: a bulk read through the scheduler.
    Pull(Box<OpReq>),
    /// Deregister a buffer a peer could read (an offered message, now pulled or given up).
    Withdraw(u64),
}

/// Actions in the order they are to be carried out.
pub(super) type Outbox = Vec<Action>;

impl Reactor {
    /// Carry out what a side machine asked for, in order.
    pub(super) fn apply(&mut self, out: Outbox) {
        for a in out {
            match a {
                Action::Tell(slot, msg) => self.tell(slot, msg),
                Action::Settle(cell, res) => self.settle_past_audit(&cell, res),
                Action::Complete(cell, res) => settle_cell(&self.counters, &cell, res),
                Action::DropPeer(slot, why) => self.drop_peer(slot, why),
                Action::FailSilent { slot, id, why } => self.fail_silent(slot, id, why),
                Action::Pull(req) => self.accept(*req),
                // Counted and logged where it fails. The buffer is the send's own future's to
                // give back with the outcome, which stands: the registration let the peer only
                // read, so what a live one still allows is a read of what the buffer holds later.
                Action::Withdraw(mr) => {
                    let _ = self.deregister(mr, None);
                }
            }
        }
    }
}
