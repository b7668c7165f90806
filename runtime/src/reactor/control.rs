//! The reactor's side of its peers' control connections: messages in, messages out, and the
//! glue between the op path and the two machines that talk over them (the audit, the
//! rendezvous), whose actions it carries out.
use std::sync::Arc;
use std::time::Duration;

use super::action::Outbox;
use super::audit::Question;
use super::cmd::{PeerLink, PeerSlot};
use super::rendezvous::PeerRef;
use super::{InFlight, Phase, Reactor};
use crate::base::control::Ctl;
use crate::base::control_outbox::{Refused, BACKLOG};
use crate::base::error::{Error, FailureClass, OpKind};
use crate::base::transport::{WrId, WrKind};

/// The longest nap of an idle reactor whose memory peers reach through the target's checks:
/// its progress is what serves their one-sided ops. It delays only the first op after a quiet
/// spell: one served keeps the reactor polling (`Reactor::peers_served`).
const SERVING_NAP: Duration = Duration::from_millis(2);

/// How long after telling its peers it sleeps a serving reactor keeps its naps short. An op a
/// peer posted before our `Asleep` reached it comes with no kick, and waits out a nap; once the
/// peer has heard (a control message's way, far less than this), its ops kick us awake, and
/// the naps may grow to the idle policy's longest (each wake of a napping thread costs about
/// half a percent of a core at 2 ms naps in a VM, so two serving reactors idled at 2-3%).
const SERVING_WINDOW: Duration = Duration::from_millis(100);

impl Reactor {
    pub(super) fn tell(&mut self, slot: PeerSlot, msg: Ctl) {
        if let Some(p) = self.peers.get(slot) {
            let refused = p.ctl.send(msg).err();
            self.told(slot, refused);
        }
    }

    /// What came of telling the peer in `slot` something. A closed outbox means the control
    /// connection is gone, and with it the peer: its loss fails what waits on the answer. A
    /// full one means the peer stopped reading: it is dropped at the next turn.
    pub(super) fn told(&mut self, slot: PeerSlot, refused: Option<Refused>) {
        if refused != Some(Refused::Backlog) {
            return;
        }
        let Some(link) = self.peers.get(slot).map(|p| p.link) else { return };
        if !self.backlogged.contains(&(slot, link)) {
            self.backlogged.push((slot, link));
        }
    }

    /// Give up on the peers that left their control messages unread.
    pub(super) fn drop_backlogged(&mut self) {
        for (slot, link) in std::mem::take(&mut self.backlogged) {
            if self.peers.get(slot).is_some_and(|p| p.link == link) {
                let why = format!("it left {BACKLOG} control messages unread");
                self.drop_peer(slot, why);
            }
        }
    }

    /// A message on a peer's control connection.
    pub(super) fn on_control(&mut self, slot: PeerSlot, link: PeerLink, msg: Ctl) {
        let Some(p) = self.peers.get(slot).filter(|p| p.link == link && p.lost().is_none()) else {
            return;
        };
        let label = p.label.clone();
        let peer = PeerRef { slot, id: p.id, label: &label };
        let running = self.phase == Phase::Running;
        let mut out = Outbox::new();
        match msg {
            // Both end at the connection's task, which never hands them on.
            Ctl::Heartbeat | Ctl::Goodbye { .. } => {}
            Ctl::Asleep { rails } => self.peers[slot].heard_asleep(rails),
            // The command that brought it woke us: we may announce our next sleep to it again.
            Ctl::Kick { .. } => self.peers[slot].heard_kick(),
            Ctl::Check { .. } => {
                let now = self.now();
                self.audit.on_check(slot, msg, now, &mut out)
            }
            Ctl::Verdict { token, verdict } => {
                self.audit.on_verdict(slot, token, verdict, self.silent_refusals, &mut out)
            }
            Ctl::Offer { token, desc } => self.rndv.on_offer(peer, token, desc, running, &mut out),
            Ctl::Withdrawn { token } => self.rndv.on_withdrawn(peer, token, &mut out),
            Ctl::Done { token, outcome } => self.rndv.on_done(slot, token, outcome, &mut out),
        }
        self.apply(out);
    }

    /// A one-sided op's request came back cancelled: ask its target why.
    pub(super) fn question(&mut self, f: &InFlight, kind: WrKind, len: usize) {
        if self.peers.get(f.peer).is_none_or(|p| p.lost().is_some()) {
            return;
        }
        let mut out = Outbox::new();
        let now = self.now();
        let q = Question { id: f.id, slot: f.peer, op: f.op, kind, len, cell: &f.cell };
        self.audit.ask(q, now, &mut out);
        self.apply(out);
    }

    /// A receive completed with a rendezvous marker.
    pub(super) fn marker_arrived(&mut self, f: InFlight, token: u32) {
        let Some(p) = self.peers.get(f.peer) else {
            // Gone (never while its requests are in flight: its loss fails them first).
            let e = Error::PeerLost { op: OpKind::Recv, peer: "-".into(), reason: "endpoint closed".into() };
            super::settle_cell(&self.counters, &f.cell, Err(e));
            return;
        };
        let label = p.label.clone();
        let peer = PeerRef { slot: f.peer, id: p.id, label: &label };
        let running = self.phase == Phase::Running;
        let now = self.now();
        let mut out = Outbox::new();
        self.rndv.marker_arrived(peer, token, f.cell, f.seg, now, running, &mut out);
        self.apply(out);
    }

    /// Give up on what waits too long for a peer: questions it does not answer, offers that
    /// do not follow their markers.
    pub(super) fn expire_waits(&mut self) {
        let mut out = Outbox::new();
        if !self.audit.idle() {
            let now = self.now();
            self.audit.expire(now, self.patience, &mut out);
        }
        if self.rndv.markers_waiting() {
            let now = self.now();
            self.rndv.expire(now, self.patience, &mut out);
        }
        self.apply(out);
    }

    /// The peer in `slot` is gone (`lost`: its label and why; `None` at shutdown): what the
    /// audit and the rendezvous hold for it fails with `why`.
    pub(super) fn side_machines_lost(
        &mut self,
        slot: PeerSlot,
        lost: Option<(&Arc<str>, &str)>,
        why: impl Fn(OpKind) -> Error,
    ) {
        let mut out = Outbox::new();
        self.rndv.lost(slot, why, &mut out);
        self.audit.lost(slot, lost, &mut out);
        self.apply(out);
    }

    /// A bound on the idle reactor's naps: where one-sided ops are checked (and so served) by
    /// the target's progress, while this runtime exposes memory (regions, or a large message a
    /// peer is reading), peers' ops posted before they heard we sleep must not wait out a long
    /// nap (`SERVING_WINDOW`).
    pub(crate) fn longest_nap(&mut self) -> Option<Duration> {
        let serving = self.silent_refusals && (self.audit.exposes() || self.rndv.open());
        let at = self.announced_at.filter(|_| serving)?;
        (self.now().saturating_duration_since(at) < SERVING_WINDOW).then_some(SERVING_NAP)
    }

    /// On a transport whose refusals are silent: ask about the one-sided ops that were in flight
    /// at the previous look already (at least `audit::SILENT_AFTER` ago).
    pub(super) fn sweep_silent(&mut self) {
        let now = self.now();
        let Some(since) = self.audit.sweep_due(now, self.generation) else {
            return;
        };
        let silent: Vec<usize> = self
            .inflight
            .iter()
            .filter(|(_, f)| {
                f.id.generation() < since && matches!(f.kind, WrKind::Write { .. } | WrKind::Read { .. })
            })
            .map(|(k, _)| k)
            .collect();
        let mut out = Outbox::new();
        for k in silent {
            let f = &self.inflight[k];
            let q = Question { id: f.id, slot: f.peer, op: f.op, kind: f.kind, len: f.len(), cell: &f.cell };
            if self.peers.get(f.peer).is_some_and(|p| p.lost().is_none()) {
                self.audit.ask(q, now, &mut out);
            }
        }
        self.apply(out);
    }

    /// The target refused an op the provider will never complete. Its requests may still be
    /// queued in the provider, so only closing the peer's lanes makes sure nothing touches
    /// their memory: the peer is lost, and the refused op fails as `RemoteAccess`.
    pub(super) fn fail_silent(&mut self, slot: PeerSlot, id: WrId, why: &str) {
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
            self.chunk_failed(c, e);
        }
        self.drop_peer(slot, format!("it refused a one-sided op of ours ({why})"));
    }
}
