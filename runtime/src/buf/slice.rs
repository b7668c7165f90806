use std::ops::{Bound, Deref, DerefMut, RangeBounds};

use super::{IoBuf, IoBufMut};
use crate::base::error::{Error, OpKind, Result};
use crate::base::memory::{DmaBuf, Memory};
use crate::base::remote::bounds;
use crate::base::transport::LocalSeg;

use super::staging::StagedView;

/// A sub-range of a buffer, used as a buffer of its own (`buf.slice(64..128)`).
#[derive(Debug)]
pub struct Slice<B> {
    buf: B,
    start: usize,
    end: usize,
}

impl<B: IoBuf> Slice<B> {
    pub(crate) fn new(buf: B, range: impl RangeBounds<usize>) -> Result<Slice<B>> {
        let len = buf.bytes_len();
        let widen = |b: Bound<&usize>| b.map(|&v| v as u64);
        let (start, end) = bounds(widen(range.start_bound()), widen(range.end_bound()), len as u64);
        let (start, end) = (start as usize, end as usize);
        if start > end || end > len {
            return Err(Error::invalid(
                OpKind::Register,
                format!("slice {start}..{end} of a {len}-byte buffer"),
            ));
        }
        Ok(Slice { buf, start, end })
    }

    /// The whole buffer back.
    pub fn into_inner(self) -> B {
        self.buf
    }

    /// Start offset in the underlying buffer.
    pub fn begin(&self) -> usize {
        self.start
    }

    /// End offset (exclusive) in the underlying buffer.
    pub fn end(&self) -> usize {
        self.end
    }
}

// SAFETY: a sub-range of memory that `B` keeps valid and registered.
unsafe impl<B: IoBuf> IoBuf for Slice<B> {
    fn seg(&self) -> LocalSeg {
        let s = self.buf.seg();
        // wrapping_add: in bounds by construction, and no dereference happens here.
        LocalSeg { ptr: s.ptr.wrapping_add(self.start), len: self.end - self.start, desc: s.desc }
    }
    fn runtime_id(&self) -> u64 {
        self.buf.runtime_id()
    }
    fn runtime(&self) -> Option<&crate::runtime::Runtime> {
        self.buf.runtime()
    }
    fn memory(&self) -> Memory {
        self.buf.memory()
    }
    fn staging(&self) -> Option<StagedView> {
        self.buf.staging().map(|v| v.sub(self.start..self.end))
    }
    fn dmabuf(&self) -> Option<DmaBuf> {
        self.buf.dmabuf().map(|d| DmaBuf { offset: d.offset + self.start as u64, ..d })
    }
    fn fence(&self) -> crate::Result<()> {
        self.buf.fence()
    }
}

// SAFETY: exclusive because `B` is.
unsafe impl<B: IoBufMut> IoBufMut for Slice<B> {}

impl<B: IoBuf + Deref<Target = [u8]>> Deref for Slice<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl<B: IoBuf + DerefMut<Target = [u8]>> DerefMut for Slice<B> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }
}
