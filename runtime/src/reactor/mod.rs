//! The reactor: owns the transport, takes commands from the submission queue, asks the
//! fair-share scheduler what to post, posts it, polls the completion queue in batches and
//! completes op cells. One thread drives it at a time: its own pinned thread ([`thread`]) or a
//! caller of `Runtime::block_on` (inline driver).
pub(crate) mod cmd;
pub(crate) mod thread;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::buf::lease;
use crate::error::{Error, OpKind, TransportError};
use crate::imm::ImmQueue;
use crate::op::{Complete, Done};
use crate::sched::{Chunk, OpDone, OpId, OpSpec, SchedConfig, Scheduler};
use crate::stats::Counters;
use crate::transport::{Completion, LocalSeg, PeerAddr, PostError, Posted, Transport, WorkRequest, WrKind};
use cmd::{Cmd, OpReq};
use thread::Idle;

/// Completions reaped per poll call.
const POLL_BATCH: usize = 64;
/// Chunks asked of the scheduler per round.
const POST_BATCH: usize = 32;

struct InFlight {
    cell: Arc<dyn Complete>,
    peer: usize,
    op: OpKind,
    /// The scheduler's chunk; `None` for receives, which bypass it.
    chunk: Option<Chunk>,
}

/// An op the scheduler holds, with what the reactor needs to post its chunks.
struct Held {
    req: OpReq,
    /// The first failure among its chunks.
    error: Option<Error>,
}

struct Peer {
    addr: PeerAddr,
    label: String,
    lost: Option<(String, Instant)>,
    closing: bool,
    inflight: usize,
    in_av: bool,
}

pub(crate) struct Reactor {
    t: Box<dyn Transport>,
    rx: Receiver<Cmd>,
    sched: Scheduler,
    /// Ops in the scheduler, indexed by their `OpId`.
    held: Vec<Option<Held>>,
    /// Receives wait here only when the provider's queue is full.
    receives: VecDeque<OpReq>,
    inflight: Slab<InFlight>,
    peers: Slab<Peer>,
    comps: Vec<Completion>,
    chunks: Vec<Chunk>,
    imm: Arc<ImmQueue>,
    /// Posted requests that are not passive receives.
    active: usize,
    lost_peers: usize,
    grace: Duration,
    disconnected: bool,
    counters: Arc<Counters>,
    idle: Arc<Idle>,
}

/// Complete an op cell and count the outcome.
fn resolve(counters: &Counters, cell: &Arc<dyn Complete>, res: Result<Done, Error>) {
    Counters::add(if res.is_ok() {
        &counters.completed
    } else {
        &counters.failed
    });
    cell.complete(res);
}

/// The work request for `len` bytes at `offset` into an op.
fn piece(kind: WrKind, seg: LocalSeg, offset: usize, len: usize) -> (WrKind, LocalSeg) {
    let seg = LocalSeg {
        ptr: seg.ptr.wrapping_add(offset),
        len,
        desc: seg.desc,
    };
    let kind = match kind {
        WrKind::Write {
            remote_addr,
            key,
            imm,
        } => WrKind::Write {
            remote_addr: remote_addr + offset as u64,
            key,
            imm,
        },
        WrKind::Read { remote_addr, key } => WrKind::Read {
            remote_addr: remote_addr + offset as u64,
            key,
        },
        other => other,
    };
    (kind, seg)
}

impl Reactor {
    pub(crate) fn new(
        t: Box<dyn Transport>,
        rx: Receiver<Cmd>,
        imm: Arc<ImmQueue>,
        grace: Duration,
        counters: Arc<Counters>,
        idle: Arc<Idle>,
        sched: SchedConfig,
    ) -> Reactor {
        Reactor {
            t,
            rx,
            sched: Scheduler::new(sched),
            held: Vec::new(),
            receives: VecDeque::new(),
            inflight: Slab::with_capacity(1024),
            peers: Slab::new(),
            comps: Vec::with_capacity(POLL_BATCH),
            chunks: Vec::with_capacity(POST_BATCH),
            imm,
            active: 0,
            lost_peers: 0,
            grace,
            disconnected: false,
            counters,
            idle,
        }
    }

    /// One round: take commands, reap completions, then post what the scheduler allows (lazy
    /// posting from the completion loop). True if anything happened.
    pub(crate) fn turn(&mut self) -> bool {
        let mut work = self.take_commands();
        work |= self.reap();
        work |= self.post();
        if self.lost_peers > 0 {
            self.expire_lost();
        }
        work
    }

    /// Queue an op from the driving thread and post what can be posted, commands first so
    /// nothing overtakes them.
    pub(crate) fn submit_now(&mut self, req: OpReq) {
        self.take_commands();
        self.accept(req);
        self.post();
    }

    /// Ops are posted or queued that will complete without the peer's help.
    pub(crate) fn busy(&self) -> bool {
        self.active > 0 || !self.sched.is_empty() || !self.receives.is_empty()
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
        if matches!(req.kind, WrKind::Recv) {
            self.receives.push_back(req);
            return;
        }
        let one_sided = matches!(req.kind, WrKind::Write { .. } | WrKind::Read { .. });
        let spec = OpSpec {
            tenant: req.tenant,
            class: req
                .class
                .unwrap_or_else(|| self.sched.config().default_class(req.seg.len)),
            len: req.seg.len,
            // One lane per peer until the transport opens several endpoints.
            lanes: vec![req.peer],
            splittable: one_sided,
        };
        let id = self.sched.push(spec);
        if self.held.len() <= id.0 {
            self.held.resize_with(id.0 + 1, || None);
        }
        self.held[id.0] = Some(Held { req, error: None });
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Op(req) => self.accept(req),
            Cmd::SetWeight { tenant, weight } => self.sched.set_weight(tenant, weight),
            Cmd::Register {
                ptr,
                len,
                access,
                reply,
            } => {
                Counters::add(&self.counters.registrations);
                let _ = reply.send(lease::register(self.t.as_mut(), ptr as *mut u8, len, access));
            }
            Cmd::Deregister { id, keep, reply } => {
                let res = self.t.deregister(id);
                if let Err(e) = &res {
                    tracing::warn!(id, error = %e, "deregistration failed");
                }
                drop(keep);
                if let Some(reply) = reply {
                    let _ = reply.send(res);
                }
            }
            Cmd::AddPeer { name, label, reply } => {
                let res = self.t.insert_peer(&name).map(|addr| {
                    self.peers.insert(Peer {
                        addr,
                        label,
                        lost: None,
                        closing: false,
                        inflight: 0,
                        in_av: true,
                    })
                });
                let _ = reply.send(res);
            }
            Cmd::RemovePeer { slot } => {
                if let Some(p) = self.peers.get_mut(slot) {
                    p.closing = true;
                    let err = (p.label.clone(), "endpoint closed".to_string());
                    self.fail_peer(slot, err);
                    self.cancel_posted(slot, true);
                    self.maybe_forget(slot);
                }
            }
            Cmd::PeerLost { slot, reason } => {
                let Some(p) = self.peers.get_mut(slot) else { return };
                if p.lost.is_some() {
                    return;
                }
                tracing::info!(peer = %p.label, %reason, "peer lost");
                p.lost = Some((reason.clone(), Instant::now()));
                let label = p.label.clone();
                self.lost_peers += 1;
                self.fail_peer(slot, (label, reason));
                // Receives would wait for the peer forever; sends and writes get a grace period
                // to fail on their own (see expire_lost).
                self.cancel_posted(slot, true);
            }
        }
    }

    /// Fail what a gone peer has queued: unposted receives at once, scheduled ops as soon as
    /// their posted chunks are back.
    fn fail_peer(&mut self, slot: usize, (peer, reason): (String, String)) {
        let counters = &self.counters;
        self.receives.retain(|req| {
            if req.peer != slot {
                return true;
            }
            let err = Error::PeerLost {
                op: req.op,
                peer: peer.clone(),
                reason: reason.clone(),
            };
            resolve(counters, &req.cell, Err(err));
            false
        });
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

    /// Cancel posted requests of a peer (all, or only the receives waiting on it).
    fn cancel_posted(&mut self, slot: usize, receives_only: bool) {
        let ids: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, f)| f.peer == slot && (f.chunk.is_none() || !receives_only))
            .map(|(id, _)| id as u64)
            .collect();
        for id in ids {
            self.t.cancel(id);
        }
    }

    /// An op the scheduler resolved: complete its cell.
    fn finish_op(&mut self, done: OpDone) {
        let Some(h) = self.held[done.op.0].take() else {
            return;
        };
        if done.ok {
            resolve(
                &self.counters,
                &h.req.cell,
                Ok(Done {
                    len: h.req.seg.len,
                    imm: None,
                }),
            );
        } else if let Some(e) = h.error {
            resolve(&self.counters, &h.req.cell, Err(e));
        } else {
            // Cancelled: its future is gone; nothing to tell.
            Counters::add(&self.counters.withdrawn);
        }
    }

    fn post(&mut self) -> bool {
        let mut work = self.post_receives();
        self.chunks.clear();
        self.sched.next(&mut self.chunks, POST_BATCH);
        let mut chunks = std::mem::take(&mut self.chunks);
        let mut stop = false;
        for (i, &c) in chunks.iter().enumerate() {
            work = true;
            if stop {
                self.sched.unissue(c);
                continue;
            }
            let h = self.held[c.op.0].as_ref().expect("scheduled ops are held");
            // Only the reactor holds the cell: the future was dropped. Withdraw the rest.
            if Arc::strong_count(&h.req.cell) == 1 {
                self.sched.unissue(c);
                if !chunks[i + 1..].iter().any(|x| x.op == c.op) {
                    if let Some(done) = self.sched.cancel(c.op) {
                        self.finish_op(done);
                    }
                }
                continue;
            }
            let (peer_addr, lost) = {
                let p = &self.peers[h.req.peer];
                (p.addr, p.lost.as_ref().map(|(r, _)| (p.label.clone(), r.clone())))
            };
            if let Some((peer, reason)) = lost {
                let h = self.held[c.op.0].as_mut().expect("held");
                h.error.get_or_insert(Error::PeerLost {
                    op: h.req.op,
                    peer,
                    reason,
                });
                self.sched.unissue(c);
                if !chunks[i + 1..].iter().any(|x| x.op == c.op) {
                    if let Some(done) = self.sched.fail(c.op) {
                        self.finish_op(done);
                    }
                }
                continue;
            }
            let (kind, seg) = piece(h.req.kind, h.req.seg, c.offset, c.len);
            let entry = self.inflight.vacant_entry();
            let wr = WorkRequest {
                id: entry.key() as u64,
                peer: peer_addr,
                kind,
                local: std::slice::from_ref(&seg),
                more: false,
            };
            match lease::post(self.t.as_mut(), &wr) {
                Ok(Posted::Queued) => {
                    Counters::add(&self.counters.posted);
                    let (cell, peer, op) = (h.req.cell.clone(), h.req.peer, h.req.op);
                    entry.insert(InFlight {
                        cell,
                        peer,
                        op,
                        chunk: Some(c),
                    });
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
                    self.sched.unissue(c);
                    stop = true;
                }
                Err(PostError::Failed(e)) => {
                    let h = self.held[c.op.0].as_mut().expect("held");
                    let label = &self.peers[h.req.peer].label;
                    h.error.get_or_insert(Error::from_transport(h.req.op, label, e));
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

    fn post_receives(&mut self) -> bool {
        let mut work = false;
        while let Some(req) = self.receives.front() {
            if Arc::strong_count(&req.cell) == 1 {
                self.receives.pop_front();
                Counters::add(&self.counters.withdrawn);
                work = true;
                continue;
            }
            let entry = self.inflight.vacant_entry();
            let wr = WorkRequest {
                id: entry.key() as u64,
                peer: self.peers[req.peer].addr,
                kind: req.kind,
                local: std::slice::from_ref(&req.seg),
                more: false,
            };
            match lease::post(self.t.as_mut(), &wr) {
                Ok(_) => {
                    let req = self.receives.pop_front().expect("front exists");
                    Counters::add(&self.counters.posted);
                    entry.insert(InFlight {
                        cell: req.cell,
                        peer: req.peer,
                        op: req.op,
                        chunk: None,
                    });
                    self.peers[req.peer].inflight += 1;
                    work = true;
                }
                Err(PostError::Again) => break,
                Err(PostError::Failed(e)) => {
                    let req = self.receives.pop_front().expect("front exists");
                    let label = &self.peers[req.peer].label;
                    resolve(
                        &self.counters,
                        &req.cell,
                        Err(Error::from_transport(req.op, label, e)),
                    );
                    work = true;
                }
            }
        }
        work
    }

    fn reap(&mut self) -> bool {
        let n = self.t.poll(&mut self.comps, POLL_BATCH);
        if n == 0 {
            return false;
        }
        let mut comps = std::mem::take(&mut self.comps);
        for c in comps.drain(..) {
            match c {
                Completion::Op { id, len, imm, status } => self.complete(id as usize, len, imm, status),
                Completion::RemoteWrite { imm, len } => self.imm.push(imm, len),
            }
        }
        self.comps = comps;
        true
    }

    fn complete(&mut self, id: usize, len: usize, imm: Option<u64>, status: Result<(), TransportError>) {
        let Some(f) = self.inflight.try_remove(id) else {
            tracing::error!(id, "completion for an unknown work request");
            return;
        };
        let peer = &mut self.peers[f.peer];
        peer.inflight -= 1;
        let err = status.err().map(|e| match &peer.lost {
            Some((reason, _)) => Error::PeerLost {
                op: f.op,
                peer: peer.label.clone(),
                reason: format!("{reason}; {e}"),
            },
            None => Error::from_transport(f.op, &peer.label, e),
        });
        match f.chunk {
            Some(c) => {
                self.active -= 1;
                let ok = err.is_none();
                if let Some(e) = err {
                    if let Some(h) = self.held[c.op.0].as_mut() {
                        h.error.get_or_insert(e);
                    }
                }
                if let Some(done) = self.sched.complete(c, ok) {
                    self.finish_op(done);
                }
            }
            None => {
                let res = match err {
                    None => Ok(Done { len, imm }),
                    Some(e) => Err(e),
                };
                resolve(&self.counters, &f.cell, res);
            }
        }
        self.maybe_forget(f.peer);
    }

    /// Drop a peer from the address vector once nothing of it is in flight.
    fn maybe_forget(&mut self, slot: usize) {
        let p = &self.peers[slot];
        if p.closing && p.inflight == 0 {
            let p = self.peers.remove(slot);
            if p.lost.is_some() {
                self.lost_peers -= 1;
            }
            if p.in_av {
                self.t.remove_peer(p.addr);
            }
        }
    }

    /// A lost peer's posted ops get a grace period to complete with the provider's own error;
    /// then the peer is removed from the address vector and its requests cancelled.
    fn expire_lost(&mut self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        for (slot, p) in self.peers.iter_mut() {
            if let Some((_, since)) = &p.lost {
                if p.in_av && p.inflight > 0 && now.duration_since(*since) > self.grace {
                    tracing::warn!(peer = %p.label, inflight = p.inflight, "removing lost peer to flush its ops");
                    self.t.remove_peer(p.addr);
                    p.in_av = false;
                    expired.push(slot);
                }
            }
        }
        for slot in expired {
            self.cancel_posted(slot, false);
        }
    }

    /// Fail everything queued, wait (bounded) for posted ops, and leak what never completes
    /// rather than free memory a NIC may still touch.
    pub(crate) fn shutdown(&mut self, limit: Duration) {
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Cmd::Op(req) => resolve(&self.counters, &req.cell, Err(Error::Shutdown { op: req.op })),
                other => self.handle(other),
            }
        }
        for req in std::mem::take(&mut self.receives) {
            resolve(&self.counters, &req.cell, Err(Error::Shutdown { op: req.op }));
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
        let deadline = Instant::now() + limit;
        while self.active > 0 && Instant::now() < deadline {
            self.reap();
        }
        let left = self.inflight.len();
        if left > 0 {
            tracing::debug!(
                left,
                "requests still posted at shutdown: their buffers are leaked, never freed under DMA"
            );
            for f in self.inflight.drain() {
                resolve(&self.counters, &f.cell, Err(Error::Shutdown { op: f.op }));
                std::mem::forget(f.cell);
            }
        }
    }
}
