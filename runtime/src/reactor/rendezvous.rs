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
use crate::reactor::cmd::PeerSlot;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::{cell_key, settle_cell, Reactor};
use crate::base::control::{Ctl, Pulled};
use crate::base::error::{Error, FailureClass, OpKind};
use crate::base::remote::RemoteBuf;
use crate::base::sched::Class;
use crate::base::transport::{Access, LocalSeg, WrKind};
use crate::reactor::cell::{Done, OpCell};

use super::cmd::OpReq;

/// Offers one peer may have outstanding before it counts as misbehaving.
const MAX_OFFERS: usize = 4096;

/// A send of ours the peer is pulling.
struct Outgoing {
    slot: PeerSlot,
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

#[derive(Default)]
pub(super) struct Rendezvous {
    next_token: u32,
    /// Our sends, by token.
    outgoing: HashMap<u32, Outgoing>,
    /// Marker sends in the op path, by cell address: their completion is not the send's.
    markers: HashMap<usize, u32>,
    /// Offers whose marker has not arrived, by (peer slot, token).
    offers: HashMap<(PeerSlot, u32), RemoteBuf>,
    /// Receives whose marker arrived before the offer.
    waiting: HashMap<(PeerSlot, u32), Waiting>,
    /// Reads in progress, by the receive's cell address.
    pulling: HashMap<usize, Pulling>,
}

impl Rendezvous {
    /// Nothing in progress: the op path needs no look-ups.
    pub(super) fn idle(&self) -> bool {
        self.markers.is_empty() && self.pulling.is_empty()
    }
}

impl Reactor {
    /// A send of ours is being read by its peer.
    pub(super) fn rendezvous_open(&self) -> bool {
        !self.rndv.outgoing.is_empty()
    }

    /// Complete an op's cell, unless it belongs to a rendezvous, which takes it from there.
    pub(super) fn settle(&mut self, cell: &Arc<OpCell>, res: Result<Done, Error>) {
        if self.rndv.idle() && self.audit.idle() {
            settle_cell(&self.counters, cell, res);
            return;
        }
        let Some(res) = self.audited(cell, res) else {
            return;
        };
        self.settle_audited(cell, res);
    }

    /// Complete an op whose target's verdict is in (or not wanted): a marker finishes its send,
    /// a read of an offered message answers the sender, and any other op simply completes.
    pub(super) fn settle_audited(&mut self, cell: &Arc<OpCell>, res: Result<Done, Error>) {
        let k = cell_key(cell);
        if let Some(token) = self.rndv.markers.remove(&k) {
            self.marker_done(token, res);
        } else if let Some(p) = self.rndv.pulling.remove(&k) {
            let outcome = if res.is_ok() { Pulled::Whole } else { Pulled::Failed };
            self.tell(p.slot, Ctl::Done { token: p.token, outcome });
            settle_cell(&self.counters, cell, res.map(|d| Done { len: d.len, imm: None }));
        } else {
            settle_cell(&self.counters, cell, res);
        }
    }

    /// A send above the largest message: expose its buffer, offer it, and turn the request into
    /// its marker. `None` when the send failed (its cell is resolved).
    pub(super) fn offer(&mut self, mut req: OpReq) -> Option<OpReq> {
        if req.cell.abandoned(1) {
            // Its future is gone and nothing was posted: withdraw it, as any op.
            crate::base::stats::Counters::add(&self.counters.withdrawn);
            return None;
        }
        let len = req.seg.len;
        let peer = &self.peers[req.peer];
        let label = peer.label.clone();
        // SAFETY of the registration (see `lease::register`): the cell, which holds the buffer
        // once the future is gone, stays in `outgoing` until the deregistration below.
        let mr = match super::lease::register(self.t.as_mut(), req.seg.ptr, len, Access::READ) {
            Ok(mr) => mr,
            Err(e) => {
                settle_cell(&self.counters, &req.cell, Err(Error::from_transport(OpKind::Send, &label, e)));
                return None;
            }
        };
        self.rndv.next_token = self.rndv.next_token.wrapping_add(1);
        let token = self.rndv.next_token;
        // The keys of the host's rails 0, 1, ... this reactor's transport spans: a descriptor
        // names rails by host index, and the other rail groups' transports know nothing of
        // this registration.
        let prefix = self.rail_ids.iter().enumerate().take_while(|&(i, &r)| i == r).count().max(1);
        let keys: Vec<u64> =
            std::iter::once(mr.key).chain(mr.rail_keys.iter().copied()).take(prefix).collect();
        let desc = RemoteBuf::new(0, mr.remote_base, len as u64, &keys, Access::READ);
        // Known to the audit like any exposure, so the peer's questions about its reads of it
        // get true answers.
        self.audit.exposed(&mr, len, Access::READ);
        self.tell(req.peer, Ctl::Offer { token, desc });
        let cell = req.cell.clone();
        self.rndv.markers.insert(cell_key(&cell), token);
        let out = Outgoing { slot: req.peer, cell, mr: mr.id, len, marked: false, answer: None };
        self.rndv.outgoing.insert(token, out);
        req.class = Some(req.class.unwrap_or_else(|| self.sched.config().default_class(len)));
        req.kind = WrKind::Send { imm: Some(token as u64) };
        req.seg.len = 0;
        Some(req)
    }

    fn marker_done(&mut self, token: u32, res: Result<Done, Error>) {
        let Some(out) = self.rndv.outgoing.get_mut(&token) else {
            return;
        };
        match res {
            Ok(_) => {
                out.marked = true;
                if let Some(answer) = out.answer {
                    self.finish_send(token, Ok(answer));
                }
            }
            Err(e) => {
                // No marker will come: the peer forgets the offer (else it keeps it until we
                // are lost, counting against our offers there).
                let slot = out.slot;
                self.tell(slot, Ctl::Withdrawn { token });
                self.finish_send(token, Err(e));
            }
        }
    }

    /// The send is over: withdraw the access, then complete it.
    fn finish_send(&mut self, token: u32, res: Result<Pulled, Error>) {
        let Some(out) = self.rndv.outgoing.remove(&token) else {
            return;
        };
        self.rndv.markers.remove(&cell_key(&out.cell));
        self.audit.withdrawn(out.mr);
        if let Err(e) = self.t.deregister(out.mr) {
            tracing::warn!(token, error = %e, "deregistering an offered buffer failed");
        }
        let label: Arc<str> = self.peers.get(out.slot).map_or_else(|| "-".into(), |p| p.label.clone());
        let res = match res {
            Ok(Pulled::Whole) => Ok(Done { len: out.len, imm: None }),
            Ok(Pulled::TooSmall(n)) => Err(Error::Transport {
                op: OpKind::Send,
                peer: label.clone(),
                source: self.local_error(
                    FailureClass::Truncated,
                    format!(
                        "the peer's {n}-byte receive buffer is too small for the {}-byte message",
                        out.len
                    ),
                ),
            }),
            Ok(Pulled::Failed) => Err(Error::Transport {
                op: OpKind::Send,
                peer: label.clone(),
                source: self.local_error(FailureClass::Other, "the peer failed to read the message"),
            }),
            Err(e) => Err(e),
        };
        settle_cell(&self.counters, &out.cell, res);
    }

    /// A receive completed with immediate data: a marker. Pull the message it stands for.
    pub(super) fn marker_arrived(&mut self, slot: PeerSlot, token: u32, cell: Arc<OpCell>, seg: LocalSeg) {
        match self.rndv.offers.remove(&(slot, token)) {
            Some(desc) => self.pull(slot, token, desc, cell, seg),
            None if self.rndv.waiting.contains_key(&(slot, token)) => {
                // A correct peer never reuses a token while its send runs.
                let reason = format!("it sent two messages under rendezvous token {token}");
                self.drop_peer(slot, reason.clone());
                let peer = self.peers.get(slot).map_or_else(|| "-".into(), |p| p.label.clone());
                settle_cell(
                    &self.counters,
                    &cell,
                    Err(Error::PeerLost { op: OpKind::Recv, peer, reason: reason.into() }),
                );
            }
            None => {
                self.rndv.waiting.insert((slot, token), Waiting { cell, seg, since: self.now });
            }
        }
    }

    /// Markers are waiting for their offers: give up on a peer whose offer is overdue. The
    /// sender tells the offer before it posts the marker, so the offer trails by a control
    /// hop at most; one later than the reactor's patience means a broken peer.
    pub(super) fn expire_markers(&mut self) {
        let now = self.now;
        let mut late: Vec<(PeerSlot, u32)> = self
            .rndv
            .waiting
            .iter()
            .filter(|(_, w)| now.duration_since(w.since) >= self.patience)
            .map(|(k, _)| *k)
            .collect();
        late.sort_unstable();
        late.dedup_by_key(|(slot, _)| *slot);
        for (slot, token) in late {
            let why = format!(
                "its offer for rendezvous token {token} did not come within {} s",
                self.patience.as_secs()
            );
            self.drop_peer(slot, why);
        }
    }

    /// Receives wait for offers.
    pub(super) fn markers_waiting(&self) -> bool {
        !self.rndv.waiting.is_empty()
    }

    /// A message on a peer's control connection.
    pub(super) fn on_control(&mut self, slot: PeerSlot, peer_id: u64, msg: Ctl) {
        if self.peers.get(slot).is_none_or(|p| p.id != peer_id || p.lost().is_some()) {
            return;
        }
        match msg {
            // Both end at the connection's task, which never hands them on.
            Ctl::Heartbeat | Ctl::Goodbye { .. } => {}
            Ctl::Asleep => self.peers[slot].heard(true),
            // The command that brought it woke us: we may announce our next sleep to it again.
            Ctl::Kick => self.peers[slot].heard(false),
            Ctl::Check { .. } | Ctl::Verdict { .. } => self.on_audit(slot, msg),
            Ctl::Offer { token, desc } => match self.rndv.waiting.remove(&(slot, token)) {
                Some(w) => self.pull(slot, token, desc, w.cell, w.seg),
                None if self.rndv.offers.keys().filter(|(s, _)| *s == slot).count() >= MAX_OFFERS => {
                    self.drop_peer(slot, format!("more than {MAX_OFFERS} offers outstanding"));
                }
                None => {
                    self.rndv.offers.insert((slot, token), desc);
                }
            },
            Ctl::Withdrawn { token } => {
                self.rndv.offers.remove(&(slot, token));
                // The marker arrived although the sender saw its post fail: the message is
                // gone all the same.
                if let Some(w) = self.rndv.waiting.remove(&(slot, token)) {
                    let peer = self.peers[slot].label.clone();
                    let source = self.local_error(FailureClass::Other, "the sender withdrew the message");
                    settle_cell(
                        &self.counters,
                        &w.cell,
                        Err(Error::Transport { op: OpKind::Recv, peer, source }),
                    );
                }
            }
            Ctl::Done { token, outcome } => {
                let Some(out) = self.rndv.outgoing.get_mut(&token).filter(|o| o.slot == slot) else {
                    tracing::debug!(token, "answer to no offer of ours ignored");
                    return;
                };
                if out.marked {
                    self.finish_send(token, Ok(outcome));
                } else {
                    out.answer = Some(outcome);
                }
            }
        }
    }

    /// Read an offered message into the receive buffer `seg`, as a bulk read through the
    /// scheduler; its completion answers the sender and completes the receive.
    fn pull(&mut self, slot: PeerSlot, token: u32, desc: RemoteBuf, cell: Arc<OpCell>, seg: LocalSeg) {
        if self.phase != super::Phase::Running {
            self.tell(slot, Ctl::Done { token, outcome: Pulled::Failed });
            settle_cell(&self.counters, &cell, Err(Error::Shutdown { op: OpKind::Recv }));
            return;
        }
        let len = desc.len();
        if len > seg.len as u64 || len == 0 {
            self.tell(slot, Ctl::Done { token, outcome: Pulled::TooSmall(seg.len as u64) });
            let p = &self.peers[slot];
            let text = format!("a {len}-byte message does not fit the {}-byte receive buffer", seg.len);
            let source = self.local_error(FailureClass::Truncated, text);
            settle_cell(
                &self.counters,
                &cell,
                Err(Error::Transport { op: OpKind::Recv, peer: p.label.clone(), source }),
            );
            return;
        }
        let req = OpReq {
            peer: slot,
            peer_id: self.peers[slot].id,
            op: OpKind::Recv,
            kind: WrKind::Read { remote_addr: desc.addr(), key: desc.key() },
            seg: LocalSeg { len: len as usize, ..seg },
            cell: cell.clone(),
            tenant: 0,
            class: Some(Class::Bulk),
            batch: None,
            rail_keys: desc.rail_keys(),
            slots: None,
        };
        self.rndv.pulling.insert(cell_key(&cell), Pulling { slot, token, _cell: cell });
        self.accept(req);
    }

    pub(super) fn tell(&self, slot: PeerSlot, msg: Ctl) {
        if let Some(p) = self.peers.get(slot) {
            // A closed outbox means the control connection is gone, and with it the peer: its
            // loss fails what waits on the answer.
            let _ = p.ctl.send(msg);
        }
    }

    /// The peer is gone (its ops have been failed): give back what waits on it.
    pub(super) fn rendezvous_lost(&mut self, slot: PeerSlot, why: impl Fn(OpKind) -> Error) {
        // A send whose marker is still on its way is finished by the marker's failure.
        let tokens: Vec<u32> =
            self.rndv.outgoing.iter().filter(|(_, o)| o.slot == slot && o.marked).map(|(t, _)| *t).collect();
        for t in tokens {
            self.finish_send(t, Err(why(OpKind::Send)));
        }
        self.rndv.offers.retain(|(s, _), _| *s != slot);
        let waiting: Vec<(PeerSlot, u32)> =
            self.rndv.waiting.keys().filter(|(s, _)| *s == slot).copied().collect();
        for k in waiting {
            let w = self.rndv.waiting.remove(&k).expect("listed");
            settle_cell(&self.counters, &w.cell, Err(why(OpKind::Recv)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::control::Verdict;
    use crate::base::transport::WrId;
    use crate::reactor::testing::{cancelled, peer, reactor};

    #[test]
    fn a_cancelled_read_of_an_offered_message_answers_its_sender_once_the_verdict_is_in() {
        let mut r = reactor();
        let (slot, mut told) = peer(&mut r);
        let cell = OpCell::new();
        r.rndv.pulling.insert(cell_key(&cell), Pulling { slot, token: 42, _cell: cell.clone() });
        // The read came back cancelled (tcp;ofi_rxm dropped the connection): its target is
        // asked, and the receive waits for the answer.
        r.question(WrId::new(1, 1), slot, OpKind::Recv, WrKind::Read { remote_addr: 0, key: 9 }, 64, &cell);
        let Ok(Ctl::Check { token, key: 9, write: false, .. }) = told.try_recv() else {
            panic!("the sender should be asked about its key");
        };
        r.settle(&cell, Err(cancelled()));
        assert!(cell.outcome().is_none(), "the receive waits for the verdict");

        r.on_audit(slot, Ctl::Verdict { token, verdict: Verdict::Allowed });

        assert_eq!(told.try_recv().ok(), Some(Ctl::Done { token: 42, outcome: Pulled::Failed }));
        assert!(matches!(cell.outcome(), Some(Err(_))), "the receive fails");
        assert!(r.rndv.pulling.is_empty() && r.rndv.idle());
    }

    #[test]
    fn a_second_marker_under_one_token_drops_the_peer_and_fails_both_receives() {
        let mut r = reactor();
        let (slot, mut told) = peer(&mut r);
        let seg = LocalSeg { ptr: std::ptr::null_mut(), len: 0, desc: 0 };
        let (first, second) = (OpCell::new(), OpCell::new());
        r.marker_arrived(slot, 5, first.clone(), seg);
        assert!(first.outcome().is_none(), "a marker waits for its offer");
        r.marker_arrived(slot, 5, second.clone(), seg);
        assert!(matches!(first.outcome(), Some(Err(Error::PeerLost { .. }))));
        assert!(matches!(second.outcome(), Some(Err(Error::PeerLost { .. }))));
        assert!(r.peers[slot].lost().is_some_and(|w| w.contains("token 5")));
        assert!(matches!(told.try_recv(), Ok(Ctl::Goodbye { reason }) if reason.contains("token 5")));
    }

    #[test]
    fn a_marker_whose_offer_never_comes_drops_the_peer() {
        let mut r = reactor();
        let (slot, mut told) = peer(&mut r);
        let seg = LocalSeg { ptr: std::ptr::null_mut(), len: 0, desc: 0 };
        let cell = OpCell::new();
        r.marker_arrived(slot, 3, cell.clone(), seg);
        r.expire_markers();
        assert!(cell.outcome().is_none(), "an offer may trail its marker a while");
        r.rndv.waiting.get_mut(&(slot, 3)).unwrap().since -= r.patience;
        r.expire_markers();
        assert!(matches!(cell.outcome(), Some(Err(Error::PeerLost { .. }))));
        assert!(matches!(told.try_recv(), Ok(Ctl::Goodbye { reason }) if reason.contains("did not come")));
    }

    #[test]
    fn a_withdrawn_offer_is_forgotten_and_a_receive_waiting_on_it_fails() {
        let mut r = reactor();
        let (slot, _told) = peer(&mut r);
        let id = r.peers[slot].id;
        let desc = RemoteBuf::new(0, 4096, 64, &[1], Access::READ);
        r.on_control(slot, id, Ctl::Offer { token: 8, desc });
        assert_eq!(r.rndv.offers.len(), 1);
        r.on_control(slot, id, Ctl::Withdrawn { token: 8 });
        assert!(r.rndv.offers.is_empty(), "the offer is forgotten");

        let seg = LocalSeg { ptr: std::ptr::null_mut(), len: 0, desc: 0 };
        let cell = OpCell::new();
        r.marker_arrived(slot, 9, cell.clone(), seg);
        r.on_control(slot, id, Ctl::Withdrawn { token: 9 });
        match cell.outcome() {
            Some(Err(Error::Transport { source, .. })) => assert!(source.text.contains("withdrew")),
            other => panic!("the receive should fail, got {other:?}"),
        }
        assert!(r.rndv.waiting.is_empty() && r.peers[slot].lost().is_none());
    }

    #[test]
    fn a_failed_marker_withdraws_its_offer_and_fails_the_send() {
        let mut r = reactor();
        let (slot, mut told) = peer(&mut r);
        let cell = OpCell::new();
        r.rndv.markers.insert(cell_key(&cell), 4);
        let out = Outgoing { slot, cell: cell.clone(), mr: 1, len: 1 << 20, marked: false, answer: None };
        r.rndv.outgoing.insert(4, out);
        r.settle(&cell, Err(cancelled()));
        assert_eq!(told.try_recv().ok(), Some(Ctl::Withdrawn { token: 4 }));
        assert!(matches!(cell.outcome(), Some(Err(_))));
        assert!(r.rndv.outgoing.is_empty() && r.rndv.idle());
    }
}
