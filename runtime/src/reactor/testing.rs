//! A bare reactor and a peer without lanes, for unit tests of the reactor's bookkeeping (the
//! audit, the rendezvous) that reach into its tables.
use crate::reactor::cmd::PeerSlot;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::peers::Peer;
use super::Reactor;
use crate::base::control::Ctl;
use crate::base::error::{Error, FailureClass, OpKind, TransportError};

/// A reactor over a scripted transport with no peers (see `scripted`).
pub(super) fn reactor() -> Reactor {
    let script = super::scripted::Script::default();
    let (_tx, rx) = std::sync::mpsc::channel();
    Reactor::new(
        script.transport(1 << 20),
        rx,
        Default::default(),
        Default::default(),
        Default::default(),
        Default::default(),
    )
}

/// A peer with no lanes; what the reactor tells it arrives on the receiver.
pub(super) fn peer(r: &mut Reactor) -> (PeerSlot, UnboundedReceiver<Ctl>) {
    let (ctl, rx) = unbounded_channel();
    let p = Peer::new(7, "peer".into(), Vec::new(), 1, ctl, Instant::now());
    (r.peers.insert(p), rx)
}

/// A write the provider cancelled.
pub(super) fn cancelled() -> Error {
    Error::Transport {
        op: OpKind::Write,
        peer: "peer".into(),
        source: TransportError {
            provider: "nothing".into(),
            errno: 125,
            text: "Operation canceled".into(),
            class: FailureClass::Cancelled,
        },
    }
}
