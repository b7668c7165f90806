//! A host-memory stand-in for a device buffer on the staging path (the `emulated-device`
//! feature): its "device memory" is a host allocation and its copies are `memcpy`s that
//! report done one look later than they are, as a device's asynchronous copies do. Tests run
//! the whole staging path (plan, mirror, copies, transfers, settle and publish) through it on
//! real providers, on hosts without a GPU. Not part of the API.
use std::ops::Range;
use std::sync::{Arc, Mutex};

use slab::Slab;

use super::staging::{CopyDir, CopyTicket, Mirror, MirrorCopies, StagedView, Staging};
use super::{IoBuf, IoBufMut};
use crate::base::error::{Error, OpKind, Result};
use crate::base::memory::Memory;
use crate::base::transport::LocalSeg;
use crate::runtime::Runtime;

/// "Device" memory: a host allocation only the copies touch.
struct FakeDevice(Mutex<Vec<u8>>);

struct HostCopies {
    dev: Arc<FakeDevice>,
    host: *mut u8,
    len: usize,
    /// Looks left before each copy reports done.
    pending: Mutex<Slab<u8>>,
    copies: std::sync::atomic::AtomicU64,
}

// SAFETY: `host` is the mirror's memory, alive while this lives (the staging drops its copies
// first); the plan gives each range to one copy or transfer at a time.
unsafe impl Send for HostCopies {}
// SAFETY: as above.
unsafe impl Sync for HostCopies {}

impl MirrorCopies for HostCopies {
    fn start(&self, dir: CopyDir, range: Range<usize>) -> Result<CopyTicket> {
        if range.end > self.len || range.start > range.end {
            return Err(Error::invalid(
                OpKind::Copy,
                format!("copy of {range:?} in a {}-byte buffer", self.len),
            ));
        }
        let mut dev = self.dev.0.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the range lies inside the mirror (checked above), which no transfer owns
        // while its copy runs.
        let mirror = unsafe { std::slice::from_raw_parts_mut(self.host.add(range.start), range.len()) };
        match dir {
            CopyDir::ToMirror => mirror.copy_from_slice(&dev[range]),
            CopyDir::ToDevice => dev[range].copy_from_slice(mirror),
        }
        self.copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(CopyTicket(self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(1) as u64))
    }

    fn done(&self, t: CopyTicket) -> Result<bool> {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        match p.get_mut(t.0 as usize) {
            None => Err(Error::invalid(OpKind::Copy, "no such copy")),
            Some(0) => {
                p.remove(t.0 as usize);
                Ok(true)
            }
            Some(n) => {
                *n -= 1;
                Ok(false)
            }
        }
    }

    fn drain(&self) -> Result<()> {
        Ok(())
    }
}

/// A device buffer emulated in host memory, always on the staging path (see the module doc).
/// It reports itself as CUDA device 0's memory, so every device branch is taken.
pub struct EmulatedDeviceBuf {
    dev: Arc<FakeDevice>,
    staging: Arc<Staging>,
    len: usize,
    rt: Runtime,
}

impl EmulatedDeviceBuf {
    /// `len` zeroed bytes of emulated device memory with a mirror registered with `rt`.
    pub fn alloc(rt: &Runtime, len: usize) -> Result<EmulatedDeviceBuf> {
        if len == 0 {
            return Err(Error::invalid(OpKind::Register, "cannot allocate a zero-length device buffer"));
        }
        let dev = Arc::new(FakeDevice(Mutex::new(vec![0u8; len])));
        let mirror = Mirror::alloc(rt, len)?;
        let copies = HostCopies {
            dev: dev.clone(),
            host: mirror.ptr(),
            len,
            pending: Mutex::new(Slab::new()),
            copies: Default::default(),
        };
        let staging = Arc::new(Staging { copies: Box::new(copies), mirror });
        rt.count_device_buffer(crate::base::memory::DevicePath::Staged);
        Ok(EmulatedDeviceBuf { dev, staging, len, rt: rt.clone() })
    }

    /// Write `src` into the "device" memory at `at`.
    pub fn copy_from_host(&mut self, at: usize, src: &[u8]) -> Result<()> {
        let mut d = self.dev.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(dst) = d.get_mut(at..at.saturating_add(src.len())) else {
            return Err(Error::OutOfBounds {
                op: OpKind::Copy,
                offset: at as u64,
                want: src.len() as u64,
                len: self.len as u64,
            });
        };
        dst.copy_from_slice(src);
        Ok(())
    }

    /// The "device" memory's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.dev.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never the case).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: `seg` describes the mirror, heap memory registered with `rt` that stays at its
// address while the staging lives, which this value holds.
unsafe impl IoBuf for EmulatedDeviceBuf {
    fn seg(&self) -> LocalSeg {
        self.view().mirror_seg()
    }
    fn runtime_id(&self) -> u64 {
        self.rt.id()
    }
    fn memory(&self) -> Memory {
        Memory::Cuda { device: 0 }
    }
    fn staging(&self) -> Option<StagedView> {
        Some(self.view())
    }
}

// SAFETY: the value owns its memory exclusively.
unsafe impl IoBufMut for EmulatedDeviceBuf {}

impl EmulatedDeviceBuf {
    fn view(&self) -> StagedView {
        StagedView::new(self.staging.clone(), 0, self.len)
    }
}

impl std::fmt::Debug for EmulatedDeviceBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedDeviceBuf").field("len", &self.len).finish()
    }
}
