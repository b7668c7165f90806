use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut, RangeBounds};
use std::ptr::NonNull;

use bytes::BytesMut;

use super::{IoBuf, IoBufMut, Slice};
use crate::base::error::{Error, OpKind, Result};
use crate::base::transport::{Access, LocalSeg, MemoryRegion};
use crate::runtime::Runtime;

/// Where a registered buffer's bytes live. Each keeps its heap memory at one address.
enum Storage {
    /// Page-aligned memory we allocated.
    Aligned(Layout),
    /// A caller's vector, kept untouched (its pointer was taken once, with write provenance).
    Vec(#[allow(dead_code)] Vec<u8>),
    /// A caller's `BytesMut`, kept the same way.
    Bytes(#[allow(dead_code)] BytesMut),
}

/// Memory registered with a runtime for local use: the source of writes and sends, the target of
/// reads and receives. Moves keep its address; dropping it deregisters it.
pub struct RegisteredBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The registration's descriptor, kept beside the pointer: every op reads it.
    desc: usize,
    /// The rest, boxed: ops move the buffer by value, and a small value moves cheaply.
    reg: Box<Registration>,
}

struct Registration {
    storage: Storage,
    mr: MemoryRegion,
    rt: Runtime,
}

// SAFETY: the buffer owns its memory exclusively (the raw pointer is to heap memory nobody else
// references); moving it to another thread moves that ownership.
unsafe impl Send for RegisteredBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for RegisteredBuf {}

const PAGE: usize = 4096;

impl RegisteredBuf {
    /// Allocate `len` zeroed, page-aligned bytes and register them with `rt`.
    pub fn alloc(rt: &Runtime, len: usize) -> Result<RegisteredBuf> {
        if len == 0 {
            return Err(Error::invalid(OpKind::Register, "cannot allocate a zero-length buffer"));
        }
        let layout = Layout::from_size_align(len, PAGE)
            .map_err(|e| Error::invalid(OpKind::Register, format!("{len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            return Err(Error::invalid(OpKind::Register, format!("out of memory for {len} bytes")));
        };
        Self::register(rt, ptr, len, Storage::Aligned(layout))
    }

    /// Register a caller's vector (its length, not its capacity, is the buffer).
    pub fn from_vec(rt: &Runtime, mut v: Vec<u8>) -> Result<RegisteredBuf> {
        if v.is_empty() {
            return Err(Error::invalid(OpKind::Register, "cannot register an empty Vec"));
        }
        let len = v.len();
        let ptr = NonNull::new(v.as_mut_ptr()).expect("non-empty Vec has a non-null pointer");
        Self::register(rt, ptr, len, Storage::Vec(v))
    }

    /// Register a caller's `BytesMut` (its length is the buffer).
    pub fn from_bytes_mut(rt: &Runtime, mut b: BytesMut) -> Result<RegisteredBuf> {
        if b.is_empty() {
            return Err(Error::invalid(OpKind::Register, "cannot register an empty BytesMut"));
        }
        let len = b.len();
        let ptr = NonNull::new(b.as_mut_ptr()).expect("non-empty BytesMut has a non-null pointer");
        Self::register(rt, ptr, len, Storage::Bytes(b))
    }

    fn register(rt: &Runtime, ptr: NonNull<u8>, len: usize, storage: Storage) -> Result<RegisteredBuf> {
        // The storage is dropped (freed) only after the deregistration in Drop, so the memory
        // outlives the registration as `Transport::register` requires.
        match rt.register_region(ptr.as_ptr(), len, Access::LOCAL) {
            Ok(mr) => Ok(RegisteredBuf {
                ptr,
                len,
                desc: mr.desc,
                reg: Box::new(Registration { storage, mr, rt: rt.clone() }),
            }),
            Err(e) => {
                free(ptr, &storage);
                Err(e)
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never the case for a registered one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registration (key, descriptor).
    pub fn region(&self) -> &MemoryRegion {
        &self.reg.mr
    }

    /// The runtime the buffer is registered with.
    pub fn runtime(&self) -> &Runtime {
        &self.reg.rt
    }

    /// A sub-range of this buffer as a buffer of its own; refused when out of range.
    pub fn slice(self, range: impl RangeBounds<usize>) -> Result<Slice<RegisteredBuf>> {
        Slice::new(self, range)
    }
}

fn free(ptr: NonNull<u8>, storage: &Storage) {
    if let Storage::Aligned(layout) = storage {
        // SAFETY: allocated in `alloc` with this very layout, and freed only here, once.
        unsafe { alloc::dealloc(ptr.as_ptr(), *layout) };
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        // Local-only memory: no peer can reach it and no op of ours owns it (ops own the buffer
        // itself), so the memory may go before the deregistration is processed, as
        // `Transport::register` allows for local registrations.
        self.reg.rt.release_region(self.reg.mr.id, None);
        free(self.ptr, &self.reg.storage);
    }
}

impl Deref for RegisteredBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr/len describe memory this value owns and keeps initialised (zeroed at
        // allocation, or a caller's initialised Vec/BytesMut).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for RegisteredBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf").field("len", &self.len).field("key", &self.reg.mr.key).finish()
    }
}

// SAFETY: the memory is heap memory owned by the value (stable across moves) and registered with
// `rt` under `mr.desc` until the value drops.
unsafe impl IoBuf for RegisteredBuf {
    fn seg(&self) -> LocalSeg {
        LocalSeg { ptr: self.ptr.as_ptr(), len: self.len, desc: self.desc }
    }
    fn runtime_id(&self) -> u64 {
        self.reg.rt.id()
    }
    fn runtime(&self) -> Option<&Runtime> {
        Some(&self.reg.rt)
    }
}

// SAFETY: the value owns the memory exclusively.
unsafe impl IoBufMut for RegisteredBuf {}

impl Runtime {
    /// Allocate `len` zeroed bytes of registered memory.
    pub fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        RegisteredBuf::alloc(self, len)
    }
}
