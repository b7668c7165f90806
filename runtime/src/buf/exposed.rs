use std::fmt;

use super::IoBuf;
use crate::base::error::{Error, OpKind, Result};
use crate::base::remote::RemoteBuf;
use crate::base::transport::{Access, MemoryRegion};
use crate::runtime::Runtime;

/// A buffer peers may reach with one-sided reads or writes, as the access it was exposed with
/// allows. Hand [`descriptor`](Self::descriptor) to a peer; [`revoke`](Self::revoke) takes the
/// access back and returns the buffer.
pub struct ExposedBuf<B: IoBuf> {
    buf: Option<B>,
    mr: MemoryRegion,
    desc: RemoteBuf,
    rt: Runtime,
}

impl<B: IoBuf> ExposedBuf<B> {
    pub(crate) fn new(rt: &Runtime, buf: B, access: Access) -> Result<ExposedBuf<B>> {
        if !access.is_remote() {
            return Err(Error::invalid(OpKind::Expose, "access grants peers nothing"));
        }
        if buf.runtime_id() != rt.id() {
            return Err(Error::invalid(OpKind::Expose, "buffer is registered with another runtime"));
        }
        let seg = buf.seg();
        let mr = rt.register_region(seg.ptr, seg.len, access)?;
        let keys: Vec<u64> = std::iter::once(mr.key).chain(mr.rail_keys.iter().copied()).collect();
        let desc = RemoteBuf::new(rt.id(), mr.remote_base, seg.len as u64, &keys, access);
        Ok(ExposedBuf { buf: Some(buf), mr, desc, rt: rt.clone() })
    }

    /// The descriptor a peer needs to reach this buffer.
    pub fn descriptor(&self) -> RemoteBuf {
        self.desc.clone()
    }

    /// The bytes as they are now. Peers may be writing them: read after the peer said it is done
    /// (a message, an immediate event).
    pub fn as_slice(&self) -> &[u8] {
        let seg = self.buf.as_ref().expect("present until revoke or drop").seg();
        // SAFETY: the memory is owned by `buf` and stays valid while self lives; peers write it
        // only through the NIC, as with any memory shared with a device.
        unsafe { std::slice::from_raw_parts(seg.ptr, seg.len) }
    }

    /// Byte `i` as it is in memory now, read without the compiler caching it: for polling a
    /// flag or sequence byte a peer writes (as perftest's write latency test does). `None`
    /// past the end.
    pub fn peek(&self, i: usize) -> Option<u8> {
        let seg = self.buf.as_ref().expect("present until revoke or drop").seg();
        if i >= seg.len {
            return None;
        }
        // SAFETY: in bounds of memory `buf` owns while self lives; a volatile read of a byte a
        // device may write concurrently is how device-shared memory is polled.
        Some(unsafe { std::ptr::read_volatile(seg.ptr.add(i)) })
    }

    /// Take the access back (waits until the registration is gone) and return the buffer.
    pub fn revoke(mut self) -> Result<B> {
        self.rt.deregister_now(self.mr.id)?;
        Ok(self.buf.take().expect("present until revoke or drop"))
    }
}

impl<B: IoBuf> Drop for ExposedBuf<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // Peers may still reach the memory until the deregistration returns, so the reactor
            // keeps the buffer and frees it after.
            self.rt.release_region(self.mr.id, Some(Box::new(buf)));
        }
    }
}

impl<B: IoBuf> fmt::Debug for ExposedBuf<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExposedBuf").field("descriptor", &self.desc).finish()
    }
}

impl Runtime {
    /// Let peers reach `buf` with the given access; the result carries the descriptor to hand
    /// them.
    pub fn expose<B: IoBuf>(&self, buf: B, access: Access) -> Result<ExposedBuf<B>> {
        ExposedBuf::new(self, buf, access)
    }
}
