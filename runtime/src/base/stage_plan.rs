//! The staging path's plan, sans-IO: which copies between device memory and its host mirror,
//! and which transfers from or into the mirror, may start, given what has finished. The op
//! that drives it (`op::staged`) does the copies and posts the transfers; this decides the
//! order, so that it is tested here on its own, with no GPU and no transport.
//!
//! Two flows:
//! - **out** (write, write with immediate, send, write batch): copy device → mirror, then the
//!   transfer from the mirror. Every copy starts at once (they run in order on the buffer's
//!   stream); transfer `j` is posted as soon as the copies it reads are done, so chunk `k`'s
//!   transfer overlaps chunk `k + 1`'s copy. A write carrying an immediate value posts its last
//!   chunk (the one with the value) only once every other chunk has landed: the peer's event
//!   then means every byte is there.
//! - **in** (read, receive, read batch): the transfers into the mirror first, all at once;
//!   copy `k` (mirror → device) starts as soon as the transfer that fills it has landed. The
//!   op is done when the last copy is.
//!
//! The first failure ends the plan: nothing more starts, and its outcome waits for what is in
//! flight (copies and transfers already started), so that the op hands the buffer back only
//! once neither the device nor the NIC touches it. (A dropped op drops its transfers, each
//! keeping its part of the mirror until its completion, and the buffer waits for its copies.)
use std::ops::Range;

use crate::base::error::Error;

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Device → mirror → peer.
    Out,
    /// Peer → mirror → device.
    In,
}

/// What the plan asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Start copy `i` (its range is [`StagePlan::copy_range`]).
    Copy(usize),
    /// Post transfer `j` (its range is [`StagePlan::transfer_range`]).
    Post(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for what it depends on.
    Waiting,
    /// Asked for: the driver runs it.
    Running,
    /// Finished.
    Done,
}

/// One op's plan (see the module doc).
#[derive(Debug)]
pub(crate) struct StagePlan {
    flow: Flow,
    /// The buffer's ranges each copy moves.
    copies: Vec<Range<usize>>,
    /// The buffer's ranges each transfer reads or fills.
    transfers: Vec<Range<usize>>,
    /// Out: the copies transfer `j` reads, as a range of copy indices. In: unused.
    reads: Vec<Range<usize>>,
    /// In: the transfer that fills copy `i`. Out: unused.
    filled_by: Vec<usize>,
    copy_state: Vec<State>,
    transfer_state: Vec<State>,
    /// Out: hold the last transfer until every other one has landed (it carries the
    /// immediate value).
    hold_last: bool,
    /// Bytes each transfer moved (a receive may be shorter than its buffer, a batch moves its
    /// pieces).
    landed: Vec<usize>,
    failed: Option<Error>,
    /// In: the transfer may land fewer bytes than its range (a receive).
    short_ok: bool,
    /// Steps handed out, waiting for `next` to be asked again.
    ready: Vec<Step>,
}

impl StagePlan {
    /// A plain transfer of `len` bytes in chunks of `chunk` bytes (at least 1): a copy and a
    /// transfer per chunk. `hold_last`: see the module doc (out only).
    pub(crate) fn chunked(flow: Flow, len: usize, chunk: usize, hold_last: bool) -> StagePlan {
        let chunk = chunk.max(1);
        let ranges: Vec<Range<usize>> = (0..len).step_by(chunk).map(|s| s..(s + chunk).min(len)).collect();
        let n = ranges.len();
        StagePlan::new(
            flow,
            ranges.clone(),
            ranges,
            (0..n).map(|j| j..j + 1).collect(),
            (0..n).collect(),
            hold_last,
        )
    }

    /// One transfer of `len` bytes (a send, a receive) with one copy of it.
    pub(crate) fn whole(flow: Flow, len: usize) -> StagePlan {
        let one = || std::iter::once(0..len).collect::<Vec<_>>();
        let mut p = StagePlan::new(flow, one(), one(), std::iter::once(0..1).collect(), vec![0], false);
        p.short_ok = true;
        p
    }

    /// One transfer (a batch over the whole buffer, `len` bytes) whose pieces cover the local
    /// ranges `locals`: a copy of each range, all before (out) or after (in) the transfer.
    pub(crate) fn batch(flow: Flow, len: usize, locals: Vec<Range<usize>>) -> StagePlan {
        let n = locals.len();
        let whole = std::iter::once(0..len).collect();
        StagePlan::new(flow, locals, whole, std::iter::once(0..n).collect(), vec![0; n], false)
    }

    fn new(
        flow: Flow,
        copies: Vec<Range<usize>>,
        transfers: Vec<Range<usize>>,
        reads: Vec<Range<usize>>,
        filled_by: Vec<usize>,
        hold_last: bool,
    ) -> StagePlan {
        let mut p = StagePlan {
            flow,
            copy_state: vec![State::Waiting; copies.len()],
            transfer_state: vec![State::Waiting; transfers.len()],
            landed: vec![0; transfers.len()],
            copies,
            transfers,
            reads,
            filled_by,
            hold_last: hold_last && flow == Flow::Out,
            failed: None,
            short_ok: false,
            ready: Vec::new(),
        };
        match flow {
            Flow::Out => (0..p.copies.len()).for_each(|i| p.start_copy(i)),
            Flow::In => (0..p.transfers.len()).for_each(|j| p.start_transfer(j)),
        }
        p.release();
        p
    }

    /// The buffer range copy `i` moves.
    pub(crate) fn copy_range(&self, i: usize) -> Range<usize> {
        let r = self.copies[i].clone();
        match self.flow {
            // A receive's copy up moves what landed, no more (a read or a batch lands its
            // whole range, or fails).
            Flow::In if self.short_ok => {
                let t = &self.transfers[self.filled_by[i]];
                let end = (t.start + self.landed[self.filled_by[i]]).min(r.end);
                r.start..end.max(r.start)
            }
            _ => r,
        }
    }

    /// The buffer range transfer `j` reads or fills.
    pub(crate) fn transfer_range(&self, j: usize) -> Range<usize> {
        self.transfers[j].clone()
    }

    /// Transfers there are.
    pub(crate) fn transfers(&self) -> usize {
        self.transfers.len()
    }

    /// True for the last transfer of a plan that holds it (it carries the immediate value).
    pub(crate) fn is_held(&self, j: usize) -> bool {
        self.hold_last && j + 1 == self.transfers.len()
    }

    /// The next step to take now, if any.
    pub(crate) fn next(&mut self) -> Option<Step> {
        if self.failed.is_some() {
            return None;
        }
        self.ready.pop()
    }

    /// Copy `i` finished.
    pub(crate) fn copied(&mut self, i: usize) {
        if self.copy_state.get(i) == Some(&State::Running) {
            self.copy_state[i] = State::Done;
            self.release();
        }
    }

    /// Transfer `j` finished with `res` (bytes moved).
    pub(crate) fn transferred(&mut self, j: usize, res: Result<usize, Error>) {
        if self.transfer_state.get(j) != Some(&State::Running) {
            return;
        }
        self.transfer_state[j] = State::Done;
        match res {
            Ok(n) => {
                self.landed[j] = n;
                self.release();
            }
            Err(e) => self.fail(e),
        }
    }

    /// Copy `i` failed (to start, or as it ran): it is over, and the plan fails with `e`.
    pub(crate) fn copy_failed(&mut self, i: usize, e: Error) {
        if self.copy_state.get(i) == Some(&State::Running) {
            self.copy_state[i] = State::Done;
        }
        self.fail(e);
    }

    /// The plan ends with `e` (the first failure wins): what was asked for and not yet handed
    /// out never starts.
    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
        for step in std::mem::take(&mut self.ready) {
            match step {
                Step::Copy(i) => self.copy_state[i] = State::Waiting,
                Step::Post(j) => self.transfer_state[j] = State::Waiting,
            }
        }
    }

    /// How it ended: the bytes moved, or the first failure once nothing started is still
    /// running; `None` while work remains.
    pub(crate) fn outcome(&mut self) -> Option<Result<usize, Error>> {
        let running = |s: &[State]| s.contains(&State::Running);
        if self.failed.is_some() && (running(&self.copy_state) || running(&self.transfer_state)) {
            return None;
        }
        if let Some(e) = self.failed.take() {
            // Asked once: the failure is handed over, and the plan stays failed.
            self.failed = Some(Error::invalid(e.op(), "staged op already failed"));
            return Some(Err(e));
        }
        let all = |s: &[State]| s.iter().all(|&s| s == State::Done);
        if !all(&self.copy_state) || !all(&self.transfer_state) {
            return None;
        }
        // What the transfers moved (a batch moves its pieces, not its whole range).
        Some(Ok(self.landed.iter().sum()))
    }

    /// Copies running now.
    #[cfg(test)]
    pub(crate) fn copies_running(&self) -> usize {
        self.copy_state.iter().filter(|&&s| s == State::Running).count()
    }

    fn start_copy(&mut self, i: usize) {
        self.copy_state[i] = State::Running;
        self.ready.insert(0, Step::Copy(i));
    }

    fn start_transfer(&mut self, j: usize) {
        self.transfer_state[j] = State::Running;
        self.ready.insert(0, Step::Post(j));
    }

    /// Start whatever now has what it depends on (nothing, once the plan failed).
    fn release(&mut self) {
        if self.failed.is_some() {
            return;
        }
        match self.flow {
            Flow::Out => {
                let n = self.transfers.len();
                for j in 0..n {
                    if self.transfer_state[j] != State::Waiting {
                        continue;
                    }
                    let read = self.reads[j].clone().all(|i| self.copy_state[i] == State::Done);
                    let others_landed =
                        !self.is_held(j) || (0..n - 1).all(|k| self.transfer_state[k] == State::Done);
                    if read && others_landed {
                        self.start_transfer(j);
                    }
                }
            }
            Flow::In => {
                for i in 0..self.copies.len() {
                    if self.copy_state[i] == State::Waiting
                        && self.transfer_state[self.filled_by[i]] == State::Done
                    {
                        if self.copy_range(i).is_empty() {
                            // Nothing of it landed (a short receive): nothing to copy.
                            self.copy_state[i] = State::Done;
                        } else {
                            self.start_copy(i);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::error::OpKind;

    fn drain(p: &mut StagePlan) -> Vec<Step> {
        std::iter::from_fn(|| p.next()).collect()
    }

    #[test]
    fn out_copies_all_at_once_and_posts_each_chunk_as_its_copy_lands() {
        let mut p = StagePlan::chunked(Flow::Out, 10, 4, false);
        assert_eq!(drain(&mut p), vec![Step::Copy(0), Step::Copy(1), Step::Copy(2)]);
        assert_eq!((p.copy_range(2), p.transfer_range(2)), (8..10, 8..10));
        p.copied(1);
        assert_eq!(drain(&mut p), vec![Step::Post(1)], "chunk 1 goes while chunk 0 still copies");
        p.copied(0);
        assert_eq!(drain(&mut p), vec![Step::Post(0)]);
        p.transferred(0, Ok(4));
        p.transferred(1, Ok(4));
        assert_eq!(p.outcome().map(|r| r.is_ok()), None, "chunk 2 is still to go");
        p.copied(2);
        assert_eq!(drain(&mut p), vec![Step::Post(2)]);
        p.transferred(2, Ok(2));
        assert_eq!(p.outcome().unwrap().unwrap(), 10);
    }

    #[test]
    fn the_immediate_chunk_waits_until_every_other_chunk_has_landed() {
        let mut p = StagePlan::chunked(Flow::Out, 12, 4, true);
        drain(&mut p);
        (0..3).for_each(|i| p.copied(i));
        assert_eq!(drain(&mut p), vec![Step::Post(0), Step::Post(1)], "the last is held");
        assert!(p.is_held(2) && !p.is_held(1));
        p.transferred(1, Ok(4));
        assert_eq!(drain(&mut p), vec![]);
        p.transferred(0, Ok(4));
        assert_eq!(drain(&mut p), vec![Step::Post(2)]);
        p.transferred(2, Ok(4));
        assert_eq!(p.outcome().unwrap().unwrap(), 12);
    }

    #[test]
    fn in_posts_every_transfer_first_and_copies_each_chunk_up_as_it_lands() {
        let mut p = StagePlan::chunked(Flow::In, 8, 4, true);
        assert!(!p.is_held(1), "an in flow holds nothing back");
        assert_eq!(drain(&mut p), vec![Step::Post(0), Step::Post(1)]);
        p.transferred(1, Ok(4));
        assert_eq!(drain(&mut p), vec![Step::Copy(1)]);
        assert_eq!(p.copy_range(1), 4..8);
        p.copied(1);
        assert_eq!(p.outcome().map(|r| r.is_ok()), None);
        p.transferred(0, Ok(4));
        assert_eq!(drain(&mut p), vec![Step::Copy(0)]);
        p.copied(0);
        assert_eq!(p.outcome().unwrap().unwrap(), 8);
    }

    #[test]
    fn a_short_receive_copies_up_what_landed_and_an_empty_one_copies_nothing() {
        let mut p = StagePlan::whole(Flow::In, 100);
        assert_eq!(drain(&mut p), vec![Step::Post(0)]);
        p.transferred(0, Ok(30));
        assert_eq!(drain(&mut p), vec![Step::Copy(0)]);
        assert_eq!(p.copy_range(0), 0..30);
        p.copied(0);
        assert_eq!(p.outcome().unwrap().unwrap(), 30);
        let mut empty = StagePlan::whole(Flow::In, 100);
        drain(&mut empty);
        empty.transferred(0, Ok(0));
        assert_eq!(drain(&mut empty), vec![]);
        assert_eq!(empty.outcome().unwrap().unwrap(), 0);
    }

    #[test]
    fn a_batch_posts_once_every_piece_is_copied_and_copies_every_piece_after() {
        let mut out = StagePlan::batch(Flow::Out, 64, vec![0..8, 32..40]);
        assert_eq!(drain(&mut out), vec![Step::Copy(0), Step::Copy(1)]);
        out.copied(0);
        assert_eq!(drain(&mut out), vec![]);
        out.copied(1);
        assert_eq!(drain(&mut out), vec![Step::Post(0)]);
        out.transferred(0, Ok(16));
        assert_eq!(out.outcome().unwrap().unwrap(), 16, "a batch counts its pieces' bytes");
        let mut back = StagePlan::batch(Flow::In, 64, vec![0..8, 32..40]);
        assert_eq!(drain(&mut back), vec![Step::Post(0)]);
        back.transferred(0, Ok(16));
        assert_eq!(drain(&mut back), vec![Step::Copy(0), Step::Copy(1)]);
        assert_eq!((back.copy_range(0), back.copy_range(1)), (0..8, 32..40));
        back.copied(1);
        back.copied(0);
        assert!(back.outcome().unwrap().is_ok());
    }

    #[test]
    fn the_first_failure_ends_the_plan_and_nothing_more_starts() {
        let mut p = StagePlan::chunked(Flow::Out, 12, 4, false);
        drain(&mut p);
        p.copied(0);
        assert_eq!(drain(&mut p), vec![Step::Post(0)]);
        p.transferred(0, Err(Error::invalid(OpKind::Write, "first")));
        p.copied(1);
        assert_eq!(drain(&mut p), vec![], "nothing starts after a failure");
        p.fail(Error::invalid(OpKind::Write, "second"));
        assert!(p.outcome().is_none(), "copy 2 still runs: the buffer is not handed back yet");
        p.copied(2);
        let e = p.outcome().unwrap().unwrap_err();
        assert!(e.to_string().contains("first"), "{e}");
        assert!(p.outcome().unwrap().is_err(), "it stays failed");
    }

    #[test]
    fn a_failure_waits_for_what_is_in_flight_and_never_starts_what_was_not_handed_out() {
        // In: every transfer is posted at once; one fails while the others are with the NIC.
        let mut p = StagePlan::chunked(Flow::In, 12, 4, false);
        assert_eq!(drain(&mut p), vec![Step::Post(0), Step::Post(1), Step::Post(2)]);
        p.transferred(1, Err(Error::invalid(OpKind::Read, "lost")));
        assert!(p.outcome().is_none(), "transfers 0 and 2 still write the mirror");
        p.transferred(0, Ok(4));
        assert_eq!(drain(&mut p), vec![], "its copy does not start after the failure");
        assert!(p.outcome().is_none());
        p.transferred(2, Ok(4));
        let e = p.outcome().unwrap().unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
        // Out: a copy asked for but never handed out does not run, so nothing waits for it.
        let mut p = StagePlan::chunked(Flow::Out, 8, 4, false);
        assert_eq!(p.next(), Some(Step::Copy(0)));
        p.copy_failed(0, Error::invalid(OpKind::Write, "no device"));
        assert_eq!(p.copies_running(), 0, "copy 1 was never started");
        assert!(p.outcome().unwrap().is_err());
    }

    #[test]
    fn stale_or_unknown_reports_change_nothing() {
        let mut p = StagePlan::chunked(Flow::Out, 4, 4, false);
        drain(&mut p);
        p.transferred(0, Ok(4));
        p.copied(7);
        assert_eq!(p.copies_running(), 1, "a transfer not yet posted cannot finish");
        p.copied(0);
        p.copied(0);
        assert_eq!(drain(&mut p), vec![Step::Post(0)]);
    }
}
