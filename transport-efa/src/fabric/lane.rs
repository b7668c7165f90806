//! A lane's endpoint and completion queue: opened on a rail, connected to one peer's address,
//! closed (on shm, after waiting up to a patience for a peer endpoint of this process to close
//! first, see `shm_peers`).
use std::ptr;
use std::time::Duration;

use rdmalane::backend::{LaneId, PeerAddr};
use rdmalane::TransportError;

use super::{FabricTransport, Lane};
use crate::exit_guard::Teardown;
use crate::ffi;
use crate::util::{fi_error, terr};

/// Open an endpoint and its completion queue on `rail`, bound to the rail's address vector
/// (and its served-ops counter where it has one): the lane's id and its address.
pub(super) fn open(t: &mut FabricTransport, rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
    if rail >= t.rails.len() {
        return Err(t.err(-(ffi::FI_EINVAL as i64), "open_lane: no such rail"));
    }
    let (cq, fd) = t.open_cq(rail, t.wait_fd)?;
    let (domain, av, info) = (t.rails[rail].domain, t.rails[rail].av, t.rails[rail].info.0);
    let served = t.rails[rail].served;
    let mut ep: *mut ffi::fid_ep = ptr::null_mut();
    let prov = t.caps.provider.clone();
    let step = |r: i32, what: &str| if r == 0 { Ok(()) } else { Err(terr(&prov, r, what)) };
    // SAFETY: opening an endpoint on our domain from our info, binding our AV and CQ; on
    // any failure the endpoint is closed before returning.
    let res = unsafe {
        step(ffi::fi_endpoint(domain, info, &mut ep, ptr::null_mut()), "fi_endpoint")
            .and_then(|_| step(ffi::fi_ep_bind(ep, &mut (*av).fid, 0), "fi_ep_bind(av)"))
            .and_then(|_| {
                let flags = (ffi::FI_TRANSMIT | ffi::FI_RECV) as u64;
                step(ffi::fi_ep_bind(ep, &mut (*cq).fid, flags), "fi_ep_bind(cq)")
            })
            .and_then(|_| match served.is_null() {
                true => Ok(()),
                false => {
                    let flags = (ffi::FI_REMOTE_WRITE | ffi::FI_REMOTE_READ) as u64;
                    step(ffi::fi_ep_bind(ep, &mut (*served).fid, flags), "fi_ep_bind(cntr)")
                }
            })
            .and_then(|_| step(ffi::fi_enable(ep), "fi_enable"))
    };
    if let Err(e) = res {
        // SAFETY: closing what we just opened, endpoint first.
        unsafe {
            if !ep.is_null() {
                ffi::fi_close(&mut (*ep).fid);
            }
            ffi::fi_close(&mut (*cq).fid);
        }
        return Err(e);
    }
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: the endpoint is open; buf/len describe writable memory.
    let mut r = unsafe { ffi::fi_getname(&mut (*ep).fid, buf.as_mut_ptr() as *mut _, &mut len) };
    if r == -(ffi::FI_ETOOSMALL as i32) {
        buf.resize(len, 0);
        // SAFETY: as above, with the size the provider asked for.
        r = unsafe { ffi::fi_getname(&mut (*ep).fid, buf.as_mut_ptr() as *mut _, &mut len) };
    }
    if r != 0 {
        // SAFETY: closing what we just opened, endpoint first.
        unsafe {
            ffi::fi_close(&mut (*ep).fid);
            ffi::fi_close(&mut (*cq).fid);
        }
        return Err(t.err(r, "fi_getname"));
    }
    buf.truncate(len);
    let shm = t.caps.provider == "shm";
    if shm {
        crate::shm_peers::opened(&buf);
    }
    let name = if shm { buf.clone() } else { Vec::new() };
    let own_len = buf.len();
    Ok((LaneId(t.lanes.insert(Lane { ep, cq, fd, addr: None, rail, name, own_len, peer: None })), buf))
}

/// Whether `name`, a peer's lane address from its hello, is a whole address of the rail's
/// format (`format`, our own lanes' addresses being `own_len` bytes): libfabric reads as many
/// bytes as the format says, not as the peer sent, so a short or empty one would be read past.
fn fits(format: u32, own_len: usize, name: &[u8]) -> Result<(), String> {
    const AF_INET: u16 = libc::AF_INET as u16;
    const AF_INET6: u16 = libc::AF_INET6 as u16;
    let family = || name.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
    let sockaddr = |want: Option<u16>| match family() {
        Some(f @ AF_INET) if want.is_none_or(|w| w == f) && name.len() == SOCKADDR_IN => Ok(()),
        Some(f @ AF_INET6) if want.is_none_or(|w| w == f) && name.len() == SOCKADDR_IN6 => Ok(()),
        f => Err(format!("{} bytes of address family {f:?} is no socket address of this rail", name.len())),
    };
    match format {
        ffi::FI_SOCKADDR => sockaddr(None),
        ffi::FI_SOCKADDR_IN => sockaddr(Some(AF_INET)),
        ffi::FI_SOCKADDR_IN6 => sockaddr(Some(AF_INET6)),
        // Read up to its terminating NUL.
        ffi::FI_ADDR_STR if name.len() > 1 && name.iter().position(|&b| b == 0).is_some_and(|i| i > 0) => {
            Ok(())
        }
        ffi::FI_ADDR_STR => Err(format!("{} bytes, not a NUL-terminated name", name.len())),
        // A format of fixed size, ours.
        _ if name.len() == own_len => Ok(()),
        _ => Err(format!("{} bytes where this rail's addresses are {own_len}", name.len())),
    }
}

/// `struct sockaddr_in`'s size, and `sockaddr_in6`'s.
const SOCKADDR_IN: usize = std::mem::size_of::<libc::sockaddr_in>();
const SOCKADDR_IN6: usize = std::mem::size_of::<libc::sockaddr_in6>();

/// Point `lane` at a peer endpoint named `name` (its address from the peer's hello).
pub(super) fn connect(
    t: &mut FabricTransport,
    lane: LaneId,
    name: &[u8],
) -> Result<PeerAddr, TransportError> {
    if !t.lanes.contains(lane.index()) {
        return Err(t.err(-(ffi::FI_EINVAL as i64), "connect_lane: no such lane"));
    }
    let rail = t.lanes[lane.index()].rail;
    // SAFETY: the rail's info list stays open while the transport lives.
    let format = unsafe { (*t.rails[rail].info.0).addr_format };
    let own_len = t.lanes[lane.index()].own_len;
    if let Err(why) = fits(format, own_len, name) {
        return Err(t.err(-(ffi::FI_EINVAL as i64), &format!("the peer's lane address: {why}")));
    }
    let mut addr: ffi::fi_addr_t = 0;
    let av = t.rails[rail].av;
    // SAFETY: `name` holds a whole address of this rail's format (`fits`: the bytes libfabric
    // reads for it are all there); libfabric copies it.
    let n = unsafe { ffi::fi_av_insert(av, name.as_ptr() as *const _, 1, &mut addr, 0, ptr::null_mut()) };
    if n != 1 {
        return Err(t.err(if n < 0 { n as i64 } else { -(ffi::FI_EINVAL as i64) }, "fi_av_insert"));
    }
    t.lanes[lane.index()].addr = Some(addr);
    if t.caps.provider == "shm" {
        t.lanes[lane.index()].peer = Some(name.to_vec());
    }
    Ok(addr)
}

/// Close `lane`: its endpoint, then its completion queue; its peer's address leaves the AV.
pub(super) fn close(t: &mut FabricTransport, lane: LaneId) {
    let Some(Lane { ep, cq, addr, rail, name, peer, .. }) = t.lanes.try_remove(lane.index()) else {
        return;
    };
    let Some(_inside) = Teardown::enter() else { return };
    let patience = patience(t.hurried_until);
    // SAFETY: the lane's endpoint and CQ, just taken out of the transport.
    if !unsafe { close_endpoint(lane, ep, cq, &name, peer.as_deref(), patience) } {
        t.hurried_until = Some(std::time::Instant::now() + HURRY);
    }
    if let Some(mut a) = addr {
        // SAFETY: removing an address this AV returned.
        unsafe { ffi::fi_av_remove(t.rails[rail].av, &mut a, 1, 0) };
    }
}

/// After a wait for a peer endpoint of this process ran out, closes do not wait for this long.
pub(super) const HURRY: Duration = Duration::from_secs(2);

/// How long a close may wait for a peer endpoint of this process (`shm_peers`).
pub(super) fn patience(hurried_until: Option<std::time::Instant>) -> Duration {
    match hurried_until {
        Some(t) if std::time::Instant::now() < t => Duration::ZERO,
        _ => crate::shm_peers::PATIENCE,
    }
}

/// Close a lane's endpoint, then its CQ (with whatever completions it still held); libfabric
/// discards what is posted on it. An shm endpoint whose peer is an endpoint of this process
/// still serving first waits for it to close, up to `patience`, progressing ours meanwhile
/// (`shm_peers`); `name` is empty on other providers. False when that wait ran out. Nothing
/// is closed once the process exits (as with every teardown call then).
///
/// # Safety
/// `ep` and `cq` are a lane's, open, taken out of the transport: nobody uses them again.
pub(super) unsafe fn close_endpoint(
    lane: LaneId,
    ep: *mut ffi::fid_ep,
    cq: *mut ffi::fid_cq,
    name: &[u8],
    peer: Option<&[u8]>,
    patience: Duration,
) -> bool {
    let wait = match name.is_empty() {
        true => crate::shm_peers::Wait::Clear,
        // SAFETY: the caller's contract: the CQ is open and ours alone; what it yields is
        // dropped (the caller fails the lane's ops once it is closed).
        false => crate::shm_peers::before_close(name, peer, patience, &mut || unsafe { drain(cq) }),
    };
    match wait {
        crate::shm_peers::Wait::Exiting => return true,
        crate::shm_peers::Wait::TimedOut => {
            tracing::warn!(
                lane = lane.index(),
                "an shm peer endpoint of this process still serves: closing anyway"
            )
        }
        crate::shm_peers::Wait::Clear => {}
    }
    // SAFETY: the caller's contract: an endpoint and CQ of ours, closed once.
    let r = unsafe { ffi::fi_close(&mut (*ep).fid) };
    if r != 0 {
        tracing::warn!(lane = %lane, error = %fi_error(r), "fi_close(ep)");
    }
    // SAFETY: as above.
    unsafe { ffi::fi_close(&mut (*cq).fid) };
    if !name.is_empty() {
        crate::shm_peers::closed(name);
    }
    wait != crate::shm_peers::Wait::TimedOut
}

/// Progress a closing lane's endpoint through its CQ, dropping what it yields (errors too, so
/// the CQ does not stay stuck on one).
///
/// # Safety
/// `cq` is open and used by nobody else meanwhile.
unsafe fn drain(cq: *mut ffi::fid_cq) {
    let mut entries = [ffi::fi_cq_data_entry::default(); 8];
    // SAFETY: the caller's contract; `entries` holds 8 entries of the CQ's format.
    let r = unsafe { ffi::fi_cq_read(cq, entries.as_mut_ptr() as *mut _, entries.len()) };
    if r == -(ffi::FI_EAVAIL as isize) {
        let mut e = ffi::fi_cq_err_entry::default();
        // SAFETY: as above, one error entry into a zeroed struct we own.
        unsafe { ffi::fi_cq_readerr(cq, &mut e, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sockaddr(family: i32, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        v[..2].copy_from_slice(&(family as u16).to_ne_bytes());
        v
    }

    #[test]
    fn a_peer_address_must_be_whole_for_the_rails_format() {
        let v4 = sockaddr(libc::AF_INET, SOCKADDR_IN);
        let v6 = sockaddr(libc::AF_INET6, SOCKADDR_IN6);
        assert!(fits(ffi::FI_SOCKADDR_IN, 16, &v4).is_ok());
        assert!(fits(ffi::FI_SOCKADDR, 16, &v6).is_ok(), "either family where the format allows both");
        assert!(fits(ffi::FI_SOCKADDR_IN6, 28, &v6).is_ok());
        for bad in [vec![], vec![2], v4[..8].to_vec(), sockaddr(libc::AF_INET6, SOCKADDR_IN), v6.clone()] {
            assert!(fits(ffi::FI_SOCKADDR_IN, 16, &bad).is_err(), "{bad:?}");
        }
        assert!(fits(ffi::FI_SOCKADDR, 16, &sockaddr(libc::AF_UNIX, 16)).is_err(), "another family");
        assert!(fits(ffi::FI_ADDR_STR, 30, b"fi_shm://1234\0").is_ok());
        for bad in [&b""[..], b"\0", b"fi_shm://1234"] {
            assert!(fits(ffi::FI_ADDR_STR, 30, bad).is_err(), "{bad:?}");
        }
        assert!(fits(99, 32, &[1; 32]).is_ok(), "a fixed-size format: our own length");
        assert!(fits(99, 32, &[1; 31]).is_err());
    }
}
