//! The reactor: owns the transport, takes commands from the submission queue, asks the
//! fair-share scheduler what to post, posts it, polls the completion queue in batches and
//! completes op cells. One thread drives it at a time: its own pinned thread ([`thread`]) or a
//! caller of `Runtime::block_on` (inline driver).
mod action;
mod audit;
pub(crate) mod cell;
pub(crate) mod cmd;
mod complete;
mod control;
mod idle;
mod peers;
mod post;
mod rendezvous;
#[cfg(test)]
pub(crate) mod scripted;
mod shutdown;
#[cfg(test)]
mod testing;
#[cfg(test)]
pub(crate) mod tests;

use crate::reactor::cmd::{GroupId, PeerLink, PeerSlot};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::base::error::{Error, FailureClass, OpKind, TransportError};
use crate::base::imm::ImmQueue;
use crate::base::memory::DeviceMem;
use crate::base::probe::{self, Stage};
use crate::base::sched::{Chunk, SchedConfig, Scheduler};
use crate::base::stats::Counters;
use crate::base::transport::{Access, Completion, LocalSeg, MemoryRegion, Transport, WrKind};
use crate::base::transport::{RailId, WrId};
use crate::buf::lease;
use crate::reactor::cell::{Done, OpCell};
use cmd::{Cmd, OpReq};
use complete::note_unposted;
pub(crate) use idle::Idle;
use peers::Peers;
pub(crate) use post::AtOnce;
pub(crate) use shutdown::Phase;

/// How long a stopping reactor waits for its posted ops to complete.
pub(crate) const SHUTDOWN_LIMIT: Duration = Duration::from_secs(2);

/// Completions reaped per poll call.
const POLL_BATCH: usize = 64;
/// Chunks asked of the scheduler per round.
const POST_BATCH: usize = 32;

/// Question tokens carry the asking reactor's rail group above this bit, so that the answer
/// finds its way back to it.
pub(crate) const TOKEN_GROUP_SHIFT: u32 = 27;

/// Kept to 128 bytes: a completion moves it out of the slab, and up to that size moves inline.
struct InFlight {
    /// The whole request id (slot and generation).
    id: WrId,
    cell: Arc<OpCell>,
    peer: PeerSlot,
    op: OpKind,
    /// The scheduler's chunk; `None` for ops that bypass it.
    chunk: Option<Chunk>,
    /// The op's memory (a receive that gets a rendezvous marker reads the message into it).
    seg: LocalSeg,
    /// What the work request did (where a cancelled one-sided op went, to ask the target).
    kind: WrKind,
}

impl InFlight {
    /// Bytes the request moves (completions report a length only for receives): its chunk's,
    /// or the whole op's.
    fn len(&self) -> usize {
        self.chunk.map_or(self.seg.len, |c| c.len)
    }
}

/// An op the scheduler holds, with what the reactor needs to post its chunks.
struct Held {
    req: OpReq,
    /// The first failure among its chunks.
    error: Option<Error>,
    /// Chunks posted and not completed: each holds a reference to the cell.
    posted: usize,
}

pub(crate) struct Reactor {
    t: Box<dyn Transport>,
    rx: Receiver<Cmd>,
    sched: Scheduler,
    /// Ops in the scheduler, indexed by their `OpId`.
    held: Vec<Option<Held>>,
    /// Ops that bypass the scheduler: receives, and latency ops while the scheduler holds
    /// nothing (no bulk to get ahead of, so no queueing to do). They wait here only when the
    /// provider's queue is full.
    direct: VecDeque<OpReq>,
    inflight: Slab<InFlight>,
    peers: Peers,
    comps: Vec<Completion>,
    chunks: Vec<Chunk>,
    imm: Arc<ImmQueue>,
    /// Posted requests that are not passive receives.
    active: usize,
    /// Makes every request id unique (high bits), so a stale completion is recognised.
    generation: u64,
    disconnected: bool,
    counters: Arc<Counters>,
    idle: Arc<Idle>,
    /// Rails the transport spans.
    rails: usize,
    /// The host's index of each of the transport's rails (a rail group's share of them).
    rail_ids: Vec<RailId>,
    /// This reactor's rail group (the first carries messages).
    group: GroupId,
    /// How many rail groups the runtime has.
    groups: u32,
    /// Reactors of the runtime done draining at shutdown (shared by all its groups).
    drained: Arc<std::sync::atomic::AtomicUsize>,
    /// Our (host) rail of each open lane, indexed by lane id.
    lane_rail: Vec<RailId>,
    /// The provider's largest message (the runtime's `max_message` may be lower): receives
    /// post at most this much, as larger messages come by rendezvous.
    provider_max: usize,
    rndv: rendezvous::Rendezvous,
    audit: audit::Audit,
    /// Turns taken, to look at the clock only now and then.
    turns: u32,
    /// `Caps::silent_refusals`.
    silent_refusals: bool,
    /// Where the reactor is in its life.
    phase: Phase,
    /// The time of the current turn: passed in (`turn_at`, so that tests run on virtual time),
    /// or read from the clock the first time the turn needs it (see [`now`](Self::now)).
    now: Instant,
    /// `now` holds this turn's time. A driver's turn leaves it unread: most turns of a polling
    /// loop need no time, and a clock read is a good part of an idle turn's cost (some 20 ns
    /// of a shm reactor's 100-odd ns on a VM).
    now_read: bool,
    /// When this reactor last told a peer it sleeps (`announce_sleep`).
    announced_at: Option<Instant>,
    /// How long a peer's answer on the control connection may take (a verdict, the offer that
    /// follows a marker) before we give up on it: `PATIENCE_MIN`, or twice the peer timeout
    /// where that is longer (each control write may take up to a peer timeout).
    patience: Duration,
    /// Peers whose control outbox refused a message (they stopped reading it), by slot and
    /// link (the slot may have a new peer by then): dropped at the start of the next turn, where
    /// no op of theirs is half-way through the reactor.
    backlogged: Vec<(PeerSlot, PeerLink)>,
}

/// The least patience with a peer's answers.
const PATIENCE_MIN: Duration = Duration::from_secs(10);

/// An op's cell by address: names the op in the side tables (rendezvous, audit), which hold
/// the cell while they name it, so the address is not reused meanwhile.
fn cell_key(cell: &Arc<OpCell>) -> usize {
    Arc::as_ptr(cell) as usize
}

/// Complete an op cell and count the outcome, as completed or failed.
fn settle_cell(counters: &Counters, cell: &OpCell, res: Result<Done, Error>) {
    Counters::add(if res.is_ok() { &counters.completed } else { &counters.failed });
    cell.complete(res);
}

impl Reactor {
    pub(crate) fn new(
        t: Box<dyn Transport>,
        rx: Receiver<Cmd>,
        imm: Arc<ImmQueue>,
        counters: Arc<Counters>,
        idle: Arc<Idle>,
        sched: SchedConfig,
    ) -> Reactor {
        Reactor {
            rx,
            sched: Scheduler::new(sched),
            held: Vec::new(),
            direct: VecDeque::new(),
            inflight: Slab::with_capacity(1024),
            peers: Peers::default(),
            comps: Vec::with_capacity(POLL_BATCH),
            chunks: Vec::with_capacity(POST_BATCH),
            imm,
            active: 0,
            generation: 0,
            disconnected: false,
            rails: t.caps().rails.max(1),
            rail_ids: (0..t.caps().rails.max(1)).map(RailId).collect(),
            group: GroupId::FIRST,
            groups: 1,
            drained: Arc::default(),
            lane_rail: Vec::new(),
            provider_max: t.caps().max_msg_size.max(1),
            rndv: rendezvous::Rendezvous::new(t.caps().provider.clone()),
            audit: audit::Audit::new(t.caps().provider.clone(), GroupId::FIRST, 1),
            turns: 0,
            silent_refusals: t.caps().silent_refusals,
            phase: Phase::Running,
            now: Instant::now(),
            now_read: false,
            announced_at: None,
            patience: PATIENCE_MIN,
            backlogged: Vec::new(),
            counters,
            idle,
            t,
        }
    }

    /// One round: take commands, reap completions, then post what the scheduler allows (lazy
    /// posting from the completion loop). True if anything happened.
    pub(crate) fn turn(&mut self) -> bool {
        self.now_read = false;
        self.turn_once()
    }

    /// As [`turn`](Self::turn), at time `now`.
    #[cfg(test)]
    pub(crate) fn turn_at(&mut self, now: Instant) -> bool {
        self.now = now;
        self.now_read = true;
        self.turn_once()
    }

    /// Turns taken so far (wrapping).
    #[cfg(test)]
    pub(crate) fn turns(&self) -> u32 {
        self.turns
    }

    /// The time of this turn: the one passed in, else the clock's, read once per turn.
    pub(crate) fn now(&mut self) -> Instant {
        if !self.now_read {
            self.now = Instant::now();
            self.now_read = true;
        }
        self.now
    }

    fn turn_once(&mut self) -> bool {
        if !self.backlogged.is_empty() {
            self.drop_backlogged();
        }
        let mut work = self.take_commands();
        work |= self.reap();
        // Most turns of a spinning driver find nothing to post: skip the scheduler's round then.
        if !self.direct.is_empty() || !self.sched.is_empty() {
            work |= self.post();
        }
        self.turns = self.turns.wrapping_add(1);
        if self.silent_refusals && self.turns.is_multiple_of(1024) && self.active > 0 {
            self.sweep_silent();
        }
        if self.turns.is_multiple_of(64) {
            self.expire_waits();
        }
        // A peer refused a message this turn: the next drops it, with no sleep in between.
        work |= !self.backlogged.is_empty();
        probe::mark(Stage::TurnDone);
        work
    }

    /// A failure the runtime reports itself, in the provider's name (no errno).
    fn local_error(&self, class: FailureClass, text: impl Into<String>) -> TransportError {
        TransportError::local(&self.t.caps().provider, class, text)
    }

    /// This reactor serves rail group `group` of `groups`, whose transport spans the host's
    /// rails `rail_ids`.
    /// `drained`: shared by the runtime's reactors (see `shutdown`).
    pub(crate) fn set_group(
        &mut self,
        group: GroupId,
        groups: usize,
        rail_ids: Vec<RailId>,
        drained: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        self.group = group;
        self.groups = groups.max(1) as u32;
        self.audit = audit::Audit::new(self.t.caps().provider.clone(), self.group, self.groups);
        self.drained = drained;
        if rail_ids.len() == self.rails {
            self.rail_ids = rail_ids;
        }
    }

    /// Peers are lost after `t` without a heartbeat: wait for their answers at least twice
    /// that.
    pub(crate) fn set_peer_timeout(&mut self, t: Duration) {
        self.patience = t.saturating_mul(2).max(PATIENCE_MIN);
    }

    /// Ops are posted or queued that will complete without the peer's help.
    pub(crate) fn busy(&self) -> bool {
        self.active > 0 || !self.sched.is_empty() || !self.direct.is_empty()
    }

    /// All senders are gone: the runtime handle was dropped.
    pub(crate) fn orphaned(&self) -> bool {
        self.disconnected
    }

    /// Only serving peers, or not (see `Transport::serving`): said by the reactor thread as it
    /// falls idle and as work comes back.
    pub(crate) fn set_serving(&mut self, on: bool) {
        self.t.serving(on);
    }

    pub(crate) fn transport_mut(&mut self) -> &mut dyn Transport {
        self.t.as_mut()
    }

    fn take_commands(&mut self) -> bool {
        if self.idle.commands.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut work = false;
        loop {
            match self.rx.try_recv() {
                Ok(cmd) => {
                    work = true;
                    self.idle.commands.fetch_sub(1, Ordering::AcqRel);
                    self.handle(cmd);
                }
                Err(TryRecvError::Empty) => return work,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    return work;
                }
            }
        }
    }

    /// A command from the submission queue.
    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Op(req) => {
                Counters::add(&self.counters.submitted);
                self.accept(req)
            }
            Cmd::SetWeight { tenant, weight } => self.sched.set_weight(tenant, weight),
            Cmd::Register { ptr, len, access, device, reply } => {
                let _ = reply.send(self.register(ptr as *mut u8, len, access, device));
            }
            Cmd::Exposed { mr, len, access } => self.audit.exposed(&mr, len, access),
            Cmd::Deregister { id, keep, reply } => {
                let res = self.deregister(id, keep);
                if let Some(reply) = reply {
                    let _ = reply.send(res);
                }
            }
            Cmd::OpenLanes { rails, reply } => {
                let _ = reply.send(self.open_lanes(rails));
            }
            Cmd::AddPeer { id, link, lanes, map, label, ctl, reply } => {
                let _ = reply.send(self.add_peer(id, link, lanes, map, label, ctl));
            }
            Cmd::CloseLanes { lanes } => lanes.iter().for_each(|&l| self.t.close_lane(l)),
            Cmd::RemovePeer { slot, link } => self.remove_peer(slot, link),
            Cmd::PeerLost { slot, link, reason } => self.peer_lost(slot, link, reason),
            // The credit goes once the message is handled.
            Cmd::Control { slot, link, msg, credit: _credit } => self.on_control(slot, link, msg),
        }
    }

    /// Register memory for the runtime (a peer may reach it where `access` says so).
    fn register(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        device: Option<DeviceMem>,
    ) -> Result<MemoryRegion, TransportError> {
        Counters::add(&self.counters.registrations);
        let res = match device {
            None => lease::register(self.t.as_mut(), ptr, len, access),
            Some(mem) => lease::register_device(self.t.as_mut(), ptr, len, access, mem),
        };
        if let (Ok(mr), true) = (&res, access.is_remote()) {
            self.audit.exposed(mr, len, access);
        }
        res
    }

    /// Deregister region `id`, then drop `keep` (the memory peers could reach until now).
    fn deregister(
        &mut self,
        id: u64,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) -> Result<(), TransportError> {
        self.audit.withdrawn(id);
        let res = self.t.deregister(id);
        match &res {
            Ok(()) => drop(keep),
            Err(e) => self.deregistration_failed(id, e, keep),
        }
        res
    }

    /// Region `id`'s deregistration failed: the registration may still be live, and a peer
    /// holding its key still able to read or write the memory. Freed, that memory would go
    /// back to the allocator with the peer's writes still landing in it; so `keep` (the memory
    /// it covers, where a peer could reach it) is kept for good instead: leaked, never reused.
    /// A registered buffer leaked so keeps its handle on the runtime with it, which then stops
    /// only by `Runtime::shutdown`: a reactor left running is the lesser harm.
    fn deregistration_failed(
        &self,
        id: u64,
        e: &TransportError,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) {
        Counters::add(&self.counters.deregistrations_failed);
        tracing::error!(id, error = %e, stranded = keep.is_some(), "deregistration failed: its memory is kept for good");
        std::mem::forget(keep);
    }
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn an_in_flight_entry_moves_without_a_memcpy_call() {
        let size = std::mem::size_of::<super::InFlight>();
        assert!(size <= 128, "an in-flight entry is {size} bytes");
    }
}
