//! The two places raw memory is handed to a transport. Their callers (the reactor) uphold the
//! ownership rule: an op's buffer stays in its op cell, alive, until the completion arrives.
use crate::error::TransportError;
use crate::transport::{Access, MemoryRegion, PostError, Posted, Transport, WorkRequest};

/// Post a work request whose memory the reactor keeps alive in its in-flight table.
pub(crate) fn post(t: &mut dyn Transport, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
    // SAFETY: every segment comes from an `IoBuf` that sits in the op cell the reactor holds in
    // its in-flight slab until `poll` returns this id (or, at shutdown, is leaked when it never
    // does), so the memory stays valid and unshared for the whole DMA.
    unsafe { t.post(wr) }
}

/// Register memory whose owner deregisters (through the reactor) before freeing it.
pub(crate) fn register(
    t: &mut dyn Transport,
    ptr: *mut u8,
    len: usize,
    access: Access,
) -> Result<MemoryRegion, TransportError> {
    // SAFETY: callers are `RegisteredBuf` / `ExposedBuf`, whose Drop sends the deregistration
    // and, for remotely reachable memory, hands the memory itself to the reactor to free after
    // the deregistration has returned.
    unsafe { t.register(ptr, len, access) }
}
