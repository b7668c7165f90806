//! The staging path's copies for CUDA memory: asynchronous copies between a device buffer and
//! its pinned host mirror on a stream of the buffer's own, each followed by an event the
//! staged op polls.
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use slab::Slab;

use super::driver::{check, pin, unpin, Context, Event, Stream};
use crate::base::error::{Error, OpKind, Result};
use crate::buf::staging::{CopyDir, CopyTicket, MirrorCopies};

/// Copies between `len` bytes of device memory at `dev` and the mirror at `host`.
pub(crate) struct CudaCopies {
    ctx: Arc<Context>,
    stream: Stream,
    dev: sys::CUdeviceptr,
    host: *mut u8,
    len: usize,
    pinned: bool,
    events: Mutex<Slab<Event>>,
}

// SAFETY: the raw addresses are of memory the owning device buffer keeps alive while this
// lives (the mirror outlives it: `Staging` drops its copies first); driver calls are
// thread-safe with the context made current.
unsafe impl Send for CudaCopies {}
// SAFETY: as above; the events are behind a lock.
unsafe impl Sync for CudaCopies {}

impl CudaCopies {
    /// Copies for the device memory at `dev` and the mirror at `host` (pinned here).
    pub(crate) fn new(
        ctx: Arc<Context>,
        dev: sys::CUdeviceptr,
        host: *mut u8,
        len: usize,
    ) -> Result<CudaCopies> {
        let stream = Stream::new(ctx.clone())?;
        let pinned = pin(&ctx, host, len);
        Ok(CudaCopies { ctx, stream, dev, host, len, pinned, events: Mutex::new(Slab::new()) })
    }
}

impl MirrorCopies for CudaCopies {
    fn start(&self, dir: CopyDir, range: Range<usize>) -> Result<CopyTicket> {
        if range.end > self.len || range.start > range.end {
            return Err(Error::invalid(
                OpKind::Copy,
                format!("copy of {range:?} in a {}-byte buffer", self.len),
            ));
        }
        self.ctx.bind(OpKind::Copy)?;
        let (dev, host, n) =
            (self.dev + range.start as u64, self.host.wrapping_add(range.start), range.len());
        // SAFETY: both ranges lie inside memory this copier's owner keeps alive until the copy
        // is drained; the plan gives the range to this copy alone while it runs.
        let r = unsafe {
            match dir {
                CopyDir::ToMirror => sys::cuMemcpyDtoHAsync_v2(host.cast(), dev, n, self.stream.raw),
                CopyDir::ToDevice => sys::cuMemcpyHtoDAsync_v2(dev, host.cast(), n, self.stream.raw),
            }
        };
        check(OpKind::Copy, "cuMemcpyAsync", r)?;
        let ev = Event::record(&self.stream)?;
        Ok(CopyTicket(self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(ev) as u64))
    }

    fn done(&self, t: CopyTicket) -> Result<bool> {
        self.ctx.bind(OpKind::Copy)?;
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ev) = events.get(t.0 as usize) else {
            return Err(Error::invalid(OpKind::Copy, "no such copy"));
        };
        let done = ev.done();
        if !matches!(done, Ok(false)) {
            events.remove(t.0 as usize);
        }
        done
    }

    fn drain(&self) -> Result<()> {
        self.stream.sync()
    }
}

impl Drop for CudaCopies {
    fn drop(&mut self) {
        let _ = self.stream.sync();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if self.pinned {
            unpin(&self.ctx, self.host);
        }
    }
}
