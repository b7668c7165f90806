//! Completion: reaping the provider's completion queue, matching each completion to its work
//! request, and settling the ops it ends.
use std::sync::Arc;

use super::action::Outbox;
use super::cell::{Done, OpCell};
use super::{settle_cell, Held, Reactor, POLL_BATCH};
use crate::base::error::OpKind;
use crate::base::error::{Error, FailureClass, TransportError};
use crate::base::probe::{self, Stage};
use crate::base::sched::{Chunk, OpDone};
use crate::base::stats::Counters;
use crate::base::transport::Completion;
use crate::base::transport::WrId;

/// A batch failing with pieces still unposted (withdrawn with the failure, so never failed
/// themselves): the error names the first piece that did not land, which may be one of those
/// (a range handed back by a full queue, re-issued first, sits before the failing one). With
/// one lane that is the failing piece; with several, it may come before it.
pub(super) fn note_unposted(h: &mut Held, unposted: Option<usize>) {
    let (Some(b), Some(off)) = (&h.req.batch, unposted) else { return };
    let first = b.piece_at(off);
    if let Some(Error::Batch { piece, .. }) = &mut h.error {
        *piece = (*piece).min(first);
    }
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
    /// Chunk `c` of a scheduled op failed with `e`: record it on the op, naming the batch
    /// piece that did not land first (see [`note_unposted`]).
    pub(super) fn chunk_failed(&mut self, c: Chunk, e: Error) {
        let unposted = self.sched.first_unposted(c.op);
        if let Some(h) = self.held[c.op.0].as_mut() {
            note_chunk_error(h, c.offset, e);
            note_unposted(h, unposted);
        }
    }

    /// Finish an op with `res`: the one way an op's outcome leaves the reactor. While the
    /// audit or the rendezvous have something in progress, they see it first: the audit may
    /// hold a failure back until its target's verdict, and a rendezvous turns a marker's or a
    /// pull's outcome into its send's or receive's.
    pub(super) fn settle(&mut self, cell: &Arc<OpCell>, res: Result<Done, Error>) {
        if self.rndv.idle() && self.audit.idle() {
            settle_cell(&self.counters, cell, res);
            return;
        }
        if let Some(res) = self.audit.audited(cell, res) {
            self.settle_past_audit(cell, res);
        }
    }

    /// As [`settle`](Self::settle), for an op the audit is done with.
    pub(super) fn settle_past_audit(&mut self, cell: &Arc<OpCell>, res: Result<Done, Error>) {
        let mut out = Outbox::new();
        if let Some(res) = self.rndv.settled(cell, res, &mut out) {
            settle_cell(&self.counters, cell, res);
        }
        self.apply(out);
    }

    /// An op the scheduler resolved: complete its cell.
    pub(super) fn settle_held(&mut self, done: OpDone) {
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

    pub(super) fn reap(&mut self) -> bool {
        let n = self.t.poll(&mut self.comps, POLL_BATCH);
        if n == 0 {
            return false;
        }
        probe::mark(Stage::Reaped);
        self.complete_polled(n);
        probe::mark(Stage::Settled);
        true
    }

    /// As `reap`, reading the completion queues now even where the transport spaces its
    /// reads: a drain must see what has arrived.
    pub(super) fn reap_now(&mut self) -> bool {
        let n = self.t.poll_now(&mut self.comps, POLL_BATCH);
        self.complete_polled(n)
    }

    /// Complete the `n` completions just polled into `comps`; false when there were none.
    pub(super) fn complete_polled(&mut self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        let mut comps = std::mem::take(&mut self.comps);
        for c in comps.drain(..) {
            match c {
                Completion::Op { id, len, imm, status } => self.on_completion(id, len, imm, status),
                Completion::RemoteWrite { imm, len } => self.imm.push(imm, len),
            }
        }
        self.comps = comps;
        true
    }

    pub(super) fn on_completion(
        &mut self,
        id: WrId,
        len: usize,
        imm: Option<u64>,
        status: Result<(), Box<TransportError>>,
    ) {
        let slot = id.slot();
        if self.inflight.get(slot).is_none_or(|f| f.id != id) {
            // A completion from a lane closed since (its request was failed then).
            tracing::debug!(id = id.to_raw(), "stale completion ignored");
            return;
        }
        let f = self.inflight.remove(slot);
        let peer = &mut self.peers[f.peer];
        peer.inflight -= 1;
        let err = status.err().map(|e| match peer.lost() {
            Some(reason) => Error::PeerLost {
                op: f.op,
                peer: peer.label.clone(),
                reason: format!("{reason}; {e}").into(),
            },
            None => Error::from_transport(f.op, &peer.label, *e),
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
                self.question(&f, kind, len);
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
                    self.chunk_failed(c, e);
                }
                if let Some(done) = self.sched.complete(c, ok) {
                    self.settle_held(done);
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
                        self.marker_arrived(f, token);
                        return;
                    }
                    None => Ok(Done { len, imm }),
                    Some(e) => Err(e),
                };
                self.settle(&f.cell, res);
                OpCell::let_go(f.cell);
            }
        }
    }
}
