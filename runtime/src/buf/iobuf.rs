use crate::base::transport::LocalSeg;

/// A buffer an operation can take by value: registered memory with a stable address.
///
/// # Safety
/// `seg()` must describe memory that stays valid, at the same address, for as long as the value
/// lives, even when the value is moved, and that is registered with the runtime `runtime_id()`
/// names under the descriptor it gives.
pub unsafe trait IoBuf: Send + 'static {
    /// The memory, its length and its registration descriptor.
    fn seg(&self) -> LocalSeg;
    /// The runtime this memory is registered with.
    fn runtime_id(&self) -> u64;
    /// Length in bytes.
    fn bytes_len(&self) -> usize {
        self.seg().len
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
}
