//! Splitting a bulk one-sided op across rail groups: each group's reactor drives its own
//! rails, so an op meant to stripe over every rail is cut into one part per group, in
//! proportion to the group's rails, and the parts complete the op together
//! ([`OpCell::fan_out`]). A plain op is cut into byte ranges, a batch between its work
//! requests (a part's failure still names the piece of the whole batch).
use std::sync::Arc;

use crate::base::sched::Class;
use crate::base::transport::{LocalSeg, WrKind};
use crate::reactor::cell::OpCell;
use crate::reactor::cmd::OpReq;
use crate::reactor::cmd::{GroupId, PeerSlot};

/// Parts are cut on multiples of this many bytes where the op is larger.
const ALIGN: usize = 4096;

/// The byte ranges `(offset, len)` of `len` bytes shared out by `weights` (one per group; 0
/// gets nothing), cut on multiples of `ALIGN` bytes; the last group with a weight takes the
/// remainder.
pub(crate) fn shares(len: usize, weights: &[usize]) -> Vec<(usize, usize)> {
    let total: usize = weights.iter().sum();
    let last = weights.iter().rposition(|&w| w > 0);
    let mut out = Vec::with_capacity(weights.len());
    let (mut at, mut acc) = (0usize, 0usize);
    for (g, &w) in weights.iter().enumerate() {
        acc += w;
        let end = if Some(g) == last || total == 0 {
            len
        } else {
            let exact = (len as u128 * acc as u128 / total as u128) as usize;
            (exact / ALIGN * ALIGN).clamp(at, len)
        };
        out.push((at, end - at));
        at = end;
    }
    out
}

/// One group's share of an op.
struct Share {
    group: GroupId,
    /// The index of its first batch piece in the whole batch (0 for a plain op).
    first_piece: usize,
    /// Its pieces, for a batch.
    batch: Option<Arc<crate::base::batch::Layout>>,
    /// Its byte range `(offset, len)`, for a plain op.
    range: (usize, usize),
}

/// Cut `req` into one part per group with a share of it (see [`shares`]): `slots` are the
/// peer's slots in each group, `weights` the groups' rails reaching it. Returns each part
/// with its group; a part's descriptor is still the runtime's (the caller names the group's).
pub(crate) fn split(req: OpReq, slots: &[Option<PeerSlot>], weights: &[usize]) -> Vec<(GroupId, OpReq)> {
    let bytes = shares(req.len(), weights);
    let mut plan: Vec<Share> = Vec::new();
    match &req.batch {
        Some(layout) => {
            let lens: Vec<usize> = bytes.iter().map(|&(_, n)| n).collect();
            for (g, part) in layout.split(&lens).into_iter().enumerate() {
                if let Some((first, l)) = part {
                    plan.push(Share {
                        group: GroupId(g),
                        first_piece: first,
                        batch: Some(Arc::new(l)),
                        range: (0, 0),
                    });
                }
            }
        }
        None => {
            for (g, &(off, n)) in bytes.iter().enumerate() {
                if n > 0 {
                    plan.push(Share { group: GroupId(g), first_piece: 0, batch: None, range: (off, n) });
                }
            }
        }
    }
    if plan.len() < 2 {
        let g = plan.first().map_or(GroupId::FIRST, |p| p.group);
        return vec![(g, OpReq { peer: slots[g.0].unwrap_or(req.peer), ..req })];
    }
    let firsts: Vec<usize> = plan.iter().map(|p| p.first_piece).collect();
    let cells = OpCell::fan_out(&req.cell, &firsts);
    plan.into_iter()
        .zip(cells)
        .map(|(Share { group: g, batch, range: (off, n), .. }, cell)| {
            let (seg, kind) = match batch {
                Some(_) => (req.seg, req.kind),
                None => (
                    LocalSeg { ptr: req.seg.ptr.wrapping_add(off), len: n, desc: req.seg.desc },
                    shift(req.kind, off as u64),
                ),
            };
            let part = OpReq {
                // A group in the plan has a share, so it holds the peer.
                peer: slots[g.0].unwrap_or(req.peer),
                peer_id: req.peer_id,
                op: req.op,
                kind,
                seg,
                cell,
                tenant: req.tenant,
                // A share of bulk stays bulk, however small it came out.
                class: Some(req.class.unwrap_or(Class::Bulk)),
                batch,
                rail_keys: req.rail_keys.clone(),
                slots: None,
                device: req.device,
            };
            (g, part)
        })
        .collect()
}

/// The same one-sided request `by` bytes further into the remote region.
fn shift(kind: WrKind, by: u64) -> WrKind {
    match kind {
        WrKind::Write { remote_addr, key, imm } => WrKind::Write { remote_addr: remote_addr + by, key, imm },
        WrKind::Read { remote_addr, key } => WrKind::Read { remote_addr: remote_addr + by, key },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shares_follow_weights_and_skip_empty_groups() {
        assert_eq!(shares(1 << 20, &[2, 2]), vec![(0, 1 << 19), (1 << 19, 1 << 19)]);
        assert_eq!(shares(1 << 20, &[1, 0, 3]), vec![(0, 1 << 18), (1 << 18, 0), (1 << 18, 3 << 18)]);
        assert_eq!(shares(5000, &[1, 1]), vec![(0, 0), (0, 5000)]);
    }

    proptest! {
        /// The shares tile the op: consecutive, every byte once, none to a weightless group.
        #[test]
        fn shares_tile_the_op(len in 1usize..1 << 30, weights in proptest::collection::vec(0usize..4, 1..6)) {
            prop_assume!(weights.iter().any(|&w| w > 0));
            let s = shares(len, &weights);
            prop_assert_eq!(s.len(), weights.len());
            let mut at = 0;
            for (&(off, n), &w) in s.iter().zip(&weights) {
                prop_assert_eq!(off, at);
                prop_assert!(w > 0 || n == 0);
                at += n;
            }
            prop_assert_eq!(at, len);
        }
    }
}
