//! Descriptors of memory a peer exposed: what a one-sided op names as its target.
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::base::error::{Error, OpKind, Result};
use crate::base::memory::Memory;
use crate::base::transport::Access;

const MAGIC: [u8; 4] = *b"RLRB";
const VERSION: u8 = 1;

/// A peer's exposed memory: owner runtime, remote address, length, a key per rail and the
/// access granted. Serializable with [`to_bytes`](Self::to_bytes); sub-ranges by
/// [`slice`](Self::slice), which refuses anything outside the original. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteBuf {
    owner: u64,
    addr: u64,
    len: u64,
    key: u64,
    /// Keys on the owner's rails 1, 2, ... (`None` with one rail).
    rail_keys: Option<Arc<[u64]>>,
    access: Access,
    /// Where the exposed bytes live (device memory: see the GPU chapter of the book).
    memory: Memory,
}

/// Flag bit: an 8-byte memory trailer follows the rail keys (kind byte, 3 zero bytes, device).
const FLAG_MEMORY: u8 = 0b100;

impl RemoteBuf {
    /// The encoded size of a one-rail descriptor.
    pub const ENCODED_LEN: usize = 4 + 1 + 1 + 2 + 8 * 4;
    /// The largest encoded size (a descriptor of device memory with a key on each of
    /// `MAX_RAILS` rails).
    pub const MAX_ENCODED_LEN: usize = Self::ENCODED_LEN + 8 * (crate::base::MAX_RAILS - 1) + 8;

    pub(crate) fn new(owner: u64, addr: u64, len: u64, keys: &[u64], access: Access) -> RemoteBuf {
        let rail_keys = (keys.len() > 1).then(|| keys[1..].into());
        RemoteBuf {
            owner,
            addr,
            len,
            key: keys.first().copied().unwrap_or(0),
            rail_keys,
            access,
            memory: Memory::Host,
        }
    }

    /// The same descriptor, of memory of kind `memory`.
    pub(crate) fn with_memory(self, memory: Memory) -> RemoteBuf {
        RemoteBuf { memory, ..self }
    }

    /// Where the exposed bytes live.
    pub fn memory(&self) -> Memory {
        self.memory
    }

    /// The size of this descriptor on the wire.
    pub fn encoded_len(&self) -> usize {
        let trailer = if self.memory.is_device() { 8 } else { 0 };
        Self::ENCODED_LEN + 8 * self.rail_keys.as_ref().map_or(0, |k| k.len()) + trailer
    }

    /// Rails the owner exposed the memory on (a key each).
    pub fn rails(&self) -> usize {
        1 + self.rail_keys.as_ref().map_or(0, |k| k.len())
    }

    /// The key on the owner's rail `rail`.
    pub fn key_on(&self, rail: usize) -> Option<u64> {
        match rail {
            0 => Some(self.key),
            r => self.rail_keys.as_ref()?.get(r - 1).copied(),
        }
    }

    pub(crate) fn rail_keys(&self) -> Option<Arc<[u64]>> {
        self.rail_keys.clone()
    }

    /// The id of the runtime that exposed the memory.
    pub fn owner(&self) -> u64 {
        self.owner
    }
    /// Remote address of the first byte, as the provider addresses it.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The remote key (on the owner's rail 0).
    pub fn key(&self) -> u64 {
        self.key
    }
    /// The access the owner granted.
    pub fn access(&self) -> Access {
        self.access
    }

    /// A sub-range; `Err(OutOfBounds)` when it does not fit.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteBuf> {
        let (start, end) = bounds(range.start_bound().cloned(), range.end_bound().cloned(), self.len);
        if start > end || end > self.len {
            return Err(Error::OutOfBounds {
                op: OpKind::Write,
                offset: start,
                want: end.saturating_sub(start),
                len: self.len,
            });
        }
        Ok(RemoteBuf { addr: self.addr + start, len: end - start, ..self.clone() })
    }

    /// Check that `want` bytes at `offset` fit, for `op`.
    pub(crate) fn check(&self, op: OpKind, offset: u64, want: u64) -> Result<()> {
        if offset.checked_add(want).is_none_or(|end| end > self.len) {
            return Err(Error::OutOfBounds { op, offset, want, len: self.len });
        }
        Ok(())
    }

    /// Encode for the wire: 40 bytes, then 8 per rail beyond the first, then (device memory)
    /// 8 naming its kind and device.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_len()];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = u8::from(self.access.remote_read) | (u8::from(self.access.remote_write) << 1);
        let extra = self.rail_keys.as_ref().map_or(&[][..], |k| &k[..]);
        out[6..8].copy_from_slice(&(extra.len() as u16).to_le_bytes());
        for (i, v) in [self.owner, self.addr, self.len, self.key].iter().chain(extra).enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        if self.memory.is_device() {
            out[5] |= FLAG_MEMORY;
            let (kind, device) = self.memory.to_byte();
            let at = out.len() - 8;
            out[at] = kind;
            out[at + 4..].copy_from_slice(&device.to_le_bytes());
        }
        out
    }

    /// Decode from the wire; refuses wrong lengths, magic, versions, flags and rail counts.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteBuf> {
        let bad = |why: &str| Error::invalid(OpKind::Expose, format!("remote descriptor: {why}"));
        if b.len() < Self::ENCODED_LEN {
            return Err(bad(&format!("{} bytes, expected at least {}", b.len(), Self::ENCODED_LEN)));
        }
        if b[0..4] != MAGIC {
            return Err(bad("bad magic"));
        }
        if b[4] != VERSION {
            return Err(bad(&format!("version {} (this build reads {VERSION})", b[4])));
        }
        if b[5] & !(0b11 | FLAG_MEMORY) != 0 {
            return Err(bad("unknown flags"));
        }
        let trailer = if b[5] & FLAG_MEMORY != 0 { 8 } else { 0 };
        let extra = u16::from_le_bytes([b[6], b[7]]) as usize;
        if extra + 1 > crate::base::MAX_RAILS {
            return Err(bad(&format!("{} rails (at most {})", extra + 1, crate::base::MAX_RAILS)));
        }
        if b.len() != Self::ENCODED_LEN + 8 * extra + trailer {
            return Err(bad(&format!(
                "{} bytes, expected {} for {} rails",
                b.len(),
                Self::ENCODED_LEN + 8 * extra + trailer,
                extra + 1
            )));
        }
        let memory = if trailer == 0 {
            Memory::Host
        } else {
            let t = &b[b.len() - 8..];
            let device = u32::from_le_bytes(t[4..8].try_into().expect("4 bytes"));
            match Memory::from_byte(t[0], device) {
                Some(m) if m.is_device() && t[1..4] == [0, 0, 0] => m,
                _ => return Err(bad(&format!("unknown memory kind {}", t[0]))),
            }
        };
        let word = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
        let access = Access { remote_read: b[5] & 1 != 0, remote_write: b[5] & 2 != 0 };
        let (owner, addr, len, key) = (word(0), word(1), word(2), word(3));
        if addr.checked_add(len).is_none() {
            return Err(bad("range wraps around the address space"));
        }
        let rail_keys = (extra > 0).then(|| (0..extra).map(|i| word(4 + i)).collect());
        Ok(RemoteBuf { owner, addr, len, key, rail_keys, access, memory })
    }
}

/// A range's bounds as `start..end` within `len` (saturating; the caller checks the result).
pub(crate) fn bounds(start: Bound<u64>, end: Bound<u64>, len: u64) -> (u64, u64) {
    let start = match start {
        Bound::Included(s) => s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match end {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => e,
        Bound::Unbounded => len,
    };
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(owner: u64, addr in 0u64..1 << 48, len in 0u64..1 << 40, keys in proptest::collection::vec(any::<u64>(), 1..33), r: bool, w: bool, gpu in proptest::option::of(0u32..16)) {
            let d = RemoteBuf::new(owner, addr, len, &keys, Access { remote_read: r, remote_write: w });
            let d = match gpu { Some(device) => d.with_memory(Memory::Cuda { device }), None => d };
            prop_assert_eq!(d.rails(), keys.len());
            prop_assert_eq!(d.key_on(keys.len() - 1), keys.last().copied());
            prop_assert_eq!(RemoteBuf::from_bytes(&d.to_bytes()).unwrap(), d);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = RemoteBuf::from_bytes(&bytes);
        }

        #[test]
        fn slice_stays_inside(len in 0u64..1 << 20, a in 0u64..1 << 21, b in 0u64..1 << 21) {
            let d = RemoteBuf::new(1, 4096, len, &[7], Access::WRITE);
            match d.slice(a..b) {
                Ok(s) => prop_assert!(a <= b && b <= len && s.addr() == 4096 + a && s.len() == b - a),
                Err(Error::OutOfBounds { .. }) => prop_assert!(a > b || b > len),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
