//! The runtime handle and its builder.
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use slab::Slab;
use tokio::sync::mpsc::UnboundedSender;

use crate::bootstrap::RefusalCounters;
use crate::buf::cache::{timed, MrCache};
use crate::buf::{CacheStats, ExposedBuf, IoBuf, RegisteredBuf, SharedBuf};
use crate::control::Ctl;
use crate::error::{Error, OpKind, Result, TransportError};
use crate::imm::{ImmEvent, ImmQueue, NextImm, WaitImm};
use crate::op::OpCell;
use crate::reactor::cmd::{Cmd, Draft, OpReq, PeerLane};
use crate::reactor::inline::{turn_held, with_held, Slot};
use crate::reactor::rail_of;
use crate::reactor::thread::{self, Idle, IdlePolicy};
use crate::reactor::{AtOnce, Reactor, SHUTDOWN_LIMIT};
use crate::sched::{SchedConfig, TenantId};
use crate::stats::{Counters, Stats};
use crate::transport::{Access, Backend, Caps, LaneId, LocalSeg, MemoryRegion, Notify, TransportConfig};

/// Most rails one runtime spans (a p5 host has 32 EFA NICs).
pub const MAX_RAILS: usize = 32;

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

/// Configures and builds a [`Runtime`]. Environment variables override nothing set here
/// explicitly; they fill in what is left unset: `RDMALANE_PROVIDER`, `RDMALANE_NODE`,
/// `RDMALANE_CORE`.
pub struct Builder {
    backends: Vec<Arc<dyn Backend>>,
    config: TransportConfig,
    core: Option<usize>,
    driver: Driver,
    idle: IdlePolicy,
    connect_timeout: Duration,
    max_handshakes: usize,
    peer_timeout: Duration,
    lanes: usize,
    sched: SchedConfig,
    secret: Option<Vec<u8>>,
    mr_cache_bytes: Option<usize>,
    max_message: Option<usize>,
    rail_groups: Option<Vec<Vec<usize>>>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            backends: Vec::new(),
            config: TransportConfig::default(),
            core: None,
            driver: Driver::Thread,
            idle: IdlePolicy { spin: Duration::from_micros(200), max_sleep: Duration::from_millis(5) },
            connect_timeout: Duration::from_secs(5),
            max_handshakes: 256,
            peer_timeout: Duration::from_secs(3),
            lanes: 1,
            sched: SchedConfig::default(),
            secret: None,
            mr_cache_bytes: None,
            max_message: None,
            rail_groups: None,
        }
    }
}

impl Builder {
    /// A backend that may open the transport (e.g. `rdmalane_efa::Libfabric`,
    /// `rdmalane_verbs::Verbs`). Called several times, the first backend that accepts the
    /// provider name opens it, so one binary serves every fabric:
    /// `.backend(Verbs).backend(Libfabric)` with `RDMALANE_PROVIDER=verbs` or `=efa`.
    pub fn backend(mut self, backend: impl Backend + 'static) -> Self {
        self.backends.push(Arc::new(backend));
        self
    }

    /// Provider or device by name (`efa`, `shm`, `tcp`, `tcp;ofi_rxm`, ...). Unset: the
    /// backend's preference, logged.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.config.provider = Some(name.into());
        self
    }

    /// Local address to bind the fabric endpoint to (tcp needs one that peers can reach).
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.config.node = Some(node.into());
        self
    }

    /// Pin the reactor thread to this core.
    pub fn core(mut self, core: usize) -> Self {
        self.core = Some(core);
        self
    }

    /// Who drives the reactor.
    pub fn driver(mut self, driver: Driver) -> Self {
        self.driver = driver;
        self
    }

    /// How long an idle reactor thread busy-spins before it sleeps.
    pub fn idle_spin(mut self, spin: Duration) -> Self {
        self.idle.spin = spin;
        self
    }

    /// Limit for establishing a connection (TCP connect plus handshake).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Handshakes a listener runs at once (default 256, at least 1). At the cap a new
    /// connection takes the place of the oldest one that has not sent a whole hello; when every
    /// handshake is past its hello, the newcomer is refused. Both count as
    /// [`RefusalReason::OverCap`](crate::RefusalReason::OverCap) in [`Stats::refused`].
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n.max(1);
        self
    }

    /// A peer whose control connection stays silent this long (no heartbeat) is lost: its
    /// pending ops fail with `Error::PeerLost`. Heartbeats go out three times per period.
    /// `RDMALANE_PEER_TIMEOUT_MS` overrides it (slow debugging tools such as valgrind need more).
    pub fn peer_timeout(mut self, t: Duration) -> Self {
        self.peer_timeout = t.max(Duration::from_millis(30));
        self
    }

    /// Require peers to prove they know `secret` (HMAC-SHA256 challenge-response in the
    /// handshake, compared in constant time); peers that do not are refused. Unset here,
    /// `RDMALANE_SECRET` is used when present.
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Lanes (transport endpoints, QPs) per peer: bulk chunks rotate over them
    /// (`RDMALANE_LANES` when unset here).
    pub fn lanes(mut self, n: usize) -> Self {
        self.lanes = n;
        self
    }

    /// Span `n` rails (NICs or libfabric domains; `RDMALANE_RAILS` when unset here): every
    /// registration is made on each, descriptors carry a key per rail, and bulk chunks stripe
    /// over the lanes of all rails. tcp rails bind to 127.0.0.1, 127.0.0.2, ... unless
    /// [`rail_nodes`](Self::rail_nodes) names them.
    pub fn rails(mut self, n: usize) -> Self {
        self.config.rails = n;
        self
    }

    /// Split the rails among reactors, one per group, each on a thread of its own with a
    /// transport of its own (`RDMALANE_RAIL_GROUPS=0,1;2,3` when unset here). Unset: one group
    /// per NUMA node the rails' NICs sit on, its reactor pinned to a core of that node (one
    /// group on a single-node host). Every rail belongs to one group. The group holding rail 0
    /// carries messages and small ops; a bulk one-sided op (a write, a read, a batch) is split
    /// across the groups in proportion to their rails. With [`Driver::Inline`] there is one
    /// reactor, whatever the groups.
    pub fn rail_groups<G: IntoIterator<Item = usize>>(mut self, groups: impl IntoIterator<Item = G>) -> Self {
        self.rail_groups = Some(groups.into_iter().map(|g| g.into_iter().collect()).collect());
        self
    }

    /// Local addresses, one per rail (tcp: the NICs' addresses).
    pub fn rail_nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.config.rail_nodes = nodes.into_iter().map(Into::into).collect();
        if self.config.rails < self.config.rail_nodes.len() {
            self.config.rails = self.config.rail_nodes.len();
        }
        self
    }

    /// Trust peers on this host with this process's memory (or `RDMALANE_TRUST_LOCAL_PEERS=1`):
    /// shm then lets their one-sided ops skip the target's checks of key, range and access,
    /// about 4x faster for small ones, and a stale or forged descriptor (a revoked region, a
    /// bug) writes wherever it points. Off by default: every one-sided op is checked.
    pub fn trust_local_peers(mut self, trust: bool) -> Self {
        self.config.trust_local_peers = trust;
        self
    }

    /// Leave at least `every` between a completion-queue read that found nothing and the next
    /// (or `RDMALANE_POLL_SPACING_NS`). A reader polling back to back slows a peer posting to
    /// it where both take one lock (shm), so a little spacing makes round trips shorter there.
    /// Default: the backend's (libfabric: 80 ns on shm and tcp; none on efa, where the NIC
    /// writes completions); `Duration::ZERO` reads on every turn; at most 1 ms is taken. The
    /// verbs backend reads on every turn and ignores it.
    pub fn poll_spacing(mut self, every: Duration) -> Self {
        self.config.poll_spacing = Some(every);
        self
    }

    /// Byte cap of the registration cache (`register_shared`): idle registrations beyond it are
    /// dropped, least recently used first. Default 1 GiB, or `RDMALANE_MR_CACHE_BYTES`.
    pub fn mr_cache_bytes(mut self, cap: usize) -> Self {
        self.mr_cache_bytes = Some(cap);
        self
    }

    /// Treat `bytes` as the largest message the provider takes, when it is below the
    /// provider's own limit (`RDMALANE_MAX_MESSAGE` when unset here): one-sided ops above it
    /// are split (a write with an immediate value too: its last piece carries the value and
    /// goes out once the rest has landed); a send above it goes by rendezvous (the receiver
    /// reads it from the sender's buffer).
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = Some(bytes);
        self
    }

    /// Fair-share scheduler settings (chunk size, budgets, latency threshold, fifo mode).
    /// Environment variables (`RDMALANE_SCHEDULER`, `RDMALANE_CHUNK_SIZE`, ...) override them.
    pub fn scheduler(mut self, cfg: SchedConfig) -> Self {
        self.sched = cfg;
        self
    }

    /// Open the transport and start the reactor.
    pub fn build(self) -> Result<Runtime> {
        if self.backends.is_empty() {
            return Err(Error::invalid(OpKind::Open, "no backend: call .backend(rdmalane_efa::Libfabric)"));
        }
        let mut config = self.config;
        if config.provider.is_none() {
            config.provider = std::env::var("RDMALANE_PROVIDER").ok().filter(|s| !s.is_empty());
        }
        let backend = match config.provider.as_deref() {
            None => self.backends[0].clone(),
            Some(p) => self.backends.iter().find(|b| b.accepts(p)).cloned().ok_or_else(|| {
                Error::invalid(
                    OpKind::Open,
                    format!("no backend given to the builder accepts provider '{p}'"),
                )
            })?,
        };
        if config.node.is_none() {
            config.node = std::env::var("RDMALANE_NODE").ok().filter(|s| !s.is_empty());
        }
        let core_set = self.core.or_else(|| std::env::var("RDMALANE_CORE").ok().and_then(|s| s.parse().ok()));
        config.no_wait_object = self.driver == Driver::Inline;
        config.trust_local_peers |= crate::transport::trust_local_peers_env();
        config.poll_spacing = config.poll_spacing.or_else(crate::transport::poll_spacing_env);
        if config.rails == 0 {
            config.rails = std::env::var("RDMALANE_RAILS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
        }
        if !(1..=MAX_RAILS).contains(&config.rails) {
            return Err(Error::invalid(OpKind::Open, format!("{} rails (1 to {MAX_RAILS})", config.rails)));
        }
        let transport = backend.open(&config)?;
        let lanes = if self.lanes != 1 {
            self.lanes
        } else {
            std::env::var("RDMALANE_LANES").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
        };
        if !(1..=64).contains(&lanes) {
            return Err(Error::invalid(OpKind::Open, format!("{lanes} lanes per peer (1 to 64)")));
        }
        let mut caps = transport.caps().clone();
        let cap = self
            .max_message
            .or_else(|| std::env::var("RDMALANE_MAX_MESSAGE").ok().and_then(|s| s.parse().ok()));
        if let Some(cap) = cap {
            if cap == 0 {
                return Err(Error::invalid(OpKind::Open, "a largest message of 0 bytes"));
            }
            caps.max_msg_size = caps.max_msg_size.min(cap);
        }
        // With several rails, one bulk lane per rail at least (behind the express lane).
        let lanes = if caps.rails > 1 { lanes.max(1 + caps.rails).min(64) } else { lanes };
        caps.rails = caps.rails.max(1);
        caps.rail_numa.resize(caps.rails, None);
        let mut groups = match self.rail_groups {
            Some(g) => crate::topology::check_rail_groups(g, caps.rails)
                .map_err(|why| Error::invalid(OpKind::Open, why))?,
            None => groups_from_env(caps.rails).unwrap_or_else(|| {
                crate::topology::rail_groups(&caps.rail_numa).into_iter().map(|(_, rails)| rails).collect()
            }),
        };
        if self.driver == Driver::Inline && groups.len() > 1 {
            tracing::warn!(?groups, "the inline driver runs one reactor: the rail groups are merged");
            groups = vec![(0..caps.rails).collect()];
        }
        // One transport per group: the one just opened serves a single group; several open
        // their own shares of the rails (it is closed first, as they bind the same addresses).
        let transports = if groups.len() == 1 {
            vec![transport]
        } else {
            drop(transport);
            let mut ts = Vec::with_capacity(groups.len());
            for g in &groups {
                let mut c = config.clone();
                c.rails = g.len();
                c.rail_ids = g.clone();
                ts.push(backend.open(&c)?);
            }
            tracing::info!(?groups, "one reactor per rail group");
            ts
        };
        let imm = Arc::new(ImmQueue::default());
        let mut counters = Vec::with_capacity(groups.len());
        let mut sched = self.sched;
        sched.apply_env();
        // Chunks must be messages the provider takes.
        sched.max_message = caps.max_msg_size.max(1);
        tracing::debug!(?sched, "scheduler");
        let peer_timeout = std::env::var("RDMALANE_PEER_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(self.peer_timeout, |ms: u64| Duration::from_millis(ms.max(30)));
        let mut inline = None;
        let mut started = Vec::with_capacity(groups.len());
        let mut taken = Vec::new();
        let drained = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for (g, (rails, transport)) in groups.iter().zip(transports).enumerate() {
            let notifier = transport.notifier();
            let (tx, rx) = mpsc::channel();
            let idle = Arc::new(Idle::default());
            // Unpinned by the caller: next to the group's NICs where the host has several NUMA
            // nodes. A configured core is the first group's.
            let core = match (g, core_set) {
                (0, Some(c)) => Some(c),
                _ => caps
                    .rail_numa
                    .get(rails[0])
                    .copied()
                    .flatten()
                    .and_then(|node| crate::topology::reactor_core_for(node, &taken)),
            };
            taken.extend(core);
            // Each reactor writes counters of its own (plain stores, no locked instructions).
            counters.push(Arc::new(Counters::default()));
            let mine = counters[g].clone();
            let mut reactor = Reactor::new(transport, rx, imm.clone(), mine, idle.clone(), sched.clone());
            reactor.set_peer_timeout(peer_timeout);
            reactor.set_group(g, groups.len(), rails.clone(), drained.clone());
            let (thread, thread_id) =
                match self.driver {
                    Driver::Inline => {
                        inline = Some(Slot::new(reactor));
                        (None, None)
                    }
                    Driver::Thread => {
                        let mut policy = self.idle;
                        if caps.wait_fd {
                            // The CQ's fd wakes the thread for completions and the eventfd for
                            // submissions and peer losses; the timeout only paces housekeeping
                            // (expiring unanswered control questions, which wait 10 s at least).
                            // Each wake costs: at 50 ms an idle verbs reactor in the emulated VM
                            // used up to 2.3% of a core.
                            policy.max_sleep = Duration::from_millis(100);
                        }
                        let h = thread::spawn(reactor, g, core, idle.clone(), policy)
                            .map_err(|e| Error::Io { op: OpKind::Open, peer: "-".into(), source: e })?;
                        let id = h.thread().id();
                        (Some(h), Some(id))
                    }
                };
            started.push(Group {
                tx,
                idle,
                notifier,
                thread: Mutex::new(thread),
                thread_id,
                rails: rails.clone(),
                core,
            });
        }
        tracing::info!(provider = %caps.provider, driver = ?self.driver, "rdmalane runtime started");
        let fan_min = sched.chunk_size.max(1).saturating_mul(2);
        Ok(Runtime {
            inner: Arc::new(Inner {
                id: rand::random::<u64>() | 1,
                lanes,
                caps,
                groups: started,
                inline,
                regs: std::sync::RwLock::new(Slab::new()),
                fan_min,
                imm,
                counters,
                mr_cache: MrCache::new(self.mr_cache_bytes.unwrap_or_else(|| {
                    std::env::var("RDMALANE_MR_CACHE_BYTES")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1 << 30)
                })),
                connect_timeout: self.connect_timeout,
                max_handshakes: self.max_handshakes,
                refusals: RefusalCounters::default(),
                peer_timeout,
                secret: self
                    .secret
                    .or_else(|| std::env::var("RDMALANE_SECRET").ok().map(String::into_bytes))
                    .filter(|s| !s.is_empty()),
            }),
        })
    }
}

/// The rail groups `RDMALANE_RAIL_GROUPS` names, where they fit a runtime of `rails` rails
/// (other runtimes of the process, with other rail counts, ignore it, saying so).
fn groups_from_env(rails: usize) -> Option<Vec<Vec<usize>>> {
    let v = std::env::var("RDMALANE_RAIL_GROUPS").ok().filter(|s| !s.is_empty())?;
    let groups = crate::topology::parse_rail_groups(&v)
        .ok_or_else(|| "want rails by group, e.g. 0,1;2,3".to_string())
        .and_then(|g| crate::topology::check_rail_groups(g, rails));
    match groups {
        Ok(g) => Some(g),
        Err(why) => {
            tracing::warn!(value = %v, rails, %why, "RDMALANE_RAIL_GROUPS ignored by this runtime");
            None
        }
    }
}

/// One reactor and the way to it: a rail group's share of the runtime.
struct Group {
    tx: Sender<Cmd>,
    idle: Arc<Idle>,
    notifier: Arc<dyn Notify>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Option<ThreadId>,
    /// The host rails its transport spans.
    rails: Vec<usize>,
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

/// A registration made on every group's transport: its handle in each (id, local descriptor).
/// With several groups, the runtime's region id and descriptor name an entry here.
type GroupRegs = Vec<(u64, usize)>;

struct Inner {
    id: u64,
    lanes: usize,
    caps: Caps,
    /// One per rail group; the first holds rail 0 and takes messages and small ops.
    groups: Vec<Group>,
    /// The one reactor, when the caller of `block_on` drives it.
    inline: Option<Slot>,
    /// Registrations on several groups (unused with one).
    regs: std::sync::RwLock<Slab<GroupRegs>>,
    /// Bulk one-sided ops of at least this many bytes are split across the groups.
    fan_min: usize,
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

    /// Allocate `len` zeroed bytes of registered memory.
    pub fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        RegisteredBuf::alloc(self, len)
    }

    /// Register shared, immutable memory through the registration cache: the same `Bytes`
    /// (same address and length) registered again reuses its registration. Use it for memory
    /// sent or written repeatedly (weights, cached pages, reply templates).
    pub fn register_shared(&self, bytes: bytes::Bytes) -> Result<SharedBuf> {
        self.inner.mr_cache.register(self, bytes)
    }

    /// What the registration cache has done (hits, misses, evictions, bytes held). Registration
    /// counts and time are in [`stats`](Self::stats).
    pub fn mr_cache_stats(&self) -> CacheStats {
        self.inner.mr_cache.trim();
        self.inner.mr_cache.stats()
    }

    /// Let peers reach `buf` with the given access; the result carries the descriptor to hand
    /// them.
    pub fn expose<B: IoBuf>(&self, buf: B, access: Access) -> Result<ExposedBuf<B>> {
        ExposedBuf::new(self, buf, access)
    }

    /// The next immediate value a peer's `write_with_imm` raised here.
    pub fn next_imm(&self) -> NextImm {
        NextImm { q: self.inner.imm.clone() }
    }

    /// Resolves once `n` immediate events with value `tag` have arrived (from writes or batch
    /// pieces, in any order), and takes them: `next_imm` will not return them. Dropping the
    /// future takes nothing.
    pub fn wait_imm(&self, tag: u64, n: usize) -> WaitImm {
        WaitImm { q: self.inner.imm.clone(), tag, n: n as u64 }
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
        self.inner.groups.iter().map(|g| (g.rails.clone(), g.core)).collect()
    }

    /// A snapshot of the op counters.
    pub fn stats(&self) -> Stats {
        Stats { refused: self.inner.refusals.snapshot(), ..Counters::snapshot(&self.inner.counters) }
    }

    /// Bytes posted on each rail so far (one entry per rail).
    pub fn rail_bytes(&self) -> Vec<u64> {
        let rails = self.inner.caps.rails;
        (0..rails)
            .map(|r| self.inner.counters.iter().map(|c| c.rail_bytes[r].load(Ordering::Relaxed)).sum())
            .collect()
    }

    /// Run a future to completion on this thread. With [`Driver::Inline`] this thread also
    /// drives the reactor, busy-polling; otherwise it parks until woken.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        let Some(slot) = &self.inner.inline else {
            // No driver of ours here, even nested in an inline driver's poll: that driver's
            // budget must not be spent (and, spent, make every op yield) where it never resets.
            let _outer = Driving::enter(false, None);
            return futures::executor::block_on(fut);
        };
        let (id, idle) = (self.inner.id, &self.inner.groups[0].idle);
        let mut fut = std::pin::pin!(fut);
        let flag = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        // Restores the thread's driver state however this returns, a panic included.
        let _driving = Driving::enter(true, Some((self.id(), waker.clone())));
        // The reactor stays on this thread until this returns (see `inline`).
        let mut hold = slot.hold(id);
        let mut kicks = crate::op::cell::driver_kicks();
        loop {
            // Poll only when woken, or when a parked op completed (the count is this thread's
            // plus one all threads share, so an extra poll now and then): between those the
            // loop is the reactor's alone.
            let now = crate::op::cell::driver_kicks();
            let woken = flag.0.load(Ordering::Relaxed) && flag.0.swap(false, Ordering::Acquire);
            if woken || now != kicks {
                kicks = now;
                REAP_IN_POLL.set(true);
                BUDGET.set(POLL_BUDGET);
                if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                    return v;
                }
            }
            // Every reactor this thread holds turns (an outer `block_on`'s too, should this
            // one be nested in another runtime's).
            let turned = turn_held(id, |r| {
                if idle.shutdown.load(Ordering::Relaxed) {
                    // A stop from another thread waits for this (it finds the slot empty).
                    r.shutdown(SHUTDOWN_LIMIT);
                }
                r.turn();
            });
            // Another thread's `block_on` holds it: take it once it is back.
            if !turned && !hold.retake() {
                std::hint::spin_loop();
            }
        }
    }

    /// Hand a command to the first group's reactor (the only one, mostly).
    fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.inner.groups[0].send(cmd)
    }

    /// On the thread inside this runtime's inline `block_on`, with nobody else turning: one
    /// turn of the reactor now, at most once per poll of the driver's future. False where that
    /// is not the case.
    /// (`rt`: the runtime's id.)
    pub(crate) fn turn_inline(rt: u64) -> bool {
        // Once per poll: a future looping over ops that keep completing as they are polled
        // would otherwise never return, starving whatever it is joined with.
        REAP_IN_POLL.replace(false) && with_held(rt, (), |r, ()| r.turn()).is_ok()
    }

    /// Is `cx` the waker of runtime `rt`'s inline driver on this thread? An op polled with it
    /// needs no waker of its own: the driver polls again when a parked op completes.
    pub(crate) fn drives_here(rt: u64, cx: &Context<'_>) -> bool {
        DRIVER.with_borrow(|d| matches!(d, Some((id, w)) if *id == rt && cx.waker().will_wake(w)))
    }

    /// Inside an inline driver's `block_on`: spend one unit of the budget of op polls the
    /// driver's future gets per poll; false when it is spent (the op then yields, so a future
    /// looping over ops that complete at once still lets what it is joined with run).
    pub(crate) fn coop_proceed() -> bool {
        if !DRIVING.get() {
            return true;
        }
        let left = BUDGET.get();
        BUDGET.set(left.saturating_sub(1));
        left > 0
    }

    /// Hand an op to the reactor; on shutdown the op fails at once.
    /// `polled`: the op's cell, when its future is being polled: an op not done at posting then
    /// reaps at once, in the same reach of the held reactor (the inline turn its poll would
    /// take next).
    /// Takes the op's handle on the runtime, and lets go of it once the op is posted (off the
    /// latency path).
    pub(crate) fn submit(self, req: OpReq, polled: Option<&OpCell>) {
        if self.inner.groups.len() > 1 {
            return self.submit_groups(req);
        }
        if self.inner.groups[0].idle.shutdown.load(Ordering::Acquire) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
            return;
        }
        // Inside the inline driver's block_on, which holds the reactor: post at once, skipping
        // the queue hop. Elsewhere ops wait for the driver like any other.
        let req = match &self.inner.inline {
            Some(_) => {
                let posted = with_held(self.inner.id, req, |r, req| {
                    r.submit_now(req);
                    if polled.is_some_and(|c| !c.is_done()) && REAP_IN_POLL.replace(false) {
                        r.turn();
                    }
                });
                let Err(req) = posted else { return };
                req
            }
            None => req,
        };
        if let Err(Cmd::Op(req)) = self.send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }

    /// On the thread whose inline `block_on` holds this runtime's reactor: post `draft` over
    /// `seg` now if the reactor would post it straight away (see `Reactor::post_at_once`).
    /// The draft comes back anywhere else, for [`submit`](Self::submit).
    pub(crate) fn post_at_once(&self, draft: Draft, seg: LocalSeg) -> Result<AtOnce, Draft> {
        let inner = &self.inner;
        if inner.inline.is_none()
            || inner.groups.len() > 1
            || inner.groups[0].idle.shutdown.load(Ordering::Acquire)
        {
            return Err(draft);
        }
        with_held(inner.id, draft, |r, draft| r.post_at_once(draft, seg)).unwrap_or_else(Err)
    }

    /// Run a control command on the first group's reactor and wait for its reply.
    fn call<T>(&self, op: OpKind, make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd) -> Result<T> {
        self.call_on(0, op, make)
    }

    /// Run a control command on group `g`'s reactor and wait for its reply.
    fn call_on<T>(&self, g: usize, op: OpKind, make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd) -> Result<T> {
        let (reply, rx) = mpsc::sync_channel(1);
        let cmd = make(reply);
        if self.inner.groups[g].send(cmd).is_err() {
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
        let op = if access.is_remote() { OpKind::Expose } else { OpKind::Register };
        let (res, ns) = timed(|| {
            if self.inner.groups.len() > 1 {
                return self.register_on_groups(op, ptr, len, access);
            }
            self.call(op, |reply| Cmd::Register { ptr: ptr as usize, len, access, reply })?
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
    ) -> Result<MemoryRegion> {
        let mut keys = vec![0u64; self.inner.caps.rails];
        let mut regs: GroupRegs = Vec::with_capacity(self.inner.groups.len());
        let mut base = None;
        let mut failure = None;
        for (g, group) in self.inner.groups.iter().enumerate() {
            let res = self
                .call_on(g, op, |reply| Cmd::Register { ptr: ptr as usize, len, access, reply })
                .and_then(|r| r.map_err(|e| Error::from_transport(op, "-", e)));
            match res {
                Ok(mr) if base.is_none_or(|b| b == mr.remote_base) => {
                    base = Some(mr.remote_base);
                    let group_keys = std::iter::once(mr.key).chain(mr.rail_keys.iter().copied());
                    for (&rail, key) in group.rails.iter().zip(group_keys) {
                        keys[rail] = key;
                    }
                    regs.push((mr.id, mr.desc));
                }
                Ok(mr) => {
                    regs.push((mr.id, mr.desc));
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
            for (g, (id, _)) in regs.into_iter().enumerate() {
                let _ = self.inner.groups[g].send(Cmd::Deregister { id, keep: None, reply: None });
            }
            return Err(e);
        }
        let first = regs[0].0;
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
    fn group_desc(&self, desc: usize, g: usize) -> usize {
        let regs = self.inner.regs.read().unwrap_or_else(|p| p.into_inner());
        regs.get(desc).and_then(|r| r.get(g)).map_or(0, |&(_, d)| d)
    }

    /// Deregister without waiting; `keep` is dropped by the reactor after the deregistration
    /// (with several groups, by the last of them).
    pub(crate) fn release_region(&self, id: u64, keep: Option<Box<dyn std::any::Any + Send>>) {
        if self.inner.groups.len() > 1 {
            let Some(regs) = self.take_group_regs(id) else { return };
            let keep = keep.map(|k| Arc::new(Mutex::new(k)));
            for (g, (id, _)) in regs.into_iter().enumerate() {
                let keep = keep.clone().map(|k| Box::new(k) as Box<dyn std::any::Any + Send>);
                let _ = self.inner.groups[g].send(Cmd::Deregister { id, keep, reply: None });
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
            1 => vec![(id, 0)],
            _ => self.take_group_regs(id).unwrap_or_default(),
        };
        let mut first = Ok(());
        for (g, (id, _)) in regs.into_iter().enumerate() {
            let res = self
                .call_on(g, OpKind::Expose, |reply| Cmd::Deregister { id, keep: None, reply: Some(reply) })
                .and_then(|r| r.map_err(|e: TransportError| Error::from_transport(OpKind::Expose, "-", e)));
            if first.is_ok() {
                first = res;
            }
        }
        first
    }

    /// The group serving each host rail.
    fn group_of_rail(&self, rail: usize) -> (usize, usize) {
        for (g, group) in self.inner.groups.iter().enumerate() {
            if let Some(local) = group.rails.iter().position(|&r| r == rail) {
                return (g, local);
            }
        }
        (0, 0)
    }

    /// Open `n` lanes for a new peer: lane i on rail `rail_of(i, rails)`, by that rail's group.
    /// Returns them in lane order with their addresses.
    pub(crate) fn open_lanes(&self, peer: &str, n: usize) -> Result<Vec<(Lane, Vec<u8>)>> {
        let groups = self.inner.groups.len();
        let rails = self.inner.caps.rails;
        let at: Vec<(usize, usize)> = (0..n).map(|i| self.group_of_rail(rail_of(i, rails))).collect();
        let mut out: Vec<Option<(Lane, Vec<u8>)>> = vec![None; n];
        let mut failure = None;
        for g in 0..groups {
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
                    for (i, (lane, name)) in slots.zip(opened) {
                        out[i] = Some(((g, lane), name));
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
    /// group that holds one of them. Returns its slot in each group ([`NO_SLOT`] where none).
    pub(crate) fn add_peer(
        &self,
        id: u64,
        lanes: Vec<Lane>,
        names: Vec<Vec<u8>>,
        rails: usize,
        label: String,
        ctl: UnboundedSender<Ctl>,
    ) -> Result<Slots> {
        let mut slots = vec![NO_SLOT; self.inner.groups.len()];
        for g in 0..self.inner.groups.len() {
            let mine: Vec<PeerLane> = (0..lanes.len())
                .filter(|&i| lanes[i].0 == g)
                .map(|i| (lanes[i].1, names[i].clone(), i))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let (l, c) = (label.clone(), ctl.clone());
            let res = self
                .call_on(g, OpKind::Connect, |reply| Cmd::AddPeer {
                    id,
                    lanes: mine,
                    rails,
                    label: l,
                    ctl: c,
                    reply,
                })
                .and_then(|r| r.map_err(|e| Error::from_transport(OpKind::Connect, &label, e)));
            match res {
                Ok(slot) => slots[g] = slot,
                Err(e) => {
                    // Undo: the groups done lose the peer (closing its lanes), the others'
                    // lanes close (this group's failed add closed its own).
                    let added: Slots = slots.into();
                    self.remove_peer(&added);
                    let rest = lanes.into_iter().filter(|l| l.0 > g).collect();
                    self.close_lanes(rest);
                    return Err(e);
                }
            }
        }
        Ok(slots.into())
    }

    pub(crate) fn close_lanes(&self, lanes: Vec<Lane>) {
        for g in 0..self.inner.groups.len() {
            let mine: Vec<LaneId> = lanes.iter().filter(|l| l.0 == g).map(|l| l.1).collect();
            if !mine.is_empty() {
                let _ = self.inner.groups[g].send(Cmd::CloseLanes { lanes: mine });
            }
        }
    }

    pub(crate) fn remove_peer(&self, slots: &Slots) {
        self.each_slot(slots, |slot| Cmd::RemovePeer { slot });
    }

    pub(crate) fn peer_lost(&self, slots: &Slots, reason: String) {
        self.each_slot(slots, |slot| Cmd::PeerLost { slot, reason: reason.clone() });
    }

    fn each_slot(&self, slots: &Slots, mut make: impl FnMut(usize) -> Cmd) {
        for (g, &slot) in slots.iter().enumerate() {
            if slot != NO_SLOT {
                let _ = self.inner.groups[g].send(make(slot));
            }
        }
    }

    /// A message the peer (runtime `peer_id`, at `slots`) sent on its control connection, to
    /// the reactor it concerns: an answer to a question goes to the group that asked (named
    /// in the token's high bits), wake-ups to every group, the rest to the first group (which
    /// keeps messages and answers questions about our memory).
    pub(crate) fn control(&self, slots: &Slots, peer_id: u64, msg: Ctl) {
        let to = match &msg {
            Ctl::Asleep | Ctl::Kick if slots.len() > 1 => {
                return self.each_slot(slots, |slot| Cmd::Control { slot, peer_id, msg: msg.clone() });
            }
            Ctl::Verdict { token, .. } => (*token >> crate::reactor::TOKEN_GROUP_SHIFT) as usize,
            _ => 0,
        };
        if let Some(&slot) = slots.get(to).filter(|&&s| s != NO_SLOT) {
            let _ = self.inner.groups[to].send(Cmd::Control { slot, peer_id, msg });
        }
    }

    /// An op on several groups: a bulk one-sided op the endpoint let fan out is split across
    /// the groups in proportion to their rails; anything else goes whole to the first group.
    /// Either way each part names its group's descriptor for the local memory.
    fn submit_groups(&self, mut req: OpReq) {
        let fan = req
            .slots
            .take()
            .filter(|_| req.len() >= self.inner.fan_min && req.class != Some(crate::sched::Class::Latency));
        let Some(slots) = fan else {
            return self.submit_to(0, req);
        };
        let weights: Vec<usize> = self
            .inner
            .groups
            .iter()
            .zip(slots.iter())
            .map(|(g, &s)| if s == NO_SLOT { 0 } else { g.rails.len() })
            .collect();
        for (g, part) in crate::fanout::split(req, &slots, &weights) {
            self.submit_to(g, part);
        }
    }

    /// Hand an op (or a part) to group `g`'s reactor, naming the group's own descriptor.
    fn submit_to(&self, g: usize, mut req: OpReq) {
        req.seg.desc = self.group_desc(req.seg.desc, g);
        if let Err(Cmd::Op(req)) = self.inner.groups[g].send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }
}

/// A lane of a peer: the rail group whose reactor owns it, and its id in that group's transport.
pub(crate) type Lane = (usize, LaneId);

/// A peer's slot in each group's reactor ([`NO_SLOT`] in a group that holds none of its lanes).
/// (A thin pointer: ops carry it.)
pub(crate) type Slots = Arc<Vec<usize>>;

/// No slot: the group holds none of the peer's lanes.
pub(crate) const NO_SLOT: usize = usize::MAX;

/// A [`Runtime`] handle that does not keep it alive.
#[derive(Clone, Debug)]
pub struct WeakRuntime(std::sync::Weak<Inner>);

impl WeakRuntime {
    /// The runtime, if it still runs.
    pub fn upgrade(&self) -> Option<Runtime> {
        self.0.upgrade().map(|inner| Runtime { inner })
    }
}

thread_local! {
    /// This thread is inside an inline driver's `block_on`.
    static DRIVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The runtime this thread drives inline right now, and its driver's waker.
    static DRIVER: std::cell::RefCell<Option<(u64, Waker)>> = const { std::cell::RefCell::new(None) };
    /// An op polled now may still turn the reactor in this poll of the driver's future.
    static REAP_IN_POLL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Op polls left to the driver's future in this poll (see `coop_proceed`).
    static BUDGET: std::cell::Cell<u32> = const { std::cell::Cell::new(POLL_BUDGET) };
}

/// Op polls per poll of an inline driver's future before ops start to yield (tokio's budget).
const POLL_BUDGET: u32 = 128;

/// What `block_on` found in the thread's driver state, put back when it returns or unwinds.
struct Driving {
    outer: bool,
    outer_driver: Option<(u64, Waker)>,
    /// An outer driver's poll in progress keeps its reap and budget.
    reap: bool,
    budget: u32,
}

impl Driving {
    /// Set this thread's driver state (`driver`: the runtime id and waker of an inline driver
    /// now polling); the guard restores the outer state when dropped.
    fn enter(driving: bool, driver: Option<(u64, Waker)>) -> Driving {
        Driving {
            outer: DRIVING.replace(driving),
            outer_driver: DRIVER.replace(driver),
            reap: REAP_IN_POLL.get(),
            budget: BUDGET.get(),
        }
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        DRIVING.set(self.outer);
        DRIVER.set(self.outer_driver.take());
        REAP_IN_POLL.set(self.reap);
        BUDGET.set(self.budget);
    }
}

/// The inline driver's waker: marks the future as worth polling again.
struct Flag(AtomicBool);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}
