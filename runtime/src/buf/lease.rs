//! The two places raw memory is handed to a transport. Their callers (the reactor) uphold the
//! ownership rule: an op's buffer stays alive, in its future or (once the future is dropped) in
//! its op cell, until the completion arrives.
use crate::base::error::TransportError;
use crate::base::memory::DeviceMem;
use crate::base::transport::{Access, MemoryRegion, PostError, Posted, Transport, WorkRequest};

/// Post a work request whose memory the reactor keeps alive in its in-flight table.
pub(crate) fn post(t: &mut dyn Transport, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
    // SAFETY: every segment comes from an `IoBuf` held by its op's future, whose drop moves it
    // into the op cell; the reactor holds that cell in its in-flight slab until `poll` returns
    // this id (or, at shutdown, until the lane is closed), and `IoBuf` memory keeps its address
    // when the value moves, so the memory stays valid and unshared for the whole DMA. (An op
    // posted at once by its future's own poll, `Reactor::post_at_once`, gets its cell just
    // after this returns: the cell goes into the slab and to the future before any waker or
    // other code runs, so nothing can drop the future in between.)
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

/// Register device memory whose owner deregisters (through the reactor) before freeing it.
pub(crate) fn register_device(
    t: &mut dyn Transport,
    ptr: *mut u8,
    len: usize,
    access: Access,
    mem: DeviceMem,
) -> Result<MemoryRegion, TransportError> {
    // SAFETY: the caller is `CudaBuf`, whose Drop hands the device allocation to the reactor,
    // which frees it only after the deregistration has returned.
    unsafe { t.register_device(ptr, len, access, mem) }
}
