//! The flags a reactor and the threads that submit to it share.
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// Flags the submitters and the reactor's driver share.
#[derive(Default)]
pub(crate) struct Idle {
    /// The reactor is (about to be) asleep: a submitter must notify.
    pub sleeping: AtomicBool,
    /// Stop after draining.
    pub shutdown: AtomicBool,
    /// The reactor has shut down.
    pub stopped: AtomicBool,
    /// Commands sent and not yet taken: lets the reactor skip the channel when it is empty.
    pub commands: AtomicUsize,
}
