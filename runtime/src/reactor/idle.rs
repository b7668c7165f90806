//! The flags a reactor and the threads that submit to it share.
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// Flags the submitters and the reactor's driver share. On lines of their own (two: the
/// adjacent-line prefetcher pairs them): a reactor thread that lends its reactor reads them all
/// through its spin, while the task holding the reactor writes whatever the heap put beside
/// them: a line shared with such an allocation would cross between the two cores at each
/// of those writes.
#[derive(Default)]
#[repr(align(128))]
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
