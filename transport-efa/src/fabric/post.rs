//! Posting a work request: sends (small ones injected), receives, writes and reads, each with
//! the context its completion hands back.
use std::ptr;

use rdmalane::backend::{LocalSeg, PeerAddr, PostError, Posted, WorkRequest, WrId, WrKind};

use super::{Ctx, FabricTransport, Lane};
use crate::ffi;
use crate::probe;

/// Post `wr` on its lane.
///
/// # Safety
/// As `Transport::post`: every segment's memory stays valid (and, for receives and reads, is
/// not accessed by anyone else) until `poll` returns the request's completion.
pub(super) unsafe fn post(t: &mut FabricTransport, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
    // The latency path's shapes, one segment on one rail: a send the provider copies as it is
    // posted, a write, and a receive. They skip the scatter arrays, the per-rail descriptor
    // lookups and the general body's frame: a 16 B shm ping-pong's round trip ran some 110
    // fewer instructions on the client (callgrind), under the runtime and under the raw engine
    // alike, which posts through here too (see the book's benchmarks, "The provider call's
    // own frame").
    if let ([seg], 1) = (wr.local, t.rails.len()) {
        // SAFETY: the caller's contract, passed on.
        if let Some(posted) = unsafe { post_one(t, wr, seg) } {
            return posted;
        }
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { post_any(t, wr) }
}

/// `post` of a one-segment injected send, write or receive on a one-rail transport (`None` for
/// any other request, or a lane that is not there: the general path reports that).
///
/// # Safety
/// As [`post`].
#[inline]
unsafe fn post_one(
    t: &mut FabricTransport,
    wr: &WorkRequest<'_>,
    seg: &LocalSeg,
) -> Option<Result<Posted, PostError>> {
    let ep = t.lanes.get(wr.lane.index())?.ep;
    match wr.kind {
        WrKind::Send { imm: None } if seg.len <= t.caps.inject_size && !t.is_device(seg.desc) => {
            let t0 = probe::start();
            probe::reply(t0);
            // SAFETY: the provider copies `seg.len` bytes from valid memory before returning.
            let r = unsafe { ffi::fi_inject(ep, seg.ptr as *mut _, seg.len, wr.peer) };
            probe::posted(t0);
            Some(injected(t, r))
        }
        WrKind::Write { remote_addr, key, imm } => {
            // SAFETY: the caller's contract, passed on.
            Some(unsafe { write_one(t, wr, seg, ep, remote_addr, key, imm) })
        }
        WrKind::Recv => {
            let mut iov = libc::iovec { iov_base: seg.ptr as *mut _, iov_len: seg.len };
            let mut desc = seg.desc as *mut std::ffi::c_void;
            let msg = ffi::fi_msg {
                msg_iov: &mut iov as *mut libc::iovec as *const _,
                desc: &mut desc,
                iov_count: 1,
                addr: wr.peer,
                context: ctx(t, wr.id),
                data: 0,
            };
            // SAFETY: the memory is ours alone until the completion; msg and what it points
            // at live for the call.
            let r = unsafe { ffi::fi_recvmsg(ep, &msg, ffi::FI_COMPLETION as u64) };
            Some(queued(t, r))
        }
        _ => None,
    }
}

/// The write of `post_one`: out of line, so that a ping-pong's send and receive keep a frame
/// of their own size.
///
/// # Safety
/// As [`post`].
#[inline(never)]
unsafe fn write_one(
    t: &mut FabricTransport,
    wr: &WorkRequest<'_>,
    seg: &LocalSeg,
    ep: *mut ffi::fid_ep,
    remote_addr: u64,
    key: u64,
    imm: Option<u64>,
) -> Result<Posted, PostError> {
    let flags = ffi::FI_COMPLETION as u64 | more(wr) | write_flags(t, imm, seg.len);
    let mut iov = libc::iovec { iov_base: seg.ptr as *mut _, iov_len: seg.len };
    let mut desc = seg.desc as *mut std::ffi::c_void;
    let mut rma = ffi::fi_rma_iov { addr: remote_addr, len: seg.len, key };
    let msg = ffi::fi_msg_rma {
        msg_iov: &mut iov as *mut libc::iovec as *const _,
        desc: &mut desc,
        iov_count: 1,
        addr: wr.peer,
        rma_iov: &mut rma,
        rma_iov_count: 1,
        context: ctx(t, wr.id),
        data: imm.unwrap_or(0),
    };
    let t0 = probe::start();
    probe::reply(t0);
    // SAFETY: the caller keeps the local memory valid until the completion; msg and
    // what it points at live for the call (libfabric copies what it keeps).
    let r = unsafe { ffi::fi_writemsg(ep, &msg, flags) };
    probe::posted(t0);
    queued(t, r)
}

/// FI_MORE where more requests follow at once.
fn more(wr: &WorkRequest<'_>) -> u64 {
    if wr.more {
        ffi::FI_MORE as u64
    } else {
        0
    }
}

/// A write's flags beside FI_COMPLETION and FI_MORE: its immediate value, and how its
/// completion is meant (delivered, where the transport asks for that; else a payload of `len`
/// bytes small enough is copied at post time, and the completion still says when it is at the
/// target).
fn write_flags(t: &FabricTransport, imm: Option<u64>, len: usize) -> u64 {
    let mut flags = if imm.is_some() { ffi::FI_REMOTE_CQ_DATA as u64 } else { 0 };
    if t.delivery_complete {
        flags |= ffi::FI_DELIVERY_COMPLETE as u64;
    } else if len <= t.caps.inject_size {
        flags |= ffi::FI_INJECT as u64;
    }
    flags
}

/// The outcome of an injected send (`ret`, `fi_inject`'s return): copied, nothing to wait for.
fn injected(t: &FabricTransport, ret: isize) -> Result<Posted, PostError> {
    match ret {
        0 => Ok(Posted::Completed),
        r if r == -(ffi::FI_EAGAIN as isize) => Err(PostError::Again),
        r => Err(PostError::failed(t.err(r as i64, "fi_inject"))),
    }
}

/// The outcome of a request the provider queued (`ret`, its post's return).
fn queued(t: &FabricTransport, ret: isize) -> Result<Posted, PostError> {
    match ret {
        0 => Ok(Posted::Queued),
        r if r == -(ffi::FI_EAGAIN as isize) => Err(PostError::Again),
        r => Err(PostError::failed(t.err(r as i64, "post"))),
    }
}

/// `post`, any request. Out of line: its arrays and lookups would weigh on the common
/// shapes' calls (the registers it saves, the stack it takes).
///
/// # Safety
/// As [`post`].
#[inline(never)]
unsafe fn post_any(t: &mut FabricTransport, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
    let mut iov = [libc::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; 4];
    let mut desc = [ptr::null_mut::<std::ffi::c_void>(); 4];
    let n = wr.local.len();
    if n == 0 || n > iov.len().min(t.caps.iov_limit) {
        return Err(PostError::failed(t.err(-(ffi::FI_EINVAL as i64), "scatter list length")));
    }
    let Some(&Lane { ep, rail, .. }) = t.lanes.get(wr.lane.index()) else {
        return Err(PostError::failed(t.err(-(ffi::FI_EINVAL as i64), "post: no such lane")));
    };
    let multi = t.rails.len() > 1;
    for (k, LocalSeg { ptr, len, desc: d }) in wr.local.iter().enumerate() {
        iov[k] = libc::iovec { iov_base: *ptr as *mut _, iov_len: *len };
        desc[k] = match (*d, multi) {
            (d, false) => d as *mut _,
            (0, true) => ptr::null_mut(),
            // A registration's handle: its descriptor on this lane's rail.
            (d, true) => match t.mrs.get(d - 1) {
                Some(m) => m.descs[rail] as *mut _,
                None => {
                    return Err(PostError::failed(t.err(-(ffi::FI_EINVAL as i64), "post: unknown region")))
                }
            },
        };
    }
    if matches!(wr.kind, WrKind::Read { .. }) && !t.read_twins.is_empty() {
        for d in &mut desc[..n] {
            if let Some(&twin) = t.read_twins.get(&(*d as usize)) {
                *d = twin as *mut _;
            }
        }
    }
    let total: usize = wr.local.iter().map(|s| s.len).sum();
    let t0 = probe::start();
    let reply = matches!(wr.kind, WrKind::Send { .. } | WrKind::Write { .. });
    if reply {
        probe::reply(t0);
    }
    let context = ctx(t, wr.id);
    let mut flags = ffi::FI_COMPLETION as u64 | more(wr);
    let ret = match wr.kind {
        WrKind::Write { remote_addr, key, imm } => {
            flags |= write_flags(t, imm, total);
            let mut rma = ffi::fi_rma_iov { addr: remote_addr, len: total, key };
            let msg = rma_msg(&mut iov, &mut desc, n, wr.peer, &mut rma, context, imm.unwrap_or(0));
            // SAFETY: the caller keeps the local memory valid until the completion; msg and
            // its arrays live for the call (libfabric copies what it keeps).
            unsafe { ffi::fi_writemsg(ep, &msg, flags) }
        }
        WrKind::Read { remote_addr, key } => {
            let mut rma = ffi::fi_rma_iov { addr: remote_addr, len: total, key };
            let msg = rma_msg(&mut iov, &mut desc, n, wr.peer, &mut rma, context, 0);
            // SAFETY: as for writes; the memory is ours alone until the completion.
            unsafe { ffi::fi_readmsg(ep, &msg, flags) }
        }
        WrKind::Send { imm } => {
            let data = imm.unwrap_or(0);
            if imm.is_some() {
                flags |= ffi::FI_REMOTE_CQ_DATA as u64;
            }
            if imm.is_none() && n == 1 && total <= t.caps.inject_size && !t.is_device(desc[0] as usize) {
                // Small payloads go inline: copied now, no completion to wait for.
                // SAFETY: the provider copies `total` bytes from valid memory before returning.
                let r = unsafe { ffi::fi_inject(ep, iov[0].iov_base, total, wr.peer) };
                probe::posted(t0);
                return injected(t, r);
            }
            let msg = plain_msg(&mut iov, &mut desc, n, wr.peer, context, data);
            // SAFETY: as for reads.
            unsafe { ffi::fi_sendmsg(ep, &msg, flags) }
        }
        WrKind::Recv => {
            let msg = plain_msg(&mut iov, &mut desc, n, wr.peer, context, 0);
            // SAFETY: as for reads; the memory is ours alone until the completion.
            unsafe { ffi::fi_recvmsg(ep, &msg, ffi::FI_COMPLETION as u64) }
        }
    };
    if reply {
        probe::posted(t0);
    }
    queued(t, ret)
}

/// The context for request `id`: one per slot (the low bits of the id, reused only after
/// the slot's request completed), stamped with the whole id.
fn ctx(t: &mut FabricTransport, id: WrId) -> *mut std::ffi::c_void {
    let i = id.slot();
    while t.ctxs.len() <= i {
        t.ctxs.push(Box::new(Ctx { fi: ffi::fi_context2::default(), id: WrId::from_raw(0) }));
    }
    t.ctxs[i].id = id;
    &mut *t.ctxs[i] as *mut Ctx as *mut _
}

fn plain_msg(
    iov: &mut [libc::iovec; 4],
    desc: &mut [*mut std::ffi::c_void; 4],
    n: usize,
    peer: PeerAddr,
    context: *mut std::ffi::c_void,
    data: u64,
) -> ffi::fi_msg {
    ffi::fi_msg {
        msg_iov: iov.as_mut_ptr() as *const _,
        desc: desc.as_mut_ptr(),
        iov_count: n,
        addr: peer,
        context,
        data,
    }
}

fn rma_msg(
    iov: &mut [libc::iovec; 4],
    desc: &mut [*mut std::ffi::c_void; 4],
    n: usize,
    peer: PeerAddr,
    rma: &mut ffi::fi_rma_iov,
    context: *mut std::ffi::c_void,
    data: u64,
) -> ffi::fi_msg_rma {
    ffi::fi_msg_rma {
        msg_iov: iov.as_mut_ptr() as *const _,
        desc: desc.as_mut_ptr(),
        iov_count: n,
        addr: peer,
        rma_iov: rma,
        rma_iov_count: 1,
        context,
        data,
    }
}
