//! One libfabric RDM endpoint with its fabric, domain, address vector and completion queue: the
//! `Transport` the reactor drives.
use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use rdmalane::backend::{
    Access, Caps, Completion, DeviceMem, DeviceRegistration, LaneId, LocalSeg, Memory, MemoryRegion, Notify,
    PeerAddr, PostError, Posted, Transport, WorkRequest, WrId, WrKind,
};
use rdmalane::{Error, OpKind, Result, TransportError};
use slab::Slab;

use crate::exit_guard::{self, Teardown};
use crate::ffi;
use crate::info::{self, InfoList};
use crate::probe;
use crate::spacing::{self, Spacing};
use crate::util::{classify, fi_error, terr};
use rdmalane_wake::EventFd;

/// A completion a peer's write raised here, not one of our ops': flagged FI_REMOTE_WRITE, or,
/// as shm 2.x reports a write with remote CQ data, FI_REMOTE_CQ_DATA on an entry that is no
/// receive (its context is the initiator's, not one of ours: it must not be read as a `Ctx`).
fn is_remote_write(flags: u64) -> bool {
    flags & ffi::FI_REMOTE_WRITE as u64 != 0
        || (flags & ffi::FI_REMOTE_CQ_DATA as u64 != 0 && flags & ffi::FI_RECV as u64 == 0)
}

/// Completion entries read per `fi_cq_read`.
const CQ_BATCH: usize = 64;
/// A registration the provider does not need (local memory where FI_MR_LOCAL is off).
const NO_MR: u64 = u64::MAX;

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

/// A registration: one libfabric MR per rail, with its local descriptor.
struct Mr {
    /// Every MR this registration opened (its read twins too): closed together.
    fids: Vec<*mut ffi::fid_mr>,
    descs: Vec<usize>,
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
    // Boxed: the provider holds their addresses while requests are posted, and the Vec grows.
    #[allow(clippy::vec_box)]
    ctxs: Vec<Box<Ctx>>,
    efd: Arc<EventFd>,
    entries: Vec<ffi::fi_cq_data_entry>,
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

fn check(ret: impl Into<i64>, prov: &str, what: &str) -> Result<()> {
    let ret = ret.into();
    if ret == 0 {
        Ok(())
    } else {
        Err(Error::Transport { op: OpKind::Open, peer: "-".into(), source: terr(prov, ret, what) })
    }
}

impl FabricTransport {
    /// Open `provider` (or the preference list when `None`), binding to `node` where the
    /// provider needs an address; `wait_fd` asks for a CQ the caller can sleep on.
    /// Spacing and trust come from the environment, as the runtime's builder reads them.
    pub fn open(provider: Option<&str>, node: Option<&str>, wait_fd: bool) -> Result<FabricTransport> {
        let nodes = [node.map(String::from)];
        let mut t = Self::open_rails(
            provider,
            &nodes,
            &[0],
            wait_fd,
            rdmalane::backend::trust_local_peers_env(),
            false,
            false,
        )?;
        t.space_polls(rdmalane::backend::poll_spacing_env());
        Ok(t)
    }

    /// Leave `every` after a completion-queue read that found nothing before the next one
    /// (see the crate's `spacing` module); `None` keeps the provider's default.
    pub fn space_polls(&mut self, every: Option<Duration>) {
        if let Some(every) = every {
            self.spacing = Spacing::new(every);
        }
        tracing::debug!(provider = %self.caps.provider, ?every, "empty completion-queue reads spaced");
    }

    /// Open one rail per entry of `ids`, the rails' indices on the host (a rail group opens a
    /// subset): rail `r` binds to `nodes[r]` where given; otherwise tcp takes loopback address
    /// 127.0.0.(id+1) (127.0.0.1 is also the provider's default for rail 0), efa the id-th NIC
    /// fi_getinfo lists, and shm a domain of its own. `trust_local`: see
    /// `TransportConfig::trust_local_peers`. `hmem`: ask for device memory (FI_HMEM), taking the
    /// provider without it where it has none (`Caps::device` says which); on shm, whose CUDA IPC
    /// path completes before its copies land, only with `hmem_early` (see
    /// `TransportConfig::device_early_completion`).
    pub fn open_rails(
        provider: Option<&str>,
        nodes: &[Option<String>],
        ids: &[usize],
        wait_fd: bool,
        trust_local: bool,
        hmem: bool,
        hmem_early: bool,
    ) -> Result<FabricTransport> {
        let hmem = info::Hmem { wanted: hmem, early_ok: hmem_early };
        let ids = if ids.is_empty() { &[0][..] } else { ids };
        let node0 = nodes.first().cloned().flatten();
        let (list, prov) = match provider {
            Some(p) => info::select(p, node0.as_deref(), trust_local, hmem)?,
            None => {
                let mut last = None;
                let mut found = None;
                for p in info::PREFERENCE {
                    match info::select(p, node0.as_deref(), trust_local, hmem) {
                        Ok(v) => {
                            found = Some(v);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                match found {
                    Some(v) => {
                        tracing::info!(provider = %v.1, "no provider named: chose by preference efa > shm > tcp");
                        v
                    }
                    None => return Err(last.expect("preference list is not empty")),
                }
            }
        };
        let mut infos = vec![list];
        for (r, &id) in ids.iter().enumerate() {
            let node = match nodes.get(r).cloned().flatten() {
                Some(n) => Some(n),
                None if prov.starts_with("tcp") && id > 0 => Some(format!("127.0.0.{}", id + 1)),
                None => None,
            };
            // Rail 0 of the host, at its given address, is the list found above.
            if r == 0 && (id == 0 || node.is_none() || node == node0) {
                continue;
            }
            let (list, _) = info::select(&prov, node.as_deref(), trust_local, hmem)?;
            if r == 0 {
                infos[0] = list;
            } else {
                infos.push(list);
            }
        }
        Self::open_info(infos, ids, &prov, wait_fd, trust_local)
    }

    fn open_info(
        infos: Vec<InfoList>,
        ids: &[usize],
        prov: &str,
        wait_fd: bool,
        trust_local: bool,
    ) -> Result<FabricTransport> {
        // shm checks one-sided ops at the target unless local peers are trusted (`info`).
        let checked_shm = prov == "shm" && !trust_local;
        if prov == "shm" {
            crate::shm_files::remove_leftovers();
        }
        let nrails = infos.len();
        // Before the first fabric object: from here on the exit handler must run first.
        exit_guard::install();
        let mut t = FabricTransport {
            rails: Vec::with_capacity(nrails),
            lanes: Slab::new(),
            wait_fd: false,
            caps: Caps {
                provider: prov.to_string(),
                max_msg_size: 0,
                inject_size: 0,
                iov_limit: 1,
                cq_data_size: 0,
                tx_depth: 0,
                rx_depth: 0,
                wait_fd: false,
                silent_refusals: checked_shm,
                rails: nrails,
                rail_numa: Vec::new(),
                device: rdmalane::backend::DeviceRegistration::None,
            },
            mr_mode: 0,
            key_mask: u64::MAX,
            delivery_complete: false,
            mrs: Slab::new(),
            read_twins: HashMap::new(),
            ctxs: Vec::new(),
            efd: Arc::new(EventFd::new().map_err(|e| Error::Io {
                op: OpKind::Open,
                peer: "-".into(),
                source: e,
            })?),
            entries: vec![ffi::fi_cq_data_entry::default(); CQ_BATCH],
            spacing: Spacing::new(spacing::default_for(prov)),
            served_seen: 0,
            hurried_until: None,
        };
        for (r, list) in infos.into_iter().enumerate() {
            // efa lists one entry per NIC: the rail with host index id takes the id-th (all
            // rails of one device otherwise); other providers were asked per rail with the
            // rail's own address.
            let mut info = list.0;
            let id = ids.get(r).copied().unwrap_or(r);
            if prov == "efa" {
                for _ in 0..id {
                    // SAFETY: walking the list fi_getinfo returned; it lives in `list`.
                    let next = unsafe { (*info).next };
                    if next.is_null() {
                        return Err(Error::invalid(
                            OpKind::Open,
                            format!("rail {id}: efa lists only {id} NICs"),
                        ));
                    }
                    info = next;
                }
            }
            let mut rail = Rail {
                info: list,
                fabric: ptr::null_mut(),
                domain: ptr::null_mut(),
                av: ptr::null_mut(),
                served: ptr::null_mut(),
            };
            // SAFETY: `info` is an entry of the list fi_getinfo returned, kept alive in
            // `rail.info`; every out-pointer is a field of `rail`, closed in Drop.
            let opened = unsafe {
                let i = &*info;
                if r == 0 {
                    let (ep_attr, dom, tx, rx) = (&*i.ep_attr, &*i.domain_attr, &*i.tx_attr, &*i.rx_attr);
                    t.caps.max_msg_size = ep_attr.max_msg_size;
                    t.caps.inject_size = tx.inject_size;
                    t.caps.iov_limit = tx.iov_limit.max(1);
                    t.caps.cq_data_size = dom.cq_data_size;
                    t.caps.tx_depth = tx.size;
                    t.caps.rx_depth = rx.size;
                    t.mr_mode = dom.mr_mode as u32;
                    if i.caps & ffi::FI_HMEM != 0 {
                        t.caps.device = DeviceRegistration::FiHmem {
                            // FI_MR_DMABUF is a registration flag from 1.20 on, which efa
                            // takes (shm moves device memory by CUDA IPC, not by dma-buf).
                            dmabuf: cfg!(fi_1_20) && prov == "efa",
                            device_only: true,
                            // shm's CUDA IPC path completes ops before its copies land, at
                            // the initiator and the target alike (measured on libfabric 2.1:
                            // a 16 B read back differed; 64 MiB writes counted at the target
                            // beat the GPU's own memory rate).
                            early_completion: prov == "shm",
                        };
                    }
                    if dom.mr_key_size > 0 && dom.mr_key_size < 8 {
                        t.key_mask = (1u64 << (8 * dom.mr_key_size)) - 1;
                    }
                    // tcp;ofi_rxm completes plain writes when they leave, and so does shm on
                    // its checked path (see `info::getinfo`); only with FI_DELIVERY_COMPLETE is
                    // the data at the target. efa, and shm's fast path, place data first.
                    t.delivery_complete = !(prov == "efa" || (prov == "shm" && !checked_shm));
                }
                t.caps.rail_numa.push(numa_of(i));
                check(ffi::fi_fabric(i.fabric_attr, &mut rail.fabric, ptr::null_mut()), prov, "fi_fabric")
                    .and_then(|_| {
                        check(
                            ffi::fi_domain(rail.fabric, info, &mut rail.domain, ptr::null_mut()),
                            prov,
                            "fi_domain",
                        )
                    })
                    .and_then(|_| {
                        let mut av_attr = ffi::fi_av_attr {
                            type_: ffi::fi_av_type_FI_AV_TABLE,
                            count: 64,
                            ..Default::default()
                        };
                        check(
                            ffi::fi_av_open(rail.domain, &mut av_attr, &mut rail.av, ptr::null_mut()),
                            prov,
                            "fi_av_open",
                        )
                    })
                    .and_then(|_| {
                        if !checked_shm || i.caps & ffi::FI_RMA_EVENT == 0 {
                            return Ok(());
                        }
                        let mut attr = ffi::fi_cntr_attr {
                            events: ffi::fi_cntr_events_FI_CNTR_EVENTS_COMP,
                            wait_obj: ffi::fi_wait_obj_FI_WAIT_NONE,
                            ..Default::default()
                        };
                        check(
                            ffi::fi_cntr_open(rail.domain, &mut attr, &mut rail.served, ptr::null_mut()),
                            prov,
                            "fi_cntr_open",
                        )
                    })
            };
            // Pushed before checking, so Drop closes what did open.
            t.rails.push(rail);
            opened?;
        }
        // Probe once whether this provider's CQs have a wait fd.
        if wait_fd {
            if let Ok((cq, fd)) = t.open_cq(0, true) {
                t.wait_fd = fd.is_some();
                // SAFETY: closing the CQ just opened.
                unsafe { ffi::fi_close(&mut (*cq).fid) };
            }
        }
        t.caps.wait_fd = t.wait_fd;
        tracing::info!(
            provider = %prov,
            rails = nrails,
            mr_mode = format!("{:#x}", t.mr_mode),
            max_msg = t.caps.max_msg_size,
            inject = t.caps.inject_size,
            wait_fd = t.caps.wait_fd,
            "libfabric endpoint open"
        );
        Ok(t)
    }

    /// A completion queue, with a wait fd when asked for and available.
    fn open_cq(
        &mut self,
        rail: usize,
        want_fd: bool,
    ) -> Result<(*mut ffi::fid_cq, Option<i32>), TransportError> {
        let domain = self.rails[rail].domain;
        let mut cq: *mut ffi::fid_cq = ptr::null_mut();
        let mut attr = ffi::fi_cq_attr {
            format: ffi::fi_cq_format_FI_CQ_FORMAT_DATA,
            wait_obj: ffi::fi_wait_obj_FI_WAIT_FD,
            ..Default::default()
        };
        // SAFETY: opening a CQ on our domain into a local out-pointer.
        if want_fd && unsafe { ffi::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut()) } == 0 {
            let mut fd: i32 = -1;
            // SAFETY: FI_GETWAIT on an FD-wait CQ writes an int.
            let r = unsafe {
                ffi::fi_control(&mut (*cq).fid, ffi::FI_GETWAIT as i32, &mut fd as *mut i32 as *mut _)
            };
            if r == 0 && fd >= 0 {
                return Ok((cq, Some(fd)));
            }
            // SAFETY: closing the CQ just opened.
            unsafe { ffi::fi_close(&mut (*cq).fid) };
        }
        // No wait object (shm has none; busy-polling drivers want none): an idle reactor backs
        // off with short sleeps instead.
        attr.wait_obj = ffi::fi_wait_obj_FI_WAIT_NONE;
        // SAFETY: as above.
        let r = unsafe { ffi::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut()) };
        if r != 0 {
            return Err(self.err(r, "fi_cq_open"));
        }
        Ok((cq, None))
    }

    /// Close the rails' registrations `m` made before one failed with `r` in `what`.
    fn close_partial(&self, m: Mr, r: i32, what: &str) -> TransportError {
        // SAFETY: closing the registrations of the rails before the failed one, once.
        m.fids.iter().for_each(|&f| unsafe {
            ffi::fi_close(&mut (*f).fid);
        });
        self.err(r, what)
    }

    /// The region a registration on every rail (`m`, their keys `keys`) of memory at `ptr` is.
    fn region(&mut self, ptr: *mut u8, m: Mr, mut keys: Vec<u64>) -> MemoryRegion {
        let remote_base = if self.mr_mode & ffi::FI_MR_VIRT_ADDR != 0 { ptr as u64 } else { 0 };
        let single = m.descs[0];
        let id = self.mrs.insert(m) as u64;
        // One rail: the provider's descriptor itself. Several: a handle `post` resolves per lane.
        let desc = if self.rails.len() == 1 { single } else { id as usize + 1 };
        MemoryRegion { id, desc, key: keys[0], remote_base, rail_keys: keys.split_off(1) }
    }

    fn err(&self, ret: impl Into<i64>, what: &str) -> TransportError {
        terr(&self.caps.provider, ret, what)
    }

    /// The context for request `id`: one per slot (the low bits of the id, reused only after
    /// the slot's request completed), stamped with the whole id.
    fn ctx(&mut self, id: WrId) -> *mut std::ffi::c_void {
        let i = id.slot();
        while self.ctxs.len() <= i {
            self.ctxs.push(Box::new(Ctx { fi: ffi::fi_context2::default(), id: WrId::from_raw(0) }));
        }
        self.ctxs[i].id = id;
        &mut *self.ctxs[i] as *mut Ctx as *mut _
    }

    /// Read every lane's completion queue, up to `max` completions in all: how many, and
    /// whether a read was made and found nothing at all (no completion, event or error).
    /// Nothing is read once the process is exiting.
    fn read_queues(&mut self, out: &mut Vec<Completion>, max: usize) -> (usize, bool) {
        if exit_guard::exiting() {
            return (0, false);
        }
        let before = out.len();
        let (mut read, mut found) = (false, false);
        let mut entries = std::mem::take(&mut self.entries);
        for (_, lane) in self.lanes.iter() {
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
                    // SAFETY: every context we post points at a live `Ctx` in `self.ctxs`.
                    let id = unsafe { (*(e.op_context as *const Ctx)).id };
                    let imm = (e.flags & ffi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(e.data);
                    out.push(Completion::Op { id, len: e.len, imm, status: Ok(()) });
                }
            } else if r == -(ffi::FI_EAVAIL as isize) {
                self.cq_error(lane.cq, out);
            }
        }
        self.entries = entries;
        (out.len() - before, read && !found)
    }

    fn cq_error(&self, cq: *mut ffi::fid_cq, out: &mut Vec<Completion>) {
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
            provider: self.caps.provider.clone(),
            errno: e.err,
            text: format!("{} (provider: {prov_text}, prov_errno {})", fi_error(e.err), e.prov_errno),
            class: classify(e.err),
        };
        if e.op_context.is_null() {
            tracing::warn!(error = %status, "completion error without a request");
            return;
        }
        // SAFETY: every context we post points at a live `Ctx` in `self.ctxs`.
        let id = unsafe { (*(e.op_context as *const Ctx)).id };
        out.push(Completion::Op { id, len: 0, imm: None, status: Err(Box::new(status)) });
    }
}

impl Transport for FabricTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn open_lane(&mut self, rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        if rail >= self.rails.len() {
            return Err(self.err(-(ffi::FI_EINVAL as i64), "open_lane: no such rail"));
        }
        let (cq, fd) = self.open_cq(rail, self.wait_fd)?;
        let (domain, av, info) = (self.rails[rail].domain, self.rails[rail].av, self.rails[rail].info.0);
        let served = self.rails[rail].served;
        let mut ep: *mut ffi::fid_ep = ptr::null_mut();
        let prov = self.caps.provider.clone();
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
            return Err(self.err(r, "fi_getname"));
        }
        buf.truncate(len);
        let shm = self.caps.provider == "shm";
        if shm {
            crate::shm_peers::opened(&buf);
        }
        let name = if shm { buf.clone() } else { Vec::new() };
        Ok((LaneId(self.lanes.insert(Lane { ep, cq, fd, addr: None, rail, name, peer: None })), buf))
    }

    fn connect_lane(&mut self, lane: LaneId, name: &[u8]) -> Result<PeerAddr, TransportError> {
        if !self.lanes.contains(lane.index()) {
            return Err(self.err(-(ffi::FI_EINVAL as i64), "connect_lane: no such lane"));
        }
        let mut addr: ffi::fi_addr_t = 0;
        let av = self.rails[self.lanes[lane.index()].rail].av;
        // SAFETY: `name` is a peer address of this provider's format (the handshake checked the
        // provider); libfabric copies it.
        let n = unsafe { ffi::fi_av_insert(av, name.as_ptr() as *const _, 1, &mut addr, 0, ptr::null_mut()) };
        if n != 1 {
            return Err(self.err(if n < 0 { n as i64 } else { -(ffi::FI_EINVAL as i64) }, "fi_av_insert"));
        }
        self.lanes[lane.index()].addr = Some(addr);
        if self.caps.provider == "shm" {
            self.lanes[lane.index()].peer = Some(name.to_vec());
        }
        Ok(addr)
    }

    fn close_lane(&mut self, lane: LaneId) {
        let Some(Lane { ep, cq, addr, rail, name, peer, .. }) = self.lanes.try_remove(lane.index()) else {
            return;
        };
        let Some(_inside) = Teardown::enter() else { return };
        let patience = patience(self.hurried_until);
        // SAFETY: the lane's endpoint and CQ, just taken out of the transport.
        if !unsafe { close_endpoint(lane, ep, cq, &name, peer.as_deref(), patience) } {
            self.hurried_until = Some(std::time::Instant::now() + HURRY);
        }
        if let Some(mut a) = addr {
            // SAFETY: removing an address this AV returned.
            unsafe { ffi::fi_av_remove(self.rails[rail].av, &mut a, 1, 0) };
        }
    }

    unsafe fn register(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, TransportError> {
        let local = self.mr_mode & ffi::FI_MR_LOCAL != 0;
        if !access.is_remote() && !local {
            return Ok(MemoryRegion { id: NO_MR, desc: 0, key: 0, remote_base: 0, rail_keys: Vec::new() });
        }
        // A region peers reach is registered for that alone (local ops use the buffer's own
        // registration): rxm widens a registration that may send to remote reads, for its own
        // rendezvous, which would make a write-only region readable.
        let mut acs = if access.is_remote() {
            0
        } else {
            (ffi::FI_SEND | ffi::FI_RECV | ffi::FI_READ | ffi::FI_WRITE) as u64
        };
        if access.remote_read {
            acs |= ffi::FI_REMOTE_READ as u64;
        }
        if access.remote_write {
            acs |= ffi::FI_REMOTE_WRITE as u64;
        }
        let prov_key = self.mr_mode & ffi::FI_MR_PROV_KEY != 0;
        let mut m = Mr {
            fids: Vec::with_capacity(self.rails.len()),
            descs: Vec::with_capacity(self.rails.len()),
            read_descs: Vec::new(),
        };
        let mut keys = Vec::with_capacity(self.rails.len());
        for rail in 0..self.rails.len() {
            let domain = self.rails[rail].domain;
            let mut mr: *mut ffi::fid_mr = ptr::null_mut();
            // Random keys where we choose them: never a guessable counter. Retry on collision.
            let mut tries = 0;
            let r = loop {
                let key = if prov_key { 0 } else { rand::random::<u64>() & self.key_mask };
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
                return Err(self.close_partial(m, r, "fi_mr_reg"));
            }
            m.push(mr, &mut keys);
        }
        Ok(self.region(ptr, m, keys))
    }

    unsafe fn register_device(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        mem: DeviceMem,
    ) -> Result<MemoryRegion, TransportError> {
        let DeviceRegistration::FiHmem { dmabuf, device_only, early_completion } = self.caps.device else {
            return Err(self.err(-(ffi::FI_EOPNOTSUPP as i64), "device memory without FI_HMEM"));
        };
        let Memory::Cuda { device } = mem.memory else {
            return Err(self.err(-(ffi::FI_EINVAL as i64), "register_device: host memory"));
        };
        // Device memory is registered for local use too (FI_MR_HMEM): the descriptor tells the
        // provider the memory's kind, so it never guesses per op.
        let mut acs = (ffi::FI_SEND | ffi::FI_RECV | ffi::FI_READ | ffi::FI_WRITE) as u64;
        if access.remote_read {
            acs |= ffi::FI_REMOTE_READ as u64;
        }
        if access.remote_write {
            acs |= ffi::FI_REMOTE_WRITE as u64;
        }
        let prov_key = self.mr_mode & ffi::FI_MR_PROV_KEY != 0;
        let iov = ffi::iovec { iov_base: ptr as *mut _, iov_len: len };
        let mut m = Mr {
            fids: Vec::with_capacity(self.rails.len()),
            descs: Vec::with_capacity(self.rails.len()),
            read_descs: Vec::new(),
        };
        let mut keys = Vec::with_capacity(self.rails.len());
        for rail in 0..self.rails.len() {
            let domain = self.rails[rail].domain;
            // Zeroed room past the struct as these headers define it: a newer library reads the
            // fields of the API version we asked for, and no more, but zeros cost nothing.
            let mut room = HmemAttr::default();
            let attr = &mut room.attr;
            set_iov(attr, &iov);
            attr.access = acs;
            attr.requested_key = if prov_key { 0 } else { rand::random::<u64>() & self.key_mask };
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
                return Err(self.close_partial(m, r, "fi_mr_regattr(FI_HMEM_CUDA)"));
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
                twin.attr.requested_key = if prov_key { 0 } else { rand::random::<u64>() & self.key_mask };
                twin.attr.iface = ffi::fi_hmem_iface_FI_HMEM_CUDA;
                twin.attr.device.cuda = device as i32;
                let mut tmr: *mut ffi::fid_mr = ptr::null_mut();
                // SAFETY: as above.
                let r = unsafe { ffi::fi_mr_regattr(domain, &twin.attr, 0, &mut tmr) };
                if r != 0 {
                    return Err(self.close_partial(m, r, "fi_mr_regattr(FI_HMEM_CUDA, read twin)"));
                }
                m.push_read_twin(tmr);
            }
        }
        for (&d, &t) in m.descs.iter().zip(&m.read_descs) {
            self.read_twins.insert(d, t);
        }
        Ok(self.region(ptr, m, keys))
    }

    fn deregister(&mut self, id: u64) -> Result<(), TransportError> {
        if id == NO_MR {
            return Ok(());
        }
        let Some(m) = self.mrs.try_remove(id as usize) else {
            return Err(self.err(-(ffi::FI_ENOENT as i64), "deregister: unknown region"));
        };
        if !m.read_descs.is_empty() {
            m.descs.iter().for_each(|d| {
                self.read_twins.remove(d);
            });
        }
        let Some(_inside) = Teardown::enter() else { return Ok(()) };
        let mut res = Ok(());
        for mr in m.fids {
            // SAFETY: closing a registration we opened, once.
            let r = unsafe { ffi::fi_close(&mut (*mr).fid) };
            if r != 0 {
                res = Err(self.err(r, "fi_close(mr)"));
            }
        }
        res
    }

    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
        let mut iov = [libc::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; 4];
        let mut desc = [ptr::null_mut::<std::ffi::c_void>(); 4];
        let n = wr.local.len();
        if n == 0 || n > iov.len().min(self.caps.iov_limit) {
            return Err(PostError::failed(self.err(-(ffi::FI_EINVAL as i64), "scatter list length")));
        }
        let Some(&Lane { ep, rail, .. }) = self.lanes.get(wr.lane.index()) else {
            return Err(PostError::failed(self.err(-(ffi::FI_EINVAL as i64), "post: no such lane")));
        };
        let multi = self.rails.len() > 1;
        for (k, LocalSeg { ptr, len, desc: d }) in wr.local.iter().enumerate() {
            iov[k] = libc::iovec { iov_base: *ptr as *mut _, iov_len: *len };
            desc[k] = match (*d, multi) {
                (d, false) => d as *mut _,
                (0, true) => ptr::null_mut(),
                // A registration's handle: its descriptor on this lane's rail.
                (d, true) => match self.mrs.get(d - 1) {
                    Some(m) => m.descs[rail] as *mut _,
                    None => {
                        return Err(PostError::failed(
                            self.err(-(ffi::FI_EINVAL as i64), "post: unknown region"),
                        ))
                    }
                },
            };
        }
        if matches!(wr.kind, WrKind::Read { .. }) && !self.read_twins.is_empty() {
            for d in &mut desc[..n] {
                if let Some(&t) = self.read_twins.get(&(*d as usize)) {
                    *d = t as *mut _;
                }
            }
        }
        let total: usize = wr.local.iter().map(|s| s.len).sum();
        let t0 = probe::start();
        let reply = matches!(wr.kind, WrKind::Send { .. } | WrKind::Write { .. });
        if reply {
            probe::reply(t0);
        }
        let context = self.ctx(wr.id);
        let more = if wr.more { ffi::FI_MORE as u64 } else { 0 };
        let mut flags = ffi::FI_COMPLETION as u64 | more;
        let ret = match wr.kind {
            WrKind::Write { remote_addr, key, imm } => {
                if imm.is_some() {
                    flags |= ffi::FI_REMOTE_CQ_DATA as u64;
                }
                if self.delivery_complete {
                    flags |= ffi::FI_DELIVERY_COMPLETE as u64;
                } else if total <= self.caps.inject_size {
                    // Tiny payloads are copied at post time (inline); the completion still
                    // says when they are at the target.
                    flags |= ffi::FI_INJECT as u64;
                }
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
                if imm.is_none() && n == 1 && total <= self.caps.inject_size {
                    // Small payloads go inline: copied now, no completion to wait for.
                    // SAFETY: the provider copies `total` bytes from valid memory before returning.
                    let r = unsafe { ffi::fi_inject(ep, iov[0].iov_base, total, wr.peer) };
                    probe::posted(t0);
                    return match r {
                        0 => Ok(Posted::Completed),
                        r if r == -(ffi::FI_EAGAIN as isize) => Err(PostError::Again),
                        r => Err(PostError::failed(self.err(r as i64, "fi_inject"))),
                    };
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
        match ret {
            0 => Ok(Posted::Queued),
            r if r == -(ffi::FI_EAGAIN as isize) => Err(PostError::Again),
            r => Err(PostError::failed(self.err(r as i64, "post"))),
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(started) = self.spacing.ready() else { return 0 };
        let (n, found_nothing) = self.read_queues(out, max);
        if found_nothing {
            self.spacing.found_nothing(started);
        }
        n
    }

    fn serving(&mut self, on: bool) {
        self.spacing.serving(on);
    }

    fn poll_now(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.read_queues(out, max).0
    }

    fn remote_served(&mut self) -> bool {
        if exit_guard::exiting() {
            return false;
        }
        let mut total = 0u64;
        for rail in &self.rails {
            if !rail.served.is_null() {
                // SAFETY: reading a counter we opened; the endpoints' progress (in `poll`)
                // advances it.
                total = total.wrapping_add(unsafe { ffi::fi_cntr_read(rail.served) });
            }
        }
        let changed = total != self.served_seen;
        self.served_seen = total;
        changed
    }

    fn wait(&mut self, timeout: Duration) {
        if exit_guard::exiting() {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            return;
        }
        let mut fds = Vec::with_capacity(self.lanes.len());
        let mut by_rail: Vec<Vec<*mut ffi::fid>> = vec![Vec::new(); self.rails.len()];
        for (_, lane) in self.lanes.iter() {
            if let Some(fd) = lane.fd {
                // SAFETY: taking the address of an open CQ's fid.
                by_rail[lane.rail].push(unsafe { &mut (*lane.cq).fid });
                fds.push(fd);
            }
        }
        if fds.is_empty() || fds.len() != self.lanes.len() {
            self.efd.wait(&[], timeout);
            return;
        }
        // Each rail's CQs are checked with their own fabric; blocking is safe only when every
        // rail says so.
        let ok = by_rail.iter_mut().zip(&self.rails).all(|(fids, rail)| {
            // SAFETY: trywait on our open CQs of this rail; it returns 0 only when it is safe
            // to block on them.
            fids.is_empty()
                || unsafe { ffi::fi_trywait(rail.fabric, fids.as_mut_ptr(), fids.len() as i32) == 0 }
        });
        if ok {
            self.efd.wait(&fds, timeout);
        }
    }

    fn notifier(&self) -> Arc<dyn Notify> {
        self.efd.clone()
    }
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

impl Drop for FabricTransport {
    fn drop(&mut self) {
        let Some(_inside) = Teardown::enter() else { return };
        // SAFETY: closing what we opened, endpoints first, each once; null means never opened.
        unsafe {
            let mut hurried = self.hurried_until;
            for (id, lane) in self.lanes.iter() {
                let patience = patience(hurried);
                if !close_endpoint(LaneId(id), lane.ep, lane.cq, &lane.name, lane.peer.as_deref(), patience) {
                    hurried = Some(std::time::Instant::now() + HURRY);
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

/// After a wait for a peer endpoint of this process ran out, closes do not wait for this long.
const HURRY: Duration = Duration::from_secs(2);

/// How long a close may wait for a peer endpoint of this process (`shm_peers`).
fn patience(hurried_until: Option<std::time::Instant>) -> Duration {
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
unsafe fn close_endpoint(
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

/// The NUMA node of the NIC behind `info`, from sysfs (efa and verbs devices); `None` where
/// there is no device (tcp on loopback, shm) or the host has one node.
fn numa_of(info: &ffi::fi_info) -> Option<usize> {
    // SAFETY: reading the domain name string of an entry fi_getinfo returned.
    let name = unsafe {
        let d = info.domain_attr;
        if d.is_null() || (*d).name.is_null() {
            return None;
        }
        CStr::from_ptr((*d).name).to_string_lossy().into_owned()
    };
    // efa domains are named after the device with a suffix: rdmap16s27-rdm.
    let dev = name.split('-').next().unwrap_or(&name);
    rdmalane::backend::device_numa_node(dev)
}
