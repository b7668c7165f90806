//! Memory registration: one libfabric MR per rail for a region, host memory by address and
//! device memory through FI_HMEM (by dma-buf where the provider takes it), with random keys
//! where we choose them.
use std::ptr;

use rdmalane::backend::{Access, DeviceMem, DeviceRegistration, Memory, MemoryRegion};
use rdmalane::TransportError;

use super::FabricTransport;
use crate::exit_guard::Teardown;
use crate::ffi;
use crate::util::fi_error;

/// A registration the provider does not need (local memory where FI_MR_LOCAL is off).
const NO_MR: u64 = u64::MAX;

/// A registration: one libfabric MR per rail, with its local descriptor.
pub(super) struct Mr {
    /// Every MR this registration opened (its read twins too): closed together.
    pub(super) fids: Vec<*mut ffi::fid_mr>,
    pub(super) descs: Vec<usize>,
    /// Device memory on shm's FI_HMEM: per rail, the descriptor of a twin registration without
    /// FI_HMEM_DEVICE_ONLY, which reads into this memory use (see `register_device`). Empty
    /// elsewhere.
    read_descs: Vec<usize>,
}

/// A registration's attributes with zeroed room behind them (see `register_device`).
#[repr(C)]
#[derive(Default)]
struct HmemAttr {
    attr: ffi::fi_mr_attr,
    room: [u64; 8],
}

/// Point a registration's attributes at one iovec (a union member from libfabric 1.20 on,
/// beside the dma-buf export).
fn set_iov(attr: &mut ffi::fi_mr_attr, iov: &ffi::iovec) {
    #[cfg(fi_1_20)]
    {
        attr.__bindgen_anon_1.mr_iov = iov;
    }
    #[cfg(not(fi_1_20))]
    {
        attr.mr_iov = iov;
    }
    attr.iov_count = 1;
}

/// Register device memory by its dma-buf export (FI_MR_DMABUF, libfabric 1.20 and up);
/// returns the provider's status.
#[cfg(fi_1_20)]
fn dmabuf_regattr(
    domain: *mut ffi::fid_domain,
    room: &mut HmemAttr,
    d: rdmalane::backend::DmaBuf,
    ptr: *mut u8,
    len: usize,
    flags: u64,
    mr: &mut *mut ffi::fid_mr,
) -> i32 {
    let buf = ffi::fi_mr_dmabuf { fd: d.fd, offset: d.offset, len, base_addr: ptr as *mut _ };
    room.attr.__bindgen_anon_1.dmabuf = &buf;
    room.attr.iov_count = 1;
    // SAFETY: the attr points at `buf`, alive for the call; the caller keeps the device memory
    // (and the dma-buf fd) until deregister.
    unsafe { ffi::fi_mr_regattr(domain, &room.attr, flags | ffi::FI_MR_DMABUF, mr) }
}

/// Without FI_MR_DMABUF (headers before 1.20) a dma-buf export cannot be used.
#[cfg(not(fi_1_20))]
fn dmabuf_regattr(
    _domain: *mut ffi::fid_domain,
    _room: &mut HmemAttr,
    _d: rdmalane::backend::DmaBuf,
    _ptr: *mut u8,
    _len: usize,
    _flags: u64,
    _mr: &mut *mut ffi::fid_mr,
) -> i32 {
    -(ffi::FI_EOPNOTSUPP as i32)
}

impl Mr {
    /// An empty registration with room for one MR per rail.
    fn for_rails(n: usize) -> Mr {
        Mr { fids: Vec::with_capacity(n), descs: Vec::with_capacity(n), read_descs: Vec::new() }
    }

    /// Keep rail registration `mr` (open, valid), its key in `keys`.
    fn push(&mut self, mr: *mut ffi::fid_mr, keys: &mut Vec<u64>) {
        // SAFETY: mr is a valid, open registration.
        let (key, desc) = unsafe { (ffi::fi_mr_key(mr), ffi::fi_mr_desc(mr) as usize) };
        self.fids.push(mr);
        self.descs.push(desc);
        keys.push(key);
    }

    /// Keep `mr` (open, valid) as the read twin of the last rail's registration.
    fn push_read_twin(&mut self, mr: *mut ffi::fid_mr) {
        // SAFETY: mr is a valid, open registration.
        let desc = unsafe { ffi::fi_mr_desc(mr) as usize };
        self.fids.push(mr);
        self.read_descs.push(desc);
    }
}

/// The access bits of local use: sends, receives, and the local side of writes and reads.
const LOCAL: u64 = (ffi::FI_SEND | ffi::FI_RECV | ffi::FI_READ | ffi::FI_WRITE) as u64;

/// The access bits peers get to a region.
fn remote_bits(access: Access) -> u64 {
    let mut acs = 0;
    if access.remote_read {
        acs |= ffi::FI_REMOTE_READ as u64;
    }
    if access.remote_write {
        acs |= ffi::FI_REMOTE_WRITE as u64;
    }
    acs
}

/// The key to ask for in a registration: random where we choose keys (never a guessable
/// counter), 0 where the provider does (FI_MR_PROV_KEY).
fn new_key(t: &FabricTransport) -> u64 {
    if t.mr_mode & ffi::FI_MR_PROV_KEY != 0 {
        0
    } else {
        rand::random::<u64>() & t.key_mask
    }
}

/// Register host memory `[ptr, ptr + len)` on every rail for `access`.
///
/// # Safety
/// `[ptr, ptr + len)` stays allocated until the region is deregistered.
pub(super) unsafe fn register(
    t: &mut FabricTransport,
    ptr: *mut u8,
    len: usize,
    access: Access,
) -> Result<MemoryRegion, TransportError> {
    let local = t.mr_mode & ffi::FI_MR_LOCAL != 0;
    if !access.is_remote() && !local {
        return Ok(MemoryRegion { id: NO_MR, desc: 0, key: 0, remote_base: 0, rail_keys: Vec::new() });
    }
    // A region peers reach is registered for that alone (local ops use the buffer's own
    // registration): rxm widens a registration that may send to remote reads, for its own
    // rendezvous, which would make a write-only region readable.
    let acs = if access.is_remote() { remote_bits(access) } else { LOCAL };
    let mut m = Mr::for_rails(t.rails.len());
    let mut keys = Vec::with_capacity(t.rails.len());
    for rail in 0..t.rails.len() {
        let domain = t.rails[rail].domain;
        let mut mr: *mut ffi::fid_mr = ptr::null_mut();
        // Random keys may collide: retry.
        let mut tries = 0;
        let r = loop {
            let key = new_key(t);
            // SAFETY: the caller keeps [ptr, ptr+len) allocated until deregister.
            let r = unsafe {
                ffi::fi_mr_reg(domain, ptr as *const _, len, acs, 0, key, 0, &mut mr, ptr::null_mut())
            };
            tries += 1;
            if r == 0 || r != -(ffi::FI_ENOKEY as i32) || tries > 8 {
                break r;
            }
        };
        if r != 0 {
            return Err(close_partial(t, m, r, "fi_mr_reg"));
        }
        m.push(mr, &mut keys);
    }
    Ok(region(t, ptr, m, keys))
}

/// Register CUDA device memory on every rail through FI_HMEM (see `Caps::device`).
///
/// # Safety
/// The device memory at `[ptr, ptr + len)`, and its dma-buf fd where `mem` has one, stay
/// allocated and open until the region is deregistered.
pub(super) unsafe fn register_device(
    t: &mut FabricTransport,
    ptr: *mut u8,
    len: usize,
    access: Access,
    mem: DeviceMem,
) -> Result<MemoryRegion, TransportError> {
    let DeviceRegistration::FiHmem { dmabuf, device_only, early_completion } = t.caps.device else {
        return Err(t.err(-(ffi::FI_EOPNOTSUPP as i64), "device memory without FI_HMEM"));
    };
    let Memory::Cuda { device } = mem.memory else {
        return Err(t.err(-(ffi::FI_EINVAL as i64), "register_device: host memory"));
    };
    // Device memory is registered for local use too (FI_MR_HMEM): the descriptor tells the
    // provider the memory's kind, so it never guesses per op.
    let acs = LOCAL | remote_bits(access);
    let iov = ffi::iovec { iov_base: ptr as *mut _, iov_len: len };
    let mut m = Mr::for_rails(t.rails.len());
    let mut keys = Vec::with_capacity(t.rails.len());
    for rail in 0..t.rails.len() {
        let domain = t.rails[rail].domain;
        // Zeroed room past the struct as these headers define it: a newer library reads the
        // fields of the API version we asked for, and no more, but zeros cost nothing.
        let mut room = HmemAttr::default();
        let attr = &mut room.attr;
        set_iov(attr, &iov);
        attr.access = acs;
        attr.requested_key = new_key(t);
        attr.iface = ffi::fi_hmem_iface_FI_HMEM_CUDA;
        attr.device.cuda = device as i32;
        let mut flags = if device_only { ffi::FI_HMEM_DEVICE_ONLY } else { 0 };
        let mut mr: *mut ffi::fid_mr = ptr::null_mut();
        let mut r = -(ffi::FI_EINVAL as i32);
        if let (true, Some(d)) = (dmabuf, mem.dmabuf) {
            r = dmabuf_regattr(domain, &mut room, d, ptr, len, flags, &mut mr);
            if r != 0 {
                tracing::debug!(error = %fi_error(r), "dma-buf registration refused: by address instead");
                set_iov(&mut room.attr, &iov);
            }
        }
        if r != 0 {
            // SAFETY: the attr points at `iov`, alive for the call; the caller keeps the
            // device memory allocated until deregister.
            r = unsafe { ffi::fi_mr_regattr(domain, &room.attr, flags, &mut mr) };
            if r != 0 && device_only {
                // A provider that does not take the hint registers without it.
                flags = 0;
                // SAFETY: as above.
                r = unsafe { ffi::fi_mr_regattr(domain, &room.attr, flags, &mut mr) };
            }
        }
        if r != 0 {
            return Err(close_partial(t, m, r, "fi_mr_regattr(FI_HMEM_CUDA)"));
        }
        m.push(mr, &mut keys);
        if early_completion && flags & ffi::FI_HMEM_DEVICE_ONLY != 0 {
            // shm takes its CUDA IPC path for an op whose local memory is registered
            // FI_HMEM_DEVICE_ONLY, and for a read that path runs the copy into our memory
            // in the *peer's* process, where it may still be running when our completion
            // comes: nothing on this side can wait for it. A read into this memory uses a
            // twin registration without the flag instead, which shm serves through its
            // bounce buffers, with the last copy (into our memory) in this process, where
            // a context synchronize covers it. Writes and sends keep the IPC path: their
            // copies run in the target's process, which `settle` synchronizes.
            let mut twin = HmemAttr::default();
            set_iov(&mut twin.attr, &iov);
            twin.attr.access = (ffi::FI_READ | ffi::FI_RECV) as u64;
            twin.attr.requested_key = new_key(t);
            twin.attr.iface = ffi::fi_hmem_iface_FI_HMEM_CUDA;
            twin.attr.device.cuda = device as i32;
            let mut tmr: *mut ffi::fid_mr = ptr::null_mut();
            // SAFETY: as above.
            let r = unsafe { ffi::fi_mr_regattr(domain, &twin.attr, 0, &mut tmr) };
            if r != 0 {
                return Err(close_partial(t, m, r, "fi_mr_regattr(FI_HMEM_CUDA, read twin)"));
            }
            m.push_read_twin(tmr);
        }
    }
    for (&d, &twin) in m.descs.iter().zip(&m.read_descs) {
        t.read_twins.insert(d, twin);
    }
    t.device_descs.extend(m.descs.iter().copied());
    Ok(region(t, ptr, m, keys))
}

/// Close a region's registrations on every rail.
pub(super) fn deregister(t: &mut FabricTransport, id: u64) -> Result<(), TransportError> {
    if id == NO_MR {
        return Ok(());
    }
    let Some(m) = t.mrs.try_remove(id as usize) else {
        return Err(t.err(-(ffi::FI_ENOENT as i64), "deregister: unknown region"));
    };
    if !m.read_descs.is_empty() {
        m.descs.iter().for_each(|d| {
            t.read_twins.remove(d);
        });
    }
    if !t.device_descs.is_empty() {
        m.descs.iter().for_each(|d| {
            t.device_descs.remove(d);
        });
    }
    let Some(_inside) = Teardown::enter() else { return Ok(()) };
    let mut res = Ok(());
    for mr in m.fids {
        // SAFETY: closing a registration we opened, once.
        let r = unsafe { ffi::fi_close(&mut (*mr).fid) };
        if r != 0 {
            res = Err(t.err(r, "fi_close(mr)"));
        }
    }
    res
}

/// Close the rails' registrations `m` made before one failed with `r` in `what`.
fn close_partial(t: &FabricTransport, m: Mr, r: i32, what: &str) -> TransportError {
    // SAFETY: closing the registrations of the rails before the failed one, once.
    m.fids.iter().for_each(|&f| unsafe {
        ffi::fi_close(&mut (*f).fid);
    });
    t.err(r, what)
}

/// The region a registration on every rail (`m`, their keys `keys`) of memory at `ptr` is.
fn region(t: &mut FabricTransport, ptr: *mut u8, m: Mr, mut keys: Vec<u64>) -> MemoryRegion {
    let remote_base = if t.mr_mode & ffi::FI_MR_VIRT_ADDR != 0 { ptr as u64 } else { 0 };
    let single = m.descs[0];
    let id = t.mrs.insert(m) as u64;
    // One rail: the provider's descriptor itself. Several: a handle `post` resolves per lane.
    let desc = if t.rails.len() == 1 { single } else { id as usize + 1 };
    MemoryRegion { id, desc, key: keys[0], remote_base, rail_keys: keys.split_off(1) }
}
