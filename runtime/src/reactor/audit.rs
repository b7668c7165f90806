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
use crate::reactor::cmd::PeerSlot;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{cell_key, Reactor};
use crate::base::control::{Ctl, Verdict};
use crate::base::error::{Error, FailureClass, OpKind};
use crate::base::transport::WrId;
use crate::base::transport::{Access, MemoryRegion, WrKind};
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

/// How long a one-sided op may stay silent before its target is asked about it.
const SILENT_AFTER: Duration = Duration::from_secs(1);

/// Questions a peer may ask per second.
const MAX_CHECKS_PER_SEC: u32 = 1024;

/// Refusals a peer may be answered in a minute before it counts as probing.
const MAX_REFUSED: u32 = 64;

/// Questions we ask one peer per second: half what it answers, so that a burst of cancelled
/// ops (a dropped connection cancels every op on it) stays within its ration even when its
/// windows and ours do not line up. Ops beyond it keep the provider's own error.
const MAX_ASKED_PER_SEC: u32 = MAX_CHECKS_PER_SEC / 2;

/// The longest nap of an idle reactor whose memory peers reach through the target's checks:
/// its progress is what serves their one-sided ops. It delays only the first op after a quiet
/// spell: one served keeps the reactor polling (`Reactor::peers_served`).
const SERVING_NAP: Duration = Duration::from_millis(2);

#[derive(Default)]
pub(super) struct Audit {
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
}

impl Audit {
    /// No question out: the op path needs no look-ups.
    pub(super) fn idle(&self) -> bool {
        self.asking.is_empty()
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
}

impl Reactor {
    /// A one-sided op's work request came back cancelled: ask its target whether it was
    /// allowed (once per op).
    pub(super) fn question(
        &mut self,
        id: WrId,
        slot: PeerSlot,
        op: OpKind,
        kind: WrKind,
        len: usize,
        cell: &Arc<OpCell>,
    ) {
        let (key, addr, write) = match (op, kind) {
            (OpKind::Write | OpKind::WriteImm, WrKind::Write { remote_addr, key, .. }) => {
                (key, remote_addr, true)
            }
            // A read of ours, or a receive reading a large message (rendezvous).
            (OpKind::Read | OpKind::Recv, WrKind::Read { remote_addr, key }) => (key, remote_addr, false),
            _ => return,
        };
        let k = cell_key(cell);
        if self.audit.asking.contains_key(&k) {
            return;
        }
        let Some(p) = self.peers.get_mut(slot).filter(|p| p.lost().is_none()) else {
            return;
        };
        // The peer answers all our rail groups' questions together: each asks its share.
        let ours = MAX_ASKED_PER_SEC / self.groups.max(1);
        if !p.asked.admit(self.now, Duration::from_secs(1), ours) {
            return;
        }
        self.audit.next_token = self.audit.next_token.wrapping_add(1) & ((1 << super::TOKEN_GROUP_SHIFT) - 1);
        let token = (self.group << super::TOKEN_GROUP_SHIFT) | self.audit.next_token;
        self.tell(slot, Ctl::Check { token, key, addr, len: len as u64, write });
        self.audit.by_token.insert(token, k);
        let asking =
            Asking { slot, token, id, cell: cell.clone(), verdict: None, parked: None, asked: self.now };
        self.audit.asking.insert(k, asking);
    }

    /// The op's result, unless it waits for a verdict (then `None`).
    pub(super) fn audited(
        &mut self,
        cell: &Arc<OpCell>,
        res: Result<Done, Error>,
    ) -> Option<Result<Done, Error>> {
        let k = cell_key(cell);
        let Some(a) = self.audit.asking.get_mut(&k) else {
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

    fn forget(&mut self, k: usize) {
        if let Some(a) = self.audit.asking.remove(&k) {
            self.audit.by_token.remove(&a.token);
        }
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
            // Lost because of the refusal (`fail_silent`), or right after it.
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

    /// A bound on the idle reactor's naps: where one-sided ops are checked (and so served) by
    /// the target's progress, while this runtime exposes memory (regions, or a large message a
    /// peer is reading), peers' ops must not wait out a long nap.
    pub(crate) fn longest_nap(&self) -> Option<Duration> {
        (self.silent_refusals && (!self.audit.exposed.is_empty() || self.rendezvous_open()))
            .then_some(SERVING_NAP)
    }

    /// On a transport whose refusals are silent: ask about the one-sided ops that were in flight
    /// at the previous look already (at least `SILENT_AFTER` ago).
    pub(super) fn sweep_silent(&mut self) {
        let now = self.now;
        let since = match self.audit.swept {
            Some((at, _)) if now.duration_since(at) < SILENT_AFTER => return,
            Some((_, generation)) => generation,
            None => 0,
        };
        self.audit.swept = Some((now, self.generation + 1));
        let silent: Vec<_> = self
            .inflight
            .iter()
            .filter(|(_, f)| {
                f.id.generation() < since && matches!(f.kind, WrKind::Write { .. } | WrKind::Read { .. })
            })
            .map(|(_, f)| (f.id, f.peer, f.op, f.kind, f.len(), f.cell.clone()))
            .collect();
        for (id, slot, op, kind, len, cell) in silent {
            self.question(id, slot, op, kind, len, &cell);
        }
    }

    /// The target refused an op the provider will never complete. Its requests may still be
    /// queued in the provider, so only closing the peer's lanes makes sure nothing touches
    /// their memory: the peer is lost, and the refused op fails as `RemoteAccess`.
    fn fail_silent(&mut self, slot: PeerSlot, id: WrId, why: &str) {
        // The refused request's own failure first, so a batch names its piece (the peer's loss
        // would otherwise be the op's first error).
        let f = self.inflight.get(id.slot()).filter(|f| f.id == id);
        if let Some(c) = f.and_then(|f| f.chunk) {
            let e = Error::Transport {
                op: f.map_or(OpKind::Write, |f| f.op),
                peer: self.peers.get(slot).map_or_else(|| "-".into(), |p| p.label.clone()),
                source: self
                    .local_error(FailureClass::Cancelled, "dropped by the provider without a completion"),
            };
            if let Some(h) = self.held[c.op.0].as_mut() {
                super::note_chunk_error(h, c.offset, e);
            }
        }
        self.drop_peer(slot, format!("it refused a one-sided op of ours ({why})"));
    }

    /// A peer asks about an op of its own on our memory, or answers about one of ours.
    pub(super) fn on_audit(&mut self, slot: PeerSlot, msg: Ctl) {
        match msg {
            Ctl::Check { token, key, addr, len, write } => {
                let now = self.now;
                let Some(p) = self.peers.get_mut(slot) else {
                    return;
                };
                let verdict = self.audit.judge(key, addr, len, write);
                // Over the ration, a question goes unanswered (the asker's op keeps its own
                // error once it gives up): a burst of honest questions, all the ops a dropped
                // connection cancelled, costs nothing more. Refusals are what probing for keys
                // looks like: too many, and the peer is dropped.
                if !p.checks.admit(now, Duration::from_secs(1), MAX_CHECKS_PER_SEC) {
                    return;
                }
                if verdict.refusal().is_some() && !p.refused.admit(now, Duration::from_secs(60), MAX_REFUSED)
                {
                    let why = format!(
                        "it was refused more than {MAX_REFUSED} times a minute asking about our memory"
                    );
                    self.drop_peer(slot, why);
                    return;
                }
                self.tell(slot, Ctl::Verdict { token, verdict });
            }
            Ctl::Verdict { token, verdict } => {
                let Some(&k) = self.audit.by_token.get(&token) else {
                    return;
                };
                let a = self.audit.asking.get_mut(&k).expect("indexed");
                if a.slot != slot {
                    return;
                }
                match a.parked.take() {
                    Some(e) => {
                        let cell = a.cell.clone();
                        self.forget(k);
                        let e = self.judged(e, verdict);
                        self.settle_audited(&cell, Err(e));
                    }
                    None if self.silent_refusals => match verdict.refusal() {
                        Some(why) => {
                            a.verdict = Some(verdict);
                            let id = a.id;
                            self.fail_silent(slot, id, why);
                        }
                        // Allowed, and still silent: forget the question, so that a later
                        // sweep asks again (another of its requests may be the refused one).
                        None => self.forget(k),
                    },
                    None => a.verdict = Some(verdict),
                }
            }
            _ => {}
        }
    }

    /// Questions out longer than the reactor's patience get no answer any more. A live runtime
    /// answers in well under a millisecond and a dead one is noticed by its heartbeats, so
    /// this bounds the wait on a peer that beats but does not answer (or is over its ration):
    /// an op waiting on one fails with its own error, and an op still in flight may be asked
    /// about again.
    pub(super) fn expire_questions(&mut self) {
        let now = self.now;
        let late: Vec<usize> = self
            .audit
            .asking
            .iter()
            .filter(|(_, a)| a.verdict.is_none() && now.duration_since(a.asked) >= self.patience)
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            let a = self.audit.asking.get_mut(&k).expect("listed");
            let parked = a.parked.take();
            let cell = a.cell.clone();
            self.forget(k);
            if let Some(e) = parked {
                let note = format!("the peer did not say why within {} s", self.patience.as_secs());
                self.settle_audited(&cell, Err(unexplained(e, &note)));
            }
        }
    }

    /// No verdict will come from `slot`: what waits for one fails as the peer's loss (`lost`:
    /// how it was noticed) or, at shutdown, with the provider's error.
    pub(super) fn audit_lost(&mut self, slot: PeerSlot, lost: Option<&str>) {
        let ks: Vec<usize> =
            self.audit.asking.iter().filter(|(_, a)| a.slot == slot).map(|(k, _)| *k).collect();
        for k in ks {
            let a = self.audit.asking.get_mut(&k).expect("listed");
            match a.parked.take() {
                Some(e) => {
                    let cell = a.cell.clone();
                    self.forget(k);
                    let e = match (lost, self.peers.get(slot)) {
                        (Some(reason), Some(p)) => Error::PeerLost {
                            op: e.op(),
                            peer: p.label.clone(),
                            reason: format!("{reason}; {e}").into(),
                        },
                        _ => e,
                    };
                    self.settle_audited(&cell, Err(e));
                }
                None => a.verdict = Some(Verdict::Allowed),
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
    use crate::reactor::peers::Window;
    use crate::reactor::testing::{cancelled, reactor};

    /// Ask about `cell` as if at `asked`, with the op over (`parked`) or still in flight.
    fn ask(r: &mut Reactor, cell: &Arc<OpCell>, token: u32, asked: Instant, parked: Option<Error>) {
        let k = cell_key(cell);
        r.audit.by_token.insert(token, k);
        let a = Asking {
            slot: PeerSlot(0),
            token,
            id: WrId::new(1, 1),
            cell: cell.clone(),
            verdict: None,
            parked,
            asked,
        };
        r.audit.asking.insert(k, a);
    }

    #[test]
    fn regions_of_rail_groups_under_one_key_are_judged_and_withdrawn_apart() {
        // Two rail groups' transports may hand out the same key for different regions.
        let mr =
            |id, key, base| MemoryRegion { id, desc: 0, key, rail_keys: vec![100 + id], remote_base: base };
        let mut a = Audit::default();
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
        let mut r = reactor();
        let old = Instant::now() - r.patience - Duration::from_millis(1);
        let (late, fresh, flying) = (OpCell::new(), OpCell::new(), OpCell::new());
        ask(&mut r, &late, 1, old, Some(cancelled()));
        ask(&mut r, &fresh, 2, Instant::now(), Some(cancelled()));
        ask(&mut r, &flying, 3, old, None);

        r.expire_questions();

        match late.outcome() {
            Some(Err(Error::Transport { source, .. })) => {
                assert_eq!(source.class, FailureClass::Cancelled);
                assert!(source.text.contains("did not say why"), "{}", source.text);
            }
            other => panic!("the unanswered op should fail as cancelled, got {other:?}"),
        }
        assert!(fresh.outcome().is_none(), "an op asked about just now still waits");
        // The op in flight is no longer asked about: its failure, when it comes, is its own.
        assert!(flying.outcome().is_none());
        assert!(r.audited(&flying, Err(cancelled())).is_some_and(|res| res.is_err()));
        assert_eq!(r.audit.asking.len(), 1);
        assert_eq!(r.audit.by_token.len(), 1);
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
