//! Messages above the largest message the provider takes, by rendezvous: the receiver pulls
//! them. A message cannot be cut into several (each piece would take a receive the application
//! posted for another message), so the sender exposes its buffer read-only, tells the receiver
//! where it is on the control connection (an offer), and posts a zero-length marker message
//! carrying the offer's token as immediate data. The marker takes the message's place among
//! the others, so the receive it lands in is the one the message would have landed in; that
//! receive then reads the bytes (split and scheduled as bulk, like any read) and answers `Done`
//! on the control connection, upon which the sender withdraws the access and completes.
//!
//! Application sends never carry immediate data, so a receive completing with one is a marker.
//! Offer and marker travel separately and arrive in either order. Both sides keep the op's
//! cell while the rendezvous runs, so a dropped future does not withdraw it half-way: the
//! exposed buffer stays alive (in the cell) until the access is gone.
//!
//! [`Rendezvous`] is a machine of its own: the reactor exposes the buffer and posts the marker;
//! everything else (tokens, offers and markers in either order, answers, giving up) happens
//! here, each input answered with [`Action`]s for the reactor to carry out.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::{Action, Outbox};
use super::cell_key;
use super::cmd::{OpReq, PeerSlot};
use crate::base::control::{Ctl, Pulled};
use crate::base::error::{Error, FailureClass, OpKind, TransportError};
use crate::base::remote::RemoteBuf;
use crate::base::sched::Class;
use crate::base::transport::{LocalSeg, WrKind};
use crate::reactor::cell::{Done, OpCell};

/// Offers one peer may have outstanding before it counts as misbehaving. A sender keeps its
/// own large sends to a peer below it, failing the next one with `Backpressure`.
pub(super) const MAX_OFFERS: usize = 4096;

/// Withdrawn offers remembered per peer, for their markers that may still come. A marker is
/// posted right after its offer is told, so only the last few can be on their way; a peer
/// withdrawing more at once forgets the oldest, and a marker for one of those waits out the
/// patience like any marker without an offer.
const WITHDRAWN_KEPT: usize = 64;

/// A send of ours the peer is pulling.
struct Outgoing {
    slot: PeerSlot,
    /// The peer, as errors name it.
    label: Arc<str>,
    cell: Arc<OpCell>,
    /// The read-only registration of the buffer.
    mr: u64,
    len: usize,
    /// The marker message's completion came (successfully).
    marked: bool,
    /// The peer's answer, if it came before the marker's completion.
    answer: Option<Pulled>,
}

/// A receive that got a marker and waits for the offer.
struct Waiting {
    cell: Arc<OpCell>,
    seg: LocalSeg,
    /// When the marker came.
    since: Instant,
}

/// A receive reading an offered message.
struct Pulling {
    slot: PeerSlot,
    token: u32,
    /// Kept so a dropped future does not withdraw the read half-way: the sender waits for an
    /// answer either way.
    _cell: Arc<OpCell>,
}

/// The peer an input concerns, as the reactor knows it.
#[derive(Clone, Copy)]
pub(super) struct PeerRef<'a> {
    pub slot: PeerSlot,
    /// The peer runtime's id.
    pub id: u64,
    pub label: &'a Arc<str>,
}

/// The rendezvous of large messages, both ways.
pub(super) struct Rendezvous {
    /// Named in the errors the rendezvous makes itself.
    provider: String,
    next_token: u32,
    /// Our sends, by token.
    outgoing: HashMap<u32, Outgoing>,
    /// How many of them go to each peer.
    outgoing_per_peer: HashMap<PeerSlot, usize>,
    /// Marker sends in the op path, by cell address: their completion is not the send's.
    markers: HashMap<usize, u32>,
    /// Offers whose marker has not arrived, by peer slot and token (by peer first: each new
    /// offer checks its peer's count).
    offers: HashMap<PeerSlot, HashMap<u32, RemoteBuf>>,
    /// Receives whose marker arrived before the offer.
    waiting: HashMap<(PeerSlot, u32), Waiting>,
    /// Offers the peer withdrew before their marker arrived, newest last: the marker takes
    /// the data path and the withdrawal the control connection, so the marker can come after.
    withdrawn: HashMap<PeerSlot, VecDeque<u32>>,
    /// Reads in progress, by the receive's cell address.
    pulling: HashMap<usize, Pulling>,
}

impl Rendezvous {
    /// A rendezvous whose errors name `provider`.
    pub(super) fn new(provider: String) -> Rendezvous {
        Rendezvous {
            provider,
            next_token: 0,
            outgoing: HashMap::new(),
            outgoing_per_peer: HashMap::new(),
            markers: HashMap::new(),
            offers: HashMap::new(),
            waiting: HashMap::new(),
            withdrawn: HashMap::new(),
            pulling: HashMap::new(),
        }
    }

    /// Nothing in progress: the op path needs no look-ups.
    pub(super) fn idle(&self) -> bool {
        self.markers.is_empty() && self.pulling.is_empty()
    }

    /// A send of ours is being read by its peer.
    pub(super) fn open(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// Our sends the peer in `slot` is yet to read (each an offer there).
    pub(super) fn outgoing_to(&self, slot: PeerSlot) -> usize {
        self.outgoing_per_peer.get(&slot).copied().unwrap_or(0)
    }

    /// Receives wait for offers.
    pub(super) fn markers_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// A failure the rendezvous reports itself, in the provider's name (no errno).
    fn local_error(&self, class: FailureClass, text: impl Into<String>) -> TransportError {
        TransportError::local(&self.provider, class, text)
    }

    /// A send to `slot` above the largest message, its buffer exposed read-only as registration
    /// `mr`: its token, for the offer the reactor tells and the marker it posts in the send's
    /// place.
    pub(super) fn offered(
        &mut self,
        slot: PeerSlot,
        label: Arc<str>,
        cell: &Arc<OpCell>,
        mr: u64,
        len: usize,
    ) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        self.markers.insert(cell_key(cell), token);
        let out = Outgoing { slot, label, cell: cell.clone(), mr, len, marked: false, answer: None };
        self.outgoing.insert(token, out);
        *self.outgoing_per_peer.entry(slot).or_default() += 1;
        token
    }

    /// An op is over (past the audit): a marker finishes its send, a read of an offered message
    /// answers its sender; what is left to complete is returned (`None`: nothing, or the
    /// actions complete it).
    pub(super) fn settled(
        &mut self,
        cell: &Arc<OpCell>,
        res: Result<Done, Error>,
        out: &mut Outbox,
    ) -> Option<Result<Done, Error>> {
        let k = cell_key(cell);
        if let Some(token) = self.markers.remove(&k) {
            self.marker_done(token, res, out);
            None
        } else if let Some(p) = self.pulling.remove(&k) {
            let outcome = if res.is_ok() { Pulled::Whole } else { Pulled::Failed };
            out.push(Action::Tell(p.slot, Ctl::Done { token: p.token, outcome }));
            Some(res.map(|d| Done { len: d.len, imm: None }))
        } else {
            Some(res)
        }
    }

    fn marker_done(&mut self, token: u32, res: Result<Done, Error>, out: &mut Outbox) {
        let Some(o) = self.outgoing.get_mut(&token) else {
            return;
        };
        match (res, o.answer) {
            (Ok(_), answer) => {
                o.marked = true;
                if let Some(answer) = answer {
                    self.finish_send(token, Ok(answer), out);
                }
            }
            // The peer answered already: the marker reached it whatever its own completion
            // says (a provider can fail a send it delivered, as tcp;ofi_rxm does when a fault
            // drops the connection), and the answer is the message's fate. Failing a send that
            // was read whole would have an application that retries deliver it twice.
            (Err(_), Some(answer)) => self.finish_send(token, Ok(answer), out),
            (Err(e), None) => {
                // No marker will come: the peer forgets the offer (else it keeps it until we
                // are lost, counting against our offers there).
                out.push(Action::Tell(o.slot, Ctl::Withdrawn { token }));
                self.finish_send(token, Err(e), out);
            }
        }
    }

    /// The send is over: withdraw the access, then complete it.
    fn finish_send(&mut self, token: u32, res: Result<Pulled, Error>, out: &mut Outbox) {
        let Some(o) = self.outgoing.remove(&token) else {
            return;
        };
        if let Some(n) = self.outgoing_per_peer.get_mut(&o.slot) {
            *n -= 1;
            if *n == 0 {
                self.outgoing_per_peer.remove(&o.slot);
            }
        }
        self.markers.remove(&cell_key(&o.cell));
        out.push(Action::Withdraw(o.mr));
        let res = match res {
            Ok(Pulled::Whole) => Ok(Done { len: o.len, imm: None }),
            Ok(Pulled::TooSmall(n)) => Err(Error::Transport {
                op: OpKind::Send,
                peer: o.label.clone(),
                source: self.local_error(
                    FailureClass::Truncated,
                    format!("the peer's {n}-byte receive buffer is too small for the {}-byte message", o.len),
                ),
            }),
            Ok(Pulled::Failed) => Err(Error::Transport {
                op: OpKind::Send,
                peer: o.label.clone(),
                source: self.local_error(FailureClass::Other, "the peer failed to read the message"),
            }),
            Err(e) => Err(e),
        };
        out.push(Action::Complete(o.cell, res));
    }

    /// A receive completed with immediate data: a marker. Pull the message it stands for once
    /// its offer is in. `running`: the reactor takes new work (else the pull fails at once).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn marker_arrived(
        &mut self,
        peer: PeerRef<'_>,
        token: u32,
        cell: Arc<OpCell>,
        seg: LocalSeg,
        now: Instant,
        running: bool,
        out: &mut Outbox,
    ) {
        match self.take_offer(peer.slot, token) {
            Some(desc) => self.pull(peer, token, desc, cell, seg, running, out),
            None if self.forget_withdrawn(peer.slot, token) => {
                out.push(Action::Complete(cell, Err(self.withdrawn_error(peer))));
            }
            None if self.waiting.contains_key(&(peer.slot, token)) => {
                // A correct peer never reuses a token while its send runs.
                let reason = format!("it sent two messages under rendezvous token {token}");
                out.push(Action::DropPeer(peer.slot, reason.clone()));
                let e = Error::PeerLost { op: OpKind::Recv, peer: peer.label.clone(), reason: reason.into() };
                out.push(Action::Complete(cell, Err(e)));
            }
            None => {
                self.waiting.insert((peer.slot, token), Waiting { cell, seg, since: now });
            }
        }
    }

    /// Markers are waiting for their offers: give up on a peer whose offer is overdue. The
    /// sender tells the offer before it posts the marker, so the offer trails by a control
    /// hop at most; one later than `patience` means a broken peer.
    pub(super) fn expire(&mut self, now: Instant, patience: Duration, out: &mut Outbox) {
        let mut late: Vec<(PeerSlot, u32)> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.duration_since(w.since) >= patience)
            .map(|(k, _)| *k)
            .collect();
        late.sort_unstable();
        late.dedup_by_key(|(slot, _)| *slot);
        for (slot, token) in late {
            let why = format!(
                "its offer for rendezvous token {token} did not come within {} s",
                patience.as_secs()
            );
            out.push(Action::DropPeer(slot, why));
        }
    }

    /// The peer's offer `token`, taken out.
    fn take_offer(&mut self, slot: PeerSlot, token: u32) -> Option<RemoteBuf> {
        let of_peer = self.offers.get_mut(&slot)?;
        let desc = of_peer.remove(&token);
        if of_peer.is_empty() {
            self.offers.remove(&slot);
        }
        desc
    }

    /// The peer offers a message of its own for us to read.
    pub(super) fn on_offer(
        &mut self,
        peer: PeerRef<'_>,
        token: u32,
        desc: RemoteBuf,
        running: bool,
        out: &mut Outbox,
    ) {
        match self.waiting.remove(&(peer.slot, token)) {
            Some(w) => self.pull(peer, token, desc, w.cell, w.seg, running, out),
            None if self.offers.get(&peer.slot).map_or(0, HashMap::len) >= MAX_OFFERS => {
                out.push(Action::DropPeer(peer.slot, format!("more than {MAX_OFFERS} offers outstanding")));
            }
            None => {
                self.offers.entry(peer.slot).or_default().insert(token, desc);
            }
        }
    }

    /// The peer withdrew an offer: its post of the marker failed.
    pub(super) fn on_withdrawn(&mut self, peer: PeerRef<'_>, token: u32, out: &mut Outbox) {
        if self.take_offer(peer.slot, token).is_some() {
            // Its marker may still be on its way although the sender saw the post fail.
            let kept = self.withdrawn.entry(peer.slot).or_default();
            if kept.len() == WITHDRAWN_KEPT {
                kept.pop_front();
            }
            kept.push_back(token);
        }
        // The marker arrived although the sender saw its post fail: the message is gone all
        // the same.
        if let Some(w) = self.waiting.remove(&(peer.slot, token)) {
            out.push(Action::Complete(w.cell, Err(self.withdrawn_error(peer))));
        }
    }

    /// The token was among the peer's withdrawn offers (and no longer is).
    fn forget_withdrawn(&mut self, slot: PeerSlot, token: u32) -> bool {
        let Some(kept) = self.withdrawn.get_mut(&slot) else {
            return false;
        };
        let Some(i) = kept.iter().position(|t| *t == token) else {
            return false;
        };
        kept.remove(i);
        if kept.is_empty() {
            self.withdrawn.remove(&slot);
        }
        true
    }

    /// How a receive fails whose marker stands for a withdrawn message.
    fn withdrawn_error(&self, peer: PeerRef<'_>) -> Error {
        let source = self.local_error(FailureClass::Other, "the sender withdrew the message");
        Error::Transport { op: OpKind::Recv, peer: peer.label.clone(), source }
    }

    /// The peer is done reading a message of ours.
    pub(super) fn on_done(&mut self, slot: PeerSlot, token: u32, outcome: Pulled, out: &mut Outbox) {
        let Some(o) = self.outgoing.get_mut(&token).filter(|o| o.slot == slot) else {
            tracing::debug!(token, "answer to no offer of ours ignored");
            return;
        };
        if o.marked {
            self.finish_send(token, Ok(outcome), out);
        } else {
            o.answer = Some(outcome);
        }
    }

    /// Read an offered message into the receive buffer `seg`, as a bulk read through the
    /// scheduler; its completion answers the sender and completes the receive.
    #[allow(clippy::too_many_arguments)]
    fn pull(
        &mut self,
        peer: PeerRef<'_>,
        token: u32,
        desc: RemoteBuf,
        cell: Arc<OpCell>,
        seg: LocalSeg,
        running: bool,
        out: &mut Outbox,
    ) {
        let slot = peer.slot;
        if !running {
            out.push(Action::Tell(slot, Ctl::Done { token, outcome: Pulled::Failed }));
            out.push(Action::Complete(cell, Err(Error::Shutdown { op: OpKind::Recv })));
            return;
        }
        let len = desc.len();
        if len > seg.len as u64 || len == 0 {
            out.push(Action::Tell(slot, Ctl::Done { token, outcome: Pulled::TooSmall(seg.len as u64) }));
            let text = format!("a {len}-byte message does not fit the {}-byte receive buffer", seg.len);
            let source = self.local_error(FailureClass::Truncated, text);
            let e = Error::Transport { op: OpKind::Recv, peer: peer.label.clone(), source };
            out.push(Action::Complete(cell, Err(e)));
            return;
        }
        let req = OpReq {
            peer: slot,
            peer_id: peer.id,
            op: OpKind::Recv,
            kind: WrKind::Read { remote_addr: desc.addr(), key: desc.key() },
            seg: LocalSeg { len: len as usize, ..seg },
            cell: cell.clone(),
            tenant: 0,
            class: Some(Class::Bulk),
            batch: None,
            rail_keys: desc.rail_keys(),
            slots: None,
            device: false,
        };
        self.pulling.insert(cell_key(&cell), Pulling { slot, token, _cell: cell });
        out.push(Action::Pull(Box::new(req)));
    }

    /// The peer in `slot` is gone (its ops have been failed): give back what waits on it, each
    /// failing with `why`.
    pub(super) fn lost(&mut self, slot: PeerSlot, why: impl Fn(OpKind) -> Error, out: &mut Outbox) {
        // A send whose marker is still on its way is finished by the marker's failure.
        let tokens: Vec<u32> =
            self.outgoing.iter().filter(|(_, o)| o.slot == slot && o.marked).map(|(t, _)| *t).collect();
        for t in tokens {
            self.finish_send(t, Err(why(OpKind::Send)), out);
        }
        self.offers.remove(&slot);
        self.withdrawn.remove(&slot);
        let waiting: Vec<(PeerSlot, u32)> =
            self.waiting.keys().filter(|(s, _)| *s == slot).copied().collect();
        for k in waiting {
            let w = self.waiting.remove(&k).expect("listed");
            out.push(Action::Complete(w.cell, Err(why(OpKind::Recv))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::transport::Access;
    use crate::reactor::testing::cancelled;

    const SEG: LocalSeg = LocalSeg { ptr: std::ptr::null_mut(), len: 64, desc: 0 };

    fn label() -> Arc<str> {
        "peer".into()
    }

    fn peer(label: &Arc<str>) -> PeerRef<'_> {
        PeerRef { slot: PeerSlot(0), id: 7, label }
    }

    #[test]
    fn offer_and_marker_meet_in_either_order_and_the_read_answers_the_sender() {
        let (l, now) = (label(), Instant::now());
        let mut r = Rendezvous::new("nothing".into());
        let desc = RemoteBuf::new(0, 4096, 64, &[1], Access::READ);
        let mut out = Outbox::new();
        // Marker first: the receive waits, then the offer starts the read.
        let first = OpCell::new();
        r.marker_arrived(peer(&l), 1, first.clone(), SEG, now, true, &mut out);
        assert!(out.is_empty() && r.markers_waiting());
        r.on_offer(peer(&l), 1, desc.clone(), true, &mut out);
        assert!(
            matches!(out.as_slice(), [Action::Pull(req)] if req.seg.len == 64 && req.class == Some(Class::Bulk))
        );
        // Offer first: the marker starts the read.
        out.clear();
        let second = OpCell::new();
        r.on_offer(peer(&l), 2, desc, true, &mut out);
        assert!(out.is_empty());
        r.marker_arrived(peer(&l), 2, second.clone(), SEG, now, true, &mut out);
        assert!(matches!(out.as_slice(), [Action::Pull(_)]));
        // Each read's completion answers its sender and leaves the receive to complete.
        out.clear();
        let res = r.settled(&first, Ok(Done { len: 64, imm: Some(1) }), &mut out);
        assert_eq!(
            res.and_then(|r| r.ok()),
            Some(Done { len: 64, imm: None }),
            "the marker's immediate is not the message's"
        );
        assert!(matches!(out.as_slice(), [Action::Tell(_, Ctl::Done { token: 1, outcome: Pulled::Whole })]));
        out.clear();
        assert!(r.settled(&second, Err(cancelled()), &mut out).is_some_and(|r| r.is_err()));
        assert!(matches!(out.as_slice(), [Action::Tell(_, Ctl::Done { token: 2, outcome: Pulled::Failed })]));
        assert!(r.idle() && !r.markers_waiting());
    }

    #[test]
    fn a_send_completes_with_its_marker_and_the_answer_whichever_comes_last() {
        let l = label();
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let (a, b) = (OpCell::new(), OpCell::new());
        let ta = r.offered(PeerSlot(0), l.clone(), &a, 11, 1 << 20);
        let tb = r.offered(PeerSlot(0), l.clone(), &b, 12, 1 << 20);
        // a: the marker completes, then the answer.
        assert!(r.settled(&a, Ok(Done { len: 0, imm: None }), &mut out).is_none());
        assert!(out.is_empty() && r.open());
        r.on_done(PeerSlot(1), ta, Pulled::Whole, &mut out);
        assert!(out.is_empty(), "another peer cannot answer for this one");
        r.on_done(PeerSlot(0), ta, Pulled::Whole, &mut out);
        assert!(matches!(
            out.as_slice(),
            [Action::Withdraw(11), Action::Complete(c, Ok(Done { len: 1048576, .. }))] if Arc::ptr_eq(c, &a)
        ));
        // b: the answer (too small a buffer) first, then the marker.
        out.clear();
        r.on_done(PeerSlot(0), tb, Pulled::TooSmall(100), &mut out);
        assert!(out.is_empty());
        assert!(r.settled(&b, Ok(Done { len: 0, imm: None }), &mut out).is_none());
        match out.as_slice() {
            [Action::Withdraw(12), Action::Complete(_, Err(Error::Transport { source, .. }))] => {
                assert_eq!(source.class, FailureClass::Truncated);
                assert!(source.text.contains("100-byte"), "{}", source.text);
            }
            _ => panic!("the send should fail as truncated after withdrawing its buffer"),
        }
        assert!(r.idle() && !r.open());
    }

    #[test]
    fn a_second_marker_under_one_token_drops_the_peer_and_fails_the_receive() {
        let (l, now) = (label(), Instant::now());
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let (first, second) = (OpCell::new(), OpCell::new());
        r.marker_arrived(peer(&l), 5, first.clone(), SEG, now, true, &mut out);
        assert!(out.is_empty(), "a marker waits for its offer");
        r.marker_arrived(peer(&l), 5, second.clone(), SEG, now, true, &mut out);
        match out.as_slice() {
            [Action::DropPeer(PeerSlot(0), why), Action::Complete(c, Err(Error::PeerLost { .. }))] => {
                assert!(why.contains("token 5"));
                assert!(Arc::ptr_eq(c, &second));
            }
            _ => panic!("the peer should be dropped and the second receive failed"),
        }
        // Dropping it loses the peer, which fails the first receive.
        out.clear();
        r.lost(PeerSlot(0), |op| Error::Shutdown { op }, &mut out);
        assert!(matches!(out.as_slice(), [Action::Complete(c, Err(_))] if Arc::ptr_eq(c, &first)));
    }

    #[test]
    fn a_marker_whose_offer_never_comes_drops_the_peer() {
        let (l, now) = (label(), Instant::now());
        let patience = Duration::from_secs(10);
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        r.marker_arrived(peer(&l), 3, OpCell::new(), SEG, now, true, &mut out);
        r.expire(now + patience / 2, patience, &mut out);
        assert!(out.is_empty(), "an offer may trail its marker a while");
        r.expire(now + patience, patience, &mut out);
        assert!(
            matches!(out.as_slice(), [Action::DropPeer(PeerSlot(0), why)] if why.contains("did not come"))
        );
    }

    #[test]
    fn a_withdrawn_offer_is_forgotten_and_a_receive_waiting_on_it_fails() {
        let (l, now) = (label(), Instant::now());
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let desc = RemoteBuf::new(0, 4096, 64, &[1], Access::READ);
        r.on_offer(peer(&l), 8, desc, true, &mut out);
        assert_eq!(r.offers.values().map(HashMap::len).sum::<usize>(), 1);
        r.on_withdrawn(peer(&l), 8, &mut out);
        assert!(r.offers.is_empty() && out.is_empty(), "the offer is forgotten");

        r.marker_arrived(peer(&l), 9, OpCell::new(), SEG, now, true, &mut out);
        r.on_withdrawn(peer(&l), 9, &mut out);
        match out.as_slice() {
            [Action::Complete(_, Err(Error::Transport { source, .. }))] => {
                assert!(source.text.contains("withdrew"))
            }
            _ => panic!("the receive should fail"),
        }
        assert!(!r.markers_waiting());
    }

    #[test]
    fn a_marker_that_comes_after_its_withdrawal_fails_its_receive_at_once() {
        let (l, now) = (label(), Instant::now());
        let patience = Duration::from_secs(10);
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let desc = RemoteBuf::new(0, 4096, 64, &[1], Access::READ);
        // The sender's marker post failed and it withdrew the offer, yet the marker arrives
        // after the withdrawal (they take different routes).
        r.on_offer(peer(&l), 8, desc.clone(), true, &mut out);
        r.on_withdrawn(peer(&l), 8, &mut out);
        assert!(out.is_empty());
        let cell = OpCell::new();
        r.marker_arrived(peer(&l), 8, cell.clone(), SEG, now, true, &mut out);
        match out.as_slice() {
            [Action::Complete(c, Err(Error::Transport { source, .. }))] => {
                assert!(Arc::ptr_eq(c, &cell));
                assert!(source.text.contains("withdrew"), "{}", source.text);
            }
            _ => panic!("the receive should fail at once"),
        }
        out.clear();
        r.expire(now + patience, patience, &mut out);
        assert!(out.is_empty() && !r.markers_waiting(), "a healthy peer is not dropped");
        assert!(r.withdrawn.is_empty(), "the withdrawal is forgotten once its marker came");

        // Only the last WITHDRAWN_KEPT withdrawals are remembered; an older one's marker waits.
        for t in 100..100 + WITHDRAWN_KEPT as u32 + 1 {
            r.on_offer(peer(&l), t, desc.clone(), true, &mut out);
            r.on_withdrawn(peer(&l), t, &mut out);
        }
        assert_eq!(r.withdrawn[&PeerSlot(0)].len(), WITHDRAWN_KEPT);
        r.marker_arrived(peer(&l), 100, OpCell::new(), SEG, now, true, &mut out);
        assert!(out.is_empty() && r.markers_waiting());
        r.lost(PeerSlot(0), |op| Error::Shutdown { op }, &mut out);
        assert!(r.withdrawn.is_empty() && !r.markers_waiting(), "a lost peer's records go with it");
    }

    #[test]
    fn a_failed_marker_withdraws_its_offer_and_fails_the_send() {
        let l = label();
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let cell = OpCell::new();
        let token = r.offered(PeerSlot(0), l, &cell, 1, 1 << 20);
        assert!(r.settled(&cell, Err(cancelled()), &mut out).is_none());
        match out.as_slice() {
            [Action::Tell(PeerSlot(0), Ctl::Withdrawn { token: t }), Action::Withdraw(1), Action::Complete(_, Err(_))] =>
            {
                assert_eq!(*t, token)
            }
            _ => panic!("the offer should be withdrawn, the buffer deregistered and the send failed"),
        }
        assert!(r.idle() && !r.open());
    }

    #[test]
    fn a_marker_that_fails_after_the_peer_answered_leaves_the_answer_standing() {
        let l = label();
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let cell = OpCell::new();
        let token = r.offered(PeerSlot(0), l, &cell, 4, 1 << 20);
        // The peer read the message whole and said so; then the marker's own completion fails.
        r.on_done(PeerSlot(0), token, Pulled::Whole, &mut out);
        assert!(out.is_empty());
        assert!(r.settled(&cell, Err(cancelled()), &mut out).is_none());
        assert!(
            matches!(
                out.as_slice(),
                [Action::Withdraw(4), Action::Complete(c, Ok(Done { len: 1048576, .. }))] if Arc::ptr_eq(c, &cell)
            ),
            "the send completes as the peer answered, and nothing is withdrawn at the peer"
        );
        assert!(r.idle() && !r.open());
    }

    #[test]
    fn a_message_too_large_for_the_receive_or_offered_at_shutdown_is_refused() {
        let (l, now) = (label(), Instant::now());
        let mut r = Rendezvous::new("nothing".into());
        let mut out = Outbox::new();
        let big = RemoteBuf::new(0, 4096, 65, &[1], Access::READ);
        r.on_offer(peer(&l), 1, big.clone(), true, &mut out);
        r.marker_arrived(peer(&l), 1, OpCell::new(), SEG, now, true, &mut out);
        assert!(matches!(
            out.as_slice(),
            [Action::Tell(_, Ctl::Done { outcome: Pulled::TooSmall(64), .. }), Action::Complete(_, Err(_))]
        ));
        out.clear();
        r.on_offer(peer(&l), 2, big, true, &mut out);
        r.marker_arrived(peer(&l), 2, OpCell::new(), SEG, now, false, &mut out);
        assert!(matches!(
            out.as_slice(),
            [
                Action::Tell(_, Ctl::Done { outcome: Pulled::Failed, .. }),
                Action::Complete(_, Err(Error::Shutdown { .. }))
            ]
        ));
    }
}
