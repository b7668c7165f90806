//! The staging path of device memory: a device buffer whose transport cannot register device
//! memory keeps a host **mirror** of the same size, registered with the runtime (and pinned by
//! the device's driver, so its copies run at DMA speed). Transfers move the mirror's bytes; the
//! copies between device and mirror are the device's (`MirrorCopies`), ordered by the plan in
//! `base::stage_plan`. Nothing here calls a GPU: the CUDA copies are in `buf::cuda`, and the
//! emulated device of the tests (`buf::emulated`) copies host memory.
use std::alloc::{self, Layout};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{IoBuf, IoBufMut};
use crate::base::error::{Error, OpKind, Result};
use crate::base::transport::{Access, LocalSeg, MemoryRegion};
use crate::runtime::Runtime;

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyDir {
    /// Device → mirror (before the mirror's bytes go out).
    ToMirror,
    /// Mirror → device (after bytes landed in the mirror).
    ToDevice,
}

/// A copy started by [`MirrorCopies::start`], to ask about with [`MirrorCopies::done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyTicket(pub(crate) u64);

/// Copies between one device buffer and its mirror, asynchronous and in the order started.
pub(crate) trait MirrorCopies: Send + Sync {
    /// Start copying the buffer's `range` in direction `dir`.
    fn start(&self, dir: CopyDir, range: Range<usize>) -> Result<CopyTicket>;
    /// Whether copy `t` has finished (each ticket reports `true` once, then is forgotten).
    fn done(&self, t: CopyTicket) -> Result<bool>;
    /// Wait for every copy started so far (before the device memory may be freed).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn drain(&self) -> Result<()>;
}

/// Copy the buffer's `range` in direction `dir` now, waiting for it.
pub(crate) fn copy_now(copies: &dyn MirrorCopies, dir: CopyDir, range: Range<usize>) -> Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    let t = copies.start(dir, range)?;
    while !copies.done(t)? {
        std::hint::spin_loop();
    }
    Ok(())
}

/// A device buffer's mirror: page-aligned host memory of the buffer's size, registered with
/// the runtime for local use. Freed (after its registration is released) when the last
/// reference goes, which may be an op's cell holding a view of it until its completion.
pub(crate) struct Mirror {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
    mr: MemoryRegion,
    rt: Runtime,
}

// SAFETY: the mirror owns its heap memory; who writes it is governed by the staged op's plan
// (views of disjoint ranges, each owned by one transfer or copy at a time).
unsafe impl Send for Mirror {}
// SAFETY: as above; shared references only hand out addresses.
unsafe impl Sync for Mirror {}

// Made by the device buffers (the `cuda` and `emulated-device` features).
#[cfg_attr(not(any(feature = "cuda", feature = "emulated-device")), allow(dead_code))]
impl Mirror {
    /// Allocate `len` zeroed bytes and register them with `rt`.
    pub(crate) fn alloc(rt: &Runtime, len: usize) -> Result<Mirror> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::invalid(OpKind::Register, format!("a mirror of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            return Err(Error::invalid(OpKind::Register, format!("out of memory for a {len}-byte mirror")));
        };
        match rt.register_region(ptr.as_ptr(), len, Access::LOCAL) {
            Ok(mr) => Ok(Mirror { ptr, len, layout, mr, rt: rt.clone() }),
            Err(e) => {
                // SAFETY: allocated just above with this layout, never handed out.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    /// The first byte's address.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mirror's bytes `range` as a work request's segment.
    fn seg(&self, range: Range<usize>) -> LocalSeg {
        debug_assert!(range.end <= self.len);
        LocalSeg { ptr: self.ptr.as_ptr().wrapping_add(range.start), len: range.len(), desc: self.mr.desc }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        // Local-only memory: no peer reaches it through this registration (an exposure has its
        // own, released by its `ExposedBuf`, which holds this mirror until then), and no op
        // holds a view (a view holds the mirror), so the memory may go now.
        self.rt.release_region(self.mr.id, None);
        // SAFETY: allocated in `alloc` with this layout, freed once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A device buffer's staging: its mirror and the copies between the two. The copies drop
/// first (a CUDA implementation unpins the mirror there), then the mirror.
pub(crate) struct Staging {
    pub(crate) copies: Box<dyn MirrorCopies>,
    pub(crate) mirror: Mirror,
}

/// The staged part of a device buffer an op works on: its staging and the range of the
/// buffer it covers. (What a device buffer's [`IoBuf::staging`] gives; not for applications.)
#[doc(hidden)]
#[derive(Clone)]
pub struct StagedView {
    pub(crate) staging: Arc<Staging>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl std::fmt::Debug for StagedView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedView").field("off", &self.off).field("len", &self.len).finish()
    }
}

impl StagedView {
    #[cfg_attr(not(any(feature = "cuda", feature = "emulated-device")), allow(dead_code))]
    pub(crate) fn new(staging: Arc<Staging>, off: usize, len: usize) -> StagedView {
        StagedView { staging, off, len }
    }

    /// The sub-range `range` (relative to this view) as a view.
    pub(crate) fn sub(&self, range: Range<usize>) -> StagedView {
        debug_assert!(range.end <= self.len);
        StagedView { staging: self.staging.clone(), off: self.off + range.start, len: range.len() }
    }

    /// The mirror's bytes this view covers, as a work request's segment.
    pub(crate) fn mirror_seg(&self) -> LocalSeg {
        self.staging.mirror.seg(self.off..self.off + self.len)
    }

    /// The mirror's bytes `range` (relative to this view) as a buffer a transfer may own.
    pub(crate) fn mirror_part(&self, range: Range<usize>) -> MirrorPart {
        MirrorPart { view: self.sub(range) }
    }

    /// Start a copy of `range` (relative to this view).
    pub(crate) fn start_copy(&self, dir: CopyDir, range: Range<usize>) -> Result<CopyTicket> {
        self.staging.copies.start(dir, self.off + range.start..self.off + range.end)
    }

    /// Whether copy `t` has finished.
    pub(crate) fn copy_done(&self, t: CopyTicket) -> Result<bool> {
        self.staging.copies.done(t)
    }

    /// Copy `range` (relative to this view) now.
    pub(crate) fn copy_now(&self, dir: CopyDir, range: Range<usize>) -> Result<()> {
        copy_now(&*self.staging.copies, dir, self.off + range.start..self.off + range.end)
    }

    /// The runtime the mirror is registered with.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.staging.mirror.rt
    }
}

/// A range of a mirror owned by one transfer of a staged op: it keeps the mirror alive while
/// the NIC may touch it (a dropped op keeps it in its cell until the completion).
pub(crate) struct MirrorPart {
    view: StagedView,
}

// SAFETY: the mirror's memory is heap memory that stays at its address while any view holds
// it, registered with the runtime under the mirror's descriptor.
unsafe impl IoBuf for MirrorPart {
    fn seg(&self) -> LocalSeg {
        self.view.mirror_seg()
    }
    fn runtime_id(&self) -> u64 {
        self.view.runtime().id()
    }
}

// SAFETY: the staged op's plan hands each range to one transfer at a time, and no copy runs on
// a range while its transfer is in flight (out: the copy finished before the post; in: the
// copy starts after the completion).
unsafe impl IoBufMut for MirrorPart {}
