//! The runtime handle and its builder.
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use slab::Slab;
use tokio::sync::mpsc::UnboundedSender;

use crate::base::control::Ctl;
use crate::base::error::{Error, OpKind, Result, TransportError};
use crate::base::imm::{ImmEvent, ImmQueue, NextImm, WaitImm};
use crate::base::lane_map::LaneMap;
use crate::base::memory::{DeviceMem, DevicePath, Memory};
use crate::base::refusal::RefusalCounters;
use crate::base::sched::{Class, TenantId};
use crate::base::stats::{Counters, Stats};
use crate::base::transport::{Access, Caps, LaneId, LocalSeg, MemoryRegion, Notify, RailId, RailSet};
use crate::driver::handoff::AwaitSpin;
use crate::driver::inline::{self, with_held, Slot};
use crate::driver::lend::Lend;
use crate::reactor::cell::OpCell;
use crate::reactor::cmd::{Cmd, Draft, OpReq, PeerLane};
use crate::reactor::Idle;
use crate::reactor::{AtOnce, Reactor, SHUTDOWN_LIMIT};

mod builder;
pub(crate) mod fanout;
pub(crate) mod mr_cache;
mod settings;

pub use builder::Builder;

use mr_cache::{timed, CacheStats, MrCache};

/// Who drives the reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Driver {
    /// A dedicated thread, pinned to a core when one is configured. Ops may come from any
    /// thread or executor.
    #[default]
    Thread,
    /// No thread: the caller of [`Runtime::block_on`] drives the reactor between polls of its
    /// future (run-to-completion, one core for app and NIC). Nothing progresses outside
    /// `block_on`. The thread in `block_on` holds the reactor until it returns: another
    /// thread's ops and registrations wait for its turns, so its future must not block on them.
    Inline,
}

/// One reactor and the way to it: a rail group's share of the runtime.
struct Group {
    tx: Sender<Cmd>,
    idle: Arc<Idle>,
    notifier: Arc<dyn Notify>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Option<ThreadId>,
    /// The host rails its transport spans.
    rails: Vec<RailId>,
    /// The core its thread is pinned to.
    core: Option<usize>,
}

impl Group {
    fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        if self.idle.shutdown.load(Ordering::Acquire) {
            return Err(cmd);
        }
        self.tx.send(cmd).map_err(|e| e.0)?;
        self.idle.commands.fetch_add(1, Ordering::SeqCst);
        if self.idle.sleeping.load(Ordering::SeqCst) {
            self.notifier.notify();
        }
        Ok(())
    }

    /// Tell the reactor to stop.
    fn signal_stop(&self) {
        self.idle.shutdown.store(true, Ordering::SeqCst);
        self.notifier.notify();
    }

    /// Wait for the reactor's thread to end, unless this is that thread.
    fn join(&self) {
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The last handle can be dropped on the reactor thread itself (a buffer freed by a
        // completion); then the thread ends on its own.
        if let Some(h) = h {
            if Some(std::thread::current().id()) != self.thread_id {
                let _ = h.join();
            }
        }
    }
}

/// A registration made on every group's transport: its handle in each.
/// With several groups, the runtime's region id and descriptor name an entry here.
type GroupRegs = Vec<GroupReg>;

/// One group's registration of a region.
#[derive(Debug, Clone, Copy)]
struct GroupReg {
    /// Its id in the group's transport.
    id: u64,
    /// Its local descriptor there.
    desc: usize,
}

struct Inner {
    id: u64,
    lanes: usize,
    caps: Caps,
    /// One per rail group; the first holds rail 0 and takes messages and small ops.
    groups: Vec<Group>,
    /// This side's rails as its lanes sit on them: with an express rail, the first group
    /// holds it alone and bulk one-sided ops go to the others.
    map: LaneMap,
    /// The one reactor, when the caller of `block_on` drives it.
    inline: Option<Slot>,
    /// The first group's reactor as its thread lends it to spinning tasks (thread driver,
    /// where ops spin and drive).
    lend: Option<Arc<Lend>>,
    /// Registrations on several groups (unused with one).
    regs: std::sync::RwLock<Slab<GroupRegs>>,
    /// Bulk one-sided ops of at least this many bytes are split across the groups.
    fan_min: usize,
    /// How long a latency-class op's poll watches for its completion (thread driver).
    await_spin: AwaitSpin,
    /// Ops of at most this many bytes are latency-class unless told otherwise.
    latency_threshold: usize,
    imm: Arc<ImmQueue>,
    /// Each group's reactor's; the first also counts what other threads count.
    counters: Vec<Arc<Counters>>,
    connect_timeout: Duration,
    max_handshakes: usize,
    /// Handshakes this runtime's listeners refused, by reason.
    refusals: RefusalCounters,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
    /// Dropped after the reactor (fields drop after `Drop::drop`), so its entries find the
    /// transport gone and free their memory directly.
    mr_cache: MrCache,
    /// Which path device memory may take.
    device_memory: crate::base::memory::DevicePolicy,
}

impl Inner {
    /// Stop every reactor: all are told first, so that they shut down together (the first
    /// group says goodbye to the peers once every group has drained), then each is waited for.
    fn stop(&self) {
        self.groups.iter().for_each(Group::signal_stop);
        if let Some(slot) = &self.inline {
            // A `block_on` on another thread may hold the reactor: it shuts it down itself on
            // seeing the stop (at its next turn), and this waits for that, bounded.
            let deadline = std::time::Instant::now() + SHUTDOWN_LIMIT + Duration::from_secs(1);
            let idle = &self.groups[0].idle;
            while slot.with(self.id, |r| r.shutdown(SHUTDOWN_LIMIT)).is_none()
                && !idle.stopped.load(Ordering::Acquire)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.groups.iter().for_each(Group::join);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The rdmalane runtime: a transport, the reactor that drives it, and the peers it talks to.
/// Cheap to clone; the reactor stops when the last clone (and the last buffer) is gone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("id", &self.inner.id)
            .field("provider", &self.inner.caps.provider)
            .finish()
    }
}

impl Runtime {
    /// Start configuring a runtime.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// This runtime's random id; descriptors it hands out carry it.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// What the transport can do (provider name, limits).
    pub fn caps(&self) -> &Caps {
        &self.inner.caps
    }

    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.inner.caps.provider
    }

    /// Lanes opened per peer.
    pub fn lanes(&self) -> usize {
        self.inner.lanes
    }

    /// A handle that does not keep the runtime alive.
    pub fn downgrade(&self) -> WeakRuntime {
        WeakRuntime(Arc::downgrade(&self.inner))
    }

    pub(crate) fn secret(&self) -> Option<&[u8]> {
        self.inner.secret.as_deref()
    }

    pub(crate) fn peer_timeout(&self) -> Duration {
        self.inner.peer_timeout
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.inner.connect_timeout
    }

    pub(crate) fn max_handshakes(&self) -> usize {
        self.inner.max_handshakes
    }

    pub(crate) fn refusal_counters(&self) -> &RefusalCounters {
        &self.inner.refusals
    }

    /// The registration cache (`register_shared`).
    pub(crate) fn mr_cache(&self) -> &MrCache {
        &self.inner.mr_cache
    }

    /// What the registration cache has done (hits, misses, evictions, bytes held). Registration
    /// counts and time are in [`stats`](Self::stats).
    pub fn mr_cache_stats(&self) -> CacheStats {
        self.inner.mr_cache.trim();
        self.inner.mr_cache.stats()
    }

    /// The next immediate value a peer's `write_with_imm` raised here.
    pub fn next_imm(&self) -> NextImm {
        NextImm::new(self.inner.imm.clone())
    }

    /// Resolves once `n` immediate events with value `tag` have arrived (from writes or batch
    /// pieces, in any order), and takes them: `next_imm` will not return them. Dropping the
    /// future takes nothing.
    pub fn wait_imm(&self, tag: u64, n: usize) -> WaitImm {
        WaitImm::new(self.inner.imm.clone(), tag, n as u64)
    }

    /// Immediate events with value `tag` that have arrived and not been taken.
    pub fn imm_count(&self, tag: u64) -> u64 {
        self.inner.imm.count(tag)
    }

    /// An immediate event if one has arrived.
    pub fn try_next_imm(&self) -> Option<ImmEvent> {
        self.inner.imm.try_pop()
    }

    /// Give `tenant` `weight` times the bulk share of a weight-1 tenant.
    pub fn set_weight(&self, tenant: TenantId, weight: u32) {
        for g in &self.inner.groups {
            let _ = g.send(Cmd::SetWeight { tenant, weight });
        }
    }

    /// Stop the reactor now, with handles (buffers, endpoints, ops) still alive: queued ops fail
    /// with `Error::Shutdown`, posted ones get up to two seconds to complete (those that do not
    /// fail with `Error::Shutdown` once their lanes are closed, after which no NIC touches their
    /// buffers), and every later op fails with `Error::Shutdown`. Dropping the last handle does
    /// the same. Where another thread's `block_on` holds the inline reactor, that thread carries
    /// the stop out at its next turn; this waits for it up to three seconds.
    pub fn shutdown(&self) {
        self.inner.stop();
    }

    /// The rail groups, one reactor each: the host rails each drives and the core its thread
    /// is pinned to (`None`: unpinned, or driven inline).
    pub fn rail_groups(&self) -> Vec<(Vec<usize>, Option<usize>)> {
        self.inner.groups.iter().map(|g| (g.rails.iter().map(|r| r.0).collect(), g.core)).collect()
    }

    /// A snapshot of the op counters.
    pub fn stats(&self) -> Stats {
        Stats {
            refused: self.inner.refusals.snapshot(),
            task_holds: self.inner.lend.as_ref().map_or(0, |l| l.holds()),
            task_asks: self.inner.lend.as_ref().map_or(0, |l| l.asks()),
            thread_retakes: self.inner.lend.as_ref().map_or(0, |l| l.retakes()),
            ..Counters::snapshot(&self.inner.counters)
        }
    }

    /// Bytes posted on each rail so far (one entry per rail).
    pub fn rail_bytes(&self) -> Vec<u64> {
        let rails = self.inner.caps.rails;
        (0..rails)
            .map(|r| self.inner.counters.iter().map(|c| c.rail_bytes[r].load(Ordering::Relaxed)).sum())
            .collect()
    }

    /// The path device memory of kind `memory` takes on this runtime (see
    /// [`Builder::device_memory`](crate::Builder::device_memory)), or the typed refusal naming
    /// the provider and what it lacks: decided before anything is registered.
    pub fn device_path(&self, memory: Memory) -> Result<DevicePath> {
        if !memory.is_device() {
            return Err(Error::invalid(OpKind::Register, "host memory takes no device path"));
        }
        self.inner.device_memory.path(self.inner.caps.device).map_err(|lacks| Error::DeviceMemory {
            op: OpKind::Register,
            memory,
            provider: self.inner.caps.provider.as_str().into(),
            lacks: lacks.into(),
        })
    }

    /// Which path device memory may take.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_policy(&self) -> crate::base::memory::DevicePolicy {
        self.inner.device_memory
    }

    /// Count a device buffer registered on `path` (see [`Stats`]).
    #[cfg_attr(not(any(feature = "cuda", feature = "emulated-device")), allow(dead_code))]
    pub(crate) fn count_device_buffer(&self, path: DevicePath) {
        let c = &self.inner.counters[0];
        match path {
            DevicePath::Native(_) => Counters::add_shared(&c.device_native),
            DevicePath::Staged => Counters::add_shared(&c.device_staged),
        }
    }

    /// Count `n` bytes copied between device memory and a staging mirror.
    pub(crate) fn count_staged_bytes(&self, n: usize) {
        self.inner.counters[0].staged_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Whether this runtime has an express rail (see
    /// [`Builder::express_rail`](crate::Builder::express_rail)): its rail 0 is then a transport
    /// of its own on the first NIC, with its own reactor, carrying messages and latency-class
    /// ops, and [`caps`](Self::caps)`().rails` counts it.
    pub fn express_rail(&self) -> bool {
        self.inner.map.express
    }

    /// Who drives this runtime's reactor.
    pub fn driver(&self) -> Driver {
        if self.inner.inline.is_some() {
            Driver::Inline
        } else {
            Driver::Thread
        }
    }

    /// Run a future to completion on this thread. With [`Driver::Inline`] this thread also
    /// drives the reactor, busy-polling; otherwise it parks until woken.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match &self.inner.inline {
            Some(slot) => inline::block_on(slot, self.inner.id, &self.inner.groups[0].idle, fut),
            None => inline::block_on_elsewhere(fut),
        }
    }

    /// The first group's reactor as its thread lends it to spinning tasks, if it does.
    pub(crate) fn lend(&self) -> Option<&Arc<Lend>> {
        self.inner.lend.as_ref()
    }

    /// How long the poll of an op of class `class` (or of `len` bytes, unclassed) may watch
    /// for its completion before parking: latency-class ops only.
    pub(crate) fn await_spin_for(&self, class: Option<Class>, len: usize) -> AwaitSpin {
        let latency = match class {
            Some(c) => c == Class::Latency,
            None => len <= self.inner.latency_threshold,
        };
        if latency {
            self.inner.await_spin
        } else {
            AwaitSpin::OFF
        }
    }

    /// Hand a command to the first group's reactor (the only one, mostly).
    fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.inner.groups[0].send(cmd)
    }

    /// Hand an op to the reactor; on shutdown the op fails at once.
    /// `polled`: the op's cell, when its future is being polled: an op not done at posting then
    /// reaps at once, in the same reach of the held reactor (the inline turn its poll would
    /// take next).
    /// The op's own handle on the runtime, where it has one, goes once the op is posted (off
    /// the latency path).
    pub(crate) fn submit(&self, req: OpReq, polled: Option<&OpCell>) {
        let req = match self.inner.groups.len() {
            1 => req,
            // What goes whole to the first group takes the path below (the inline driver's
            // hold included: under it, the first group is the one driven inline).
            _ => match self.submit_groups(req) {
                Some(req) => req,
                None => return,
            },
        };
        if self.inner.groups[0].idle.shutdown.load(Ordering::Acquire) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
            return;
        }
        // Inside the inline driver's block_on, which holds the reactor: post at once, skipping
        // the queue hop. Elsewhere ops wait for the driver like any other.
        let req = match self.inner.inline.is_some() || self.inner.lend.is_some() {
            true => {
                let posted = with_held(self.inner.id, req, |r, req| {
                    r.submit_now(req);
                    if polled.is_some_and(|c| !c.is_done()) && inline::take_reap() {
                        r.turn();
                    }
                });
                let Err(req) = posted else { return };
                req
            }
            false => req,
        };
        if let Err(Cmd::Op(req)) = self.send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }

    /// On the thread whose inline `block_on` holds this runtime's reactor: post `draft` over
    /// `seg` now if the reactor would post it straight away (see `Reactor::post_at_once`).
    /// `None` anywhere else, for [`submit`](Self::submit).
    /// With an express rail the held reactor is the first group's, which takes what it would
    /// post at once (the latency class, whole); bulk ops are left to the other groups.
    pub(crate) fn post_at_once(&self, draft: &Draft, mut seg: LocalSeg) -> Option<AtOnce> {
        let inner = &self.inner;
        if (inner.inline.is_none() && inner.lend.is_none())
            || inner.groups[0].idle.shutdown.load(Ordering::Acquire)
        {
            return None;
        }
        if inner.groups.len() > 1 {
            seg.desc = self.group_desc(seg.desc, GroupId::FIRST);
        }
        with_held(inner.id, (), |r, ()| r.post_at_once(draft, seg)).ok().flatten()
    }

    /// Run a control command on the first group's reactor and wait for its reply.
    fn call<T>(&self, op: OpKind, make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd) -> Result<T> {
        self.call_on(GroupId::FIRST, op, make)
    }

    /// Run a control command on group `g`'s reactor and wait for its reply.
    fn call_on<T>(&self, g: GroupId, op: OpKind, make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd) -> Result<T> {
        let (reply, rx) = mpsc::sync_channel(1);
        let cmd = make(reply);
        if self.group(g).send(cmd).is_err() {
            return Err(Error::Shutdown { op });
        }
        loop {
            // The inline driver may be nobody right now: turn the reactor ourselves.
            if let Some(slot) = &self.inner.inline {
                slot.with(self.inner.id, Reactor::turn);
                match rx.try_recv() {
                    Ok(v) => return Ok(v),
                    Err(mpsc::TryRecvError::Empty) => continue,
                    Err(mpsc::TryRecvError::Disconnected) => return Err(Error::Shutdown { op }),
                }
            }
            return rx.recv().map_err(|_| Error::Shutdown { op });
        }
    }

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
            for (group, GroupReg { id, .. }) in self.inner.groups.iter().zip(regs) {
                let _ = group.send(Cmd::Deregister { id, keep: None, reply: None });
            }
            return Err(e);
        }
        let first = regs[0].id;
        let handle = self.inner.regs.write().unwrap_or_else(|p| p.into_inner()).insert(regs);
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
        self.inner.regs.write().unwrap_or_else(|p| p.into_inner()).try_remove(id as usize)
    }

    /// Group `g`'s descriptor for the runtime's descriptor `desc` (several groups).
    fn group_desc(&self, desc: usize, g: GroupId) -> usize {
        let regs = self.inner.regs.read().unwrap_or_else(|p| p.into_inner());
        regs.get(desc).and_then(|r| r.get(g.0)).map_or(0, |r| r.desc)
    }

    /// Deregister without waiting; `keep` is dropped by the reactor after the deregistration
    /// (with several groups, by the last of them).
    pub(crate) fn release_region(&self, id: u64, keep: Option<Box<dyn std::any::Any + Send>>) {
        if self.inner.groups.len() > 1 {
            let Some(regs) = self.take_group_regs(id) else { return };
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
        let mut first = Ok(());
        for (g, GroupReg { id, .. }) in regs.into_iter().enumerate() {
            let res = self
                .call_on(GroupId(g), OpKind::Expose, |reply| Cmd::Deregister {
                    id,
                    keep: None,
                    reply: Some(reply),
                })
                .and_then(|r| r.map_err(|e: TransportError| Error::from_transport(OpKind::Expose, "-", e)));
            if first.is_ok() {
                first = res;
            }
        }
        first
    }

    /// Rail group `g`.
    fn group(&self, g: GroupId) -> &Group {
        &self.inner.groups[g.0]
    }

    /// The rail groups, with their ids.
    fn groups(&self) -> impl Iterator<Item = (GroupId, &Group)> {
        self.inner.groups.iter().enumerate().map(|(g, group)| (GroupId(g), group))
    }

    /// The group serving a host rail, and the rail's index in that group's transport.
    fn group_of_rail(&self, rail: RailId) -> (GroupId, usize) {
        for (g, group) in self.groups() {
            if let Some(local) = group.rails.iter().position(|&r| r == rail) {
                return (g, local);
            }
        }
        (GroupId::FIRST, 0)
    }

    /// Open `n` lanes for a new peer: lane i on rail `map.rail_of(i)`, by that rail's group.
    /// Returns them in lane order with their addresses.
    pub(crate) fn open_lanes(&self, peer: &str, n: usize) -> Result<Vec<(Lane, Vec<u8>)>> {
        let map = self.inner.map;
        let at: Vec<(GroupId, usize)> = (0..n).map(|i| self.group_of_rail(map.rail_of(i))).collect();
        let mut out: Vec<Option<(Lane, Vec<u8>)>> = vec![None; n];
        let mut failure = None;
        for (g, _) in self.groups() {
            let local: Vec<usize> = at.iter().filter(|(x, _)| *x == g).map(|&(_, r)| r).collect();
            if local.is_empty() {
                continue;
            }
            let res = self
                .call_on(g, OpKind::Connect, |reply| Cmd::OpenLanes { rails: local, reply })
                .and_then(|r| r.map_err(|e| Error::from_transport(OpKind::Connect, peer, e)));
            match res {
                Ok(opened) => {
                    let slots = (0..n).filter(|&i| at[i].0 == g);
                    for (i, o) in slots.zip(opened) {
                        out[i] = Some((Lane { group: g, lane: o.lane }, o.name));
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let out: Vec<(Lane, Vec<u8>)> = out.into_iter().flatten().collect();
        match failure {
            Some(e) => {
                self.close_lanes(out.into_iter().map(|(l, _)| l).collect());
                Err(e)
            }
            None => Ok(out),
        }
    }

    /// Connect our lanes to the peer's (pairwise, in lane order) and add the peer to every
    /// group that holds one of them. Returns its slot in each group.
    pub(crate) fn add_peer(
        &self,
        id: u64,
        lanes: Vec<Lane>,
        names: Vec<Vec<u8>>,
        map: LaneMap,
        label: String,
        ctl: UnboundedSender<Ctl>,
    ) -> Result<Slots> {
        let mut slots: Vec<Option<PeerSlot>> = vec![None; self.inner.groups.len()];
        for (g, _) in self.groups() {
            let mine: Vec<PeerLane> = (0..lanes.len())
                .filter(|&i| lanes[i].group == g)
                .map(|i| PeerLane { lane: lanes[i].lane, peer_name: names[i].clone(), place: i })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let (l, c) = (label.clone(), ctl.clone());
            let res = self
                .call_on(g, OpKind::Connect, |reply| Cmd::AddPeer {
                    id,
                    lanes: mine,
                    map,
                    label: l,
                    ctl: c,
                    reply,
                })
                .and_then(|r| r.map_err(|e| Error::from_transport(OpKind::Connect, &label, e)));
            match res {
                Ok(slot) => slots[g.0] = Some(slot),
                Err(e) => {
                    // Undo: the groups done lose the peer (closing its lanes), the others'
                    // lanes close (this group's failed add closed its own).
                    self.each_slot(&slots, |slot| Cmd::RemovePeer { slot });
                    let rest = lanes.into_iter().filter(|l| l.group > g).collect();
                    self.close_lanes(rest);
                    return Err(e);
                }
            }
        }
        let Some(first) = slots[0] else {
            // Lane 0 (the express lane) is on rail 0, which the first group holds.
            self.each_slot(&slots, |slot| Cmd::RemovePeer { slot });
            return Err(Error::invalid(
                OpKind::Connect,
                "the first rail group holds none of the peer's lanes",
            ));
        };
        Ok(Arc::new(PeerSlots { first, by_group: slots }))
    }

    pub(crate) fn close_lanes(&self, lanes: Vec<Lane>) {
        for (g, group) in self.groups() {
            let mine: Vec<LaneId> = lanes.iter().filter(|l| l.group == g).map(|l| l.lane).collect();
            if !mine.is_empty() {
                let _ = group.send(Cmd::CloseLanes { lanes: mine });
            }
        }
    }

    pub(crate) fn remove_peer(&self, slots: &Slots) {
        self.each_slot(&slots.by_group, |slot| Cmd::RemovePeer { slot });
    }

    pub(crate) fn peer_lost(&self, slots: &Slots, reason: String) {
        self.each_slot(&slots.by_group, |slot| Cmd::PeerLost { slot, reason: reason.clone() });
    }

    /// Send `make(slot)` to each group's reactor that holds the peer.
    fn each_slot(&self, slots: &[Option<PeerSlot>], mut make: impl FnMut(PeerSlot) -> Cmd) {
        for (group, slot) in self.inner.groups.iter().zip(slots) {
            if let Some(slot) = *slot {
                let _ = group.send(make(slot));
            }
        }
    }

    /// A message the peer (runtime `peer_id`, at `slots`) sent on its control connection, to
    /// the reactor it concerns: an answer to a question goes to the group that asked (named
    /// in the token's high bits), a peer's sleep to every group (any may post to the rails
    /// it names), a kick to the groups serving the rails it names, the rest to the first
    /// group (which keeps messages and answers questions about our memory).
    pub(crate) fn control(&self, slots: &Slots, peer_id: u64, msg: Ctl) {
        let to = match &msg {
            Ctl::Asleep { .. } if slots.by_group.len() > 1 => {
                return self.each_slot(&slots.by_group, |slot| Cmd::Control {
                    slot,
                    peer_id,
                    msg: msg.clone(),
                });
            }
            Ctl::Kick { rails } if slots.by_group.len() > 1 => {
                for (group, slot) in self.inner.groups.iter().zip(&slots.by_group) {
                    let mine = rails.and(RailSet::of(group.rails.iter().copied()));
                    if let (Some(slot), false) = (*slot, mine.is_empty()) {
                        let _ = group.send(Cmd::Control { slot, peer_id, msg: Ctl::Kick { rails: mine } });
                    }
                }
                return;
            }
            Ctl::Verdict { token, .. } => GroupId((*token >> crate::reactor::TOKEN_GROUP_SHIFT) as usize),
            _ => GroupId::FIRST,
        };
        if let Some(slot) = slots.of(to) {
            let _ = self.group(to).send(Cmd::Control { slot, peer_id, msg });
        }
    }

    /// An op on several groups. With an express rail (the first group holds it alone), a bulk
    /// one-sided op the endpoint let fan out goes to the other groups, split in proportion to
    /// their rails, and everything else (messages, the latency class) to the first, whose
    /// reactor then never waits behind a bulk chunk's copy. Without one, a bulk one-sided op
    /// of `fan_min` bytes or more is split across every group, and the rest goes to the first.
    /// Either way each part names its group's descriptor for the local memory. Hands back
    /// the op when it goes whole to the first group, for the caller to post there.
    fn submit_groups(&self, mut req: OpReq) -> Option<OpReq> {
        let express = self.inner.map.express;
        let bulk = match req.class {
            Some(c) => c == Class::Bulk,
            None => req.len() > self.inner.latency_threshold,
        };
        let fan = req.slots.take().filter(|_| bulk && (express || req.len() >= self.inner.fan_min));
        let Some(slots) = fan else {
            return Some(self.to_first(req));
        };
        let weights: Vec<usize> = self
            .groups()
            .zip(slots.by_group.iter())
            .map(|((g, group), s)| match s {
                Some(_) if !(express && g == GroupId::FIRST) => group.rails.len(),
                _ => 0,
            })
            .collect();
        if weights.iter().all(|&w| w == 0) {
            // A peer whose lanes all sit in the first group (it asked for one lane).
            return Some(self.to_first(req));
        }
        for (g, part) in crate::runtime::fanout::split(req, &slots.by_group, &weights) {
            self.submit_to(g, part);
        }
        None
    }

    /// An op going whole to the first group: it names that group's descriptor.
    fn to_first(&self, mut req: OpReq) -> OpReq {
        req.seg.desc = self.group_desc(req.seg.desc, GroupId::FIRST);
        req
    }

    /// Hand an op (or a part) to group `g`'s reactor, naming the group's own descriptor.
    fn submit_to(&self, g: GroupId, mut req: OpReq) {
        req.seg.desc = self.group_desc(req.seg.desc, g);
        if let Err(Cmd::Op(req)) = self.group(g).send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }
}

/// A lane of a peer, by the rail group that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    /// The rail group whose reactor owns it.
    pub group: GroupId,
    /// Its id in that group's transport.
    pub lane: LaneId,
}

pub(crate) use crate::reactor::cmd::Slots;
use crate::reactor::cmd::{GroupId, PeerSlot, PeerSlots};

/// A [`Runtime`] handle that does not keep it alive.
#[derive(Clone, Debug)]
pub struct WeakRuntime(std::sync::Weak<Inner>);

impl WeakRuntime {
    /// The runtime, if it still runs.
    pub fn upgrade(&self) -> Option<Runtime> {
        self.0.upgrade().map(|inner| Runtime { inner })
    }
}
