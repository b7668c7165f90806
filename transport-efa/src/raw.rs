//! The raw engine: one transport endpoint (libfabric's, or any backend's) driven directly, with no reactor, no op cells and no
//! scheduler. `rdmalane-perf --engine raw` measures the runtime's overhead against it. It owns
//! its memory, so its API is safe: buffers are indices and every range is checked.
use std::alloc::{self, Layout};
use std::ptr::NonNull;

use rdmalane::backend::{
    Access, Completion, DeviceMem, LaneId, LocalSeg, MemoryRegion, PeerAddr, PostError, Posted, Transport,
};
use rdmalane::backend::{WorkRequest, WrId, WrKind};
use rdmalane::{Error, OpKind, Result};

use crate::FabricTransport;

struct RawMem {
    ptr: NonNull<u8>,
    layout: Layout,
    mr: MemoryRegion,
    /// Allocated here (else the caller's, see `register_external`).
    owned: bool,
}

/// A transport endpoint plus memory it owns.
pub struct RawEngine {
    // Declared first: dropped (endpoint closed, no more DMA) before the memory below is freed.
    t: Box<dyn Transport>,
    lane: LaneId,
    name: Vec<u8>,
    mems: Vec<RawMem>,
}

// SAFETY: the engine owns its memory; the transport is Send.
unsafe impl Send for RawEngine {}

impl RawEngine {
    /// Open `provider` as the runtime would.
    pub fn open(provider: Option<&str>, node: Option<&str>) -> Result<RawEngine> {
        Self::open_with(provider, node, false)
    }

    /// As [`open`](Self::open); `hmem` asks the provider for device memory (FI_HMEM), for
    /// [`register_external`](Self::register_external) of device memory.
    pub fn open_with(provider: Option<&str>, node: Option<&str>, hmem: bool) -> Result<RawEngine> {
        let t = FabricTransport::open_rails(
            provider,
            &[node.map(String::from)],
            &[0],
            false,
            rdmalane::backend::trust_local_peers_env(),
            hmem,
            // The baseline measures the provider as it is.
            hmem,
        )?;
        Self::on(Box::new(t))
    }

    /// Drive an already open transport of any backend (e.g. `rdmalane-verbs`).
    pub fn on(mut t: Box<dyn Transport>) -> Result<RawEngine> {
        let (lane, name) =
            t.open_lane(0).map_err(|e| Error::Transport { op: OpKind::Open, peer: "-".into(), source: e })?;
        Ok(RawEngine { t, lane, name, mems: Vec::new() })
    }

    /// The underlying transport's capabilities.
    pub fn caps(&self) -> &rdmalane::Caps {
        self.t.caps()
    }

    /// This endpoint's address.
    pub fn name(&self) -> Vec<u8> {
        self.name.clone()
    }

    /// Insert a peer's address.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<PeerAddr> {
        self.t.connect_lane(self.lane, name).map_err(|e| Error::Transport {
            op: OpKind::Connect,
            peer: "-".into(),
            source: e,
        })
    }

    /// Allocate and register `len` zeroed bytes; returns the buffer's index.
    pub fn alloc(&mut self, len: usize, access: Access) -> Result<usize> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::invalid(OpKind::Register, e.to_string()))?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::invalid(OpKind::Register, "out of memory"))?;
        // SAFETY: the memory lives in `self.mems` until the engine drops, after the transport
        // (and with it every registration) is closed.
        let mr = match unsafe { self.t.register(ptr.as_ptr(), len, access) } {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: allocated just above with this layout.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(Error::Transport { op: OpKind::Register, peer: "-".into(), source: e });
            }
        };
        self.mems.push(RawMem { ptr, layout, mr, owned: true });
        Ok(self.mems.len() - 1)
    }

    /// Register `len` bytes at `ptr` that the caller owns (device memory where `device` says,
    /// through the transport's own device registration); returns the buffer's index.
    ///
    /// # Safety
    /// The memory must stay allocated until the engine is dropped, and nobody else may write
    /// it while a request the engine posted on it is in flight.
    pub unsafe fn register_external(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        device: Option<DeviceMem>,
    ) -> Result<usize> {
        // SAFETY: the caller keeps the memory for the engine's life (see above).
        let mr = unsafe {
            match device {
                Some(d) => self.t.register_device(ptr, len, access, d),
                None => self.t.register(ptr, len, access),
            }
        }
        .map_err(|e| Error::Transport { op: OpKind::Register, peer: "-".into(), source: e })?;
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::invalid(OpKind::Register, "a null buffer"))?;
        self.mems.push(RawMem {
            ptr,
            layout: Layout::from_size_align(len.max(1), 1).expect("len"),
            mr,
            owned: false,
        });
        Ok(self.mems.len() - 1)
    }

    /// (remote address, key) of buffer `mem` for a peer.
    pub fn remote(&self, mem: usize) -> (u64, u64) {
        let m = &self.mems[mem];
        (m.mr.remote_base, m.mr.key)
    }

    /// The bytes of buffer `mem` (empty for memory registered by the caller, which may be
    /// device memory).
    pub fn bytes(&mut self, mem: usize) -> &mut [u8] {
        let m = &self.mems[mem];
        if !m.owned {
            return &mut [];
        }
        // SAFETY: owned, initialised memory; `&mut self` excludes other access from Rust. A
        // NIC may write it concurrently only if the caller posted a receive into it, as with any
        // device-shared memory.
        unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr(), m.layout.size()) }
    }

    /// Byte `i` of buffer `mem` as memory holds it now (a volatile read: for polling a byte a
    /// peer writes, as perftest's write latency test does); `None` out of range.
    pub fn peek(&self, mem: usize, i: usize) -> Option<u8> {
        let m = self.mems.get(mem)?;
        if i >= m.layout.size() || !m.owned {
            return None;
        }
        // SAFETY: in bounds of memory the engine owns; a volatile read of a byte a device may
        // write concurrently.
        Some(unsafe { std::ptr::read_volatile(m.ptr.as_ptr().add(i)) })
    }

    fn seg(&self, mem: usize, off: usize, len: usize) -> Result<LocalSeg, PostError> {
        let m = self.mems.get(mem).ok_or_else(|| bad("no such buffer"))?;
        if off.checked_add(len).is_none_or(|e| e > m.layout.size()) {
            return Err(bad("range outside the buffer"));
        }
        Ok(LocalSeg { ptr: m.ptr.as_ptr().wrapping_add(off), len, desc: m.mr.desc })
    }

    /// Post one work request on `len` bytes at `off` of buffer `mem`.
    pub fn post(
        &mut self,
        id: u64,
        peer: PeerAddr,
        kind: WrKind,
        mem: usize,
        off: usize,
        len: usize,
    ) -> Result<Posted, PostError> {
        self.post_more(id, peer, kind, (mem, off, len), false)
    }

    /// [`RawEngine::post`] on `(mem, off, len)`, telling the transport whether more requests
    /// follow at once (it may hold this one back to post them together).
    pub fn post_more(
        &mut self,
        id: u64,
        peer: PeerAddr,
        kind: WrKind,
        (mem, off, len): (usize, usize, usize),
        more: bool,
    ) -> Result<Posted, PostError> {
        let seg = self.seg(mem, off, len)?;
        let wr = WorkRequest {
            id: WrId::from_raw(id),
            lane: self.lane,
            peer,
            kind,
            local: std::slice::from_ref(&seg),
            more,
        };
        // SAFETY: the memory belongs to the engine and outlives the endpoint (see field order).
        unsafe { self.t.post(&wr) }
    }

    /// Poll completions.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.t.poll(out, max)
    }

    /// Whether peers' one-sided ops on this engine's memory were served since the last call
    /// (see `Transport::remote_served`).
    pub fn remote_served(&mut self) -> bool {
        self.t.remote_served()
    }
}

fn bad(why: &str) -> PostError {
    PostError::failed(rdmalane::TransportError {
        provider: "raw".into(),
        errno: libc::EINVAL,
        text: why.into(),
        class: rdmalane::FailureClass::Other,
    })
}

impl Drop for RawMem {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: allocated in `alloc` with this layout; the engine's transport (declared
        // before `mems`) has already closed, so no registration or DMA refers to it.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
