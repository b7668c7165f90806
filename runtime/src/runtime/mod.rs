//! The runtime handle and its builder: the rail groups (a reactor each, on its thread or
//! driven inline) and what the handle does with them, in parts: handing ops and commands to
//! the reactors (`submit`), registering memory on every group (`registration`), and a peer's
//! lanes across the groups (`peers`).
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crate::base::error::{Error, OpKind, Result};
use crate::base::imm::{ImmEvent, ImmQueue, NextImm, WaitImm};
use crate::base::lane_map::LaneMap;
use crate::base::memory::{DevicePath, Memory};
use crate::base::refusal::RefusalCounters;
use crate::base::sched::{Class, TenantId};
use crate::base::stats::{Counters, Stats};
use crate::base::transport::{Caps, LaneId, Notify, RailId};
use crate::driver::handoff::AwaitSpin;
use crate::driver::inline::{self, Slot};
use crate::driver::lend::Lend;
use crate::driver::lent_block_on;
use crate::reactor::cmd::{Cmd, GroupId};
use crate::reactor::{Idle, SHUTDOWN_LIMIT};

mod builder;
pub(crate) mod fanout;
mod group_regs;
pub(crate) mod mr_cache;
mod peers;
mod registration;
mod settings;
mod submit;

pub use builder::Builder;

use group_regs::GroupRegTable;
use mr_cache::{CacheStats, MrCache};

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
        // A stopping reactor takes no new work, but still deregisters: its transport may let
        // peers reach the memory until it is closed, so the memory must go after, not now. And
        // it still hears its peers: what it drains may wait on their answers (a send a peer
        // reads by rendezvous ends with the peer's word that it has).
        let still = matches!(cmd, Cmd::Deregister { .. } | Cmd::Control { .. });
        if self.idle.shutdown.load(Ordering::Acquire) && !still {
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

    /// Let the reactor's thread end on its own (it stops once signalled).
    fn detach(&self) {
        drop(self.thread.lock().unwrap_or_else(|p| p.into_inner()).take());
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
    /// Registrations on several groups (unused with one): the runtime's region id and
    /// descriptor name an entry here.
    regs: GroupRegTable,
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
        // Dropped inside a tokio task, the stop must not hold up that executor thread: the
        // stop may need the control connections' tasks, which can be queued behind it on that
        // very thread (a peer endpoint of this process closes once its watch task sees ours
        // go, and our shm lanes wait up to a second for that: a test saw the whole second).
        // There the reactor threads finish stopping on their own, as they do when the last
        // handle goes on a reactor thread. An inline reactor has no thread to do it.
        if self.inline.is_none() && tokio::task::try_id().is_some() {
            self.groups.iter().for_each(Group::signal_stop);
            self.groups.iter().for_each(Group::detach);
            return;
        }
        self.stop();
    }
}

/// The rdmalane runtime: a transport, the reactor that drives it, and the peers it talks to.
/// Cheap to clone; the reactor stops when the last clone (and the last buffer) is gone. That
/// drop waits for the stop (as [`shutdown`](Self::shutdown) does), except inside a tokio task
/// with reactor threads: there they finish it in the background, so as not to hold up the
/// executor thread the peers' control connections may need for it.
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
    /// with `Error::Shutdown`, posted ones (sends a peer is reading by rendezvous among them) get
    /// up to two seconds to complete (those that do not fail with `Error::Shutdown` once their
    /// lanes are closed, after which no NIC touches their buffers), and every later op fails
    /// with `Error::Shutdown`. Dropping the last handle does
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
    /// drives the reactor, busy-polling. With [`Driver::Thread`] it parks until woken; where
    /// tasks spin for latency-class ops (see [`Builder::await_spin`](crate::Builder::await_spin)),
    /// it also keeps the reactor its ops hold through its future's polls and turns it between
    /// them, giving it back to the reactor thread after a poll that polled no op, once the
    /// future has waited that spin's budget with nothing to do, when another task asks for it,
    /// and on return. Code the future runs
    /// between two awaits then runs with that reactor held, as under the inline driver; a poll
    /// that ran 1 ms or more with it makes the next 64 run without it. A latency-class op that
    /// another executor polls gives it back before it waits, so another executor's `block_on`
    /// of such an op, nested in the future, still finishes; other ops do not: as under the
    /// inline driver, the future must not block its thread waiting for them.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match (&self.inner.inline, self.lend()) {
            (Some(slot), _) => inline::block_on(slot, self.inner.id, &self.inner.groups[0].idle, fut),
            (None, Some(lend)) => {
                lent_block_on::block_on(lend, self.inner.id, self.inner.await_spin.budget(), fut)
            }
            (None, None) => inline::block_on_elsewhere(fut),
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

/// A [`Runtime`] handle that does not keep it alive.
#[derive(Clone, Debug)]
pub struct WeakRuntime(std::sync::Weak<Inner>);

impl WeakRuntime {
    /// The runtime, if it still runs.
    pub fn upgrade(&self) -> Option<Runtime> {
        self.0.upgrade().map(|inner| Runtime { inner })
    }
}
