//! The verbs `Transport`: a protection domain, a completion channel, and per lane two RC queue
//! pairs on one completion queue (see the crate docs).
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{
    ibv_comp_channel, ibv_mr, ibv_pd, ibv_send_flags as sf, ibv_wc, ibv_wc_opcode as op, ibv_wc_status,
};
use rdmalane::backend::{
    Access, Caps, Completion, LaneId, MemoryRegion, Notify, PeerAddr, PostError, Posted, Transport,
    WorkRequest, WrId, WrKind,
};
use rdmalane::{Error, FailureClass, OpKind, Result, TransportError};
use slab::Slab;

use crate::device::{Device, DeviceSpec};
use crate::lane::{self, Lane, LaneName, QpCaps, DATA, NOTIFY};
use crate::status::{call_error, plain, wc_error};
use rdmalane_wake::{set_nonblocking, EventFd};

/// Work completions read per `ibv_poll_cq`.
const CQ_BATCH: usize = 64;
/// The id of the transport's own zero-length receives on a notify QP.
const NOTIFY_RECV: u64 = u64::MAX;
/// Zero-length receives kept posted per notify QP: writes with immediate data in flight from
/// the peer beyond this wait (receiver-not-ready retries) until we re-post.
const NOTIFY_RECVS: u32 = 256;
/// Send requests posted in one `ibv_post_send` call at most (one doorbell).
const POST_LIST: usize = 32;
/// At least every this many send requests on a QP one is signalled, so the send queue's
/// slots of unsignalled ones are known free again.
const SIGNAL_EVERY: u32 = 16;
/// Send and receive queue depth asked for (lowered to the device's limits).
const QUEUE_DEPTH: u32 = 1024;
/// Inline payload asked for (lowered to what the device accepts).
const INLINE_WANTED: u32 = 256;
/// Scatter-gather entries per request.
const MAX_SGE: usize = 4;

/// A send request built by `post`, posted by `flush` in a linked list with its neighbours.
struct Pending {
    lane: LaneId,
    q: usize,
    wr: rdma_sys::ibv_send_wr,
    sges: [rdma_sys::ibv_sge; MAX_SGE],
}

/// The verbs transport: see the crate docs.
pub struct VerbsTransport {
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    lanes: Slab<Lane>,
    mrs: Slab<*mut ibv_mr>,
    /// The lkeys of device memory's registrations: a request over it is never posted inline,
    /// which has the CPU copy the payload from the device address at post time.
    device_lkeys: std::collections::HashSet<u32>,
    caps: Caps,
    qp_caps: QpCaps,
    /// Send requests posted with `more` and not yet handed to the device.
    pending: Vec<Pending>,
    /// Completions already taken from a CQ (or made up for requests the device refused),
    /// returned by the next `poll`, with the lane they belong to.
    ready: Vec<(LaneId, Completion)>,
    /// Which request slots hold a receive (its completion's opcode is not reliable on errors).
    recv_slots: Vec<bool>,
    /// The open lanes' ids, to walk them without allocating.
    lane_ids: Vec<LaneId>,
    /// Completions read in `poll`, reused.
    scratch: Vec<(LaneId, Completion)>,
    wcs: Vec<ibv_wc>,
    efd: Arc<EventFd>,
    // Last: closed after everything made from it (fields drop after Drop::drop).
    dev: Device,
}

// SAFETY: the verbs objects are used only by whoever owns the transport, one thread at a time;
// libibverbs objects may be used from any thread. Only the eventfd is shared, and it is Sync.
unsafe impl Send for VerbsTransport {}

fn open_error(dev: &str, what: &str) -> Error {
    Error::invalid(OpKind::Open, format!("verbs: {dev}: {what}: {}", std::io::Error::last_os_error()))
}

impl VerbsTransport {
    /// Open the device `spec` names; `wait_fd` asks for a completion channel the reactor can
    /// sleep on.
    pub fn open(spec: &DeviceSpec, wait_fd: bool) -> Result<VerbsTransport> {
        let dev = Device::open(spec)?;
        // SAFETY: a zeroed ibv_device_attr is a valid out-parameter.
        let mut da: rdma_sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: querying our open context into a local struct.
        if unsafe { rdma_sys::ibv_query_device(dev.ctx, &mut da) } != 0 {
            return Err(open_error(&dev.name, "ibv_query_device"));
        }
        let depth = QUEUE_DEPTH.min(da.max_qp_wr.max(1) as u32);
        // Outstanding reads per QP, as responder and as initiator, within the device's limits.
        let rd_atom = (da.max_qp_rd_atom.clamp(1, 16) as u8, da.max_qp_init_rd_atom.clamp(1, 16) as u8);
        let sge = (MAX_SGE as u32).min(da.max_sge.max(1) as u32);
        let mut t = VerbsTransport {
            pd: ptr::null_mut(),
            channel: ptr::null_mut(),
            lanes: Slab::new(),
            mrs: Slab::new(),
            device_lkeys: Default::default(),
            caps: Caps {
                provider: format!("verbs;{}", dev.name),
                max_msg_size: dev.max_msg,
                inject_size: 0,
                iov_limit: sge as usize,
                cq_data_size: 4,
                tx_depth: depth as usize,
                rx_depth: depth as usize,
                wait_fd: false,
                silent_refusals: false,
                rails: 1,
                rail_numa: vec![rdmalane::backend::device_numa_node(&dev.name)],
                device: crate::gpu::registration(),
            },
            qp_caps: QpCaps { send_wr: depth, recv_wr: depth, sge, inline: INLINE_WANTED, rd_atom },
            pending: Vec::with_capacity(POST_LIST),
            ready: Vec::new(),
            recv_slots: Vec::new(),
            lane_ids: Vec::new(),
            scratch: Vec::new(),
            // SAFETY: ibv_wc is plain data; zeroed entries are overwritten by ibv_poll_cq.
            wcs: (0..CQ_BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            efd: Arc::new(EventFd::new().map_err(|e| Error::Io {
                op: OpKind::Open,
                peer: "-".into(),
                source: e,
            })?),
            dev,
        };
        // SAFETY: allocating a PD on our open context; freed in Drop.
        t.pd = unsafe { rdma_sys::ibv_alloc_pd(t.dev.ctx) };
        if t.pd.is_null() {
            return Err(open_error(&t.dev.name, "ibv_alloc_pd"));
        }
        if wait_fd {
            // SAFETY: creating a completion channel on our context; destroyed in Drop.
            t.channel = unsafe { rdma_sys::ibv_create_comp_channel(t.dev.ctx) };
            if t.channel.is_null() {
                return Err(open_error(&t.dev.name, "ibv_create_comp_channel"));
            }
            // SAFETY: the channel is open; its fd is ours to configure.
            set_nonblocking(unsafe { (*t.channel).fd }).map_err(|e| Error::Io {
                op: OpKind::Open,
                peer: "-".into(),
                source: e,
            })?;
            t.caps.wait_fd = true;
        }
        // Learn the inline limit once, with a throw-away lane.
        let (probe, _) =
            t.open_lane(0).map_err(|e| Error::Transport { op: OpKind::Open, peer: "-".into(), source: e })?;
        t.close_lane(probe);
        t.caps.inject_size = t.qp_caps.inline as usize;
        tracing::info!(
            device = %t.dev.name,
            port = t.dev.port,
            gid_index = t.dev.gid_index,
            roce = t.dev.roce,
            mtu = 128usize << t.dev.active_mtu,
            max_msg = t.caps.max_msg_size,
            inline = t.caps.inject_size,
            depth,
            "verbs device open"
        );
        Ok(t)
    }

    fn err(&self, what: &str, ret: i32) -> TransportError {
        call_error(&self.caps.provider, what, ret)
    }

    /// Keeps a registration of memory at `ptr` and names it to the runtime.
    ///
    /// # Safety
    /// `mr` is a live, non-null registration on this transport's protection domain, as
    /// `ibv_reg_mr` (or its dma-buf form) just returned it; the transport owns it from here.
    unsafe fn record(&mut self, mr: *mut ibv_mr, ptr: *mut u8) -> MemoryRegion {
        // SAFETY: the caller's contract: mr points at a live ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        MemoryRegion {
            id: self.mrs.insert(mr) as u64,
            desc: lkey as usize,
            key: rkey as u64,
            rail_keys: Vec::new(),
            remote_base: ptr as u64,
        }
    }

    fn post_notify_recvs(&self, lane: &Lane, n: u32) -> i32 {
        for _ in 0..n {
            // SAFETY: a zeroed ibv_recv_wr is valid: no scatter list, a zero-length receive.
            let mut wr: rdma_sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = NOTIFY_RECV;
            let mut bad = ptr::null_mut();
            // SAFETY: posting a receive without memory on our QP.
            let r = unsafe { rdma_sys::ibv_post_recv(lane.qp[NOTIFY], &mut wr, &mut bad) };
            if r != 0 {
                return r;
            }
        }
        0
    }

    /// Hand the pending send requests to the device: one linked list per run of requests on
    /// the same queue pair, the last of each signalled (and every SIGNAL_EVERY-th).
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        let mut start = 0;
        while start < pending.len() {
            let (l, q) = (pending[start].lane, pending[start].q);
            let mut end = start + 1;
            while end < pending.len() && pending[end].lane == l && pending[end].q == q {
                end += 1;
            }
            self.post_run(&mut pending[start..end]);
            start = end;
        }
        pending.clear();
        self.pending = pending;
    }

    /// Post `run` (requests for one queue pair) as one linked list.
    fn post_run(&mut self, run: &mut [Pending]) {
        let (l, q) = (run[0].lane, run[0].q);
        let Some(lane) = self.lanes.get_mut(l.index()) else { return };
        let n = run.len();
        for (k, p) in run.iter_mut().enumerate() {
            lane.since_signal[q] += 1;
            if k + 1 == n || lane.since_signal[q] >= SIGNAL_EVERY {
                p.wr.send_flags |= sf::IBV_SEND_SIGNALED.0;
                lane.since_signal[q] = 0;
            }
            lane.posted[q].push_back(p.wr.wr_id);
            p.wr.sg_list = p.sges.as_mut_ptr();
            p.wr.next = ptr::null_mut();
        }
        for i in 0..n - 1 {
            let next: *mut rdma_sys::ibv_send_wr = &mut run[i + 1].wr;
            run[i].wr.next = next;
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a linked list of filled requests whose scatter lists point into `run`, alive
        // for the call; the runtime keeps the memory they name valid until their completions
        // (Transport::post's contract).
        let r = unsafe { rdma_sys::ibv_post_send(lane.qp[q], &mut run[0].wr, &mut bad) };
        if r != 0 {
            // What follows `bad` was not posted; what precedes it was, possibly unsignalled
            // with nothing signalled after it. Moving the QP to the error state flushes all of
            // those with completions of their own; the rest fail here.
            let e = call_error(&self.caps.provider, "ibv_post_send", r);
            let first_bad = (0..n).find(|&i| ptr::eq(&run[i].wr, bad)).unwrap_or(0);
            for p in &run[first_bad..] {
                lane.posted[q].retain(|&id| id != p.wr.wr_id);
                self.ready.push((
                    l,
                    Completion::Op {
                        id: WrId::from_raw(p.wr.wr_id),
                        len: 0,
                        imm: None,
                        status: Err(Box::new(e.clone())),
                    },
                ));
            }
            fail_lane(lane, format!("posting failed: {e}"));
        }
    }

    /// Read up to `max` completions of lane `l` into `out`.
    fn drain_cq(&mut self, l: LaneId, out: &mut Vec<(LaneId, Completion)>, max: usize) -> usize {
        let Some(lane) = self.lanes.get(l.index()) else { return 0 };
        let cq = lane.cq;
        // SAFETY: `wcs` holds CQ_BATCH entries; we ask for at most that many.
        let n = unsafe { rdma_sys::ibv_poll_cq(cq, max.min(CQ_BATCH) as i32, self.wcs.as_mut_ptr()) };
        if n <= 0 {
            return 0;
        }
        for i in 0..n as usize {
            let wc = &self.wcs[i];
            let (id, status, opcode, len, flags, qpn, vendor) =
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.wc_flags, wc.qp_num, wc.vendor_err);
            // SAFETY: reading the union's imm_data member, a plain u32 in either reading.
            let imm_be = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
            let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
            let provider = &self.caps.provider;
            let lane = &mut self.lanes[l.index()];
            if id == NOTIFY_RECV {
                if ok && opcode == op::IBV_WC_RECV_RDMA_WITH_IMM {
                    out.push((
                        l,
                        Completion::RemoteWrite { imm: u32::from_be(imm_be) as u64, len: len as usize },
                    ));
                    // One consumed, one back; a failure shows as the lane's failure next.
                    let lane = &self.lanes[l.index()];
                    let r = self.post_notify_recvs(lane, 1);
                    if r != 0 {
                        let e = call_error(provider, "ibv_post_recv", r);
                        let why = format!("re-posting a notify receive failed: {e}");
                        fail_lane(&mut self.lanes[l.index()], why);
                    }
                } else if !ok && lane.failed.is_none() {
                    fail_lane(lane, wc_error(provider, status, vendor).to_string());
                }
                continue;
            }
            let slot = WrId::from_raw(id).slot();
            let is_recv = self.recv_slots.get(slot).copied().unwrap_or(false);
            let status = if ok {
                Ok(())
            } else {
                let mut e = wc_error(provider, status, vendor);
                match &lane.failed {
                    // Flushed because the lane failed: the connection to the peer is gone
                    // (a killed peer shows as retries exceeded or, when its registrations went
                    // first, as an access error), so every op it took down is a lost peer,
                    // with the cause.
                    Some(why) if e.class == FailureClass::Cancelled => {
                        e.class = FailureClass::PeerUnreachable;
                        e.text = format!("{}; the queue pair failed before: {why}", e.text);
                    }
                    _ if e.class == FailureClass::Cancelled => {
                        // Flushed with no failure seen here: the QP went to the error state
                        // silently (an access error the peer made at our responder).
                        e.class = FailureClass::PeerUnreachable;
                        let why = "the queue pair was flushed (it entered the error state)".to_string();
                        e.text = format!("{}; {why}", e.text);
                        fail_lane(lane, why);
                    }
                    _ => fail_lane(lane, e.to_string()),
                }
                Err(Box::new(e))
            };
            if is_recv {
                self.recv_slots[slot] = false;
                // On an error only the id and status are valid.
                let imm = (status.is_ok() && flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
                    .then_some(u32::from_be(imm_be) as u64);
                let len = if status.is_ok() { len as usize } else { 0 };
                out.push((l, Completion::Op { id: WrId::from_raw(id), len, imm, status }));
                continue;
            }
            // A send-queue completion: everything posted before it on its QP is done too.
            // SAFETY: reading the QP number of our live QP.
            let q = if unsafe { (*lane.qp[NOTIFY]).qp_num } == qpn { NOTIFY } else { DATA };
            // Completions come in posting order, so what precedes `id` is unsignalled and done.
            // An id not in the queue was failed when its post failed: it retires nothing.
            let Some(at) = lane.posted[q].iter().position(|&p| p == id) else {
                continue;
            };
            for front in lane.posted[q].drain(..at) {
                out.push((
                    l,
                    Completion::Op { id: WrId::from_raw(front), len: 0, imm: None, status: Ok(()) },
                ));
            }
            lane.posted[q].pop_front();
            out.push((l, Completion::Op { id: WrId::from_raw(id), len: 0, imm: None, status }));
        }
        n as usize
    }
}

/// Mark a lane failed (first reason kept).
fn fail_lane(lane: &mut Lane, why: String) {
    if lane.failed.is_none() {
        tracing::warn!(reason = %why, "verbs: a lane's queue pair is in the error state");
        lane.failed = Some(why);
    }
    // Make sure the device flushes everything posted, unsignalled requests included.
    for &qp in &lane.qp {
        // SAFETY: a zeroed ibv_qp_attr with only the state set; moving our QP to ERR.
        unsafe {
            let mut a: rdma_sys::ibv_qp_attr = std::mem::zeroed();
            a.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_ERR;
            rdma_sys::ibv_modify_qp(qp, &mut a, rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32);
        }
    }
}

impl Transport for VerbsTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn open_lane(&mut self, rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        if rail != 0 {
            return Err(plain(
                &self.caps.provider,
                FailureClass::Other,
                format!("open_lane: no rail {rail}"),
            ));
        }
        let cqe = (2 * self.qp_caps.send_wr + self.qp_caps.recv_wr + NOTIFY_RECVS) as i32;
        // SAFETY: creating a CQ on our context, with our channel (or none); destroyed in
        // close_lane or Drop.
        let cq = unsafe { rdma_sys::ibv_create_cq(self.dev.ctx, cqe, ptr::null_mut(), self.channel, 0) };
        if cq.is_null() {
            return Err(self.err("ibv_create_cq", 0));
        }
        let mut qp = [ptr::null_mut(); 2];
        for q in [DATA, NOTIFY] {
            match lane::create_qp(self.pd, cq, &self.dev, &mut self.qp_caps) {
                Ok(p) => qp[q] = p,
                Err(e) => {
                    // SAFETY: destroying what was just created, QPs before their CQ.
                    unsafe {
                        qp.iter().filter(|p| !p.is_null()).for_each(|&p| {
                            rdma_sys::ibv_destroy_qp(p);
                        });
                        rdma_sys::ibv_destroy_cq(cq);
                    }
                    return Err(plain(&self.caps.provider, FailureClass::Other, e));
                }
            }
        }
        let psn = [rand::random::<u32>() & 0xff_ffff, rand::random::<u32>() & 0xff_ffff];
        let lane = Lane {
            cq,
            qp,
            psn,
            connected: false,
            failed: None,
            posted: Default::default(),
            since_signal: [0; 2],
        };
        let r = self.post_notify_recvs(&lane, NOTIFY_RECVS);
        // SAFETY: reading the QP numbers of the QPs just created.
        let qpn = unsafe { [(*qp[DATA]).qp_num, (*qp[NOTIFY]).qp_num] };
        let id = LaneId(self.lanes.insert(lane));
        self.lane_ids.push(id);
        if r != 0 {
            self.close_lane(id);
            return Err(self.err("ibv_post_recv(notify)", r));
        }
        // SAFETY: reading the raw bytes of the plain GID union.
        let gid = unsafe { self.dev.gid.raw };
        let name = LaneName {
            lid: self.dev.lid,
            roce: self.dev.roce,
            mtu: self.dev.active_mtu as u8,
            gid,
            qpn,
            psn,
        };
        Ok((id, name.encode()))
    }

    fn connect_lane(&mut self, lane: LaneId, name: &[u8]) -> Result<PeerAddr, TransportError> {
        let prov = self.caps.provider.clone();
        let peer = LaneName::decode(name).map_err(|e| plain(&prov, FailureClass::Other, e))?;
        let Some(l) = self.lanes.get_mut(lane.index()) else {
            return Err(plain(&prov, FailureClass::Other, format!("connect_lane: no lane {lane}")));
        };
        for q in [DATA, NOTIFY] {
            lane::connect_qp(l.qp[q], l.psn[q], &self.dev, &peer, q, self.qp_caps.rd_atom)
                .map_err(|e| plain(&prov, FailureClass::PeerUnreachable, e))?;
        }
        l.connected = true;
        Ok(0)
    }

    fn close_lane(&mut self, lane: LaneId) {
        let Some(l) = self.lanes.try_remove(lane.index()) else { return };
        self.lane_ids.retain(|&id| id != lane);
        self.pending.retain(|p| p.lane != lane);
        self.ready.retain(|(id, _)| *id != lane);
        // SAFETY: our QPs, reset (the device drops their requests) and destroyed (it touches
        // none of their memory after), then their CQ with whatever it still held; each once.
        unsafe {
            let mut destroyed = true;
            for qp in l.qp {
                let mut a: rdma_sys::ibv_qp_attr = std::mem::zeroed();
                a.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_RESET;
                rdma_sys::ibv_modify_qp(qp, &mut a, rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32);
                let r = rdma_sys::ibv_destroy_qp(qp);
                if r != 0 {
                    tracing::error!(
                        lane = %lane,
                        errno = r,
                        "ibv_destroy_qp failed: the queue pair and its CQ are leaked"
                    );
                    destroyed = false;
                }
            }
            if destroyed {
                rdma_sys::ibv_destroy_cq(l.cq);
            }
        }
    }

    unsafe fn register_device(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        mem: rdmalane::backend::DeviceMem,
    ) -> Result<MemoryRegion, TransportError> {
        let rdmalane::backend::DeviceRegistration::Verbs { dmabuf, peermem } = self.caps.device else {
            return Err(self.err("register_device: no device registration", 0));
        };
        let flags = access_flags(access);
        let mut mr = ptr::null_mut();
        if let (true, Some(d)) = (dmabuf, mem.dmabuf) {
            // SAFETY: the caller keeps the device memory, and the dma-buf fd, until deregister;
            // the iova is the device address ops name.
            mr = unsafe {
                crate::gpu::ibv_reg_dmabuf_mr(self.pd, d.offset, len, ptr as u64, d.fd, flags as i32)
            };
        }
        if mr.is_null() && peermem {
            // SAFETY: as `register`; nvidia-peermem resolves the device address's pages.
            mr = unsafe { rdma_sys::ibv_reg_mr(self.pd, ptr as *mut _, len, flags as i32) };
        }
        if mr.is_null() {
            return Err(
                self.err("ibv_reg_dmabuf_mr / ibv_reg_mr of device memory (dma-buf or nvidia-peermem)", 0)
            );
        }
        // SAFETY: mr is the non-null registration just made above.
        let region = unsafe { self.record(mr, ptr) };
        self.device_lkeys.insert(region.desc as u32);
        Ok(region)
    }

    unsafe fn register(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, TransportError> {
        let flags = access_flags(access);
        // SAFETY: the caller keeps [ptr, ptr+len) allocated until deregister.
        let mr = unsafe { rdma_sys::ibv_reg_mr(self.pd, ptr as *mut _, len, flags as i32) };
        if mr.is_null() {
            return Err(self.err("ibv_reg_mr", 0));
        }
        // SAFETY: mr is the non-null registration just made above.
        Ok(unsafe { self.record(mr, ptr) })
    }

    fn deregister(&mut self, id: u64) -> Result<(), TransportError> {
        let Some(mr) = self.mrs.try_remove(id as usize) else {
            return Err(plain(
                &self.caps.provider,
                FailureClass::Other,
                format!("deregister: unknown region {id}"),
            ));
        };
        if !self.device_lkeys.is_empty() {
            // SAFETY: mr is a live registration of ours until the dereg below.
            self.device_lkeys.remove(&unsafe { (*mr).lkey });
        }
        // SAFETY: releasing a registration we made, once.
        let r = unsafe { rdma_sys::ibv_dereg_mr(mr) };
        if r != 0 {
            return Err(self.err("ibv_dereg_mr", r));
        }
        Ok(())
    }

    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
        let prov = &self.caps.provider;
        let Some(lane) = self.lanes.get_mut(wr.lane.index()) else {
            return Err(PostError::failed(plain(
                prov,
                FailureClass::Other,
                format!("post: no lane {}", wr.lane),
            )));
        };
        if let Some(why) = &lane.failed {
            return Err(PostError::failed(plain(
                prov,
                FailureClass::PeerUnreachable,
                format!("the lane's queue pair is in the error state ({why}); establish the endpoint again"),
            )));
        }
        let n = wr.local.len();
        if n == 0 || n > self.caps.iov_limit {
            return Err(PostError::failed(plain(
                prov,
                FailureClass::Other,
                format!("{n} scatter entries (1..={})", self.caps.iov_limit),
            )));
        }
        // SAFETY: ibv_sge is plain data.
        let mut sges: [rdma_sys::ibv_sge; MAX_SGE] = unsafe { std::mem::zeroed() };
        // Saturating: lengths come from `IoBuf`s, which applications may implement; a sum past
        // the port's message size (a segment over 4 GiB included, whose `u32` below would be
        // cut short) is refused before anything is posted.
        let mut total = 0usize;
        for (s, l) in sges.iter_mut().zip(wr.local) {
            *s = rdma_sys::ibv_sge { addr: l.ptr as u64, length: l.len as u32, lkey: l.desc as u32 };
            total = total.saturating_add(l.len);
        }
        if total > self.caps.max_msg_size {
            return Err(PostError::failed(plain(
                prov,
                FailureClass::Truncated,
                format!("{total} bytes exceed the port's {} byte messages", self.caps.max_msg_size),
            )));
        }
        if wr.kind == WrKind::Recv {
            let slot = wr.id.slot();
            // SAFETY: a zeroed ibv_recv_wr, then filled; its scatter list lives for the call.
            let mut rwr: rdma_sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
            rwr.wr_id = wr.id.to_raw();
            rwr.sg_list = sges.as_mut_ptr();
            rwr.num_sge = n as i32;
            let mut bad = ptr::null_mut();
            // SAFETY: the caller keeps the memory valid and ours until the completion.
            let r = unsafe { rdma_sys::ibv_post_recv(lane.qp[DATA], &mut rwr, &mut bad) };
            if r != 0 {
                return Err(if r.abs() == libc::ENOMEM {
                    PostError::Again
                } else {
                    PostError::failed(call_error(prov, "ibv_post_recv", r))
                });
            }
            if self.recv_slots.len() <= slot {
                self.recv_slots.resize(slot + 1, false);
            }
            self.recv_slots[slot] = true;
            return Ok(Posted::Queued);
        }
        // The slot may have held a receive on a lane closed since: it is a send's now.
        if let Some(r) = self.recv_slots.get_mut(wr.id.slot()) {
            *r = false;
        }
        if !lane.connected {
            return Err(PostError::failed(plain(
                prov,
                FailureClass::Other,
                "post: the lane is not connected yet".into(),
            )));
        }
        // Keep the send queue from overflowing: posted and pending requests hold its slots.
        let q = if matches!(wr.kind, WrKind::Write { imm: Some(_), .. }) { NOTIFY } else { DATA };
        let held =
            lane.posted[q].len() + self.pending.iter().filter(|p| p.lane == wr.lane && p.q == q).count();
        if held + SIGNAL_EVERY as usize * 2 >= self.qp_caps.send_wr as usize {
            self.flush();
            return Err(PostError::Again);
        }
        // SAFETY: a zeroed ibv_send_wr is valid; `flush` links it and points it at its sges.
        let mut swr: rdma_sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        swr.wr_id = wr.id.to_raw();
        swr.num_sge = n as i32;
        // One-sided requests name the peer's region by a 32-bit rkey; a wider key is none of
        // this device's.
        if let WrKind::Write { remote_addr, key, .. } | WrKind::Read { remote_addr, key } = wr.kind {
            let Ok(rkey) = u32::try_from(key) else {
                return Err(PostError::failed(plain(
                    prov,
                    FailureClass::RemoteAccess,
                    format!("key {key:#x} is not a verbs rkey"),
                )));
            };
            swr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
        }
        let (opcode, inline_ok) = match wr.kind {
            WrKind::Write { imm: Some(v), .. } => {
                swr.imm_data_invalidated_rkey_union.imm_data = (v as u32).to_be();
                (rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, true)
            }
            WrKind::Write { imm: None, .. } => (rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, true),
            WrKind::Read { .. } => (rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_READ, false),
            WrKind::Send { imm: Some(v) } => {
                swr.imm_data_invalidated_rkey_union.imm_data = (v as u32).to_be();
                (rdma_sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, true)
            }
            WrKind::Send { imm: None } => (rdma_sys::ibv_wr_opcode::IBV_WR_SEND, true),
            WrKind::Recv => unreachable!("receives are posted above"),
        };
        swr.opcode = opcode;
        let device = !self.device_lkeys.is_empty()
            && wr.local.iter().any(|s| self.device_lkeys.contains(&(s.desc as u32)));
        if inline_ok && total <= self.qp_caps.inline as usize && !device {
            // Copied into the work queue at post time: no DMA read of the buffer.
            swr.send_flags |= sf::IBV_SEND_INLINE.0;
        }
        let p = Pending { lane: wr.lane, q, wr: swr, sges };
        if !wr.more && self.pending.is_empty() {
            // Alone: straight to the device, the common case of a latency-bound op.
            self.post_run(&mut [p]);
            return Ok(Posted::Queued);
        }
        self.pending.push(p);
        if !wr.more || self.pending.len() >= POST_LIST {
            self.flush();
        }
        Ok(Posted::Queued)
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.flush();
        let before = out.len();
        let take = self.ready.len().min(max);
        out.extend(self.ready.drain(..take).map(|(_, c)| c));
        let mut got = std::mem::take(&mut self.scratch);
        for k in 0..self.lane_ids.len() {
            let room = max.saturating_sub(out.len() - before);
            if room == 0 {
                break;
            }
            // One signalled completion may stand for up to SIGNAL_EVERY requests: what does not
            // fit `max` waits in `ready` (empty here, so the order holds).
            self.drain_cq(self.lane_ids[k], &mut got, room);
            let fit = got.len().min(room);
            out.extend(got.drain(..fit).map(|(_, c)| c));
            self.ready.append(&mut got);
        }
        self.scratch = got;
        out.len() - before
    }

    fn wait(&mut self, timeout: Duration) {
        self.flush();
        if !self.ready.is_empty() {
            return;
        }
        if self.channel.is_null() {
            self.efd.wait(&[], timeout);
            return;
        }
        // Arm every CQ, then look once more: a completion that arrived before arming raises
        // no event, so it must be found now or it would sleep through it.
        let ids = self.lane_ids.clone();
        let mut found = Vec::new();
        let mut read = 0;
        for &l in &ids {
            // SAFETY: arming our live CQ.
            unsafe { rdma_sys::ibv_req_notify_cq(self.lanes[l.index()].cq, 0) };
            read += self.drain_cq(l, &mut found, CQ_BATCH);
        }
        // Entries read (even ones that make no completion, like flushed internal receives)
        // mean more may be queued that raised no event: look again instead of sleeping.
        if read > 0 {
            self.ready.append(&mut found);
            return;
        }
        // SAFETY: reading the fd of our open channel.
        let fd = unsafe { (*self.channel).fd };
        self.efd.wait(&[fd], timeout);
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel's fd is nonblocking: this returns -1 at once when no event
            // is queued. Each event is acknowledged at once, so destroying a CQ never waits.
            unsafe {
                if rdma_sys::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) != 0 {
                    break;
                }
                rdma_sys::ibv_ack_cq_events(cq, 1);
            }
        }
    }

    fn notifier(&self) -> Arc<dyn Notify> {
        self.efd.clone()
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        let ids: Vec<LaneId> = self.lanes.iter().map(|(id, _)| LaneId(id)).collect();
        for l in ids {
            self.close_lane(l);
        }
        // SAFETY: releasing what we made, each once, before the device closes (it drops
        // after this).
        unsafe {
            for mr in self.mrs.drain() {
                rdma_sys::ibv_dereg_mr(mr);
            }
            if !self.channel.is_null() {
                rdma_sys::ibv_destroy_comp_channel(self.channel);
            }
            if !self.pd.is_null() {
                rdma_sys::ibv_dealloc_pd(self.pd);
            }
        }
    }
}

/// The verbs access flags of a registration granting `access` (local write always: reads and
/// receives land in registered memory).
fn access_flags(access: Access) -> u32 {
    let mut flags = rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.remote_read {
        flags |= rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.remote_write {
        flags |= rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    flags
}
