//! Registering memory with every rail group's transport, and releasing it: one region, a
//! registration per group, each group's descriptor found by the region's.
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::group_regs::{GroupReg, GroupRegs};
use super::mr_cache::timed;
use super::Runtime;
use crate::base::error::{Error, OpKind, Result, TransportError};
use crate::base::memory::DeviceMem;
use crate::base::transport::{Access, MemoryRegion, RailId};
use crate::reactor::cmd::{Cmd, GroupId};

impl Runtime {
    pub(crate) fn register_region(&self, ptr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion> {
        self.register_memory(ptr, len, access, None)
    }

    /// Register host memory, or (`device`) device memory with the transport's own device
    /// registration.
    pub(crate) fn register_memory(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        device: Option<DeviceMem>,
    ) -> Result<MemoryRegion> {
        let op = if access.is_remote() { OpKind::Expose } else { OpKind::Register };
        let (res, ns) = timed(|| {
            if self.inner.groups.len() > 1 {
                return self.register_on_groups(op, ptr, len, access, device);
            }
            self.call(op, |reply| Cmd::Register { ptr: ptr as usize, len, access, device, reply })?
                .map_err(|e| Error::from_transport(op, "-", e))
        });
        self.inner.counters[0].registration_ns.fetch_add(ns, Ordering::Relaxed);
        res
    }

    /// Register on every group's transport: the region's keys are each rail's, wherever its
    /// group is; its id and descriptor name the groups' own (`regs`).
    fn register_on_groups(
        &self,
        op: OpKind,
        ptr: *mut u8,
        len: usize,
        access: Access,
        device: Option<DeviceMem>,
    ) -> Result<MemoryRegion> {
        let mut keys = vec![0u64; self.inner.caps.rails];
        let mut regs: GroupRegs = Vec::with_capacity(self.inner.groups.len());
        let mut base = None;
        let mut failure = None;
        for (g, group) in self.groups() {
            let res = self
                .call_on(g, op, |reply| Cmd::Register { ptr: ptr as usize, len, access, device, reply })
                .and_then(|r| r.map_err(|e| Error::from_transport(op, "-", e)));
            match res {
                Ok(mr) if base.is_none_or(|b| b == mr.remote_base) => {
                    base = Some(mr.remote_base);
                    let group_keys = std::iter::once(mr.key).chain(mr.rail_keys.iter().copied());
                    for (&RailId(rail), key) in group.rails.iter().zip(group_keys) {
                        keys[rail] = key;
                    }
                    regs.push(GroupReg { id: mr.id, desc: mr.desc });
                }
                Ok(mr) => {
                    regs.push(GroupReg { id: mr.id, desc: mr.desc });
                    failure =
                        Some(Error::invalid(op, "the rail groups' transports address memory differently"));
                    break;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            // Undone before the error goes back, as the caller may free the memory then: a
            // group's registration (a remote one) must not outlive it. (An undo that fails is
            // counted and logged by its group, as any failed deregistration.)
            let _ = self.deregister_on_groups(regs, op);
            return Err(e);
        }
        let first = regs[0].id;
        let handle = self.inner.regs.insert(regs);
        let mr = MemoryRegion {
            id: handle as u64,
            desc: handle,
            key: keys[0],
            rail_keys: keys[1..].to_vec(),
            remote_base: base.unwrap_or(0),
        };
        if access.is_remote() {
            // The first group answers peers' questions about our memory: it learns every key.
            let _ = self.send(Cmd::Exposed { mr: MemoryRegion { id: first, ..mr.clone() }, len, access });
        }
        Ok(mr)
    }

    /// The groups' own handles of region `id` (several groups), forgotten here.
    fn take_group_regs(&self, id: u64) -> Option<GroupRegs> {
        self.inner.regs.remove(id as usize)
    }

    /// Group `g`'s descriptor for the runtime's descriptor `desc` (several groups).
    pub(super) fn group_desc(&self, desc: usize, g: GroupId) -> usize {
        self.inner.regs.desc(desc, g.0)
    }

    /// Deregister without waiting; `keep` is dropped by the reactor after the deregistration
    /// (with several groups, by the last of them).
    pub(crate) fn release_region(&self, id: u64, keep: Option<Box<dyn std::any::Any + Send>>) {
        if self.inner.groups.len() > 1 {
            let Some(regs) = self.take_group_regs(id) else {
                // Not ours to deregister, so not ours to say a peer no longer reaches it.
                std::mem::forget(keep);
                return;
            };
            let keep = keep.map(|k| Arc::new(Mutex::new(k)));
            for (group, GroupReg { id, .. }) in self.inner.groups.iter().zip(regs) {
                let keep = keep.clone().map(|k| Box::new(k) as Box<dyn std::any::Any + Send>);
                let _ = group.send(Cmd::Deregister { id, keep, reply: None });
            }
            return;
        }
        if let Err(Cmd::Deregister { keep, .. }) = self.send(Cmd::Deregister { id, keep, reply: None }) {
            // The reactor is gone and the transport with it: nothing can reach the memory now.
            drop(keep);
        }
    }

    pub(crate) fn deregister_now(&self, id: u64) -> Result<()> {
        let regs = match self.inner.groups.len() {
            1 => vec![GroupReg { id, desc: 0 }],
            _ => self.take_group_regs(id).unwrap_or_default(),
        };
        self.deregister_on_groups(regs, OpKind::Expose)
    }

    /// Deregister `regs` (group `g`'s registration at place `g`) and wait for each group's
    /// answer: the first failure, a transport's outranking a stopped group's.
    fn deregister_on_groups(&self, regs: GroupRegs, op: OpKind) -> Result<()> {
        let mut first = Ok(());
        for (g, GroupReg { id, .. }) in regs.into_iter().enumerate() {
            let res = self
                .call_on(GroupId(g), op, |reply| Cmd::Deregister { id, keep: None, reply: Some(reply) })
                .and_then(|r| r.map_err(|e: TransportError| Error::from_transport(op, "-", e)));
            // A transport's failure outranks a stopped group's: it says the memory must be kept.
            if first.is_ok() || matches!((&first, &res), (Err(Error::Shutdown { .. }), Err(_))) {
                first = res;
            }
        }
        first
    }
}
