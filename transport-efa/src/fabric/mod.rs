//! One libfabric RDM transport: per rail a fabric, domain and address vector, per lane an
//! endpoint with its own completion queue; the `Transport` the reactor drives. Its parts:
//! `open` (the provider and the rails), `lane` (endpoints), `mr` (registration), `post`
//! (work requests) and `completions` (reading the queues, and the sleep on them).
mod completions;
mod lane;
mod mr;
mod open;
mod post;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdmalane::backend::{
    Access, Caps, Completion, DeviceMem, LaneId, MemoryRegion, Notify, PeerAddr, PostError, Posted,
    Transport, WorkRequest, WrId,
};
use rdmalane::TransportError;
use slab::Slab;

use crate::exit_guard::Teardown;
use crate::ffi;
use crate::info::InfoList;
use crate::spacing::Spacing;
use crate::util::terr;
use mr::Mr;
use rdmalane_wake::EventFd;

/// Completion entries read per `fi_cq_read`.
const CQ_BATCH: usize = 64;

/// The per-request context libfabric may use (FI_CONTEXT/FI_CONTEXT2), followed by our id. The
/// provider hands its address back in the completion.
#[repr(C)]
struct Ctx {
    fi: ffi::fi_context2,
    id: WrId,
}

/// One lane: an endpoint and its own completion queue, on one rail.
struct Lane {
    ep: *mut ffi::fid_ep,
    cq: *mut ffi::fid_cq,
    fd: Option<i32>,
    addr: Option<ffi::fi_addr_t>,
    rail: usize,
    /// Its address, and its peer's (shm only: see `shm_peers`).
    name: Vec<u8>,
    /// Its address's length (every provider): a peer's must fit the same format.
    own_len: usize,
    peer: Option<Vec<u8>>,
}

/// One rail: a NIC's (or a loopback address's) fabric, domain and address vector.
struct Rail {
    // Kept until the fids are closed; freed after them (fields drop after Drop::drop).
    info: InfoList,
    fabric: *mut ffi::fid_fabric,
    domain: *mut ffi::fid_domain,
    av: *mut ffi::fid_av,
    /// Counts peers' one-sided ops the rail's endpoints served (checked shm only; else null).
    served: *mut ffi::fid_cntr,
}

/// The libfabric transport: see the crate docs.
pub struct FabricTransport {
    rails: Vec<Rail>,
    /// One endpoint and completion queue per lane: closing a lane closes both, so nothing of a
    /// closed lane lingers in a queue another lane uses.
    lanes: Slab<Lane>,
    /// Open lane CQs with a wait object (FI_WAIT_FD) where the provider has one.
    wait_fd: bool,
    caps: Caps,
    mr_mode: u32,
    key_mask: u64,
    delivery_complete: bool,
    mrs: Slab<Mr>,
    /// A device registration's descriptor on a rail -> its read twin's (see `Mr::read_descs`).
    read_twins: HashMap<usize, usize>,
    /// The descriptors of device memory's registrations: a send from it never goes by
    /// `fi_inject`, which takes no descriptor, so that the provider would copy from the
    /// device address as if it were host memory.
    device_descs: std::collections::HashSet<usize>,
    // Boxed: the provider holds their addresses while requests are posted, and the Vec grows.
    #[allow(clippy::vec_box)]
    ctxs: Vec<Box<Ctx>>,
    efd: Arc<EventFd>,
    entries: Vec<ffi::fi_cq_data_entry>,
    /// The lane whose queue the next read starts with (counting in lane order): the reads
    /// take turns, so that a lane whose queue fills a whole batch every time does not keep
    /// the others' completions waiting.
    first_lane: usize,
    /// Time left after a read of the completion queues that found nothing (see `spacing`).
    spacing: Spacing,
    /// Until when closing an shm endpoint does not wait for a peer endpoint of this process to
    /// close first: set when such a wait runs out, so that a shutdown whose peers do not close
    /// (nobody drives them) waits once, not once per lane.
    hurried_until: Option<std::time::Instant>,
    /// The rails' `served` counts at the last look.
    served_seen: u64,
}

// SAFETY: the fid pointers are only used by whoever owns the transport, one thread at a time
// (FI_THREAD_DOMAIN); nothing is shared with other threads except the eventfd, which is Sync.
unsafe impl Send for FabricTransport {}

impl FabricTransport {
    fn err(&self, ret: impl Into<i64>, what: &str) -> TransportError {
        terr(&self.caps.provider, ret, what)
    }

    /// Is `desc` (a rail's own descriptor) one of device memory's registrations?
    #[inline]
    fn is_device(&self, desc: usize) -> bool {
        !self.device_descs.is_empty() && self.device_descs.contains(&desc)
    }
}

impl Transport for FabricTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn open_lane(&mut self, rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        lane::open(self, rail)
    }

    fn connect_lane(&mut self, lane: LaneId, name: &[u8]) -> Result<PeerAddr, TransportError> {
        lane::connect(self, lane, name)
    }

    fn close_lane(&mut self, lane: LaneId) {
        lane::close(self, lane)
    }

    unsafe fn register(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, TransportError> {
        // SAFETY: the caller's contract, which is `mr::register`'s.
        unsafe { mr::register(self, ptr, len, access) }
    }

    unsafe fn register_device(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        mem: DeviceMem,
    ) -> Result<MemoryRegion, TransportError> {
        // SAFETY: the caller's contract, which is `mr::register_device`'s.
        unsafe { mr::register_device(self, ptr, len, access, mem) }
    }

    fn deregister(&mut self, id: u64) -> Result<(), TransportError> {
        mr::deregister(self, id)
    }

    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
        // SAFETY: the caller's contract, which is `post::post`'s.
        unsafe { post::post(self, wr) }
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(started) = self.spacing.ready() else { return 0 };
        let (n, found_nothing) = completions::read_queues(self, out, max);
        if found_nothing {
            self.spacing.found_nothing(started);
        }
        n
    }

    fn serving(&mut self, on: bool) {
        self.spacing.serving(on);
    }

    fn poll_now(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        completions::read_queues(self, out, max).0
    }

    fn remote_served(&mut self) -> bool {
        completions::remote_served(self)
    }

    fn wait(&mut self, timeout: Duration) {
        completions::wait(self, timeout)
    }

    fn notifier(&self) -> Arc<dyn Notify> {
        self.efd.clone()
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        let Some(_inside) = Teardown::enter() else { return };
        // SAFETY: closing what we opened, endpoints first, each once; null means never opened.
        unsafe {
            let mut hurried = self.hurried_until;
            for (id, lane) in self.lanes.iter() {
                let patience = lane::patience(hurried);
                if !lane::close_endpoint(
                    LaneId(id),
                    lane.ep,
                    lane.cq,
                    &lane.name,
                    lane.peer.as_deref(),
                    patience,
                ) {
                    hurried = Some(std::time::Instant::now() + lane::HURRY);
                }
            }
            self.lanes.clear();
            for m in self.mrs.drain() {
                for mr in m.fids {
                    ffi::fi_close(&mut (*mr).fid);
                }
            }
            for rail in &self.rails {
                if !rail.served.is_null() {
                    ffi::fi_close(&mut (*rail.served).fid);
                }
                if !rail.av.is_null() {
                    ffi::fi_close(&mut (*rail.av).fid);
                }
                if !rail.domain.is_null() {
                    ffi::fi_close(&mut (*rail.domain).fid);
                }
                if !rail.fabric.is_null() {
                    ffi::fi_close(&mut (*rail.fabric).fid);
                }
            }
        }
    }
}
