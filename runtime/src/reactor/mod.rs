//! The reactor: owns the transport, takes commands from the submission queue, posts, polls the
//! completion queue in batches and completes op cells. One thread drives it at a time: its own
//! pinned thread ([`thread`]) or a caller of `Runtime::block_on` (inline driver).
pub(crate) mod cmd;
pub(crate) mod thread;

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::buf::lease;
use crate::error::{Error, OpKind, TransportError};
use crate::imm::ImmQueue;
use crate::op::{Complete, Done};
use crate::stats::Counters;
use crate::transport::{Completion, PeerAddr, PostError, Posted, Transport, WorkRequest, WrKind};
use cmd::{Cmd, OpReq};
use std::sync::atomic::Ordering;
use thread::Idle;

/// Completions reaped per poll call.
const POLL_BATCH: usize = 64;

struct InFlight {
    cell: Arc<dyn Complete>,
    peer: usize,
    op: OpKind,
    /// Bytes the request moves (completions report a length only for receives).
    len: usize,
    /// Receives wait for the peer; they do not keep the reactor spinning.
    passive: bool,
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
    queue: VecDeque<OpReq>,
    inflight: Slab<InFlight>,
    peers: Slab<Peer>,
    comps: Vec<Completion>,
    imm: Arc<ImmQueue>,
    /// Posted ops that are not passive receives.
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

impl Reactor {
    pub(crate) fn new(
        t: Box<dyn Transport>,
        rx: Receiver<Cmd>,
        imm: Arc<ImmQueue>,
        grace: Duration,
        counters: Arc<Counters>,
        idle: Arc<Idle>,
    ) -> Reactor {
        Reactor {
            t,
            rx,
            queue: VecDeque::new(),
            inflight: Slab::with_capacity(1024),
            peers: Slab::new(),
            comps: Vec::with_capacity(POLL_BATCH),
            imm,
            active: 0,
            lost_peers: 0,
            grace,
            disconnected: false,
            counters,
            idle,
        }
    }

    /// One round: take commands, post what the queue allows, reap completions. True if anything
    /// happened.
    pub(crate) fn turn(&mut self) -> bool {
        let mut work = self.take_commands();
        work |= self.post_queued();
        work |= self.reap();
        if self.lost_peers > 0 {
            self.expire_lost();
        }
        work
    }

    /// Queue an op from the driving thread and post what can be posted, commands first so
    /// nothing overtakes them.
    pub(crate) fn submit_now(&mut self, req: OpReq) {
        self.take_commands();
        self.queue.push_back(req);
        self.post_queued();
    }

    /// Ops are posted or queued that will complete without the peer's help.
    pub(crate) fn busy(&self) -> bool {
        self.active > 0 || !self.queue.is_empty()
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

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Op(req) => self.queue.push_back(req),
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
                    let label = p.label.clone();
                    self.fail_queued(slot, |op| Error::PeerLost {
                        op,
                        peer: label.clone(),
                        reason: "endpoint closed".into(),
                    });
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
                self.fail_queued(slot, |op| Error::PeerLost {
                    op,
                    peer: label.clone(),
                    reason: reason.clone(),
                });
                // Receives would wait for the peer forever; sends and writes get a grace period
                // to fail on their own (see expire_lost).
                self.cancel_posted(slot, true);
            }
        }
    }

    fn fail_queued(&mut self, slot: usize, err: impl Fn(OpKind) -> Error) {
        let counters = &self.counters;
        self.queue.retain(|req| {
            if req.peer != slot {
                return true;
            }
            resolve(counters, &req.cell, Err(err(req.op)));
            false
        });
    }

    /// Cancel posted requests of a peer (all, or only the receives waiting on it).
    fn cancel_posted(&mut self, slot: usize, receives_only: bool) {
        let ids: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, f)| f.peer == slot && (f.passive || !receives_only))
            .map(|(id, _)| id as u64)
            .collect();
        for id in ids {
            self.t.cancel(id);
        }
    }

    fn post_queued(&mut self) -> bool {
        let mut work = false;
        while let Some(req) = self.queue.front() {
            // Only the reactor holds the cell: its future was dropped before posting. Withdraw.
            if Arc::strong_count(&req.cell) == 1 {
                self.queue.pop_front();
                Counters::add(&self.counters.withdrawn);
                work = true;
                continue;
            }
            let peer = &self.peers[req.peer];
            if let Some((reason, _)) = &peer.lost {
                let err = Error::PeerLost {
                    op: req.op,
                    peer: peer.label.clone(),
                    reason: reason.clone(),
                };
                resolve(&self.counters, &req.cell, Err(err));
                self.queue.pop_front();
                work = true;
                continue;
            }
            let entry = self.inflight.vacant_entry();
            let wr = WorkRequest {
                id: entry.key() as u64,
                peer: peer.addr,
                kind: req.kind,
                local: std::slice::from_ref(&req.seg),
                more: false,
            };
            match lease::post(self.t.as_mut(), &wr) {
                Ok(Posted::Completed) => {
                    let req = self.queue.pop_front().expect("front exists");
                    Counters::add(&self.counters.posted);
                    resolve(
                        &self.counters,
                        &req.cell,
                        Ok(Done {
                            len: req.seg.len,
                            imm: None,
                        }),
                    );
                    work = true;
                }
                Ok(Posted::Queued) => {
                    let req = self.queue.pop_front().expect("front exists");
                    Counters::add(&self.counters.posted);
                    let passive = matches!(req.kind, WrKind::Recv);
                    entry.insert(InFlight {
                        cell: req.cell,
                        peer: req.peer,
                        op: req.op,
                        len: req.seg.len,
                        passive,
                    });
                    self.peers[req.peer].inflight += 1;
                    if !passive {
                        self.active += 1;
                    }
                    work = true;
                }
                Err(PostError::Again) => break,
                Err(PostError::Failed(e)) => {
                    let req = self.queue.pop_front().expect("front exists");
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
                Completion::Op { id, len, imm, status } => self.finish(id as usize, len, imm, status),
                Completion::RemoteWrite { imm, len } => self.imm.push(imm, len),
            }
        }
        self.comps = comps;
        true
    }

    fn finish(&mut self, id: usize, len: usize, imm: Option<u64>, status: Result<(), TransportError>) {
        let Some(f) = self.inflight.try_remove(id) else {
            tracing::error!(id, "completion for an unknown work request");
            return;
        };
        if !f.passive {
            self.active -= 1;
        }
        let peer = &mut self.peers[f.peer];
        peer.inflight -= 1;
        let res = match status {
            Ok(()) => Ok(Done {
                len: if f.passive { len } else { f.len },
                imm,
            }),
            Err(e) => match &peer.lost {
                Some((reason, _)) => Err(Error::PeerLost {
                    op: f.op,
                    peer: peer.label.clone(),
                    reason: format!("{reason}; {e}"),
                }),
                None => Err(Error::from_transport(f.op, &peer.label, e)),
            },
        };
        resolve(&self.counters, &f.cell, res);
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
    /// then the peer is removed from the address vector, which makes the provider flush them.
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
        for req in std::mem::take(&mut self.queue) {
            resolve(&self.counters, &req.cell, Err(Error::Shutdown { op: req.op }));
        }
        // Receives wait for peers that may never send: cancel them by failing their futures
        // only after the transport is gone (see below).
        let deadline = Instant::now() + limit;
        while self.active > 0 && Instant::now() < deadline {
            self.reap();
        }
        let left = self.inflight.len();
        if left > 0 {
            tracing::debug!(
                left,
                "ops still posted at shutdown: their buffers are leaked, never freed under DMA"
            );
            for f in self.inflight.drain() {
                resolve(&self.counters, &f.cell, Err(Error::Shutdown { op: f.op }));
                std::mem::forget(f.cell);
            }
        }
    }
}
