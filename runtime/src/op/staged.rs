//! An op on a device buffer that takes the staging path: the plan (`base::stage_plan`) says
//! which copy between device and mirror and which transfer of the mirror's bytes may start;
//! this starts them, the transfers as ordinary ops over parts of the mirror. Dropping it drops
//! the transfers in flight (each keeps its part of the mirror in its cell until its
//! completion); copies in flight are waited for by the device buffer before its memory goes.
use std::ops::Range;
use std::task::{Context, Poll};

use super::Op;
use crate::base::error::{Error, OpKind};
use crate::base::stage_plan::{Flow, StagePlan, Step};
use crate::base::transport::WrKind;
use crate::buf::staging::{CopyDir, CopyTicket, MirrorPart, StagedView};
use crate::reactor::cmd::Draft;
use crate::runtime::Runtime;

/// How much of a plain staged transfer one chunk (a copy and a transfer) covers: large enough
/// that a copy's launch is a small part of its time, small enough that the first chunk's
/// transfer starts soon after the op does.
pub(crate) const STAGE_CHUNK: usize = 2 << 20;

/// A staged op in progress.
pub(crate) struct StagedOp {
    rt: Runtime,
    /// The op as a whole would be posted; each transfer is a copy of it over its part.
    template: Draft,
    view: StagedView,
    plan: StagePlan,
    transfers: Vec<Option<Op<MirrorPart>>>,
    copies: Vec<(usize, CopyTicket)>,
    /// Bytes copied so far (for the runtime's counters).
    copied: usize,
}

impl StagedOp {
    /// The plan for `draft` over `view`: `locals` are a batch's local ranges.
    pub(crate) fn new(
        rt: Runtime,
        template: Draft,
        view: StagedView,
        locals: Option<Vec<Range<usize>>>,
    ) -> StagedOp {
        let flow = match template.op {
            OpKind::Read | OpKind::Recv => Flow::In,
            _ => Flow::Out,
        };
        let len = view.len;
        let plan = match (&locals, &template.kind) {
            (Some(l), _) => StagePlan::batch(flow, len, l.clone()),
            (None, WrKind::Send { .. } | WrKind::Recv) => StagePlan::whole(flow, len),
            (None, WrKind::Write { imm, .. }) => StagePlan::chunked(flow, len, STAGE_CHUNK, imm.is_some()),
            (None, WrKind::Read { .. }) => StagePlan::chunked(flow, len, STAGE_CHUNK, false),
        };
        let n = plan.transfers();
        StagedOp {
            rt,
            template,
            view,
            plan,
            transfers: (0..n).map(|_| None).collect(),
            copies: Vec::new(),
            copied: 0,
        }
    }

    /// The template, to set the class and tenant of every transfer.
    pub(crate) fn template_mut(&mut self) -> &mut Draft {
        &mut self.template
    }

    /// Transfer `j` of the plan as an op.
    fn transfer(&self, j: usize) -> Op<MirrorPart> {
        let range = self.plan.transfer_range(j);
        let mut d = self.template.clone();
        if d.batch.is_none() {
            let last = j + 1 == self.plan.transfers();
            d.kind = match d.kind {
                WrKind::Write { remote_addr, key, imm } => {
                    let imm = imm.filter(|_| last);
                    if imm.is_none() {
                        d.op = OpKind::Write;
                    } else {
                        // As any plain write's: raised once, by the piece that ends it.
                        d.slots = None;
                    }
                    WrKind::Write { remote_addr: remote_addr + range.start as u64, key, imm }
                }
                WrKind::Read { remote_addr, key } => {
                    WrKind::Read { remote_addr: remote_addr + range.start as u64, key }
                }
                k => k,
            };
        }
        Op::new(&self.rt, d, self.view.mirror_part(range))
    }

    /// Drive the plan: start what it allows, look at copies and transfers in flight.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, Error>> {
        loop {
            let mut moved = false;
            while let Some(step) = self.plan.next() {
                moved = true;
                match step {
                    Step::Copy(i) => {
                        let range = self.plan.copy_range(i);
                        let dir = match self.template.op {
                            OpKind::Read | OpKind::Recv => CopyDir::ToDevice,
                            _ => CopyDir::ToMirror,
                        };
                        self.copied += range.len();
                        match self.view.start_copy(dir, range) {
                            Ok(t) => self.copies.push((i, t)),
                            Err(e) => self.plan.copy_failed(i, e),
                        }
                    }
                    Step::Post(j) => self.transfers[j] = Some(self.transfer(j)),
                }
            }
            let mut k = 0;
            while k < self.copies.len() {
                let (i, t) = self.copies[k];
                match self.view.copy_done(t) {
                    Ok(true) => {
                        self.copies.swap_remove(k);
                        self.plan.copied(i);
                        moved = true;
                    }
                    Ok(false) => k += 1,
                    Err(e) => {
                        self.copies.swap_remove(k);
                        self.plan.copy_failed(i, e);
                        moved = true;
                    }
                }
            }
            for j in 0..self.transfers.len() {
                let Some(op) = self.transfers[j].as_mut() else { continue };
                if let Poll::Ready((res, _part)) = std::pin::Pin::new(op).poll(cx) {
                    self.transfers[j] = None;
                    self.plan.transferred(j, res);
                    moved = true;
                }
            }
            // On failure the plan waits for the copies and transfers in flight: the buffer goes
            // back to its owner only once neither the device nor the NIC touches it.
            if let Some(out) = self.plan.outcome() {
                self.rt.count_staged_bytes(self.copied);
                return Poll::Ready(out);
            }
            if !moved {
                break;
            }
        }
        if !self.copies.is_empty() {
            // A copy's end wakes nobody: look again soon (the task stays runnable while the
            // device copies, a few milliseconds at most per chunk).
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

use std::future::Future;
