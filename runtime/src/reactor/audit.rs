//! Why a one-sided op was cancelled, asked of its target. tcp;ofi_rxm answers an access fault
//! (a bad key, a range outside the region, a write to a read-only region) by dropping the
//! connection, so the faulty op and every other op on it come back cancelled, as after a link
//! failure. The target's runtime knows what it exposed: the initiator asks it on the control
//! connection and fails the op as `RemoteAccess` when it was not allowed, or with the
//! provider's error when it was. Only cancelled one-sided ops are asked about, so the success
//! path does not change; providers that report access faults themselves (verbs) never ask.
//!
//! shm checks at the target too, and drops a refused op without ever completing it. On such a
//! transport (`Caps::silent_refusals`) one-sided ops still in flight a second after they were
//! posted are asked about as well. A refused one is then failed by losing the peer: closing its
//! lanes is what makes sure the provider touches the op's memory no more (as on tcp, whose
//! provider drops the connection itself).
//!
//! Answers are rationed: a peer gets `MAX_CHECKS_PER_SEC` answers a second (more questions go
//! unanswered) and `MAX_REFUSED` refusals a minute (more, and it is dropped), so it can neither
//! probe for keys nor fill our outbox. We ask at most half that ration, and give up on a
//! question after the reactor's patience.
//!
//! [`Audit`] is a machine of its own: it keeps what this runtime exposed, the questions out and
//! each peer's rations, and answers every input with [`Action`]s for the reactor to carry out.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::{Action, Outbox};
use super::cell_key;
use super::cmd::{GroupId, PeerSlot};
use super::peers::Window;
use crate::base::control::{Ctl, Verdict};
use crate::base::error::{Error, FailureClass, OpKind, TransportError};
use crate::base::transport::{Access, MemoryRegion, WrId, WrKind};
use crate::reactor::cell::{Done, OpCell};

/// A region peers may reach.
struct Exposure {
    base: u64,
    len: u64,
    access: Access,
}

/// An op whose cancellation is being asked about.
struct Asking {
    slot: PeerSlot,
    token: u32,
    /// The request asked about.
    id: WrId,
    /// Held so the cell's address names this op until it is settled.
    cell: Arc<OpCell>,
    verdict: Option<Verdict>,
    /// The op's failure, once the op is over, waiting for the verdict.
    parked: Option<Error>,
    /// When the question went out.
    asked: Instant,
}

/// What one peer may ask of us, and we of it.
struct Rations {
    /// Questions about our memory it asked in the current second.
    checks: Window,
    /// Its questions we answered with a refusal in the current minute.
    refused: Window,
    /// Questions we asked it in the current second.
    asked: Window,
}

impl Rations {
    fn new(now: Instant) -> Rations {
        Rations { checks: Window::new(now), refused: Window::new(now), asked: Window::new(now) }
    }
}

/// A cancelled one-sided request to ask its target about.
pub(super) struct Question<'a> {
    pub id: WrId,
    pub slot: PeerSlot,
    pub op: OpKind,
    /// Where the request went.
    pub kind: WrKind,
    pub len: usize,
    pub cell: &'a Arc<OpCell>,
}

/// How long a one-sided op may stay silent before its target is asked about it.
pub(super) const SILENT_AFTER: Duration = Duration::from_secs(1);

/// Questions a peer may ask per second.
const MAX_CHECKS_PER_SEC: u32 = 1024;

/// Refusals a peer may be answered in a minute before it counts as probing.
const MAX_REFUSED: u32 = 64;

/// Questions we ask one peer per second: half what it answers, so that a burst of cancelled
/// ops (a dropped connection cancels every op on it) stays within its ration even when its
/// windows and ours do not line up. Ops beyond it keep the provider's own error.
const MAX_ASKED_PER_SEC: u32 = MAX_CHECKS_PER_SEC / 2;

/// The audit: what this runtime exposed, and the questions out about ours.
pub(super) struct Audit {
    /// Named in the errors the audit makes itself.
    provider: String,
    /// This reactor's rail group, and how many the runtime has: question tokens carry the
    /// group, and each group asks its share of a peer's ration.
    group: GroupId,
    groups: u32,
    next_token: u32,
    /// When in-flight ops were last looked at, and the first request generation posted since.
    swept: Option<(Instant, u64)>,
    /// What this runtime exposed, by key (each rail's), with the registration it belongs to.
    /// Several, where rail groups' transports chose the same key for different regions.
    exposed: HashMap<u64, Vec<(u64, Exposure)>>,
    /// The keys of each remote-access registration, by registration id.
    keys_of: HashMap<u64, Vec<u64>>,
    /// By the op cell's address.
    asking: HashMap<usize, Asking>,
    /// Tokens of the questions out, to the cell's address.
    by_token: HashMap<u32, usize>,
    /// Each peer's rations, from its first question either way.
    rations: HashMap<PeerSlot, Rations>,
}

impl Audit {
    /// An audit for rail group `group` of `groups`, whose errors name `provider`.
    pub(super) fn new(provider: String, group: GroupId, groups: u32) -> Audit {
        Audit {
            provider,
            group,
            groups: groups.max(1),
            next_token: 0,
            swept: None,
            exposed: HashMap::new(),
            keys_of: HashMap::new(),
            asking: HashMap::new(),
            by_token: HashMap::new(),
            rations: HashMap::new(),
        }
    }

    /// No question out: the op path needs no look-ups.
    pub(super) fn idle(&self) -> bool {
        self.asking.is_empty()
    }

    /// Regions are exposed: peers' one-sided ops may need our progress to be served.
    pub(super) fn exposes(&self) -> bool {
        !self.exposed.is_empty()
    }

    /// A registration peers may reach, as they will name it.
    pub(super) fn exposed(&mut self, mr: &MemoryRegion, len: usize, access: Access) {
        // Learnt again (with every rail group's keys): replaces what was known of it.
        self.withdrawn(mr.id);
        let keys: Vec<u64> = std::iter::once(mr.key).chain(mr.rail_keys.iter().copied()).collect();
        for &k in &keys {
            let e = Exposure { base: mr.remote_base, len: len as u64, access };
            let under = self.exposed.entry(k).or_default();
            if !under.iter().any(|(id, _)| *id == mr.id) {
                under.push((mr.id, e));
            }
        }
        self.keys_of.insert(mr.id, keys);
    }

    /// The registration `id` is gone.
    pub(super) fn withdrawn(&mut self, id: u64) {
        for k in self.keys_of.remove(&id).unwrap_or_default() {
            if let Some(under) = self.exposed.get_mut(&k) {
                under.retain(|(i, _)| *i != id);
                if under.is_empty() {
                    self.exposed.remove(&k);
                }
            }
        }
    }

    /// Would an op with this key, range and direction have been allowed (by any region under
    /// the key)?
    fn judge(&self, key: u64, addr: u64, len: u64, write: bool) -> Verdict {
        let Some(under) = self.exposed.get(&key) else {
            return Verdict::UnknownKey;
        };
        let judge = |e: &Exposure| {
            let inside = addr >= e.base && addr.checked_add(len).is_some_and(|end| end <= e.base + e.len);
            if !inside {
                Verdict::OutOfRange
            } else if (write && !e.access.remote_write) || (!write && !e.access.remote_read) {
                Verdict::NotPermitted
            } else {
                Verdict::Allowed
            }
        };
        let rank = |v: Verdict| match v {
            Verdict::Allowed => 0,
            Verdict::NotPermitted => 1,
            _ => 2,
        };
        under.iter().map(|(_, e)| judge(e)).min_by_key(|&v| rank(v)).unwrap_or(Verdict::UnknownKey)
    }

    fn rations(&mut self, slot: PeerSlot, now: Instant) -> &mut Rations {
        self.rations.entry(slot).or_insert_with(|| Rations::new(now))
    }

    /// A one-sided request came back cancelled: ask its (live) target whether it was allowed,
    /// once per op and within our share of the peer's ration.
    pub(super) fn ask(&mut self, q: Question<'_>, now: Instant, out: &mut Outbox) {
        let (key, addr, write) = match (q.op, q.kind) {
            (OpKind::Write | OpKind::WriteImm, WrKind::Write { remote_addr, key, .. }) => {
                (key, remote_addr, true)
            }
            // A read of ours, or a receive reading a large message (rendezvous).
            (OpKind::Read | OpKind::Recv, WrKind::Read { remote_addr, key }) => (key, remote_addr, false),
            _ => return,
        };
        let k = cell_key(q.cell);
        if self.asking.contains_key(&k) {
            return;
        }
        // The peer answers all our rail groups' questions together: each asks its share.
        let ours = MAX_ASKED_PER_SEC / self.groups;
        if !self.rations(q.slot, now).asked.admit(now, Duration::from_secs(1), ours) {
            return;
        }
        self.next_token = self.next_token.wrapping_add(1) & ((1 << super::TOKEN_GROUP_SHIFT) - 1);
        let token = ((self.group.0 as u32) << super::TOKEN_GROUP_SHIFT) | self.next_token;
        out.push(Action::Tell(q.slot, Ctl::Check { token, key, addr, len: q.len as u64, write }));
        self.by_token.insert(token, k);
        let asking = Asking {
            slot: q.slot,
            token,
            id: q.id,
            cell: q.cell.clone(),
            verdict: None,
            parked: None,
            asked: now,
        };
        self.asking.insert(k, asking);
    }

    /// The op's result, unless it waits for a verdict (then `None`: the verdict's arrival, or
    /// giving up on it, settles the op).
    pub(super) fn audited(
        &mut self,
        cell: &Arc<OpCell>,
        res: Result<Done, Error>,
    ) -> Option<Result<Done, Error>> {
        let k = cell_key(cell);
        let Some(a) = self.asking.get_mut(&k) else {
            return Some(res);
        };
        match (res, a.verdict) {
            (Ok(d), _) => {
                self.forget(k);
                Some(Ok(d))
            }
            (Err(e), Some(v)) => {
                self.forget(k);
                Some(Err(self.judged(e, v)))
            }
            (Err(e), None) => {
                a.parked = Some(e);
                None
            }
        }
    }

    fn forget(&mut self, k: usize) -> Option<Asking> {
        let a = self.asking.remove(&k)?;
        self.by_token.remove(&a.token);
        Some(a)
    }

    /// A failure the audit reports itself, in the provider's name (no errno).
    fn local_error(&self, class: FailureClass, text: impl Into<String>) -> TransportError {
        TransportError::local(&self.provider, class, text)
    }

    /// The op's failure in the light of the target's verdict.
    fn judged(&self, e: Error, v: Verdict) -> Error {
        let Some(why) = v.refusal() else {
            return e;
        };
        match e {
            Error::Transport { op, peer, mut source } => {
                source.text = format!("{}; the peer says {why}", source.text);
                source.class = FailureClass::RemoteAccess;
                Error::RemoteAccess { op, peer, source }
            }
            // Lost because of the refusal (`FailSilent`), or right after it.
            Error::PeerLost { op, peer, .. } => {
                let source = self.local_error(
                    FailureClass::RemoteAccess,
                    format!("the peer says {why} (the connection is closed)"),
                );
                Error::RemoteAccess { op, peer, source }
            }
            Error::Batch { piece, source } => {
                Error::Batch { piece, source: Box::new(self.judged(*source, v)) }
            }
            other => other,
        }
    }

    /// Time to look for silently refused ops (on a transport whose refusals are silent)? Then
    /// the generation below which in-flight requests were already in flight at the last look,
    /// at least `SILENT_AFTER` ago. `generation`: the newest request's.
    pub(super) fn sweep_due(&mut self, now: Instant, generation: u64) -> Option<u64> {
        let since = match self.swept {
            Some((at, _)) if now.duration_since(at) < SILENT_AFTER => return None,
            Some((_, generation)) => generation,
            None => 0,
        };
        self.swept = Some((now, generation + 1));
        Some(since)
    }

    /// A peer asks about an op of its own on our memory.
    pub(super) fn on_check(&mut self, slot: PeerSlot, check: Ctl, now: Instant, out: &mut Outbox) {
        let Ctl::Check { token, key, addr, len, write } = check else {
            return;
        };
        let verdict = self.judge(key, addr, len, write);
        let r = self.rations(slot, now);
        // Over the ration, a question goes unanswered (the asker's op keeps its own error once
        // it gives up): a burst of honest questions, all the ops a dropped connection
        // cancelled, costs nothing more. Refusals are what probing for keys looks like: too
        // many, and the peer is dropped.
        if !r.checks.admit(now, Duration::from_secs(1), MAX_CHECKS_PER_SEC) {
            return;
        }
        if verdict.refusal().is_some() && !r.refused.admit(now, Duration::from_secs(60), MAX_REFUSED) {
            let why =
                format!("it was refused more than {MAX_REFUSED} times a minute asking about our memory");
            out.push(Action::DropPeer(slot, why));
            return;
        }
        out.push(Action::Tell(slot, Ctl::Verdict { token, verdict }));
    }

    /// A peer answers about an op of ours. `silent_refusals`: the transport drops refused ops
    /// without completing them (the op may be in flight still).
    pub(super) fn on_verdict(
        &mut self,
        slot: PeerSlot,
        token: u32,
        verdict: Verdict,
        silent_refusals: bool,
        out: &mut Outbox,
    ) {
        let Some(&k) = self.by_token.get(&token) else {
            return;
        };
        let a = self.asking.get_mut(&k).expect("indexed");
        if a.slot != slot {
            return;
        }
        match a.parked.take() {
            Some(e) => {
                let a = self.forget(k).expect("asking");
                out.push(Action::Settle(a.cell, Err(self.judged(e, verdict))));
            }
            None if silent_refusals => match verdict.refusal() {
                Some(why) => {
                    a.verdict = Some(verdict);
                    out.push(Action::FailSilent { slot, id: a.id, why });
                }
                // Allowed, and still silent: forget the question, so that a later sweep asks
                // again (another of its requests may be the refused one).
                None => {
                    self.forget(k);
                }
            },
            None => a.verdict = Some(verdict),
        }
    }

    /// Questions out longer than `patience` get no answer any more. A live runtime answers in
    /// well under a millisecond and a dead one is noticed by its heartbeats, so this bounds the
    /// wait on a peer that beats but does not answer (or is over its ration): an op waiting on
    /// one fails with its own error, and an op still in flight may be asked about again.
    pub(super) fn expire(&mut self, now: Instant, patience: Duration, out: &mut Outbox) {
        let late: Vec<usize> = self
            .asking
            .iter()
            .filter(|(_, a)| a.verdict.is_none() && now.duration_since(a.asked) >= patience)
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            let mut a = self.forget(k).expect("listed");
            if let Some(e) = a.parked.take() {
                let note = format!("the peer did not say why within {} s", patience.as_secs());
                out.push(Action::Settle(a.cell, Err(unexplained(e, &note))));
            }
        }
    }

    /// No verdict will come from `slot`: what waits for one fails as the peer's loss (`lost`:
    /// the peer's label and how it was noticed) or, at shutdown, with the provider's error.
    pub(super) fn lost(&mut self, slot: PeerSlot, lost: Option<(&Arc<str>, &str)>, out: &mut Outbox) {
        self.rations.remove(&slot);
        let ks: Vec<usize> = self.asking.iter().filter(|(_, a)| a.slot == slot).map(|(k, _)| *k).collect();
        for k in ks {
            let a = self.asking.get_mut(&k).expect("listed");
            match a.parked.take() {
                Some(e) => {
                    let a = self.forget(k).expect("listed");
                    let e = match lost {
                        Some((peer, reason)) => Error::PeerLost {
                            op: e.op(),
                            peer: peer.clone(),
                            reason: format!("{reason}; {e}").into(),
                        },
                        None => e,
                    };
                    out.push(Action::Settle(a.cell, Err(e)));
                }
                // Still in flight: a verdict already in stands; else its failure stays its own.
                None => {
                    a.verdict.get_or_insert(Verdict::Allowed);
                }
            }
        }
    }
}

/// The op's own failure, with a note that its target did not explain it.
fn unexplained(e: Error, note: &str) -> Error {
    match e {
        Error::Transport { op, peer, mut source } => {
            source.text = format!("{}; {note}", source.text);
            Error::Transport { op, peer, source }
        }
        Error::Batch { piece, source } => {
            Error::Batch { piece, source: Box::new(unexplained(*source, note)) }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reactor::testing::cancelled;

    fn audit() -> Audit {
        Audit::new("nothing".into(), GroupId::FIRST, 1)
    }

    /// Ask about `cell`'s cancelled write at `now`; the token told.
    fn ask(a: &mut Audit, cell: &Arc<OpCell>, now: Instant) -> u32 {
        let mut out = Outbox::new();
        let kind = WrKind::Write { remote_addr: 0x1000, key: 9, imm: None };
        let q = Question { id: WrId::new(1, 1), slot: PeerSlot(0), op: OpKind::Write, kind, len: 64, cell };
        a.ask(q, now, &mut out);
        match out.as_slice() {
            [Action::Tell(PeerSlot(0), Ctl::Check { token, key: 9, write: true, .. })] => *token,
            _ => panic!("one question should be told"),
        }
    }

    #[test]
    fn regions_of_rail_groups_under_one_key_are_judged_and_withdrawn_apart() {
        // Two rail groups' transports may hand out the same key for different regions.
        let mr =
            |id, key, base| MemoryRegion { id, desc: 0, key, rail_keys: vec![100 + id], remote_base: base };
        let mut a = audit();
        a.exposed(&mr(1, 7, 0x1000), 0x100, Access::READ);
        a.exposed(&mr(2, 7, 0x9000), 0x100, Access::WRITE);
        assert_eq!(a.judge(7, 0x1000, 8, false), Verdict::Allowed);
        assert_eq!(a.judge(7, 0x9000, 8, true), Verdict::Allowed);
        assert_eq!(a.judge(7, 0x9000, 8, false), Verdict::NotPermitted);
        assert_eq!(a.judge(7, 0x5000, 8, false), Verdict::OutOfRange);
        a.withdrawn(1);
        assert_eq!(a.judge(7, 0x1000, 8, false), Verdict::OutOfRange, "region 1 is gone");
        assert_eq!(a.judge(7, 0x9000, 8, true), Verdict::Allowed, "region 2 stays");
        assert_eq!(a.judge(101, 0, 8, false), Verdict::UnknownKey);
        // Learnt again with more keys (every group's): replaces, never duplicates.
        a.exposed(&MemoryRegion { rail_keys: vec![102, 300], ..mr(2, 7, 0x9000) }, 0x100, Access::WRITE);
        assert_eq!(a.exposed[&7].len(), 1);
        a.withdrawn(2);
        assert!(a.exposed.is_empty() && a.keys_of.is_empty());
    }

    #[test]
    fn a_question_nobody_answers_fails_its_op_with_its_own_error_in_time() {
        let mut a = audit();
        let patience = Duration::from_secs(10);
        let t0 = Instant::now();
        let (late, fresh, flying) = (OpCell::new(), OpCell::new(), OpCell::new());
        ask(&mut a, &late, t0);
        ask(&mut a, &flying, t0);
        ask(&mut a, &fresh, t0 + patience);
        assert!(a.audited(&late, Err(cancelled())).is_none(), "the failure waits for the verdict");
        assert!(a.audited(&fresh, Err(cancelled())).is_none());

        let mut out = Outbox::new();
        a.expire(t0 + patience + Duration::from_millis(1), patience, &mut out);

        match out.as_slice() {
            [Action::Settle(cell, Err(Error::Transport { source, .. }))] => {
                assert!(Arc::ptr_eq(cell, &late));
                assert_eq!(source.class, FailureClass::Cancelled);
                assert!(source.text.contains("did not say why"), "{}", source.text);
            }
            _ => panic!("only the unanswered parked op should be settled, as cancelled"),
        }
        // The op in flight is no longer asked about: its failure, when it comes, is its own.
        assert!(a.audited(&flying, Err(cancelled())).is_some_and(|res| res.is_err()));
        assert_eq!((a.asking.len(), a.by_token.len()), (1, 1), "the fresh question stays");
    }

    #[test]
    fn a_verdict_turns_a_parked_failure_into_a_refusal_and_a_late_one_is_kept_for_the_failure() {
        let mut a = audit();
        let now = Instant::now();
        let (parked, flying) = (OpCell::new(), OpCell::new());
        let t1 = ask(&mut a, &parked, now);
        let t2 = ask(&mut a, &flying, now);
        assert!(a.audited(&parked, Err(cancelled())).is_none());
        let mut out = Outbox::new();
        a.on_verdict(PeerSlot(1), t1, Verdict::NotPermitted, false, &mut out);
        assert!(out.is_empty(), "another peer's answer is ignored");
        a.on_verdict(PeerSlot(0), t1, Verdict::NotPermitted, false, &mut out);
        assert!(matches!(out.as_slice(), [Action::Settle(_, Err(Error::RemoteAccess { .. }))]));
        // The verdict comes first, the failure after: judged at once.
        out.clear();
        a.on_verdict(PeerSlot(0), t2, Verdict::OutOfRange, false, &mut out);
        assert!(out.is_empty());
        assert!(matches!(a.audited(&flying, Err(cancelled())), Some(Err(Error::RemoteAccess { .. }))));
        assert!(a.idle());
    }

    #[test]
    fn on_a_silent_transport_a_refusal_fails_the_request_and_an_allowance_is_asked_again() {
        let mut a = audit();
        let now = Instant::now();
        let (refused, allowed) = (OpCell::new(), OpCell::new());
        let t1 = ask(&mut a, &refused, now);
        let t2 = ask(&mut a, &allowed, now);
        let mut out = Outbox::new();
        a.on_verdict(PeerSlot(0), t1, Verdict::UnknownKey, true, &mut out);
        assert!(matches!(out.as_slice(), [Action::FailSilent { slot: PeerSlot(0), .. }]));
        out.clear();
        a.on_verdict(PeerSlot(0), t2, Verdict::Allowed, true, &mut out);
        assert!(out.is_empty() && a.asking.len() == 1, "the allowed op is forgotten, to be asked again");
        // The peer is lost: the refused op's failure, when it comes, is judged by the verdict.
        a.lost(PeerSlot(0), Some((&Arc::from("peer"), "gone")), &mut out);
        assert!(matches!(a.audited(&refused, Err(cancelled())), Some(Err(Error::RemoteAccess { .. }))));
    }

    #[test]
    fn a_prober_is_dropped_and_a_flood_of_questions_goes_unanswered() {
        let mut a = audit();
        let now = Instant::now();
        let check = Ctl::Check { token: 1, key: 404, addr: 0, len: 8, write: true };
        let mut out = Outbox::new();
        for _ in 0..MAX_REFUSED {
            a.on_check(PeerSlot(3), check.clone(), now, &mut out);
        }
        assert_eq!(out.len(), MAX_REFUSED as usize);
        assert!(out
            .iter()
            .all(|x| matches!(x, Action::Tell(_, Ctl::Verdict { verdict: Verdict::UnknownKey, .. }))));
        out.clear();
        a.on_check(PeerSlot(3), check.clone(), now, &mut out);
        assert!(matches!(out.as_slice(), [Action::DropPeer(PeerSlot(3), why)] if why.contains("refused")));
        // Another peer's ration is its own; past it, questions go unanswered.
        out.clear();
        let mr = MemoryRegion { id: 1, desc: 0, key: 5, rail_keys: vec![], remote_base: 0 };
        a.exposed(&mr, 64, Access::WRITE);
        let fine = Ctl::Check { token: 2, key: 5, addr: 0, len: 8, write: true };
        for _ in 0..MAX_CHECKS_PER_SEC + 10 {
            a.on_check(PeerSlot(4), fine.clone(), now, &mut out);
        }
        assert_eq!(out.len(), MAX_CHECKS_PER_SEC as usize);
    }

    #[test]
    fn questions_to_one_peer_are_paced_below_what_it_answers() {
        let now = Instant::now();
        let mut w = Window::new(now);
        let allowed = (0..MAX_CHECKS_PER_SEC)
            .filter(|_| w.admit(now, Duration::from_secs(60), MAX_ASKED_PER_SEC))
            .count();
        assert_eq!(allowed as u32, MAX_ASKED_PER_SEC);
        assert!(
            w.admit(now + Duration::from_secs(61), Duration::from_secs(60), MAX_ASKED_PER_SEC),
            "a new window starts afresh"
        );
        assert!(w.admit(now + Duration::from_secs(61), Duration::from_secs(60), 2), "the second of it");
        assert!(!w.admit(now + Duration::from_secs(61), Duration::from_secs(60), 2), "the third is over");
    }
}
