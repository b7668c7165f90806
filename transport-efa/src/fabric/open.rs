//! Opening the transport: choosing the provider's info per rail, then each rail's fabric,
//! domain, address vector (and served-ops counter), and the completion queues lanes get.
use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use rdmalane::backend::{Caps, DeviceRegistration};
use rdmalane::{Error, OpKind, Result, TransportError};
use slab::Slab;

use super::{FabricTransport, Rail, CQ_BATCH};
use crate::exit_guard;
use crate::ffi;
use crate::info::{self, InfoList};
use crate::spacing::{self, Spacing};
use crate::util::terr;
use rdmalane_wake::EventFd;

/// `Ok` for a libfabric call's 0, else the open error naming the call.
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
            device_descs: Default::default(),
            ctxs: Vec::new(),
            efd: Arc::new(EventFd::new().map_err(|e| Error::Io {
                op: OpKind::Open,
                peer: "-".into(),
                source: e,
            })?),
            entries: vec![ffi::fi_cq_data_entry::default(); CQ_BATCH],
            first_lane: 0,
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
    pub(super) fn open_cq(
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
