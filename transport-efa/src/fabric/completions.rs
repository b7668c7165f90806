//! Reading the lanes' completion queues (errors and peers' writes too), the served-ops
//! counter, and the sleep on the queues' wait fds.
use std::ffi::CStr;
use std::time::Duration;

use rdmalane::backend::Completion;
use rdmalane::TransportError;

use super::{Ctx, FabricTransport, CQ_BATCH};
use crate::exit_guard;
use crate::ffi;
use crate::probe;
use crate::util::{classify, fi_error};

/// A completion a peer's write raised here, not one of our ops': flagged FI_REMOTE_WRITE, or,
/// as shm 2.x reports a write with remote CQ data, FI_REMOTE_CQ_DATA on an entry that is no
/// receive (its context is the initiator's, not one of ours: it must not be read as a `Ctx`).
fn is_remote_write(flags: u64) -> bool {
    flags & ffi::FI_REMOTE_WRITE as u64 != 0
        || (flags & ffi::FI_REMOTE_CQ_DATA as u64 != 0 && flags & ffi::FI_RECV as u64 == 0)
}

/// Read every lane's completion queue, up to `max` completions in all: how many, and
/// whether a read was made and found nothing at all (no completion, event or error).
/// Nothing is read once the process is exiting.
pub(super) fn read_queues(t: &mut FabricTransport, out: &mut Vec<Completion>, max: usize) -> (usize, bool) {
    if exit_guard::exiting() {
        return (0, false);
    }
    let before = out.len();
    let (mut read, mut found) = (false, false);
    let mut entries = std::mem::take(&mut t.entries);
    let n = t.lanes.len();
    let first = if n > 1 { t.first_lane % n } else { 0 };
    t.first_lane = first + 1;
    for (_, lane) in t.lanes.iter().skip(first).chain(t.lanes.iter().take(first)) {
        let room = (max - (out.len() - before)).min(CQ_BATCH);
        if room == 0 {
            break;
        }
        let t0 = probe::start();
        // SAFETY: `entries` holds CQ_BATCH entries of the format the CQ was opened with.
        let r = unsafe { ffi::fi_cq_read(lane.cq, entries.as_mut_ptr() as *mut _, room) };
        probe::cq_read(t0, r > 0);
        read = true;
        found |= r > 0 || r == -(ffi::FI_EAVAIL as isize);
        if r > 0 {
            for e in &entries[..r as usize] {
                if is_remote_write(e.flags) {
                    if e.flags & ffi::FI_REMOTE_CQ_DATA as u64 != 0 {
                        out.push(Completion::RemoteWrite { imm: e.data, len: e.len });
                    }
                    continue;
                }
                if e.op_context.is_null() {
                    continue;
                }
                // SAFETY: every context we post points at a live `Ctx` in `t.ctxs`.
                let id = unsafe { (*(e.op_context as *const Ctx)).id };
                let imm = (e.flags & ffi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(e.data);
                out.push(Completion::Op { id, len: e.len, imm, status: Ok(()) });
            }
        } else if r == -(ffi::FI_EAVAIL as isize) {
            cq_error(t, lane.cq, out);
        }
    }
    t.entries = entries;
    (out.len() - before, read && !found)
}

fn cq_error(t: &FabricTransport, cq: *mut ffi::fid_cq, out: &mut Vec<Completion>) {
    let mut e = ffi::fi_cq_err_entry::default();
    // SAFETY: reading one error entry into a zeroed struct we own.
    let r = unsafe { ffi::fi_cq_readerr(cq, &mut e, 0) };
    if r < 0 {
        return;
    }
    let mut buf = [0i8; 256];
    // SAFETY: the provider formats into our buffer and returns a pointer into it or to a
    // static string.
    let prov_text = unsafe {
        let p = ffi::fi_cq_strerror(cq, e.prov_errno, e.err_data, buf.as_mut_ptr(), buf.len());
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    let status = TransportError {
        provider: t.caps.provider.clone(),
        errno: e.err,
        text: format!("{} (provider: {prov_text}, prov_errno {})", fi_error(e.err), e.prov_errno),
        class: classify(e.err),
    };
    if e.op_context.is_null() {
        tracing::warn!(error = %status, "completion error without a request");
        return;
    }
    // SAFETY: every context we post points at a live `Ctx` in `t.ctxs`.
    let id = unsafe { (*(e.op_context as *const Ctx)).id };
    out.push(Completion::Op { id, len: 0, imm: None, status: Err(Box::new(status)) });
}

/// Did peers' one-sided ops served here move the rails' counters since the last look?
pub(super) fn remote_served(t: &mut FabricTransport) -> bool {
    if exit_guard::exiting() {
        return false;
    }
    let mut total = 0u64;
    for rail in &t.rails {
        if !rail.served.is_null() {
            // SAFETY: reading a counter we opened; the endpoints' progress (in `poll`)
            // advances it.
            total = total.wrapping_add(unsafe { ffi::fi_cntr_read(rail.served) });
        }
    }
    let changed = total != t.served_seen;
    t.served_seen = total;
    changed
}

/// Sleep on the lanes' wait fds and the eventfd, up to `timeout`, where every rail says it is
/// safe to (`fi_trywait`); on the eventfd alone where a lane has no fd.
pub(super) fn wait(t: &mut FabricTransport, timeout: Duration) {
    if exit_guard::exiting() {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
        return;
    }
    let mut fds = Vec::with_capacity(t.lanes.len());
    let mut by_rail: Vec<Vec<*mut ffi::fid>> = vec![Vec::new(); t.rails.len()];
    for (_, lane) in t.lanes.iter() {
        if let Some(fd) = lane.fd {
            // SAFETY: taking the address of an open CQ's fid.
            by_rail[lane.rail].push(unsafe { &mut (*lane.cq).fid });
            fds.push(fd);
        }
    }
    if fds.is_empty() || fds.len() != t.lanes.len() {
        t.efd.wait(&[], timeout);
        return;
    }
    // Each rail's CQs are checked with their own fabric; blocking is safe only when every
    // rail says so.
    let ok = by_rail.iter_mut().zip(&t.rails).all(|(fids, rail)| {
        // SAFETY: trywait on our open CQs of this rail; it returns 0 only when it is safe
        // to block on them.
        fids.is_empty() || unsafe { ffi::fi_trywait(rail.fabric, fids.as_mut_ptr(), fids.len() as i32) == 0 }
    });
    if ok {
        t.efd.wait(&fds, timeout);
    }
}
