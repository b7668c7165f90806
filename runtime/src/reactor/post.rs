//! Posting: an op accepted from the submission queue goes to the scheduler or, where it skips
//! it (receives, latency ops with no bulk to get ahead of), straight to the provider; each
//! round posts the chunks the scheduler hands out, together, ringing once.
use crate::reactor::cmd::PeerSlot;
use std::sync::Arc;

use super::cell::{Done, OpCell};
use super::cmd::{Draft, OpReq};
use super::rendezvous::MAX_OFFERS;
use super::{Held, InFlight, Phase, Reactor};
use crate::base::batch::MAX_SGE;
use crate::base::control::Ctl;
use crate::base::error::Error;
use crate::base::error::OpKind;
use crate::base::probe::{self, Stage};
use crate::base::remote::RemoteBuf;
use crate::base::sched::{Chunk, Class, OpDone, OpId, OpSpec, Scheduler};
use crate::base::stats::Counters;
use crate::base::transport::WrId;
use crate::base::transport::{Access, LocalSeg, PostError, Posted, RailId, WorkRequest, WrKind};
use crate::buf::lease;

/// What became of an op posted at once ([`Reactor::post_at_once`]). Two words: it comes back
/// in registers (a value returned through memory, written field by field and read back whole,
/// stalls the read on store forwarding; that was a fifth of a small send's poll).
pub(crate) enum AtOnce {
    /// It finished as it was posted (the bytes moved), or failed: no cell was made.
    Finished(Result<usize, Box<Error>>),
    /// It is in flight, or queued behind a full provider queue: its outcome comes in this cell.
    InFlight(Arc<OpCell>),
}

/// The work request for `len` bytes at op offset `offset`, going to the peer's rail
/// `peer_rail`: its kind (remote address moved to the piece, the rail's key) and its local
/// segments, written to `segs`; returns how many.
fn piece(
    req: &OpReq,
    offset: usize,
    len: usize,
    peer_rail: RailId,
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
        (Some(keys), RailId(r)) if r > 0 => keys.get(r - 1).copied().unwrap_or(key),
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

impl Reactor {
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
    /// reference count touched, on a ping-pong's reply path. `None` for any other op, which
    /// goes to `submit_now`. (The draft is only looked at: the op's future keeps it, so the
    /// common path moves no request around.)
    pub(crate) fn post_at_once(&mut self, draft: &Draft, seg: LocalSeg) -> Option<AtOnce> {
        probe::mark(Stage::AtReactor);
        self.take_commands();
        let peer = draft.peer;
        let live = self.phase == Phase::Running
            && self.peers.get(peer).is_some_and(|p| p.id == draft.peer_id && p.lost().is_none());
        if !live || !self.direct.is_empty() || draft.batch.is_some() {
            return None;
        }
        if !matches!(draft.kind, WrKind::Recv) {
            let class = draft.class.unwrap_or_else(|| self.sched.config().default_class(seg.len));
            // (Not above the largest message either: no rendezvous.)
            if !self.bypasses_scheduler(class, true, seg.len) {
                return None;
            }
            let one_sided = matches!(draft.kind, WrKind::Write { .. } | WrKind::Read { .. });
            self.kick_if_asleep(peer, one_sided);
            self.sched.note_latency();
        }
        Counters::add(&self.counters.submitted);
        let id = self.next_id();
        let posted = self.post_whole(id, peer, draft.kind, seg);
        let (op, kind) = (draft.op, draft.kind);
        Some(match posted {
            Ok(Posted::Completed) => {
                Counters::add(&self.counters.completed);
                AtOnce::Finished(Ok(seg.len))
            }
            Ok(Posted::Queued) => {
                let (cell, mine) = OpCell::pair();
                self.in_flight(InFlight { id, cell, peer, op, chunk: None, seg, kind });
                AtOnce::InFlight(mine)
            }
            Err(PostError::Again) => {
                // A full provider queue (rare): the op waits in the direct queue, whole.
                let cell = OpCell::new();
                self.direct.push_back(draft.clone().into_req(seg, cell.clone()));
                AtOnce::InFlight(cell)
            }
            Err(PostError::Failed(e)) => {
                let err = Error::from_transport(op, &self.peers[peer].label, *e);
                Counters::add(&self.counters.failed);
                AtOnce::Finished(Err(Box::new(err)))
            }
        })
    }

    /// Does an op other than a receive skip the scheduler, posted directly? A plain
    /// (unbatched) latency op that goes whole, while the scheduler holds nothing.
    pub(super) fn bypasses_scheduler(&self, class: Class, plain: bool, len: usize) -> bool {
        let cfg = self.sched.config();
        class == Class::Latency
            && plain
            && self.sched.is_empty()
            && len <= cfg.chunk_size.min(cfg.max_message)
    }

    pub(super) fn accept(&mut self, req: OpReq) {
        if self.phase != Phase::Running {
            // Sent as the runtime stopped (its queue was drained already): the lanes are
            // closing or closed.
            self.settle(&req.cell, Err(Error::Shutdown { op: req.op }));
            return;
        }
        let peer = self.peers.get(req.peer).filter(|p| p.id == req.peer_id);
        let gone = match peer {
            None => Some((Arc::from("-"), Arc::from("endpoint closed"))),
            Some(p) => p.lost().map(|r| (p.label.clone(), r.clone())),
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
        self.kick_if_asleep(req.peer, matches!(req.kind, WrKind::Write { .. } | WrKind::Read { .. }));
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
        // Device memory moves whole where it fits (see `OpReq::device`).
        let splittable = one_sided && (!imm || tail > 0) && !(req.device && len <= max);
        let spec = OpSpec { tenant: req.tenant, class, len, lanes, splittable, cuts, tail };
        let id = self.sched.push(spec);
        if self.held.len() <= id.0 {
            self.held.resize_with(id.0 + 1, || None);
        }
        self.held[id.0] = Some(Held { req, error: None, posted: 0 });
    }

    pub(super) fn post(&mut self) -> bool {
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
            if let Some((peer, reason)) = p.lost().map(|r| (p.label.clone(), r.clone())) {
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
            let route = self.peers[h.req.peer].route(c.lane);
            let (kind, n) = piece(&h.req, c.offset, c.len, route.peer_rail, &mut segs);
            let entry = self.inflight.vacant_entry();
            self.generation += 1;
            let id = WrId::new(entry.key(), self.generation);
            let wr = WorkRequest {
                id,
                lane: c.lane,
                peer: route.addr,
                kind,
                local: &segs[..n],
                more: i + 1 < chunks.len(),
            };
            match lease::post(self.t.as_mut(), &wr) {
                Ok(Posted::Queued) => {
                    Counters::add(&self.counters.posted);
                    self.counters.add_rail_bytes(
                        self.lane_rail.get(c.lane.index()).copied().unwrap_or_default(),
                        c.len,
                    );
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
                        self.settle_held(done);
                    }
                }
                Err(PostError::Again) => {
                    // The queue is full: this chunk and the rest go back, to be posted first
                    // (those of an op withdrawn meanwhile are dropped, which may end it).
                    for &c in &chunks[i..] {
                        if let Some(done) = self.sched.unissue(c) {
                            self.settle_held(done);
                        }
                    }
                    break;
                }
                Err(PostError::Failed(e)) => {
                    let h = self.held[c.op.0].as_ref().expect("held");
                    let e = Error::from_transport(h.req.op, &self.peers[h.req.peer].label, *e);
                    self.chunk_failed(c, e);
                    if let Some(done) = self.sched.complete(c, false) {
                        self.settle_held(done);
                    }
                }
            }
        }
        chunks.clear();
        self.chunks = chunks;
        work
    }

    pub(super) fn post_direct(&mut self) -> bool {
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
    pub(super) fn give_back(
        &mut self,
        c: Chunk,
        last_of_op: bool,
        end: fn(&mut Scheduler, OpId) -> Option<OpDone>,
    ) {
        let done = match self.sched.unissue(c) {
            None if last_of_op => end(&mut self.sched, c.op),
            done => done,
        };
        if let Some(done) = done {
            self.settle_held(done);
        }
    }

    /// Post one op that bypasses the scheduler, or resolve it (withdrawn, peer lost, failed);
    /// it comes back only when the provider's queue is full.
    pub(super) fn post_req(&mut self, req: OpReq) -> Result<(), OpReq> {
        if req.cell.abandoned(1) {
            Counters::add(&self.counters.withdrawn);
            return Ok(());
        }
        let p = &self.peers[req.peer];
        if let Some(reason) = p.lost() {
            let err = Error::PeerLost { op: req.op, peer: p.label.clone(), reason: reason.clone() };
            self.settle(&req.cell, Err(err));
            return Ok(());
        }
        let id = self.next_id();
        let posted = self.post_whole(id, req.peer, req.kind, req.seg);
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
                self.settle(&req.cell, Err(Error::from_transport(req.op, label, *e)));
            }
        }
        Ok(())
    }

    /// The id of the next whole op posted: the next free slot of `inflight`, in a new
    /// generation.
    pub(super) fn next_id(&mut self) -> WrId {
        self.generation += 1;
        WrId::new(self.inflight.vacant_key(), self.generation)
    }

    /// Post a whole op that bypasses the scheduler (on the peer's first lane, where its
    /// receives are) as request `id` (from [`next_id`](Self::next_id)). The id is the
    /// caller's, not returned: the result alone comes back in registers.
    pub(super) fn post_whole(
        &mut self,
        id: WrId,
        peer: PeerSlot,
        kind: WrKind,
        seg: LocalSeg,
    ) -> Result<Posted, PostError> {
        let super::peers::Route { lane, addr, .. } = self.peers[peer].lanes[0];
        // A receive larger than any message the provider takes posts what it can take: a
        // larger message comes as a rendezvous marker and is read into the whole buffer.
        let local = LocalSeg { len: seg.len.min(self.provider_max), ..seg };
        let wr = WorkRequest { id, lane, peer: addr, kind, local: std::slice::from_ref(&local), more: false };
        probe::mark(Stage::Posting);
        let posted = lease::post(self.t.as_mut(), &wr);
        if posted.is_ok() {
            Counters::add(&self.counters.posted);
            if !matches!(kind, WrKind::Recv) {
                let rail = self.lane_rail.get(lane.index()).copied().unwrap_or_default();
                self.counters.add_rail_bytes(rail, local.len);
            }
        }
        posted
    }

    /// A request `post_whole` posted is in flight.
    pub(super) fn in_flight(&mut self, f: InFlight) {
        if f.op != OpKind::Recv {
            self.active += 1;
        }
        self.peers[f.peer].inflight += 1;
        let slot = self.inflight.insert(f);
        debug_assert_eq!(Some(slot), self.inflight.get(slot).map(|f| f.id.slot()));
    }

    /// An op that bypasses the scheduler: posted now when nothing waits ahead of it.
    pub(super) fn push_direct(&mut self, req: OpReq) {
        if !self.direct.is_empty() {
            self.direct.push_back(req);
        } else if let Err(req) = self.post_req(req) {
            self.direct.push_back(req);
        }
    }
}

impl Reactor {
    /// A send above the largest message: expose its buffer, offer it, and turn the request into
    /// its marker (see `rendezvous`). `None` when the send failed (its cell is resolved).
    fn offer(&mut self, mut req: OpReq) -> Option<OpReq> {
        if req.cell.abandoned(1) {
            // Its future is gone and nothing was posted: withdraw it, as any op.
            Counters::add(&self.counters.withdrawn);
            return None;
        }
        let len = req.seg.len;
        let label = self.peers[req.peer].label.clone();
        if self.rndv.outgoing_to(req.peer) >= MAX_OFFERS {
            // The peer would count one more offer as misbehaving and drop us.
            let reason =
                format!("{} messages above the largest message wait for the peer's receives", MAX_OFFERS);
            let e = Error::Backpressure { op: OpKind::Send, peer: label, reason: reason.into() };
            super::settle_cell(&self.counters, &req.cell, Err(e));
            return None;
        }
        // SAFETY of the registration (see `lease::register`): the cell, which holds the buffer
        // once the future is gone, stays with the rendezvous until it asks for the
        // deregistration (`Action::Withdraw`).
        let mr = match lease::register(self.t.as_mut(), req.seg.ptr, len, Access::READ) {
            Ok(mr) => mr,
            Err(e) => {
                let e = Error::from_transport(OpKind::Send, &label, e);
                super::settle_cell(&self.counters, &req.cell, Err(e));
                return None;
            }
        };
        // The keys of the host's rails 0, 1, ... this reactor's transport spans: a descriptor
        // names rails by host index, and the other rail groups' transports know nothing of
        // this registration.
        let prefix = self.rail_ids.iter().enumerate().take_while(|&(i, r)| i == r.0).count().max(1);
        let keys: Vec<u64> =
            std::iter::once(mr.key).chain(mr.rail_keys.iter().copied()).take(prefix).collect();
        let desc = RemoteBuf::new(0, mr.remote_base, len as u64, &keys, Access::READ);
        // Known to the audit like any exposure, so the peer's questions about its reads of it
        // get true answers.
        self.audit.exposed(&mr, len, Access::READ);
        let token = self.rndv.offered(req.peer, label, &req.cell, mr.id, len);
        self.tell(req.peer, Ctl::Offer { token, desc });
        req.class = Some(req.class.unwrap_or_else(|| self.sched.config().default_class(len)));
        req.kind = WrKind::Send { imm: Some(token as u64) };
        req.seg.len = 0;
        Some(req)
    }
}
