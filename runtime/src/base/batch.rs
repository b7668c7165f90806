//! Batch transfers: many contiguous pieces between one local buffer and one remote region,
//! moved as one op. The layout decides which pieces share a work request (remote-contiguous
//! runs, gathered locally up to the provider's scatter-gather limit) and where the scheduler
//! may not cut across.
use std::sync::Arc;

use crate::base::error::{Error, OpKind, Result};
use crate::base::transport::LocalSeg;

/// One contiguous piece of a batch: `len` bytes at offset `local` of the local buffer go to
/// (or come from) offset `remote` of the remote region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset into the local buffer.
    pub local: usize,
    /// Offset into the remote region.
    pub remote: u64,
    /// Length in bytes (non-zero).
    pub len: usize,
}

/// The pieces of a batch transfer, in the order they are issued (they may land in any order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pieces {
    list: Vec<Piece>,
}

impl Pieces {
    /// No pieces yet.
    pub fn new() -> Pieces {
        Pieces::default()
    }

    /// Add a piece: `len` bytes from local offset `local` to remote offset `remote`.
    pub fn push(&mut self, local: usize, remote: u64, len: usize) -> &mut Pieces {
        self.list.push(Piece { local, remote, len });
        self
    }

    /// Pages: local page `local[i]` goes to remote page `remote[i]`; pages are `page_size`
    /// bytes and lie `page_size` apart on both sides.
    pub fn pages(local: &[usize], remote: &[usize], page_size: usize) -> Result<Pieces> {
        Pieces::pages_strided(local, page_size, remote, page_size, page_size)
    }

    /// Pages with their own stride on each side (a KV cache keeps a layer's pages
    /// `layers * page_size` apart): local page `i` starts at `local[i] * local_stride`, remote
    /// page at `remote[i] * remote_stride`; `page_size` bytes each.
    pub fn pages_strided(
        local: &[usize],
        local_stride: usize,
        remote: &[usize],
        remote_stride: usize,
        page_size: usize,
    ) -> Result<Pieces> {
        if local.len() != remote.len() {
            return Err(Error::invalid(
                OpKind::Write,
                format!("{} local pages but {} remote pages", local.len(), remote.len()),
            ));
        }
        if page_size == 0 || local_stride < page_size || remote_stride < page_size {
            return Err(Error::invalid(
                OpKind::Write,
                format!(
                    "page size {page_size} with strides {local_stride}/{remote_stride}: pages must be \
                     non-empty and no wider than their stride"
                ),
            ));
        }
        let mut list = Vec::with_capacity(local.len());
        for (i, (&l, &r)) in local.iter().zip(remote).enumerate() {
            let (Some(lo), Some(ro)) =
                (l.checked_mul(local_stride), (r as u64).checked_mul(remote_stride as u64))
            else {
                return Err(Error::invalid(OpKind::Write, format!("page {i}: index overflows the address")));
            };
            list.push(Piece { local: lo, remote: ro, len: page_size });
        }
        Ok(Pieces { list })
    }

    /// The local ranges the pieces cover, sorted and merged where they touch or overlap.
    pub(crate) fn local_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut r: Vec<std::ops::Range<usize>> =
            self.list.iter().map(|p| p.local..p.local.saturating_add(p.len)).collect();
        r.sort_by_key(|r| r.start);
        let mut out: Vec<std::ops::Range<usize>> = Vec::with_capacity(r.len());
        for x in r {
            match out.last_mut() {
                Some(last) if x.start <= last.end => last.end = last.end.max(x.end),
                _ => out.push(x),
            }
        }
        out
    }

    /// The pieces.
    pub fn iter(&self) -> impl Iterator<Item = &Piece> + '_ {
        self.list.iter()
    }

    /// How many pieces.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Bytes all pieces move together.
    pub fn bytes(&self) -> u64 {
        self.list.iter().map(|p| p.len as u64).sum()
    }
}

impl FromIterator<(usize, u64, usize)> for Pieces {
    fn from_iter<I: IntoIterator<Item = (usize, u64, usize)>>(it: I) -> Pieces {
        Pieces { list: it.into_iter().map(|(local, remote, len)| Piece { local, remote, len }).collect() }
    }
}

impl From<Vec<Piece>> for Pieces {
    fn from(list: Vec<Piece>) -> Pieces {
        Pieces { list }
    }
}

/// A run of pieces one work request can carry: contiguous on the remote side.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// Offset of its first byte in the op (pieces laid end to end).
    start: usize,
    /// Its first piece.
    first: usize,
    /// How many pieces.
    count: usize,
}

/// A validated batch as the reactor posts it. Op offsets count bytes of the pieces laid end to
/// end in order; the scheduler's chunks are ranges of them that never cross a group boundary.
#[derive(Debug)]
pub(crate) struct Layout {
    pieces: Vec<Piece>,
    /// Op offset of each piece.
    starts: Vec<usize>,
    groups: Vec<Group>,
    /// Op offset of each group but the first: where chunks must be cut.
    pub cuts: Arc<[usize]>,
    /// Bytes in all pieces.
    pub total: usize,
}

/// Most local segments one work request gathers (the transports' fixed scatter arrays).
pub(crate) const MAX_SGE: usize = 4;

impl Layout {
    /// Validate `pieces` against the local buffer (`local_len`) and the remote region
    /// (`remote_len`) and group them: pieces contiguous remotely share a work request (up to
    /// `sge` local segments and `group_max` bytes), unless `one_per_piece` (each piece then
    /// raises its own immediate event).
    pub(crate) fn new(
        op: OpKind,
        pieces: &Pieces,
        local_len: usize,
        remote_len: u64,
        sge: usize,
        group_max: usize,
        one_per_piece: bool,
    ) -> Result<Layout> {
        if pieces.is_empty() {
            return Err(Error::invalid(op, "a batch with no pieces moves nothing"));
        }
        let sge = sge.clamp(1, MAX_SGE);
        let mut starts = Vec::with_capacity(pieces.len());
        let mut groups: Vec<Group> = Vec::new();
        let mut total = 0usize;
        for (i, p) in pieces.list.iter().enumerate() {
            let bad = |why: String| Err(Error::invalid(op, format!("piece {i}: {why}")));
            if p.len == 0 {
                return bad("zero length".into());
            }
            if p.local.checked_add(p.len).is_none_or(|e| e > local_len) {
                let (offset, want, len) = (p.local as u64, p.len as u64, local_len as u64);
                return Err(Error::Batch {
                    piece: i,
                    source: Box::new(Error::OutOfBounds { op, offset, want, len }),
                });
            }
            if p.remote.checked_add(p.len as u64).is_none_or(|e| e > remote_len) {
                return Err(Error::Batch {
                    piece: i,
                    source: Box::new(Error::OutOfBounds {
                        op,
                        offset: p.remote,
                        want: p.len as u64,
                        len: remote_len,
                    }),
                });
            }
            starts.push(total);
            let joins = groups.last().is_some_and(|g| {
                let last = &pieces.list[g.first + g.count - 1];
                !one_per_piece
                    && g.count < sge
                    && last.remote + last.len as u64 == p.remote
                    && total - g.start + p.len <= group_max
            });
            match groups.last_mut() {
                Some(g) if joins => g.count += 1,
                _ => groups.push(Group { start: total, first: i, count: 1 }),
            }
            total += p.len;
        }
        let cuts = groups.iter().skip(1).map(|g| g.start).collect();
        Ok(Layout { pieces: pieces.list.clone(), starts, groups, cuts, total })
    }

    /// Cut into consecutive runs of work requests, run `i` holding about `bytes[i]` bytes (it
    /// ends at the first work request boundary at or past its share; the last takes the
    /// rest). Returns each run's first piece and its layout; `None` for a run left empty.
    pub(crate) fn split(&self, bytes: &[usize]) -> Vec<Option<(usize, Layout)>> {
        let mut out = Vec::with_capacity(bytes.len());
        let (mut g, mut target) = (0usize, 0usize);
        let last = bytes.iter().rposition(|&b| b > 0);
        for (k, &b) in bytes.iter().enumerate() {
            target += b;
            let from = g;
            while g < self.groups.len() && (Some(k) == last || (b > 0 && self.groups[g].start < target)) {
                g += 1;
            }
            out.push((g > from).then(|| self.run(from, g)));
        }
        out
    }

    /// The work request groups `[from, to)` as a layout of their own, and their first piece.
    fn run(&self, from: usize, to: usize) -> (usize, Layout) {
        let first = self.groups[from].first;
        let end = self.groups[to - 1].first + self.groups[to - 1].count;
        let base = self.groups[from].start;
        let groups: Vec<Group> = self.groups[from..to]
            .iter()
            .map(|g| Group { start: g.start - base, first: g.first - first, count: g.count })
            .collect();
        let layout = Layout {
            pieces: self.pieces[first..end].to_vec(),
            starts: self.starts[first..end].iter().map(|s| s - base).collect(),
            cuts: groups.iter().skip(1).map(|g| g.start).collect(),
            total: self.starts[end - 1] + self.pieces[end - 1].len - base,
            groups,
        };
        (first, layout)
    }

    /// The piece holding op offset `off`.
    pub(crate) fn piece_at(&self, off: usize) -> usize {
        self.starts.partition_point(|&s| s <= off) - 1
    }

    /// The remote offset and local segments for op range `[off, off + len)`, which lies in one
    /// group. Returns the remote offset and how many segments were written to `out`.
    pub(crate) fn segments(
        &self,
        base: LocalSeg,
        off: usize,
        len: usize,
        out: &mut [LocalSeg; MAX_SGE],
    ) -> (u64, usize) {
        let g = &self.groups[self.groups.partition_point(|g| g.start <= off) - 1];
        let mut n = 0;
        let mut remote = None;
        let end = off + len;
        for i in g.first..g.first + g.count {
            let (p, s) = (&self.pieces[i], self.starts[i]);
            let (a, b) = (off.max(s), end.min(s + p.len));
            if a >= b {
                continue;
            }
            remote.get_or_insert(p.remote + (a - s) as u64);
            out[n] = LocalSeg { ptr: base.ptr.wrapping_add(p.local + (a - s)), len: b - a, desc: base.desc };
            n += 1;
        }
        (remote.expect("a chunk covers at least one byte of its group"), n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seg() -> LocalSeg {
        LocalSeg { ptr: std::ptr::null_mut(), len: 1 << 30, desc: 0 }
    }

    #[test]
    fn out_of_range_piece_is_named() {
        let p: Pieces = [(0, 0, 10), (100, 10, 10)].into_iter().collect();
        match Layout::new(OpKind::Write, &p, 105, 1000, 4, 1 << 20, false) {
            Err(Error::Batch { piece: 1, source }) => assert!(matches!(*source, Error::OutOfBounds { .. })),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Layout::new(OpKind::Write, &Pieces::new(), 1, 1, 4, 1, false),
            Err(Error::InvalidArgument { .. })
        ));
    }

    proptest! {
        /// Runs cut for rail groups hold every piece once, in order, and address the same
        /// bytes as the whole.
        #[test]
        fn runs_cover_the_batch_once(
            raw in proptest::collection::vec((0usize..64, 0u64..64, 1usize..5), 1..40),
            shares in proptest::collection::vec(0usize..100, 1..5),
        ) {
            let pieces: Pieces = raw.iter().map(|&(l, r, n)| (l * 4, r * 4, n * 4)).collect();
            let layout = Layout::new(OpKind::Write, &pieces, 300, 300, 2, 16, false).unwrap();
            let runs = layout.split(&shares);
            prop_assert_eq!(runs.len(), shares.len());
            let mut next = 0;
            let mut total = 0;
            for (first, run) in runs.iter().flatten() {
                prop_assert_eq!(*first, next);
                prop_assert_eq!(&run.pieces[..], &layout.pieces[next..next + run.pieces.len()]);
                next += run.pieces.len();
                total += run.total;
                let mut out = [seg(); MAX_SGE];
                for g in &run.groups {
                    let len = run.pieces[g.first..g.first + g.count].iter().map(|p| p.len).sum();
                    let (remote, _) = run.segments(seg(), g.start, len, &mut out);
                    prop_assert_eq!(remote, run.pieces[g.first].remote);
                }
            }
            if shares.iter().any(|&s| s > 0) {
                prop_assert_eq!(next, layout.pieces.len());
                prop_assert_eq!(total, layout.total);
            }
        }

        /// Every byte of every piece is covered exactly once by the segments of the chunks a
        /// scheduler would cut (here: fixed-size cuts that respect the groups).
        #[test]
        fn segments_cover_pieces(
            raw in proptest::collection::vec((0usize..64, 0u64..64, 1usize..5), 1..40),
            chunk in 1usize..9,
            sge in 1usize..5,
        ) {
            let pieces: Pieces = raw.iter().map(|&(l, r, n)| (l * 4, r * 4, n * 4)).collect();
            let layout = Layout::new(OpKind::Write, &pieces, 300, 300, sge, 16, false).unwrap();
            let mut pairs = Vec::new();
            let mut off = 0;
            while off < layout.total {
                let next_cut = layout.cuts.iter().copied().find(|&c| c > off).unwrap_or(layout.total);
                let len = chunk.min(next_cut - off);
                let mut out = [seg(); MAX_SGE];
                let (remote, n) = layout.segments(seg(), off, len, &mut out);
                prop_assert!(n <= sge);
                let mut r = remote;
                for s in &out[..n] {
                    for k in 0..s.len {
                        let l = s.ptr as usize + k;
                        pairs.push((l, r));
                        r += 1;
                    }
                }
                off += len;
            }
            let mut want = Vec::new();
            for p in pieces.iter() {
                for k in 0..p.len {
                    want.push((p.local + k, p.remote + k as u64));
                }
            }
            pairs.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(pairs, want);
        }
    }
}
