//! The builder: what the application asks for, resolved once (see `settings`) into a running
//! runtime: transports opened, one reactor per rail group, each on its driver.
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::mr_cache::MrCache;
use super::settings::{self, RailGroups, Settings};
use super::{Driver, Group, Inner, Runtime};
use crate::base::error::{Error, OpKind, Result};
use crate::base::imm::ImmQueue;
use crate::base::lane_map::LaneMap;
use crate::base::memory::DevicePolicy;
use crate::base::refusal::RefusalCounters;
use crate::base::sched::{Mode, SchedConfig};
use crate::base::stats::Counters;
use crate::base::transport::{Backend, Caps, RailId, TransportConfig};
use crate::driver::handoff::{self, AwaitSpin};
use crate::driver::inline::Slot;
use crate::driver::lend::{Lend, LendWake};
use crate::driver::thread::{self, IdlePolicy};
use crate::reactor::cmd::GroupId;
use crate::reactor::{Idle, Reactor};

/// Configures and builds a [`Runtime`]. One rule decides each setting: what is set here beats
/// the environment variable named in its doc (`RDMALANE_PROVIDER`, `RDMALANE_LANES`, ...),
/// which beats the default. A variable that is set but does not parse fails `build` with an
/// error naming it.
pub struct Builder {
    backends: Vec<Arc<dyn Backend>>,
    settings: Settings,
    driver: Driver,
    idle: IdlePolicy,
    connect_timeout: Duration,
    max_handshakes: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            backends: Vec::new(),
            settings: Settings::default(),
            driver: Driver::Thread,
            idle: IdlePolicy {
                spin: Duration::from_micros(200),
                max_sleep: Duration::from_millis(5),
                woken_by_traffic: false,
            },
            connect_timeout: Duration::from_secs(5),
            max_handshakes: 256,
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

    /// Provider or device by name (`efa`, `shm`, `tcp`, `tcp;ofi_rxm`, ...; or
    /// `RDMALANE_PROVIDER`). Unset: the backend's preference, logged.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.settings.provider = Some(name.into());
        self
    }

    /// Local address to bind the fabric endpoint to (tcp needs one that peers can reach; or
    /// `RDMALANE_NODE`).
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.settings.node = Some(node.into());
        self
    }

    /// Pin the reactor thread to this core (or `RDMALANE_CORE`).
    pub fn core(mut self, core: usize) -> Self {
        self.settings.core = Some(core);
        self
    }

    /// Who drives the reactor.
    pub fn driver(mut self, driver: Driver) -> Self {
        self.driver = driver;
        self
    }

    /// How long a latency-class op's poll watches for its completion before its task parks
    /// (`RDMALANE_AWAIT_SPIN_US` when unset here). A completion that comes meanwhile costs a
    /// cache line crossing instead of a wake-up through the executor (5-10 µs). Default 50 µs
    /// on a host of 4 cores or more, none on fewer (the reactor thread takes one; a spinning
    /// task would take another). Only the thread driver spins: the inline driver turns the
    /// reactor itself. `Duration::ZERO` turns it off.
    pub fn await_spin(mut self, d: Duration) -> Self {
        self.settings.await_spin = Some(d);
        self
    }

    /// Let a spinning op's task turn the reactor itself (or `RDMALANE_AWAIT_DRIVE=1|0` when
    /// unset here): the first rail group's reactor thread lends its reactor to a task whose
    /// latency-class op spins (see [`await_spin`](Self::await_spin)), which then posts the op
    /// and reaps its completion on its own thread, as the inline driver does, instead of
    /// handing both across to the reactor thread and back. Default: on wherever ops spin.
    pub fn await_drive(mut self, on: bool) -> Self {
        self.settings.await_drive = Some(on);
        self
    }

    /// While a task turns the lent reactor (see [`await_drive`](Self::await_drive)), let its
    /// thread park between its looks instead of spinning (or `RDMALANE_LEND_NAP=1|0` when unset
    /// here). Spinning, the thread keeps a core busy for as long as a task drives the reactor;
    /// napping, it takes an idle reactor back one or two naps of 10 µs after the task's last
    /// op instead of 10 µs, and a parked task, a command and a stop unpark it. Default: on
    /// (nap): on 16 cores the single-op latencies were the same either way within their
    /// run-to-run spread, and the nap frees a core per side while a task drives.
    pub fn lend_nap(mut self, on: bool) -> Self {
        self.settings.lend_nap = Some(on);
        self
    }

    /// Let reactor threads sleep on a completion-queue wait object even where that object
    /// costs on the busy path (or `RDMALANE_CQ_WAIT=1|0` when unset here): libfabric's
    /// FI_WAIT_FD, which on tcp;ofi_rxm cost about 1 µs of a 6.5-8.5 µs 16 B one-way on every
    /// message (2-core VM, inline driver, see the book's benchmarks), a price the thread
    /// driver's spinning tasks pay on each op. Off, such queues are opened without one, as the
    /// inline driver's always are: an idle reactor naps instead, and a peer whose op needs its
    /// progress kicks it awake over the control connection (as on shm, which has no wait
    /// object). A verbs completion channel costs only when armed for a sleep and is kept
    /// either way. Default: on. Napping costs more where the reactor thread sleeps between ops
    /// (fewer than 4 cores: a tcp ping-pong took 2-3x as long) and on a target that only
    /// serves peers' one-sided ops (tcp raises no completion for them, so it falls asleep each
    /// spin window and the next op waits for its kick).
    pub fn cq_wait(mut self, on: bool) -> Self {
        self.settings.cq_wait = Some(on);
        self
    }

    /// Give the latency class progress of its own (or `RDMALANE_EXPRESS=1|0` when unset here):
    /// an **express rail**, a second transport on rail 0's NIC with a reactor thread of its
    /// own, carries each peer's first lane (messages and latency-class ops), while bulk
    /// one-sided ops go to the other rail group(s). On software providers (tcp;ofi_rxm, shm)
    /// a bulk chunk's copy runs inside the provider call, on the reactor that posts it; with
    /// the express rail a 16 B op never waits behind it. It costs a second reactor thread (a
    /// busy core under load; it sleeps when idle) and a registration per rail more.
    /// Unset: on with a software provider and 8 cores or more; off otherwise (a hardware NIC
    /// moves the bytes itself, so splitting serves the latency class there). Under the inline driver the caller's thread turns the express rail's reactor and
    /// the bulk rails get a thread. The fifo scheduler, which has no latency class, has none.
    /// The runtime logs which layout it took; [`Runtime::express_rail`](crate::Runtime::express_rail)
    /// says it.
    pub fn express_rail(mut self, on: bool) -> Self {
        self.settings.express = Some(on);
        self
    }

    /// Which path device (GPU) memory may take (or `RDMALANE_DEVICE_MEMORY=auto|native|staged|off`):
    /// native where the transport registers device memory itself (libfabric's FI_HMEM, verbs'
    /// dma-buf or nvidia-peermem), staged through registered pinned host memory elsewhere. The
    /// path is decided when a buffer is registered, logged, and refused there (never later)
    /// where the policy allows none. Default: `Auto` in a build with the `cuda` feature, `Off`
    /// (the transport is not asked for device memory) without.
    pub fn device_memory(mut self, policy: DevicePolicy) -> Self {
        self.settings.device_memory = Some(policy);
        self
    }

    /// How long an idle reactor thread busy-spins before it sleeps (default 200 µs). A
    /// thread whose sleeps peers' traffic ends at once (a stream of one-sided ops it serves on
    /// tcp, which raise no completion here) spins up to 8 times as long until the stream ends.
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
    /// connection takes the place of the oldest idle one that has not sent a whole hello, else
    /// of the oldest idle one that has not proved the shared secret; when every handshake is
    /// busy or past that, the newcomer is refused. Both count as
    /// [`RefusalReason::OverCap`](crate::RefusalReason::OverCap) in [`Stats::refused`](crate::Stats::refused).
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n.max(1);
        self
    }

    /// A peer whose control connection stays silent this long (no heartbeat) is lost: its
    /// pending ops fail with `Error::PeerLost`. Heartbeats go out three times per period.
    /// Default 3 s, or `RDMALANE_PEER_TIMEOUT_MS` (slow debugging tools such as valgrind need
    /// more); 30 ms at least.
    pub fn peer_timeout(mut self, t: Duration) -> Self {
        self.settings.peer_timeout = Some(t);
        self
    }

    /// Require peers to prove they know `secret` (HMAC-SHA256 challenge-response in the
    /// handshake, compared in constant time); peers that do not are refused. Unset here,
    /// `RDMALANE_SECRET` is used when present.
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.settings.secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Lanes (transport endpoints, QPs) per peer, 1 to 64: bulk chunks rotate over them
    /// (`RDMALANE_LANES` when unset here; default 1).
    pub fn lanes(mut self, n: usize) -> Self {
        self.settings.lanes = Some(n);
        self
    }

    /// Span `n` rails (NICs or libfabric domains; `RDMALANE_RAILS` when unset here): every
    /// registration is made on each, descriptors carry a key per rail, and bulk chunks stripe
    /// over the lanes of all rails. tcp rails bind to 127.0.0.1, 127.0.0.2, ... unless
    /// [`rail_nodes`](Self::rail_nodes) names them.
    pub fn rails(mut self, n: usize) -> Self {
        self.settings.rails = Some(n);
        self
    }

    /// Split the rails among reactors, one per group, each on a thread of its own with a
    /// transport of its own (`RDMALANE_RAIL_GROUPS=0,1;2,3` when unset here). Unset: one group
    /// per NUMA node the rails' NICs sit on, its reactor pinned to a core of that node (one
    /// group on a single-node host). Every rail belongs to one group. The group holding rail 0
    /// carries messages and small ops; a bulk one-sided op (a write, a read, a batch) is split
    /// across the groups in proportion to their rails. With [`Driver::Inline`] the groups are
    /// merged into one reactor, the caller's (an express rail, see
    /// [`express_rail`](Self::express_rail), still gets a second, on a thread).
    pub fn rail_groups<G: IntoIterator<Item = usize>>(mut self, groups: impl IntoIterator<Item = G>) -> Self {
        self.settings.rail_groups = Some(groups.into_iter().map(|g| g.into_iter().collect()).collect());
        self
    }

    /// Local addresses, one per rail (tcp: the NICs' addresses); at least as many rails as
    /// addresses are spanned.
    pub fn rail_nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.settings.rail_nodes = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// Trust peers on this host with this process's memory (or `RDMALANE_TRUST_LOCAL_PEERS=1`;
    /// an explicit `false` beats the variable):
    /// shm then lets their one-sided ops skip the target's checks of key, range and access,
    /// about 4x faster for small ones, and a stale or forged descriptor (a revoked region, a
    /// bug) writes wherever it points. Off by default: every one-sided op is checked.
    pub fn trust_local_peers(mut self, trust: bool) -> Self {
        self.settings.trust_local_peers = Some(trust);
        self
    }

    /// Leave at least `every` between a completion-queue read that found nothing and the next
    /// (or `RDMALANE_POLL_SPACING_NS`). A reader polling back to back slows a peer posting to
    /// it where both take one lock (shm), so a little spacing makes round trips shorter there.
    /// Default: the backend's (libfabric: 80 ns on shm and tcp; none on efa, where the NIC
    /// writes completions); `Duration::ZERO` reads on every turn; at most 1 ms is taken. The
    /// verbs backend reads on every turn and ignores it.
    pub fn poll_spacing(mut self, every: Duration) -> Self {
        self.settings.poll_spacing = Some(every);
        self
    }

    /// Byte cap of the registration cache (`register_shared`): idle registrations beyond it are
    /// dropped, least recently used first. Default 1 GiB, or `RDMALANE_MR_CACHE_BYTES`.
    pub fn mr_cache_bytes(mut self, cap: usize) -> Self {
        self.settings.mr_cache_bytes = Some(cap);
        self
    }

    /// Treat `bytes` as the largest message the provider takes, when it is below the
    /// provider's own limit (`RDMALANE_MAX_MESSAGE` when unset here): one-sided ops above it
    /// are split (a write with an immediate value too: its last piece carries the value and
    /// goes out once the rest has landed); a send above it goes by rendezvous (the receiver
    /// reads it from the sender's buffer).
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.settings.max_message = Some(bytes);
        self
    }

    /// Fair-share scheduler settings (chunk size, budgets, latency threshold, fifo mode), taken
    /// whole. Unset here: the defaults, with the environment's overrides
    /// ([`SchedConfig::from_env`]).
    pub fn scheduler(mut self, cfg: SchedConfig) -> Self {
        self.settings.sched = Some(cfg);
        self
    }

    /// Open the transport and start the reactor.
    pub fn build(self) -> Result<Runtime> {
        if self.backends.is_empty() {
            return Err(Error::invalid(OpKind::Open, "no backend: call .backend(rdmalane_efa::Libfabric)"));
        }
        let set = settings::resolve(&self.settings, &|name| std::env::var(name).ok())?;
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid(
                OpKind::Open,
                "connect_timeout is 0: no handshake could finish in it",
            ));
        }
        let config = TransportConfig {
            provider: set.provider.clone(),
            node: set.node.clone(),
            no_wait_object: self.driver == Driver::Inline,
            no_costly_wait_object: !set.cq_wait,
            rails: set.rails,
            rail_nodes: self.settings.rail_nodes.clone(),
            rail_ids: Vec::new(),
            trust_local_peers: set.trust_local_peers,
            poll_spacing: set.poll_spacing,
            // The staging path needs nothing of the transport.
            device_memory: matches!(set.device_memory, DevicePolicy::Auto | DevicePolicy::Native),
            device_early_completion: set.device_memory == DevicePolicy::Native,
        };
        let backend = match config.provider.as_deref() {
            None => self.backends[0].clone(),
            Some(p) => self.backends.iter().find(|b| b.accepts(p)).cloned().ok_or_else(|| {
                Error::invalid(
                    OpKind::Open,
                    format!("no backend given to the builder accepts provider '{p}'"),
                )
            })?,
        };
        let core_set = set.core;
        let transport = backend.open(&config)?;
        let lanes = set.lanes;
        let mut caps = transport.caps().clone();
        if let Some(cap) = set.max_message {
            caps.max_msg_size = caps.max_msg_size.min(cap);
        }
        caps.rails = caps.rails.max(1);
        caps.rail_numa.resize(caps.rails, None);
        let by_numa = |caps: &Caps| -> Vec<Vec<usize>> {
            crate::base::topology::rail_groups(&caps.rail_numa).into_iter().map(|(_, rails)| rails).collect()
        };
        let mut groups = match set.rail_groups.clone() {
            RailGroups::Explicit(g) => crate::base::topology::check_rail_groups(g, caps.rails)
                .map_err(|why| Error::invalid(OpKind::Open, why))?,
            RailGroups::Env(v) => groups_from_env(&v, caps.rails).unwrap_or_else(|| by_numa(&caps)),
            RailGroups::Auto => by_numa(&caps),
        };
        if self.driver == Driver::Inline && groups.len() > 1 {
            tracing::warn!(?groups, "the inline driver turns one reactor: the rail groups are merged");
            groups = vec![(0..caps.rails).collect()];
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let express = express_rail(set.express, set.sched.mode, &caps, cores);
        // The host rails each group's transport opens; with an express rail, the runtime's rail
        // r > 0 is the host's rail r - 1, and rail 0 (the first group, alone) is host rail 0
        // again, on a transport of its own.
        let hosts = groups.clone();
        let (groups, hosts) = if express {
            let shifted = groups.iter().map(|g| g.iter().map(|r| r + 1).collect());
            caps.rails += 1;
            caps.rail_numa.insert(0, caps.rail_numa[0]);
            (
                std::iter::once(vec![0]).chain(shifted).collect(),
                std::iter::once(vec![0]).chain(hosts).collect(),
            )
        } else {
            (groups, hosts)
        };
        let map = LaneMap { rails: caps.rails, express };
        let lanes = lanes.max(map.min_lanes()).min(settings::MAX_LANES);
        // One transport per group: the one just opened serves a single group; several open
        // their own shares of the rails (it is closed first, as they bind the same addresses).
        let transports: Vec<Box<dyn crate::base::transport::Transport>> = if groups.len() == 1 {
            vec![transport]
        } else {
            drop(transport);
            let mut ts = Vec::with_capacity(groups.len());
            for (g, h) in hosts.iter().enumerate() {
                let mut c = config.clone();
                c.rails = h.len();
                c.rail_ids = h.clone();
                // Under the inline driver only the first group is driven inline; the others
                // have reactor threads, which sleep on the completion queue's fd.
                c.no_wait_object = self.driver == Driver::Inline && g == 0;
                ts.push(backend.open(&c)?);
            }
            tracing::info!(?groups, express, "one reactor per rail group");
            ts
        };
        let imm = Arc::new(ImmQueue::default());
        let mut counters = Vec::with_capacity(groups.len());
        let mut sched = set.sched.clone();
        // Chunks must be messages the provider takes.
        sched.max_message = caps.max_msg_size.max(1);
        tracing::debug!(?sched, "scheduler");
        let peer_timeout = set.peer_timeout;
        let mut inline = None;
        let id = rand::random::<u64>() | 1;
        let await_spin = match (self.driver, set.await_spin) {
            (Driver::Inline, _) => AwaitSpin::OFF,
            (Driver::Thread, Some(d)) => AwaitSpin::new(d),
            (Driver::Thread, None) => AwaitSpin::new(handoff::default_budget(cores)),
        };
        let drive = self.driver == Driver::Thread && !await_spin.is_off() && set.await_drive != Some(false);
        let mut lend = None;
        let mut started = Vec::with_capacity(groups.len());
        let mut taken = Vec::new();
        let drained = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for (g, (rails, transport)) in groups.iter().zip(transports).enumerate() {
            let mut notifier = transport.notifier();
            let wait_fd = transport.caps().wait_fd;
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
                    .and_then(|node| crate::base::topology::reactor_core_for(node, &taken)),
            };
            taken.extend(core);
            // Each reactor writes counters of its own (plain stores, no locked instructions).
            counters.push(Arc::new(Counters::default()));
            let mine = counters[g].clone();
            let mut reactor = Reactor::new(transport, rx, imm.clone(), mine, idle.clone(), sched.clone());
            reactor.set_peer_timeout(peer_timeout);
            let rail_ids: Vec<RailId> = rails.iter().copied().map(RailId).collect();
            reactor.set_group(GroupId(g), groups.len(), rail_ids.clone(), drained.clone());
            let (thread, thread_id) = match (self.driver, g) {
                (Driver::Inline, 0) => {
                    inline = Some(Slot::new(reactor));
                    (None, None)
                }
                _ => {
                    let mut policy = self.idle;
                    if wait_fd {
                        // The CQ's fd wakes the thread for completions and the eventfd for
                        // submissions and peer losses; the timeout only paces housekeeping
                        // (expiring unanswered control questions, which wait 10 s at least).
                        // Each wake costs: at 50 ms an idle verbs reactor in the emulated VM
                        // used up to 2.3% of a core.
                        policy.max_sleep = Duration::from_millis(100);
                        policy.woken_by_traffic = true;
                    }
                    if g == 0 && drive {
                        lend = Some(Arc::new(Lend::new(id, idle.clone(), notifier.clone(), set.lend_nap)));
                    }
                    let mine = if g == 0 { lend.clone() } else { None };
                    if let Some(l) = mine.as_ref().filter(|l| l.naps()) {
                        // Submitters and a stop unpark it while it naps with the reactor out.
                        notifier = Arc::new(LendWake { transport: notifier, lend: l.clone() });
                    }
                    let h = thread::spawn(reactor, g, core, idle.clone(), policy, mine)
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
                rails: rail_ids,
                core,
            });
        }
        tracing::info!(
            provider = %caps.provider,
            driver = ?self.driver,
            cores,
            express,
            await_spin_us = await_spin.budget().as_micros() as u64,
            await_drive = lend.is_some(),
            "rdmalane runtime started"
        );
        let fan_min = sched.chunk_size.max(1).saturating_mul(2);
        let regs = super::GroupRegTable::new(started.len());
        Ok(Runtime {
            inner: Arc::new(Inner {
                id,
                lanes,
                caps,
                groups: started,
                map,
                inline,
                lend,
                regs,
                fan_min,
                await_spin,
                latency_threshold: sched.latency_threshold,
                imm,
                counters,
                mr_cache: MrCache::new(set.mr_cache_bytes),
                connect_timeout: self.connect_timeout,
                max_handshakes: self.max_handshakes,
                refusals: RefusalCounters::default(),
                peer_timeout,
                secret: set.secret,
                device_memory: set.device_memory,
            }),
        })
    }
}

/// Cores a host needs for an express rail by default: a reactor thread for each group, the
/// application's threads, and room to spare.
const EXPRESS_MIN_CORES: usize = 8;

/// Whether the runtime gets an express rail: as set, else on with a provider that copies bulk
/// data inside its calls and `EXPRESS_MIN_CORES` cores. (Under the inline driver the caller's
/// thread turns the express rail's reactor and the bulk rails get a thread.)
fn express_rail(set: Option<bool>, mode: Mode, caps: &Caps, cores: usize) -> bool {
    let software = ["tcp", "shm", "sockets", "udp"].iter().any(|p| caps.provider.starts_with(p));
    let (on, why) = match set {
        // Fifo serves ops in arrival order, with no latency class to give a rail of its own.
        _ if mode == Mode::Fifo => (false, "the fifo scheduler has no latency class"),
        Some(on) => (on, "as configured"),
        None if !software => (false, "the NIC moves bulk data: splitting serves the latency class"),
        None if cores < EXPRESS_MIN_CORES => (false, "too few cores for a second reactor"),
        None => (true, "a software provider with cores to spare"),
    };
    let on = on && caps.rails < crate::base::MAX_RAILS;
    tracing::info!(express = on, provider = %caps.provider, cores, why, "lane layout");
    on
}

/// The rail groups `RDMALANE_RAIL_GROUPS` names, where they fit a runtime of `rails` rails
/// (other runtimes of the process, with other rail counts, ignore it, saying so).
fn groups_from_env(v: &str, rails: usize) -> Option<Vec<Vec<usize>>> {
    let groups = crate::base::topology::parse_rail_groups(v)
        .ok_or_else(|| "want rails by group, e.g. 0,1;2,3".to_string())
        .and_then(|g| crate::base::topology::check_rail_groups(g, rails));
    match groups {
        Ok(g) => Some(g),
        Err(why) => {
            tracing::warn!(value = %v, rails, %why, "RDMALANE_RAIL_GROUPS ignored by this runtime");
            None
        }
    }
}
