//! CUDA device memory as a buffer (the `cuda` feature): [`CudaBuf`]. Where the transport
//! registers device memory itself (libfabric with FI_HMEM, verbs with dma-buf or
//! nvidia-peermem) ops read and write it in place; elsewhere it takes the staging path
//! through a pinned host mirror (`buf::staging`). The path is decided when the buffer is
//! allocated ([`Runtime::device_path`]) and refused there, with a typed error naming the
//! provider and what it lacks, where the runtime's policy allows none.
mod copies;
mod driver;

use std::fmt;
use std::ops::RangeBounds;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use copies::CudaCopies;
use driver::{check, Context, DeviceAlloc};

use super::staging::{Mirror, StagedView, Staging};
use super::{IoBuf, IoBufMut, Slice};
use crate::base::error::{Error, OpKind, Result};
use crate::base::memory::{DeviceMem, DevicePath, DevicePolicy, DeviceRegistration, DmaBuf, Memory};
use crate::base::transport::{Access, LocalSeg, MemoryRegion};
use crate::runtime::Runtime;

/// How the buffer is registered.
enum Reg {
    /// The transport registered the device memory; `alloc` goes to the reactor with the
    /// deregistration, which frees it only after (with the dma-buf export).
    Native { mr: MemoryRegion, alloc: Option<DeviceAlloc>, dmabuf: Option<OwnedFd> },
    /// Through a mirror; the device memory is the transport's business only through copies.
    Staged { staging: Arc<Staging>, alloc: Option<DeviceAlloc> },
}

/// `len` bytes of CUDA device memory on one device, registered with a runtime: an [`IoBuf`] and
/// [`IoBufMut`] like any registered buffer, so `ep.write_remote(buf, &remote)`,
/// `read_remote`, `write_batch`, `send` and `recv` take it, from and into device memory. Its
/// [`path`](Self::path) says how the bytes move. Dropping it while an op is in flight is safe
/// (the op keeps the buffer, or on the staging path its mirror, until its completion; the
/// device memory is freed after its copies and deregistration).
pub struct CudaBuf {
    ptr: u64,
    len: usize,
    /// The descriptor ops pass (the device registration's, or the mirror's).
    desc: usize,
    path: DevicePath,
    reg: Box<Registration>,
}

struct Registration {
    rt: Runtime,
    ctx: Arc<Context>,
    kind: Reg,
}

impl CudaBuf {
    /// Allocate `len` zeroed bytes on CUDA device `device` and register them with `rt`, on
    /// the path its policy and transport give ([`Runtime::device_path`]): refused at once,
    /// before any allocation, where there is none; a host without a CUDA driver, or without
    /// that device, gets [`Error::Cuda`].
    pub fn alloc(rt: &Runtime, device: u32, len: usize) -> Result<CudaBuf> {
        if len == 0 {
            return Err(Error::invalid(OpKind::Register, "cannot allocate a zero-length device buffer"));
        }
        let memory = Memory::Cuda { device };
        let mut path = rt.device_path(memory)?;
        let ctx = Context::get(device)?;
        let alloc = DeviceAlloc::new(ctx.clone(), len)?;
        let ptr = alloc.ptr;
        let mut native = None;
        if let DevicePath::Native(reg) = path {
            // A dma-buf export only where the transport registers by one.
            let by_dmabuf = matches!(
                reg,
                DeviceRegistration::FiHmem { dmabuf: true, .. }
                    | DeviceRegistration::Verbs { dmabuf: true, .. }
            );
            let dmabuf = if by_dmabuf { driver::export_dmabuf(&ctx, ptr, len) } else { None };
            let d = dmabuf.as_ref().map(|fd| DmaBuf { fd: fd.as_raw_fd(), offset: 0 });
            let dev = Some(DeviceMem { memory, dmabuf: d });
            match rt.register_memory(ptr as *mut u8, len, Access::LOCAL, dev) {
                Ok(mr) => native = Some((mr, dmabuf)),
                // Auto: a transport that claims device registration but refuses this memory
                // (verbs without peermem on a GPU without dma-buf) stages it, saying so.
                Err(e) if rt.device_policy() == DevicePolicy::Auto => {
                    tracing::warn!(error = %e, "device memory refused by the transport: staged instead");
                    path = DevicePath::Staged;
                }
                Err(e) => return Err(e),
            }
        }
        let (desc, kind) = match native {
            Some((mr, dmabuf)) => (mr.desc, Reg::Native { mr, alloc: Some(alloc), dmabuf }),
            None => {
                let mirror = Mirror::alloc(rt, len)?;
                let copies = CudaCopies::new(ctx.clone(), ptr, mirror.ptr(), len)?;
                let staging = Arc::new(Staging { copies: Box::new(copies), mirror });
                let desc = StagedView::new(staging.clone(), 0, len).mirror_seg().desc;
                (desc, Reg::Staged { staging, alloc: Some(alloc) })
            }
        };
        tracing::debug!(device, len, %path, "device buffer registered");
        rt.count_device_buffer(path);
        Ok(CudaBuf { ptr, len, desc, path, reg: Box::new(Registration { rt: rt.clone(), ctx, kind }) })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never the case for an allocated one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device ordinal.
    pub fn device(&self) -> u32 {
        self.reg.ctx.device()
    }

    /// The device address of the first byte (for the application's kernels and copies).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// How this buffer's bytes move.
    pub fn path(&self) -> DevicePath {
        self.path
    }

    /// The runtime the buffer is registered with.
    pub fn runtime(&self) -> &Runtime {
        &self.reg.rt
    }

    /// Copy `src` into the buffer at offset `at` (waits for the copy).
    pub fn copy_from_host(&mut self, at: usize, src: &[u8]) -> Result<()> {
        self.check_range(at, src.len())?;
        self.reg.ctx.bind(OpKind::Copy)?;
        // A transport's copy out of this memory may still run after its op completed.
        self.fence()?;
        // SAFETY: the range was checked against our allocation; `src` is valid for its length.
        let r = unsafe {
            cudarc::driver::sys::cuMemcpyHtoD_v2(self.ptr + at as u64, src.as_ptr().cast(), src.len())
        };
        check(OpKind::Copy, "cuMemcpyHtoD", r)
    }

    /// Copy the buffer's bytes from offset `at` into `dst` (waits for the copy).
    pub fn copy_to_host(&self, at: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(at, dst.len())?;
        self.reg.ctx.bind(OpKind::Copy)?;
        // A transport's copy into this memory may still run after its op completed.
        self.fence()?;
        // SAFETY: the range was checked against our allocation; `dst` is valid for its length.
        let r = unsafe {
            cudarc::driver::sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + at as u64, dst.len())
        };
        check(OpKind::Copy, "cuMemcpyDtoH", r)
    }

    /// Copy all of `src` (device memory, the same device or another) to the start of this
    /// buffer, device to device (waits for the copy).
    pub fn copy_from_device(&mut self, src: &CudaBuf) -> Result<()> {
        self.check_range(0, src.len)?;
        self.reg.ctx.bind(OpKind::Copy)?;
        self.fence()?;
        src.fence()?;
        // SAFETY: both ranges lie inside live allocations (checked above for ours).
        let r = unsafe { cudarc::driver::sys::cuMemcpyDtoD_v2(self.ptr, src.ptr, src.len) };
        check(OpKind::Copy, "cuMemcpyDtoD", r)?;
        // A device-to-device copy returns before it is done: wait for it, as documented.
        // SAFETY: the context is current on this thread.
        check(OpKind::Copy, "cuCtxSynchronize", unsafe { cudarc::driver::sys::cuCtxSynchronize() })
    }

    /// The whole buffer copied to the host.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    /// A sub-range of this buffer as a buffer of its own; refused when out of range.
    pub fn slice(self, range: impl RangeBounds<usize>) -> Result<Slice<CudaBuf>> {
        Slice::new(self, range)
    }

    fn check_range(&self, at: usize, n: usize) -> Result<()> {
        if at.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfBounds {
                op: OpKind::Copy,
                offset: at as u64,
                want: n as u64,
                len: self.len as u64,
            });
        }
        Ok(())
    }
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        match &mut self.reg.kind {
            Reg::Native { mr, alloc, dmabuf } => {
                // Local registration, but of memory the provider may still map (CUDA IPC, the
                // NIC's page tables): the allocation is freed by the reactor after the
                // deregistration has returned.
                let keep = (alloc.take(), dmabuf.take());
                self.reg.rt.release_region(mr.id, Some(Box::new(keep)));
            }
            Reg::Staged { staging, alloc } => {
                // The copies in flight of a dropped op finish before the device memory goes;
                // the mirror lives on while an op's cell holds a part of it.
                if let Err(e) = staging.copies.drain() {
                    tracing::warn!(error = %e, "device buffer dropped with a failed copy");
                }
                drop(alloc.take());
            }
        }
    }
}

impl fmt::Debug for CudaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuf")
            .field("device", &self.device())
            .field("len", &self.len)
            .field("path", &self.path)
            .finish()
    }
}

// SAFETY: the device allocation stays at its address until the value drops (and, natively,
// until its deregistration after that); it is registered with `rt` under `desc`, or on the
// staging path `seg` describes the mirror, registered under its descriptor.
unsafe impl IoBuf for CudaBuf {
    fn seg(&self) -> LocalSeg {
        match &self.reg.kind {
            Reg::Staged { staging, .. } => StagedView::new(staging.clone(), 0, self.len).mirror_seg(),
            Reg::Native { .. } => LocalSeg { ptr: self.ptr as *mut u8, len: self.len, desc: self.desc },
        }
    }
    fn runtime_id(&self) -> u64 {
        self.reg.rt.id()
    }
    fn memory(&self) -> Memory {
        Memory::Cuda { device: self.device() }
    }
    fn staging(&self) -> Option<StagedView> {
        match &self.reg.kind {
            Reg::Staged { staging, .. } => Some(StagedView::new(staging.clone(), 0, self.len)),
            Reg::Native { .. } => None,
        }
    }
    fn dmabuf(&self) -> Option<DmaBuf> {
        match &self.reg.kind {
            Reg::Native { dmabuf: Some(fd), .. } => Some(DmaBuf { fd: fd.as_raw_fd(), offset: 0 }),
            _ => None,
        }
    }
    fn fence(&self) -> Result<()> {
        match &self.reg.kind {
            // shm's CUDA IPC path completes an op before the copy it queued in this process
            // (on a stream of its own) is done: wait for the context's work.
            Reg::Native { .. } => self.reg.ctx.synchronize(OpKind::Copy),
            Reg::Staged { .. } => Ok(()),
        }
    }
}

// SAFETY: the value owns the device memory exclusively.
unsafe impl IoBufMut for CudaBuf {}

// SAFETY: the handles inside are driver handles usable from any thread; the memory is owned.
unsafe impl Send for CudaBuf {}
// SAFETY: shared access only reads (copies to the host).
unsafe impl Sync for CudaBuf {}

impl Runtime {
    /// Allocate `len` zeroed bytes of device memory on CUDA device `device` (see
    /// [`CudaBuf::alloc`]).
    pub fn alloc_cuda(&self, device: u32, len: usize) -> Result<CudaBuf> {
        CudaBuf::alloc(self, device, len)
    }
}
