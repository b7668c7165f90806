//! The reactor: owns the transport, takes commands from the submission queue, asks the
//! fair-share scheduler what to post, posts it, polls the completion queue in batches and
//! completes op cells. One thread drives it at a time: its own pinned thread ([`thread`]) or a
//! caller of `Runtime::block_on` (inline driver).
mod audit;
pub(crate) mod cell;
pub(crate) mod cmd;
mod idle;
mod rendezvous;
#[cfg(test)]
mod scripted;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;
use tokio::sync::mpsc::UnboundedSender;

use crate::base::batch::MAX_SGE;
use crate::base::control::Ctl;
use crate::base::error::{Error, FailureClass, OpKind, TransportError};
use crate::base::imm::ImmQueue;
use crate::base::sched::{Chunk, Class, OpDone, OpId, OpSpec, SchedConfig, Scheduler};
use crate::base::stats::Counters;
use crate::base::transport::{
    Completion, LaneId, LocalSeg, PeerAddr, PostError, Posted, Transport, WorkRequest, WrKind,
};
use crate::buf::lease;
use crate::reactor::cell::{Done, OpCell};
use cmd::{Cmd, Draft, OpReq};
pub(crate) use idle::Idle;

/// What became of an op posted at once ([`Reactor::post_at_once`]).
pub(crate) enum AtOnce {
    /// It finished as it was posted, or failed: no cell was made.
    Finished(Result<Done, Error>),
    /// It is in flight, or queued behind a full provider queue: its outcome comes in this cell.
    InFlight(Arc<OpCell>),
}

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
    id: u64,
    cell: Arc<OpCell>,
    peer: usize,
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

struct Peer {
    /// The peer runtime's id.
    id: u64,
    label: String,
    /// Our lanes to the peer: the lane, the peer's address on it, and the rail it runs on at
    /// the peer (whose key a one-sided op on it must use). The first carries messages.
    lanes: Vec<(LaneId, PeerAddr, usize)>,
    /// The same lanes, as the scheduler takes them.
    lane_ids: Arc<[LaneId]>,
    /// The peer's rail count.
    rails: usize,
    /// The first lane alone: messages go there.
    msg_lane: Arc<[LaneId]>,
    /// The lanes bulk rotates over: all but the first when there are several.
    bulk_lanes: Arc<[LaneId]>,
    /// Why the peer is gone, once it is: its lanes are closed and new ops fail at once.
    lost: Option<String>,
    inflight: usize,
    /// The peer's control connection.
    ctl: UnboundedSender<Ctl>,
    /// Questions about our memory this peer asked in the current second, and when it began.
    checks: (Instant, u32),
    /// Its questions we answered with a refusal in the current minute, and when it began.
    refused: (Instant, u32),
    /// Questions we asked it in the current second, and when it began.
    asked: (Instant, u32),
    /// Its reactor sleeps and its provider cannot wake it (`Ctl::Asleep`): our next op that
    /// needs its progress kicks it awake on the control connection.
    asleep: bool,
    /// We told it that our reactor sleeps, and it has not kicked us since.
    announced: bool,
}

impl Peer {
    /// The peer's address on `lane` and the peer's rail there.
    fn route(&self, lane: LaneId) -> (PeerAddr, usize) {
        self.lanes.iter().find(|(l, ..)| *l == lane).map(|&(_, a, r)| (a, r)).expect("a lane of this peer")
    }

    /// Of `lanes`, those reaching a peer rail the op's descriptor has a key for (`keys` of
    /// them: rails 0 to keys - 1). A descriptor of fewer rails than the peer has (the offer of
    /// a peer whose first rail group spans only some of its rails) must not be used elsewhere.
    fn keyed(&self, lanes: Arc<[LaneId]>, keys: usize) -> Arc<[LaneId]> {
        if keys >= self.rails {
            return lanes;
        }
        let reach: Arc<[LaneId]> = lanes.iter().copied().filter(|&l| self.route(l).1 < keys).collect();
        if reach.is_empty() {
            self.msg_lane.clone()
        } else {
            reach
        }
    }
}

/// The rail lane `i` of a connection runs on, at a side with `rails` rails: the first lane
/// (messages, the express lane) on rail 0, the bulk lanes round robin over all rails. Both
/// sides compute it, each with the other's rail count, so keys match lanes.
pub(crate) fn rail_of(i: usize, rails: usize) -> usize {
    if i == 0 || rails <= 1 {
        0
    } else {
        (i - 1) % rails
    }
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
    peers: Slab<Peer>,
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
    rail_ids: Vec<usize>,
    /// This reactor's rail group (0: the one carrying messages).
    group: u32,
    /// How many rail groups the runtime has.
    groups: u32,
    /// Reactors of the runtime done draining at shutdown (shared by all its groups).
    drained: Arc<std::sync::atomic::AtomicUsize>,
    /// Our (host) rail of each open lane, indexed by lane id.
    lane_rail: Vec<usize>,
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
    /// The time of the current turn (passed in, so that tests run on virtual time).
    now: Instant,
    /// How long a peer's answer on the control connection may take (a verdict, the offer that
    /// follows a marker) before we give up on it: `PATIENCE_MIN`, or twice the peer timeout
    /// where that is longer (each control write may take up to a peer timeout).
    patience: Duration,
}

/// Where a reactor is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Serving ops.
    Running,
    /// Stopping: nothing new starts, queued ops have failed, posted ones get until `deadline`
    /// to complete.
    Draining { deadline: Instant },
    /// Drained. The first group waits (until `deadline`) for the others to drain before it
    /// tells the peers goodbye.
    Parting { deadline: Instant },
    /// Lanes closed, every op resolved.
    Stopped,
}

/// The least patience with a peer's answers.
const PATIENCE_MIN: Duration = Duration::from_secs(10);

/// An op's cell by address: names the op in the side tables (rendezvous, audit), which hold
/// the cell while they name it, so the address is not reused meanwhile.
fn cell_key(cell: &Arc<OpCell>) -> usize {
    Arc::as_ptr(cell) as usize
}

/// Complete an op cell and count the outcome.
fn resolve(counters: &Counters, cell: &OpCell, res: Result<Done, Error>) {
    cell.complete(counted(counters, res));
}

/// An op's outcome, counted as completed or failed.
fn counted(counters: &Counters, res: Result<Done, Error>) -> Result<Done, Error> {
    Counters::add(if res.is_ok() { &counters.completed } else { &counters.failed });
    res
}

/// The work request for `len` bytes at op offset `offset`, going to the peer's rail
/// `peer_rail`: its kind (remote address moved to the piece, the rail's key) and its local
/// segments, written to `segs`; returns how many.
fn piece(
    req: &OpReq,
    offset: usize,
    len: usize,
    peer_rail: usize,
    segs: &mut [LocalSeg; MAX_SGE],
) -> (WrKind, usize) {
    let (remote_off, n) = match &req.batch {
        Some(b) => b.segments(req.seg, offset, len, segs),
        None => {
            segs[0] = LocalSeg { ptr: req.seg.ptr.wrapping_add(offset), len, desc: req.seg.desc };
            (offset as u64, 1)
        }
    };
    let rail_key = |key: u64| match (&req.rail_keys, peer_rail) {
        (Some(keys), r) if r > 0 => keys.get(r - 1).copied().unwrap_or(key),
        _ => key,
    };
    // A plain write split with an immediate value: only the piece that ends it carries it.
    let ends_op = req.batch.is_some() || offset + len == req.seg.len;
    let kind = match req.kind {
        WrKind::Write { remote_addr, key, imm } => WrKind::Write {
            remote_addr: remote_addr + remote_off,
            key: rail_key(key),
            imm: imm.filter(|_| ends_op),
        },
        WrKind::Read { remote_addr, key } => {
            WrKind::Read { remote_addr: remote_addr + remote_off, key: rail_key(key) }
        }
        other => other,
    };
    (kind, n)
}

/// Record a chunk's failure on its op, naming the batch piece it belongs to. Of several failed
/// pieces the lowest is kept: completions come in no particular order, and the first piece to
/// fail is the likelier cause (later ones often fail because the connection went with it).
fn note_chunk_error(h: &mut Held, offset: usize, e: Error) {
    let Some(b) = &h.req.batch else {
        h.error.get_or_insert(e);
        return;
    };
    let piece = b.piece_at(offset);
    match &h.error {
        Some(Error::Batch { piece: p, .. }) if *p <= piece => {}
        Some(e) if !matches!(e, Error::Batch { .. }) => {}
        _ => h.error = Some(Error::Batch { piece, source: Box::new(e) }),
    }
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
            peers: Slab::new(),
            comps: Vec::with_capacity(POLL_BATCH),
            chunks: Vec::with_capacity(POST_BATCH),
            imm,
            active: 0,
            generation: 0,
            disconnected: false,
            rails: t.caps().rails.max(1),
            rail_ids: (0..t.caps().rails.max(1)).collect(),
            group: 0,
            groups: 1,
            drained: Arc::default(),
            lane_rail: Vec::new(),
            provider_max: t.caps().max_msg_size.max(1),
            rndv: rendezvous::Rendezvous::default(),
            audit: audit::Audit::default(),
            turns: 0,
            silent_refusals: t.caps().silent_refusals,
            phase: Phase::Running,
            now: Instant::now(),
            patience: PATIENCE_MIN,
            counters,
            idle,
            t,
        }
    }

    /// One round: take commands, reap completions, then post what the scheduler allows (lazy
    /// posting from the completion loop). True if anything happened.
    pub(crate) fn turn(&mut self) -> bool {
        self.turn_at(Instant::now())
    }

    /// As [`turn`](Self::turn), at time `now`.
    pub(crate) fn turn_at(&mut self, now: Instant) -> bool {
        self.now = now;
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
            if !self.audit.idle() {
                self.expire_questions();
            }
            if self.markers_waiting() {
                self.expire_markers();
            }
        }
        work
    }

    /// Queue an op from the driving thread and post what can be posted, commands first so
    /// nothing overtakes them.
    pub(crate) fn submit_now(&mut self, req: OpReq) {
        self.take_commands();
        Counters::add(&self.counters.submitted);
        self.accept(req);
        self.post();
    }

    /// An op from the driving thread that `accept` would post straight away (a receive, or a
    /// small latency op while the scheduler holds nothing), with nothing queued ahead of it:
    /// posted now, and given a cell only if it stays in flight. A small send the provider
    /// copies as it posts (shm's and tcp's inject) then finishes with no cell made, no
    /// reference count touched, on a ping-pong's reply path. Any other op comes back, for
    /// `submit_now`.
    pub(crate) fn post_at_once(&mut self, draft: Draft, seg: LocalSeg) -> Result<AtOnce, Draft> {
        self.take_commands();
        let peer = draft.peer;
        let live = self.phase == Phase::Running
            && self.peers.get(peer).is_some_and(|p| p.id == draft.peer_id && p.lost.is_none());
        if !live || !self.direct.is_empty() || draft.batch.is_some() {
            return Err(draft);
        }
        if !matches!(draft.kind, WrKind::Recv) {
            let class = draft.class.unwrap_or_else(|| self.sched.config().default_class(seg.len));
            // (Not above the largest message either: no rendezvous.)
            if !self.bypasses_scheduler(class, true, seg.len) {
                return Err(draft);
            }
            self.kick_if_asleep(peer);
            self.sched.note_latency();
        }
        Counters::add(&self.counters.submitted);
        let (id, posted) = self.post_whole(peer, draft.kind, seg);
        let (op, kind) = (draft.op, draft.kind);
        Ok(match posted {
            Ok(Posted::Completed) => {
                AtOnce::Finished(counted(&self.counters, Ok(Done { len: seg.len, imm: None })))
            }
            Ok(Posted::Queued) => {
                let cell = OpCell::new();
                self.in_flight(InFlight { id, cell: cell.clone(), peer, op, chunk: None, seg, kind });
                AtOnce::InFlight(cell)
            }
            Err(PostError::Again) => {
                let cell = OpCell::new();
                self.direct.push_back(draft.into_req(seg, cell.clone()));
                AtOnce::InFlight(cell)
            }
            Err(PostError::Failed(e)) => {
                let err = Error::from_transport(op, &self.peers[peer].label, e);
                AtOnce::Finished(counted(&self.counters, Err(err)))
            }
        })
    }

    /// Does an op other than a receive skip the scheduler, posted directly? A plain
    /// (unbatched) latency op that goes whole, while the scheduler holds nothing.
    fn bypasses_scheduler(&self, class: Class, plain: bool, len: usize) -> bool {
        let cfg = self.sched.config();
        class == Class::Latency
            && plain
            && self.sched.is_empty()
            && len <= cfg.chunk_size.min(cfg.max_message)
    }

    /// A failure the runtime reports itself, in the provider's name (no errno).
    fn local_error(&self, class: FailureClass, text: impl Into<String>) -> TransportError {
        TransportError { provider: self.t.caps().provider.clone(), errno: 0, text: text.into(), class }
    }

    /// This reactor serves rail group `group` of `groups`, whose transport spans the host's
    /// rails `rail_ids`.
    /// `drained`: shared by the runtime's reactors (see `shutdown`).
    pub(crate) fn set_group(
        &mut self,
        group: usize,
        groups: usize,
        rail_ids: Vec<usize>,
        drained: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        self.group = group as u32;
        self.groups = groups.max(1) as u32;
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

    /// The reactor thread is about to sleep. A provider without a wait object (shm) cannot wake
    /// it when a peer's op needs its progress (a message to take in, a one-sided op to check),
    /// so that op would wait out the nap: tell each peer, which then kicks us on the control
    /// connection along with its next op. Once per peer until it kicks.
    pub(crate) fn announce_sleep(&mut self) {
        if self.t.caps().wait_fd {
            return;
        }
        for (_, p) in self.peers.iter_mut() {
            if p.lost.is_none() && !p.announced {
                p.announced = true;
                // A closed outbox: the peer is being lost anyway.
                let _ = p.ctl.send(Ctl::Asleep);
            }
        }
    }

    /// An op for the peer in `slot` needs its progress: if its reactor said it sleeps, wake it.
    fn kick_if_asleep(&mut self, slot: usize) {
        let Some(p) = self.peers.get_mut(slot) else { return };
        if p.asleep {
            p.asleep = false;
            Counters::add(&self.counters.kicks);
            let _ = p.ctl.send(Ctl::Kick);
        }
    }

    /// Peers' one-sided ops on our memory were served since the last look, on a transport
    /// whose progress serves them without a completion (shm's checked path).
    pub(crate) fn peers_served(&mut self) -> bool {
        self.silent_refusals && self.t.remote_served()
    }

    /// Ops are posted or queued that will complete without the peer's help.
    pub(crate) fn busy(&self) -> bool {
        self.active > 0 || !self.sched.is_empty() || !self.direct.is_empty()
    }

    /// All senders are gone: the runtime handle was dropped.
    pub(crate) fn orphaned(&self) -> bool {
        self.disconnected
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

    fn accept(&mut self, req: OpReq) {
        if self.phase != Phase::Running {
            // Sent as the runtime stopped (its queue was drained already): the lanes are
            // closing or closed.
            self.settle(&req.cell, Err(Error::Shutdown { op: req.op }));
            return;
        }
        let peer = self.peers.get(req.peer).filter(|p| p.id == req.peer_id);
        let gone = match peer {
            None => Some((String::from("-"), String::from("endpoint closed"))),
            Some(p) => p.lost.as_ref().map(|r| (p.label.clone(), r.clone())),
        };
        if let Some((peer, reason)) = gone {
            let err = Error::PeerLost { op: req.op, peer, reason };
            self.settle(&req.cell, Err(err));
            return;
        }
        if matches!(req.kind, WrKind::Recv) {
            self.push_direct(req);
            return;
        }
        self.kick_if_asleep(req.peer);
        let req = if req.seg.len > self.sched.config().max_message
            && matches!(req.kind, WrKind::Send { imm: None })
            && req.batch.is_none()
        {
            match self.offer(req) {
                Some(marker) => marker,
                None => return,
            }
        } else {
            req
        };
        let len = req.len();
        let class = req.class.unwrap_or_else(|| self.sched.config().default_class(len));
        let plain = req.batch.is_none();
        if self.bypasses_scheduler(class, plain, len) {
            self.sched.note_latency();
            self.push_direct(req);
            return;
        }
        let one_sided = matches!(req.kind, WrKind::Write { .. } | WrKind::Read { .. });
        let p = &self.peers[req.peer];
        // Messages stay on the first lane, where the peer posts its receives. With several
        // lanes, the first is the express lane: bulk rotates over the others, so a latency op
        // (which takes the least-loaded lane) finds one with no bulk queued on it.
        let lanes = match (one_sided, class) {
            (false, _) => p.msg_lane.clone(),
            (true, Class::Bulk) if p.lane_ids.len() > 1 => p.bulk_lanes.clone(),
            (true, _) => p.lane_ids.clone(),
        };
        let lanes = match (one_sided, &req.rail_keys) {
            (true, keys) => p.keyed(lanes, 1 + keys.as_ref().map_or(0, |k| k.len())),
            (false, _) => lanes,
        };
        // An immediate value raises one event per work request: ops carrying one are not split
        // (a batch's pieces each carry it, one work request apiece), except a plain write above
        // the largest message: its last piece alone carries the value, and goes out once the
        // rest has landed.
        let imm = matches!(req.kind, WrKind::Write { imm: Some(_), .. });
        let max = self.sched.config().max_message;
        let tail = if imm && plain && len > max { max } else { 0 };
        let cuts = req.batch.as_ref().map(|b| b.cuts.clone());
        let splittable = one_sided && (!imm || tail > 0);
        let spec = OpSpec { tenant: req.tenant, class, len, lanes, splittable, cuts, tail };
        let id = self.sched.push(spec);
        if self.held.len() <= id.0 {
            self.held.resize_with(id.0 + 1, || None);
        }
        self.held[id.0] = Some(Held { req, error: None, posted: 0 });
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Op(req) => {
                Counters::add(&self.counters.submitted);
                self.accept(req)
            }
            Cmd::SetWeight { tenant, weight } => self.sched.set_weight(tenant, weight),
            Cmd::Register { ptr, len, access, reply } => {
                Counters::add(&self.counters.registrations);
                let res = lease::register(self.t.as_mut(), ptr as *mut u8, len, access);
                if let (Ok(mr), true) = (&res, access.is_remote()) {
                    self.audit.exposed(mr, len, access);
                }
                let _ = reply.send(res);
            }
            Cmd::Exposed { mr, len, access } => self.audit.exposed(&mr, len, access),
            Cmd::Deregister { id, keep, reply } => {
                self.audit.withdrawn(id);
                let res = self.t.deregister(id);
                if let Err(e) = &res {
                    tracing::warn!(id, error = %e, "deregistration failed");
                }
                drop(keep);
                if let Some(reply) = reply {
                    let _ = reply.send(res);
                }
            }
            Cmd::OpenLanes { reply, .. } if self.phase != Phase::Running => {
                let _ =
                    reply.send(Err(self.local_error(FailureClass::Other, "the runtime is shutting down")));
            }
            Cmd::OpenLanes { rails, reply } => {
                let mut opened = Vec::with_capacity(rails.len());
                for rail in rails {
                    match self.t.open_lane(rail) {
                        Ok(l) => {
                            if self.lane_rail.len() <= l.0 {
                                self.lane_rail.resize(l.0 + 1, 0);
                            }
                            self.lane_rail[l.0] = self.rail_ids.get(rail).copied().unwrap_or(rail);
                            opened.push(l)
                        }
                        Err(e) => {
                            opened.iter().for_each(|(l, _)| self.t.close_lane(*l));
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = reply.send(Ok(opened));
            }
            Cmd::AddPeer { lanes, reply, .. } if self.phase != Phase::Running => {
                lanes.iter().for_each(|l| self.t.close_lane(l.0));
                let _ =
                    reply.send(Err(self.local_error(FailureClass::Other, "the runtime is shutting down")));
            }
            Cmd::AddPeer { id, lanes, rails, label, ctl, reply } => {
                let res: Result<Vec<(LaneId, PeerAddr, usize)>, TransportError> = lanes
                    .iter()
                    .map(|(l, name, i)| self.t.connect_lane(*l, name).map(|a| (*l, a, rail_of(*i, rails))))
                    .collect();
                let res = res.map(|lanes| {
                    let lane_ids: Arc<[LaneId]> = lanes.iter().map(|(l, ..)| *l).collect();
                    let msg_lane = lane_ids[..1].into();
                    // Behind the express lane (place 0), where this group holds it, bulk
                    // rotates over the others.
                    let express = lanes.first().is_some_and(|l| l.2 == 0);
                    let bulk_lanes =
                        if express && lane_ids.len() > 1 { lane_ids[1..].into() } else { lane_ids.clone() };
                    let peer = Peer {
                        id,
                        label,
                        lanes,
                        lane_ids,
                        rails: rails.max(1),
                        msg_lane,
                        bulk_lanes,
                        lost: None,
                        inflight: 0,
                        ctl,
                        checks: (self.now, 0),
                        refused: (self.now, 0),
                        asked: (self.now, 0),
                        asleep: false,
                        announced: false,
                    };
                    self.peers.insert(peer)
                });
                if res.is_err() {
                    lanes.iter().for_each(|l| self.t.close_lane(l.0));
                }
                let _ = reply.send(res);
            }
            Cmd::CloseLanes { lanes } => lanes.iter().for_each(|&l| self.t.close_lane(l)),
            Cmd::RemovePeer { slot } => {
                if self.peers.contains(slot) {
                    self.lose_peer(slot, "endpoint closed".into());
                    self.peers.remove(slot);
                }
            }
            Cmd::PeerLost { slot, reason } => {
                if self.peers.get(slot).is_some_and(|p| p.lost.is_none()) {
                    tracing::info!(peer = %self.peers[slot].label, %reason, "peer lost");
                    self.lose_peer(slot, reason);
                }
            }
            Cmd::Control { slot, peer_id, msg } => self.on_control(slot, peer_id, msg),
        }
    }

    /// Give up on a peer of our own accord (it misbehaved, or refused an op the provider leaves
    /// pending): tell it why, which ends the control connection so that it loses us too, then
    /// lose it.
    fn drop_peer(&mut self, slot: usize, reason: String) {
        if self.peers.get(slot).is_none_or(|p| p.lost.is_some()) {
            return;
        }
        tracing::warn!(peer = %self.peers[slot].label, %reason, "giving up on a peer");
        self.tell(slot, Ctl::Goodbye { reason: reason.clone() });
        self.lose_peer(slot, reason);
    }

    /// The peer is gone: fail what it has queued, close its lanes (after reaping what already
    /// completed), and fail what was posted on them, whose buffers are ours again.
    fn lose_peer(&mut self, slot: usize, reason: String) {
        let label = self.peers[slot].label.clone();
        self.fail_peer(slot, (label.clone(), reason.clone()));
        // Lost before reaping: what the reap would start for this peer (a rendezvous read)
        // fails at once instead of being queued behind the failure.
        self.peers[slot].lost = Some(reason.clone());
        while self.reap_now() {}
        let lanes = std::mem::take(&mut self.peers[slot].lanes);
        for (lane, ..) in &lanes {
            self.t.close_lane(*lane);
        }
        let ids: Vec<usize> = self.inflight.iter().filter(|(_, f)| f.peer == slot).map(|(k, _)| k).collect();
        for k in ids {
            let id = self.inflight[k].id;
            let e = TransportError {
                provider: String::new(),
                errno: 0,
                text: "lane closed".into(),
                class: FailureClass::PeerUnreachable,
            };
            self.complete(id, 0, None, Err(e));
        }
        let peer = self.peers[slot].label.clone();
        self.rendezvous_lost(slot, |op| Error::PeerLost { op, peer: peer.clone(), reason: reason.clone() });
        self.audit_lost(slot, Some(&reason));
    }

    /// Fail what a gone peer has queued: unposted receives at once, scheduled ops as soon as
    /// their posted chunks are back.
    fn fail_peer(&mut self, slot: usize, (peer, reason): (String, String)) {
        let (gone, kept) = std::mem::take(&mut self.direct).into_iter().partition(|r| r.peer == slot);
        self.direct = kept;
        for req in gone {
            let err = Error::PeerLost { op: req.op, peer: peer.clone(), reason: reason.clone() };
            self.settle(&req.cell, Err(err));
        }
        let ids: Vec<OpId> = self.sched.ops().collect();
        for id in ids {
            let Some(h) = self.held[id.0].as_mut() else {
                continue;
            };
            if h.req.peer != slot {
                continue;
            }
            h.error.get_or_insert(Error::PeerLost {
                op: h.req.op,
                peer: peer.clone(),
                reason: reason.clone(),
            });
            if let Some(done) = self.sched.fail(id) {
                self.finish_op(done);
            }
        }
    }

    /// An op the scheduler resolved: complete its cell.
    fn finish_op(&mut self, done: OpDone) {
        let Some(h) = self.held[done.op.0].take() else {
            return;
        };
        if done.ok {
            self.settle(&h.req.cell, Ok(Done { len: h.req.len(), imm: None }));
        } else if let Some(e) = h.error {
            self.settle(&h.req.cell, Err(e));
        } else {
            // Cancelled: its future is gone; nothing to tell.
            Counters::add(&self.counters.withdrawn);
        }
    }

    fn post(&mut self) -> bool {
        let mut work = self.post_direct();
        if self.sched.is_empty() {
            return work;
        }
        self.chunks.clear();
        self.sched.next(&mut self.chunks, self.sched.config().post_batch.max(1));
        let mut chunks = std::mem::take(&mut self.chunks);
        work |= !chunks.is_empty();
        // First the chunks whose op is gone or whose peer is lost go back; the rest are posted
        // together, each but the last flagged `more` so the provider may ring once.
        let mut i = 0;
        while i < chunks.len() {
            let c = chunks[i];
            let last_of_op = !chunks[i + 1..].iter().any(|x| x.op == c.op);
            let h = self.held[c.op.0].as_ref().expect("scheduled ops are held");
            // Only the reactor holds the cell (here and in its posted chunks): the future was
            // dropped. Withdraw the rest.
            if h.req.cell.abandoned(1 + h.posted) {
                self.give_back(c, last_of_op, Scheduler::cancel);
                chunks.remove(i);
                continue;
            }
            let p = &self.peers[h.req.peer];
            if let Some((peer, reason)) = p.lost.as_ref().map(|r| (p.label.clone(), r.clone())) {
                let h = self.held[c.op.0].as_mut().expect("held");
                h.error.get_or_insert(Error::PeerLost { op: h.req.op, peer, reason });
                self.give_back(c, last_of_op, Scheduler::fail);
                chunks.remove(i);
                continue;
            }
            i += 1;
        }
        let mut segs = [LocalSeg { ptr: std::ptr::null_mut(), len: 0, desc: 0 }; MAX_SGE];
        for (i, &c) in chunks.iter().enumerate() {
            let h = self.held[c.op.0].as_ref().expect("held");
            let (peer_addr, peer_rail) = self.peers[h.req.peer].route(c.lane);
            let (kind, n) = piece(&h.req, c.offset, c.len, peer_rail, &mut segs);
            let entry = self.inflight.vacant_entry();
            self.generation += 1;
            let id = (self.generation << 24) | entry.key() as u64;
            let wr = WorkRequest {
                id,
                lane: c.lane,
                peer: peer_addr,
                kind,
                local: &segs[..n],
                more: i + 1 < chunks.len(),
            };
            match lease::post(self.t.as_mut(), &wr) {
                Ok(Posted::Queued) => {
                    Counters::add(&self.counters.posted);
                    self.counters.add_rail_bytes(self.lane_rail.get(c.lane).copied().unwrap_or(0), c.len);
                    let (cell, peer, op, seg) = (h.req.cell.clone(), h.req.peer, h.req.op, h.req.seg);
                    entry.insert(InFlight { id, cell, peer, op, chunk: Some(c), seg, kind });
                    if let Some(h) = self.held[c.op.0].as_mut() {
                        h.posted += 1;
                    }
                    self.peers[peer].inflight += 1;
                    self.active += 1;
                }
                Ok(Posted::Completed) => {
                    Counters::add(&self.counters.posted);
                    if let Some(done) = self.sched.complete(c, true) {
                        self.finish_op(done);
                    }
                }
                Err(PostError::Again) => {
                    // The queue is full: this chunk and the rest go back, to be posted first
                    // (those of an op withdrawn meanwhile are dropped, which may end it).
                    for &c in &chunks[i..] {
                        if let Some(done) = self.sched.unissue(c) {
                            self.finish_op(done);
                        }
                    }
                    break;
                }
                Err(PostError::Failed(e)) => {
                    let h = self.held[c.op.0].as_mut().expect("held");
                    let label = &self.peers[h.req.peer].label;
                    let e = Error::from_transport(h.req.op, label, e);
                    note_chunk_error(h, c.offset, e);
                    if let Some(done) = self.sched.complete(c, false) {
                        self.finish_op(done);
                    }
                }
            }
        }
        chunks.clear();
        self.chunks = chunks;
        work
    }

    fn post_direct(&mut self) -> bool {
        let mut work = false;
        while let Some(req) = self.direct.pop_front() {
            match self.post_req(req) {
                Ok(()) => work = true,
                Err(req) => {
                    self.direct.push_front(req);
                    break;
                }
            }
        }
        work
    }

    /// A chunk of an op that is not to be posted goes back; with the op's last chunk of the
    /// round, `end` (cancel or fail) withdraws the rest. Finishes the op if that ended it.
    fn give_back(&mut self, c: Chunk, last_of_op: bool, end: fn(&mut Scheduler, OpId) -> Option<OpDone>) {
        let done = match self.sched.unissue(c) {
            None if last_of_op => end(&mut self.sched, c.op),
            done => done,
        };
        if let Some(done) = done {
            self.finish_op(done);
        }
    }

    /// Post one op that bypasses the scheduler, or resolve it (withdrawn, peer lost, failed);
    /// it comes back only when the provider's queue is full.
    fn post_req(&mut self, req: OpReq) -> Result<(), OpReq> {
        if req.cell.abandoned(1) {
            Counters::add(&self.counters.withdrawn);
            return Ok(());
        }
        let p = &self.peers[req.peer];
        if let Some(reason) = &p.lost {
            let err = Error::PeerLost { op: req.op, peer: p.label.clone(), reason: reason.clone() };
            self.settle(&req.cell, Err(err));
            return Ok(());
        }
        let (id, posted) = self.post_whole(req.peer, req.kind, req.seg);
        match posted {
            Ok(Posted::Completed) => {
                self.settle(&req.cell, Ok(Done { len: req.seg.len, imm: None }));
            }
            Ok(Posted::Queued) => {
                let (cell, peer, op, seg, kind) = (req.cell, req.peer, req.op, req.seg, req.kind);
                self.in_flight(InFlight { id, cell, peer, op, chunk: None, seg, kind });
            }
            Err(PostError::Again) => return Err(req),
            Err(PostError::Failed(e)) => {
                let label = &self.peers[req.peer].label;
                self.settle(&req.cell, Err(Error::from_transport(req.op, label, e)));
            }
        }
        Ok(())
    }

    /// Post a whole op that bypasses the scheduler (on the peer's first lane, where its
    /// receives are), as the request id returned, the next free slot of `inflight`.
    fn post_whole(&mut self, peer: usize, kind: WrKind, seg: LocalSeg) -> (u64, Result<Posted, PostError>) {
        let (lane, addr, _) = self.peers[peer].lanes[0];
        self.generation += 1;
        let id = (self.generation << 24) | self.inflight.vacant_key() as u64;
        // A receive larger than any message the provider takes posts what it can take: a
        // larger message comes as a rendezvous marker and is read into the whole buffer.
        let local = LocalSeg { len: seg.len.min(self.provider_max), ..seg };
        let wr = WorkRequest { id, lane, peer: addr, kind, local: std::slice::from_ref(&local), more: false };
        let posted = lease::post(self.t.as_mut(), &wr);
        if posted.is_ok() {
            Counters::add(&self.counters.posted);
        }
        (id, posted)
    }

    /// A request `post_whole` posted is in flight.
    fn in_flight(&mut self, f: InFlight) {
        if f.op != OpKind::Recv {
            self.active += 1;
        }
        self.peers[f.peer].inflight += 1;
        let slot = self.inflight.insert(f);
        debug_assert_eq!(
            Some(slot as u64),
            self.inflight.get(slot).map(|f| f.id & crate::base::transport::WR_SLOT_MASK)
        );
    }

    /// An op that bypasses the scheduler: posted now when nothing waits ahead of it.
    fn push_direct(&mut self, req: OpReq) {
        if !self.direct.is_empty() {
            self.direct.push_back(req);
        } else if let Err(req) = self.post_req(req) {
            self.direct.push_back(req);
        }
    }

    fn reap(&mut self) -> bool {
        let n = self.t.poll(&mut self.comps, POLL_BATCH);
        self.complete_polled(n)
    }

    /// As `reap`, reading the completion queues now even where the transport spaces its
    /// reads: a drain must see what has arrived.
    fn reap_now(&mut self) -> bool {
        let n = self.t.poll_now(&mut self.comps, POLL_BATCH);
        self.complete_polled(n)
    }

    /// Complete the `n` completions just polled into `comps`; false when there were none.
    fn complete_polled(&mut self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        let mut comps = std::mem::take(&mut self.comps);
        for c in comps.drain(..) {
            match c {
                Completion::Op { id, len, imm, status } => self.complete(id, len, imm, status),
                Completion::RemoteWrite { imm, len } => self.imm.push(imm, len),
            }
        }
        self.comps = comps;
        true
    }

    fn complete(&mut self, id: u64, len: usize, imm: Option<u64>, status: Result<(), TransportError>) {
        let slot = (id & crate::base::transport::WR_SLOT_MASK) as usize;
        if self.inflight.get(slot).is_none_or(|f| f.id != id) {
            // A completion from a lane closed since (its request was failed then).
            tracing::debug!(id, "stale completion ignored");
            return;
        }
        let f = self.inflight.remove(slot);
        let peer = &mut self.peers[f.peer];
        peer.inflight -= 1;
        let err = status.err().map(|e| match &peer.lost {
            Some(reason) => {
                Error::PeerLost { op: f.op, peer: peer.label.clone(), reason: format!("{reason}; {e}") }
            }
            None => Error::from_transport(f.op, &peer.label, e),
        });
        if let Some(Error::Transport { source, .. }) = &err {
            if source.class == FailureClass::Cancelled {
                // A dropped connection cancels every piece of a split op, the valid ones too,
                // and the op is asked about once: ask about its whole range. (A batch's pieces
                // are not one range: there, the piece.)
                let (kind, len) = match f.chunk.and_then(|c| self.held[c.op.0].as_ref()) {
                    Some(h) if h.req.batch.is_none() => (h.req.kind, h.req.len()),
                    _ => (f.kind, f.len()),
                };
                self.question(f.id, f.peer, f.op, kind, len, &f.cell);
            }
        }
        match f.chunk {
            Some(c) => {
                self.active -= 1;
                // The in-flight entry's reference to the cell goes now, before the scheduler
                // may resolve the op.
                drop(f.cell);
                if let Some(h) = self.held[c.op.0].as_mut() {
                    h.posted -= 1;
                }
                let ok = err.is_none();
                if let Some(e) = err {
                    if let Some(h) = self.held[c.op.0].as_mut() {
                        note_chunk_error(h, c.offset, e);
                    }
                }
                if let Some(done) = self.sched.complete(c, ok) {
                    self.finish_op(done);
                }
            }
            None => {
                if f.op != OpKind::Recv {
                    self.active -= 1;
                }
                let len = if f.op == OpKind::Recv { len } else { f.len() };
                let res = match err {
                    // Application sends carry no immediate data: this is a rendezvous marker.
                    None if f.op == OpKind::Recv && imm.is_some() => {
                        let token = imm.unwrap_or_default() as u32;
                        self.marker_arrived(f.peer, token, f.cell, f.seg);
                        return;
                    }
                    None => Ok(Done { len, imm }),
                    Some(e) => Err(e),
                };
                self.settle(&f.cell, res);
            }
        }
    }

    /// Fail everything queued, wait (bounded by `limit`) for posted ops, then close every lane
    /// (after which no NIC touches a posted buffer) and fail what never completed. Once: later
    /// calls return at once.
    pub(crate) fn shutdown(&mut self, limit: Duration) {
        self.begin_shutdown(Instant::now() + limit);
        while !self.shutdown_step(Instant::now()) {
            if matches!(self.phase, Phase::Parting { .. }) {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Stop taking work: fail what is queued (commands included) and start draining what is
    /// posted, until `deadline`. Does nothing once begun.
    pub(crate) fn begin_shutdown(&mut self, deadline: Instant) {
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::Draining { deadline };
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Cmd::Op(req) => {
                    Counters::add(&self.counters.submitted);
                    self.settle(&req.cell, Err(Error::Shutdown { op: req.op }))
                }
                other => self.handle(other),
            }
        }
        for req in std::mem::take(&mut self.direct) {
            self.settle(&req.cell, Err(Error::Shutdown { op: req.op }));
        }
        let ids: Vec<OpId> = self.sched.ops().collect();
        for id in ids {
            if let Some(h) = self.held[id.0].as_mut() {
                h.error.get_or_insert(Error::Shutdown { op: h.req.op });
            }
            if let Some(done) = self.sched.fail(id) {
                self.finish_op(done);
            }
        }
    }

    /// One step of a shutdown at time `now` (begun now if it was not); true once stopped.
    pub(crate) fn shutdown_step(&mut self, now: Instant) -> bool {
        self.now = now;
        match self.phase {
            Phase::Running => {
                self.begin_shutdown(now);
                false
            }
            Phase::Draining { deadline } => {
                if self.active > 0 && now < deadline {
                    self.reap();
                    return false;
                }
                self.drained.fetch_add(1, Ordering::AcqRel);
                self.phase = Phase::Parting { deadline };
                false
            }
            Phase::Parting { deadline } => {
                // The first group tells the peers (the control connection is the runtime's),
                // once every group has drained: a peer told early would fail the ops the
                // others still drain.
                let others = self.drained.load(Ordering::Acquire) < self.groups as usize;
                if self.group == 0 && others && now < deadline {
                    return false;
                }
                self.part();
                self.phase = Phase::Stopped;
                true
            }
            Phase::Stopped => true,
        }
    }

    /// The end of a shutdown: tell the peers, close every lane, fail what never completed.
    fn part(&mut self) {
        // Told, the peers close their lanes to us as we close ours (on shm in one process,
        // ours wait for theirs: see rdmalane-efa's shm_peers).
        let slots: Vec<usize> = self.peers.iter().map(|(k, _)| k).collect();
        if self.group == 0 {
            for &slot in &slots {
                if self.peers[slot].lost.is_none() {
                    self.tell(slot, Ctl::Goodbye { reason: "its runtime shut down".into() });
                }
            }
        }
        // Close every lane: after that no request touches memory, so what is still posted
        // (receives, ops the deadline cut short) can give its buffer back.
        for slot in slots {
            for (lane, ..) in std::mem::take(&mut self.peers[slot].lanes) {
                self.t.close_lane(lane);
            }
        }
        for (_, f) in std::mem::take(&mut self.inflight) {
            let err = Error::Shutdown { op: f.op };
            match f.chunk {
                Some(c) => {
                    if let Some(h) = self.held[c.op.0].as_mut() {
                        h.error.get_or_insert(err);
                    }
                    if let Some(done) = self.sched.complete(c, false) {
                        self.finish_op(done);
                    }
                }
                None => self.settle(&f.cell, Err(err)),
            }
        }
        for slot in self.peers.iter().map(|(k, _)| k).collect::<Vec<_>>() {
            self.rendezvous_lost(slot, |op| Error::Shutdown { op });
            self.audit_lost(slot, None);
        }
        self.active = 0;
        self.idle.stopped.store(true, Ordering::Release);
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
