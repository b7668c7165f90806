//! What the unit tests of the reactor's side machines (the audit, the rendezvous) share.
use crate::base::error::{Error, FailureClass, OpKind, TransportError};

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
