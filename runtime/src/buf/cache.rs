//! Shared, immutable memory registered through the runtime's registration cache.
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

use super::IoBuf;
use crate::base::error::Result;
use crate::base::transport::LocalSeg;
use crate::runtime::mr_cache::Entry;
use crate::runtime::Runtime;

pub use crate::runtime::mr_cache::CacheStats;

/// Shared, immutable memory registered through the runtime's registration cache
/// (`Runtime::register_shared`): the source of writes and sends. Clones share the
/// registration; the registration lasts while any clone (or any op holding one) does, and
/// after that while the cache keeps it, as long as the runtime runs: a shared buffer does not
/// keep the runtime alive (its last handle going fails the ops still holding one).
#[derive(Clone)]
pub struct SharedBuf {
    entry: Arc<Entry>,
}

impl SharedBuf {
    /// The memory.
    pub fn bytes(&self) -> &Bytes {
        &self.entry.bytes
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.entry.bytes
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf").field("len", &self.entry.bytes.len()).finish()
    }
}

// SAFETY: the `Bytes` is kept alive by the entry (and handed to the reactor to free only after
// the deregistration), its address is stable, and it is immutable, so the NIC reads memory that
// is valid and unchanged; it is registered under `mr.desc` with runtime `rt_id`.
unsafe impl IoBuf for SharedBuf {
    fn seg(&self) -> LocalSeg {
        LocalSeg {
            ptr: self.entry.bytes.as_ptr() as *mut u8,
            len: self.entry.bytes.len(),
            desc: self.entry.mr.desc,
        }
    }
    fn runtime_id(&self) -> u64 {
        self.entry.rt_id
    }
}

impl Runtime {
    /// Register shared, immutable memory through the registration cache: the same `Bytes`
    /// (same address and length) registered again reuses its registration. Use it for memory
    /// sent or written repeatedly (weights, cached pages, reply templates).
    pub fn register_shared(&self, bytes: Bytes) -> Result<SharedBuf> {
        Ok(SharedBuf { entry: self.mr_cache().register(self, bytes)? })
    }
}
