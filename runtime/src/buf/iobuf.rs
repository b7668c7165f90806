use crate::base::memory::{DmaBuf, Memory};
use crate::base::transport::LocalSeg;
use crate::runtime::Runtime;

use super::staging::StagedView;

/// A buffer an operation can take by value: registered memory with a stable address.
///
/// # Safety
/// `seg()` must describe memory that stays valid, at the same address, for as long as the value
/// lives, even when the value is moved, and that is registered with the runtime `runtime_id()`
/// names under the descriptor it gives; `runtime()`, where it gives one, is that runtime.
pub unsafe trait IoBuf: Send + 'static {
    /// The memory, its length and its registration descriptor.
    fn seg(&self) -> LocalSeg;
    /// The runtime this memory is registered with.
    fn runtime_id(&self) -> u64;
    /// The runtime this memory is registered with, where the buffer holds a handle on it (a
    /// registered buffer keeps its runtime alive): an op on it then takes no handle of its own.
    /// Not for applications: the runtime's buffers implement it.
    #[doc(hidden)]
    fn runtime(&self) -> Option<&Runtime> {
        None
    }
    /// Length in bytes.
    fn bytes_len(&self) -> usize {
        self.seg().len
    }
    /// Where the bytes live: host memory unless the buffer says otherwise (a `CudaBuf`).
    fn memory(&self) -> Memory {
        Memory::Host
    }
    /// A device buffer on the staging path: its mirror and copies. Ops on such a buffer move
    /// the mirror's bytes, copying to and from the device around each transfer; `seg()` then
    /// describes the mirror. Not for applications: device buffers implement it.
    #[doc(hidden)]
    fn staging(&self) -> Option<StagedView> {
        None
    }
    /// A dma-buf export of device memory, for transports that register device memory by it.
    #[doc(hidden)]
    fn dmabuf(&self) -> Option<DmaBuf> {
        None
    }
    /// Wait for copies the transport queued on this memory's device (natively registered
    /// device memory: a provider that moves it with the device's copy engine may complete an op
    /// before its copy is done). Nothing to wait for in host memory.
    #[doc(hidden)]
    fn fence(&self) -> crate::Result<()> {
        Ok(())
    }
}

/// A buffer an operation may write into (receives, reads).
///
/// # Safety
/// As [`IoBuf`]; and no one else may read or write the memory while the value is owned by an
/// operation.
pub unsafe trait IoBufMut: IoBuf {}

// SAFETY: an `Arc` keeps its `T` alive and in place for as long as any clone lives, and gives
// only shared access, so the memory is valid, stable and unchanged while the NIC reads it (a
// shared buffer can be the source of writes and sends, never the target of reads or receives).
unsafe impl<T: IoBuf + Sync> IoBuf for std::sync::Arc<T> {
    fn seg(&self) -> LocalSeg {
        (**self).seg()
    }
    fn runtime_id(&self) -> u64 {
        (**self).runtime_id()
    }
    fn runtime(&self) -> Option<&Runtime> {
        (**self).runtime()
    }
    fn memory(&self) -> Memory {
        (**self).memory()
    }
    fn staging(&self) -> Option<StagedView> {
        (**self).staging()
    }
    fn dmabuf(&self) -> Option<DmaBuf> {
        (**self).dmabuf()
    }
    fn fence(&self) -> crate::Result<()> {
        (**self).fence()
    }
}
