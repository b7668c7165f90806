use std::fmt;

use std::ops::{Bound, RangeBounds};

use super::staging::CopyDir;
use super::{IoBuf, IoBufMut};
use crate::base::error::{Error, OpKind, Result};
use crate::base::memory::DeviceMem;
use crate::base::remote::bounds;
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
        // Device memory: on the staging path peers reach the mirror (`seg` describes it; see
        // `settle` and `publish`); natively, the transport registers the device memory itself.
        let seg = buf.seg();
        let memory = buf.memory();
        let device = (memory.is_device() && buf.staging().is_none())
            .then(|| DeviceMem { memory, dmabuf: buf.dmabuf() });
        let mr = rt.register_memory(seg.ptr, seg.len, access, device)?;
        let keys: Vec<u64> = std::iter::once(mr.key).chain(mr.rail_keys.iter().copied()).collect();
        let desc = RemoteBuf::new(rt.id(), mr.remote_base, seg.len as u64, &keys, access).with_memory(memory);
        Ok(ExposedBuf { buf: Some(buf), mr, desc, rt: rt.clone() })
    }

    /// The buffer, to read it its own way (a device buffer's copies to the host).
    pub fn get_ref(&self) -> &B {
        self.buf.as_ref().expect("present until revoke or drop")
    }

    /// Make what peers wrote visible in the buffer: call it after a peer said its writes are
    /// done (its message, or its write's immediate event). On the staging path of device
    /// memory, peers' writes land in the host mirror, and this copies the mirror's `range`
    /// (all of it: `..`) into device memory, waiting for the copy; for device memory registered
    /// natively it waits for the copies the provider queued on the device in this process (shm's
    /// CUDA IPC path raises events before they are done); for host memory there is nothing to do.
    pub fn settle(&self, range: impl RangeBounds<usize>) -> Result<()> {
        self.stage(CopyDir::ToDevice, range)
    }

    /// Make the buffer's bytes readable by peers: call it before peers read what the device
    /// wrote since the buffer was exposed or last published. On the staging path this copies
    /// device memory's `range` into the mirror peers read; elsewhere there is nothing to do.
    pub fn publish(&self, range: impl RangeBounds<usize>) -> Result<()> {
        self.stage(CopyDir::ToMirror, range)
    }

    fn stage(&self, dir: CopyDir, range: impl RangeBounds<usize>) -> Result<()> {
        // Natively registered device memory: the provider's copies queued in this process
        // may still run (shm's CUDA IPC path raises events before they are done).
        let Some(view) = self.get_ref().staging() else { return self.get_ref().fence() };
        let widen = |b: Bound<&usize>| b.map(|&v| v as u64);
        let (start, end) = bounds(widen(range.start_bound()), widen(range.end_bound()), view.len as u64);
        if start > end || end > view.len as u64 {
            return Err(Error::OutOfBounds {
                op: OpKind::Copy,
                offset: start,
                want: end.saturating_sub(start),
                len: view.len as u64,
            });
        }
        view.copy_now(dir, start as usize..end as usize)?;
        self.rt.count_staged_bytes((end - start) as usize);
        Ok(())
    }

    /// The descriptor a peer needs to reach this buffer.
    pub fn descriptor(&self) -> RemoteBuf {
        self.desc.clone()
    }

    /// The bytes as they are now. Peers may be writing them: read after the peer said it is done
    /// (a message, an immediate event).
    ///
    /// Device memory cannot be read from the host this way: for a device buffer this is empty
    /// (copy it out through [`get_ref`](Self::get_ref) after [`settle`](Self::settle)).
    pub fn as_slice(&self) -> &[u8] {
        if self.get_ref().memory().is_device() {
            return &[];
        }
        let seg = self.buf.as_ref().expect("present until revoke or drop").seg();
        // SAFETY: the memory is owned by `buf` and stays valid while self lives; peers write it
        // only through the NIC, as with any memory shared with a device.
        unsafe { std::slice::from_raw_parts(seg.ptr, seg.len) }
    }

    /// Byte `i` as it is in memory now, read without the compiler caching it: for polling a
    /// flag or sequence byte a peer writes (as perftest's write latency test does). `None`
    /// past the end, and for device memory (the host cannot read it).
    pub fn peek(&self, i: usize) -> Option<u8> {
        if self.get_ref().memory().is_device() {
            return None;
        }
        let seg = self.buf.as_ref().expect("present until revoke or drop").seg();
        if i >= seg.len {
            return None;
        }
        // SAFETY: in bounds of memory `buf` owns while self lives; a volatile read of a byte a
        // device may write concurrently is how device-shared memory is polled.
        Some(unsafe { std::ptr::read_volatile(seg.ptr.add(i)) })
    }

    /// Take the access back (waits until the registration is gone) and return the buffer.
    ///
    /// Where the transport fails to deregister, the error says why and the buffer is not
    /// given back: the registration may still be live, a peer still able to reach the memory,
    /// so the memory is kept for good, never freed or reused (`Stats::deregistrations_failed`).
    /// A buffer that holds a handle on its runtime keeps it too: that runtime then stops only
    /// by [`Runtime::shutdown`].
    pub fn revoke(mut self) -> Result<B> {
        let buf = self.buf.take().expect("present until revoke or drop");
        match self.rt.deregister_now(self.mr.id) {
            Ok(()) => Ok(buf),
            // Stopped: the transport is gone, and its registrations with it.
            Err(e @ Error::Shutdown { .. }) => Err(e),
            Err(e) => {
                std::mem::forget(buf);
                Err(e)
            }
        }
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
    /// them. Peers may write it, so it must be memory this side may have changed under it
    /// ([`IoBufMut`]); memory shared read-only (a [`SharedBuf`](crate::SharedBuf), an `Arc`)
    /// goes through [`expose_read`](Self::expose_read):
    ///
    /// ```compile_fail
    /// # fn f(rt: rdmalane::Runtime, shared: rdmalane::SharedBuf) {
    /// let _ = rt.expose(shared, rdmalane::Access::WRITE); // a peer could write immutable bytes
    /// # }
    /// ```
    pub fn expose<B: IoBufMut>(&self, buf: B, access: Access) -> Result<ExposedBuf<B>> {
        ExposedBuf::new(self, buf, access)
    }

    /// Let peers read `buf`, which may be memory shared read-only: no peer can write it.
    pub fn expose_read<B: IoBuf>(&self, buf: B) -> Result<ExposedBuf<B>> {
        ExposedBuf::new(self, buf, Access::READ)
    }
}
