//! The few CUDA driver calls rdmalane makes, through `cudarc`'s bindings loaded at run time (a
//! build needs no CUDA toolkit; a host without a driver gets a typed error, never a panic).
//! Each device's primary context is retained once and made current on the calling thread
//! before each call: ops, drops and the reactor may run on any thread.
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use crate::base::error::{Error, OpKind, Result};

/// A driver call's status as an error naming the call.
pub(crate) fn check(op: OpKind, call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null.
    unsafe { sys::cuGetErrorName(r, &mut name) };
    let detail = if name.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    Err(Error::Cuda { op, call, detail: detail.into() })
}

/// The driver, loaded and initialised once; the error is kept for every later caller.
fn driver() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = INIT.get_or_init(|| {
        // SAFETY: only tries to open the library; the bindings panic when it is missing, so
        // nothing else is called before this says it is there.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) on this host".into());
        }
        // SAFETY: cuInit with no flags, before any other call.
        check(OpKind::Register, "cuInit", unsafe { sys::cuInit(0) }).map_err(|e| e.to_string())
    });
    r.clone().map_err(|why| Error::Cuda { op: OpKind::Register, call: "cuInit", detail: why.into() })
}

/// A device's primary context.
pub(crate) struct Context {
    device: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext is a handle the driver lets any thread make current.
unsafe impl Send for Context {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Context {}

impl Context {
    /// Device `device`'s primary context (retained once per process, kept for its life).
    pub(crate) fn get(device: u32) -> Result<Arc<Context>> {
        driver()?;
        static ALL: OnceLock<Mutex<HashMap<u32, Arc<Context>>>> = OnceLock::new();
        let mut all = ALL.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = all.get(&device) {
            return Ok(c.clone());
        }
        let mut count = 0;
        // SAFETY: an out-pointer to a local.
        check(OpKind::Register, "cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
        if device as i64 >= count as i64 {
            return Err(Error::Cuda {
                op: OpKind::Register,
                call: "cuDeviceGet",
                detail: format!("no CUDA device {device}: this host has {count}").into(),
            });
        }
        let mut dev = 0;
        // SAFETY: an out-pointer to a local, an ordinal below the count.
        check(OpKind::Register, "cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, device as i32) })?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local, a device the driver returned.
        check(OpKind::Register, "cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let c = Arc::new(Context { device, dev, ctx });
        all.insert(device, c.clone());
        Ok(c)
    }

    /// The device ordinal.
    pub(crate) fn device(&self) -> u32 {
        self.device
    }

    /// Make the context current on this thread (cheap: a thread-local store in the driver).
    pub(crate) fn bind(&self, op: OpKind) -> Result<()> {
        // SAFETY: a context retained for the process's life.
        check(op, "cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// Wait for all work queued in the context (ours, and a provider's on its own streams).
    pub(crate) fn synchronize(&self, op: OpKind) -> Result<()> {
        self.bind(op)?;
        // SAFETY: the current context is ours (bound above).
        check(op, "cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Whether the device can export its memory as dma-buf.
    pub(crate) fn dmabuf_supported(&self) -> bool {
        let mut v = 0;
        // SAFETY: an out-pointer to a local, a device the driver returned.
        let r = unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                self.dev,
            )
        };
        r == sys::CUresult::CUDA_SUCCESS && v != 0
    }
}

/// A device allocation, freed on drop (with its context made current on the dropping thread,
/// which may be the reactor's, after the memory's deregistration).
pub(crate) struct DeviceAlloc {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) ctx: Arc<Context>,
}

impl DeviceAlloc {
    /// `len` bytes of device memory, zeroed.
    pub(crate) fn new(ctx: Arc<Context>, len: usize) -> Result<DeviceAlloc> {
        ctx.bind(OpKind::Register)?;
        let mut ptr = 0;
        // SAFETY: an out-pointer to a local; the context is current.
        check(OpKind::Register, "cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len) })?;
        let a = DeviceAlloc { ptr, ctx };
        // SAFETY: `len` bytes at `ptr` were just allocated.
        check(OpKind::Register, "cuMemsetD8", unsafe { sys::cuMemsetD8_v2(ptr, 0, len) })?;
        Ok(a)
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ctx.bind(OpKind::Register).is_ok() {
            // SAFETY: allocated in `new`, freed once; every copy and registration of it is
            // over (the owner drains its copies and deregisters first).
            let r = unsafe { sys::cuMemFree_v2(self.ptr) };
            if r != sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(?r, "cuMemFree failed");
            }
        }
    }
}

/// A CUDA stream of the context, destroyed on drop.
pub(crate) struct Stream {
    pub(crate) raw: sys::CUstream,
    ctx: Arc<Context>,
}

// SAFETY: streams are driver handles usable from any thread with their context current.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream (it does not wait on the legacy default stream).
    pub(crate) fn new(ctx: Arc<Context>) -> Result<Stream> {
        ctx.bind(OpKind::Register)?;
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: an out-pointer to a local; the context is current.
        check(OpKind::Register, "cuStreamCreate", unsafe { sys::cuStreamCreate(&mut raw, flags) })?;
        Ok(Stream { raw, ctx })
    }

    /// Wait for everything queued on the stream.
    pub(crate) fn sync(&self) -> Result<()> {
        self.ctx.bind(OpKind::Copy)?;
        // SAFETY: a stream of ours, alive.
        check(OpKind::Copy, "cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind(OpKind::Copy).is_ok() {
            // SAFETY: our stream, destroyed once; the driver finishes its queued work first.
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// An event recorded on a stream after a copy.
pub(crate) struct Event(pub(crate) sys::CUevent);

// SAFETY: events are driver handles usable from any thread with their context current.
unsafe impl Send for Event {}

impl Event {
    /// Record an event on `stream` now.
    pub(crate) fn record(stream: &Stream) -> Result<Event> {
        let mut ev = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: an out-pointer to a local; the caller made the context current.
        check(OpKind::Copy, "cuEventCreate", unsafe { sys::cuEventCreate(&mut ev, flags) })?;
        let e = Event(ev);
        // SAFETY: our event and stream, both alive.
        check(OpKind::Copy, "cuEventRecord", unsafe { sys::cuEventRecord(ev, stream.raw) })?;
        Ok(e)
    }

    /// Whether the work before the event has finished.
    pub(crate) fn done(&self) -> Result<bool> {
        // SAFETY: our event, alive.
        match unsafe { sys::cuEventQuery(self.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(OpKind::Copy, "cuEventQuery", r).map(|_| false),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: our event, destroyed once (the driver releases it when its work completes).
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Pin `len` bytes of host memory at `ptr` for DMA by every context (a mirror). False where the
/// driver refused (the copies then run from pageable memory, slower, still correct).
pub(crate) fn pin(ctx: &Context, ptr: *mut u8, len: usize) -> bool {
    if ctx.bind(OpKind::Register).is_err() {
        return false;
    }
    // SAFETY: the caller owns [ptr, ptr+len) and unpins it before freeing it.
    let r = unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE) };
    if r != sys::CUresult::CUDA_SUCCESS {
        tracing::warn!(?r, len, "cuMemHostRegister failed: the mirror's copies run from pageable memory");
    }
    r == sys::CUresult::CUDA_SUCCESS
}

/// Undo [`pin`].
pub(crate) fn unpin(ctx: &Context, ptr: *mut u8) {
    if ctx.bind(OpKind::Register).is_ok() {
        // SAFETY: pinned by `pin`, unpinned once.
        unsafe { sys::cuMemHostUnregister(ptr.cast()) };
    }
}

/// A dma-buf file descriptor exporting `len` bytes of device memory at `ptr` (page-aligned as
/// cuMemAlloc returns it), where the driver and kernel can.
pub(crate) fn export_dmabuf(
    ctx: &Context,
    ptr: sys::CUdeviceptr,
    len: usize,
) -> Option<std::os::fd::OwnedFd> {
    if !ctx.dmabuf_supported() || ctx.bind(OpKind::Register).is_err() {
        return None;
    }
    let mut fd: i32 = -1;
    let kind = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
    // SAFETY: an out-pointer to a local int, a range of our allocation.
    let r = unsafe { sys::cuMemGetHandleForAddressRange((&mut fd as *mut i32).cast(), ptr, len, kind, 0) };
    if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
        tracing::debug!(?r, "no dma-buf export of device memory");
        return None;
    }
    // SAFETY: the driver handed us a new descriptor; we own it from here.
    Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}
