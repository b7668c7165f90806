//! The peers a reactor serves: their lanes and routes, adding them, and losing them (what
//! they had queued or posted fails, their lanes close).
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use super::cmd::{OpenedLane, PeerLane, PeerLink, PeerSlot};
use super::{Phase, Reactor};
use crate::base::control::Ctl;
use crate::base::control_outbox::OutboxTx;
use crate::base::error::{Error, FailureClass, TransportError};
use crate::base::lane_map::LaneMap;
use crate::base::sched::OpId;
use crate::base::stats::Counters;
use crate::base::transport::{LaneId, PeerAddr, RailId, RailSet};

pub(super) struct Peer {
    /// The peer runtime's id.
    pub(super) id: u64,
    /// The connection: what is said about the peer names it, the slot alone being reused.
    pub(super) link: PeerLink,
    pub(super) label: Arc<str>,
    /// Our lanes to the peer, with where each reaches it. The first carries messages.
    pub(super) lanes: Vec<Route>,
    /// The same lanes, as the scheduler takes them.
    pub(super) lane_ids: Arc<[LaneId]>,
    /// The peer's rail count.
    pub(super) rails: usize,
    /// The first lane alone: messages go there.
    pub(super) msg_lane: Arc<[LaneId]>,
    /// The lanes bulk rotates over: all but the first when there are several.
    pub(super) bulk_lanes: Arc<[LaneId]>,
    /// Live, or lost and why.
    pub(super) state: PeerState,
    pub(super) inflight: usize,
    /// The peer's control connection.
    pub(super) ctl: OutboxTx,
}

/// The reactor's peers, by slot.
#[derive(Default)]
pub(super) struct Peers(Slab<Peer>);

impl Peers {
    pub(super) fn get(&self, slot: PeerSlot) -> Option<&Peer> {
        self.0.get(slot.0)
    }

    pub(super) fn get_mut(&mut self, slot: PeerSlot) -> Option<&mut Peer> {
        self.0.get_mut(slot.0)
    }

    pub(super) fn insert(&mut self, p: Peer) -> PeerSlot {
        PeerSlot(self.0.insert(p))
    }

    pub(super) fn remove(&mut self, slot: PeerSlot) -> Peer {
        self.0.remove(slot.0)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (PeerSlot, &mut Peer)> {
        self.0.iter_mut().map(|(k, p)| (PeerSlot(k), p))
    }

    /// Every slot in use.
    pub(super) fn slots(&self) -> Vec<PeerSlot> {
        self.0.iter().map(|(k, _)| PeerSlot(k)).collect()
    }
}

impl std::ops::Index<PeerSlot> for Peers {
    type Output = Peer;
    fn index(&self, slot: PeerSlot) -> &Peer {
        &self.0[slot.0]
    }
}

impl std::ops::IndexMut<PeerSlot> for Peers {
    fn index_mut(&mut self, slot: PeerSlot) -> &mut Peer {
        &mut self.0[slot.0]
    }
}

/// One of our lanes to a peer, and where it reaches the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Route {
    pub lane: LaneId,
    /// The peer's address on it (what `connect_lane` returned).
    pub addr: PeerAddr,
    /// The peer's rail it reaches (whose key a one-sided op on it must use).
    pub peer_rail: RailId,
}

/// A count of events in a window of time, for rationing what a peer may ask or be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    start: Instant,
    count: u32,
}

impl Window {
    /// An empty window starting `now`.
    pub(super) fn new(now: Instant) -> Window {
        Window { start: now, count: 0 }
    }

    /// Count one more event at `now` in a window of length `span`, starting a new window when
    /// the current one is over; false when the count goes above `max`.
    pub(super) fn admit(&mut self, now: Instant, span: Duration, max: u32) -> bool {
        if now.duration_since(self.start) >= span {
            *self = Window::new(now);
        }
        self.count = self.count.saturating_add(1);
        self.count <= max
    }
}

/// Where a peer is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PeerState {
    /// Serving ops.
    Live {
        /// Its rails whose reactors sleep where its provider cannot wake them (`Ctl::Asleep`):
        /// our next op on a lane reaching one of them kicks that reactor awake on the control
        /// connection.
        asleep: RailSet,
        /// We told it that our reactor sleeps, and it has not kicked us since.
        announced: bool,
    },
    /// Gone, for this reason: its lanes are closed and new ops fail at once.
    Lost(Arc<str>),
}

impl Peer {
    /// Runtime `id`'s connection `link`, reached over `lanes` (our lane, its address, the
    /// peer's rail there; the first carries messages), with `rails` rails, told things on `ctl`.
    pub(super) fn new(
        id: u64,
        link: PeerLink,
        label: String,
        lanes: Vec<Route>,
        rails: usize,
        ctl: OutboxTx,
    ) -> Peer {
        let lane_ids: Arc<[LaneId]> = lanes.iter().map(|r| r.lane).collect();
        let msg_lane = lane_ids[..1.min(lane_ids.len())].into();
        // Behind the express lane (place 0), where this group holds it, bulk rotates over the
        // others.
        let express = lanes.first().is_some_and(|r| r.peer_rail == RailId(0));
        let bulk_lanes = if express && lane_ids.len() > 1 { lane_ids[1..].into() } else { lane_ids.clone() };
        Peer {
            id,
            link,
            label: label.into(),
            lanes,
            lane_ids,
            rails: rails.max(1),
            msg_lane,
            bulk_lanes,
            state: PeerState::Live { asleep: RailSet::EMPTY, announced: false },
            inflight: 0,
            ctl,
        }
    }

    /// Why the peer is gone, once it is.
    pub(super) fn lost(&self) -> Option<&Arc<str>> {
        match &self.state {
            PeerState::Lost(why) => Some(why),
            PeerState::Live { .. } => None,
        }
    }

    /// It said the reactor serving its `rails` sleeps.
    pub(super) fn heard_asleep(&mut self, rails: RailSet) {
        if let PeerState::Live { asleep, .. } = &mut self.state {
            *asleep = asleep.or(rails);
        }
    }

    /// It kicked ours awake: we may announce our next sleep to it again.
    pub(super) fn heard_kick(&mut self) {
        if let PeerState::Live { announced, .. } = &mut self.state {
            *announced = false;
        }
    }

    /// Its rails an op of ours may reach: a message its message lane's, a one-sided op any
    /// of our lanes'.
    fn reached(&self, one_sided: bool) -> RailSet {
        match one_sided {
            false => RailSet::of(self.msg_lane.iter().map(|&l| self.route(l).peer_rail)),
            true => RailSet::of(self.lanes.iter().map(|r| r.peer_rail)),
        }
    }

    /// The peer's address on `lane` and the peer's rail there.
    pub(super) fn route(&self, lane: LaneId) -> Route {
        *self.lanes.iter().find(|r| r.lane == lane).expect("a lane of this peer")
    }

    /// Of `lanes`, those reaching a peer rail the op's descriptor has a key for (`keys` of
    /// them: rails 0 to keys - 1). A descriptor of fewer rails than the peer has (the offer of
    /// a peer whose first rail group spans only some of its rails) must not be used elsewhere.
    pub(super) fn keyed(&self, lanes: Arc<[LaneId]>, keys: usize) -> Arc<[LaneId]> {
        if keys >= self.rails {
            return lanes;
        }
        let reach: Arc<[LaneId]> =
            lanes.iter().copied().filter(|&l| self.route(l).peer_rail.0 < keys).collect();
        if reach.is_empty() {
            self.msg_lane.clone()
        } else {
            reach
        }
    }
}

impl Reactor {
    /// The reactor thread is about to sleep. A provider without a wait object (shm) cannot wake
    /// it when a peer's op needs its progress (a message to take in, a one-sided op to check),
    /// so that op would wait out the nap: tell each peer, which then kicks us on the control
    /// connection along with its next op. Once per peer until it kicks.
    pub(crate) fn announce_sleep(&mut self) {
        if self.t.caps().wait_fd {
            return;
        }
        let mine = RailSet::of(self.rail_ids.iter().copied());
        let mut told = false;
        let mut refused = Vec::new();
        for (slot, p) in self.peers.iter_mut() {
            if let PeerState::Live { announced: announced @ false, .. } = &mut p.state {
                *announced = true;
                if let Err(r) = p.ctl.send(Ctl::Asleep { rails: mine }) {
                    refused.push((slot, r));
                }
                told = true;
            }
        }
        for (slot, r) in refused {
            self.told(slot, Some(r));
        }
        if told {
            self.announced_at = Some(self.now());
        }
    }

    /// An op for the peer in `slot` (`one_sided`, else a message) needs its progress: if a
    /// reactor serving rails the op may reach said it sleeps, wake it. A message reaches the
    /// peer's message lane alone, so beside an express rail a ping-pong leaves the peer's idle
    /// bulk reactor asleep (kicking it woke it for a spin window each nap: 87% of a core, and a
    /// control message on the path of each ping that kicked it).
    #[inline]
    pub(super) fn kick_if_asleep(&mut self, slot: PeerSlot, one_sided: bool) {
        // Looked at inline: on a busy path the peer is awake, and the call would cost more
        // than the look.
        match self.peers.get(slot) {
            Some(p) if !matches!(p.state, PeerState::Live { asleep, .. } if asleep.is_empty()) => {
                self.kick(slot, one_sided)
            }
            _ => {}
        }
    }

    /// [`kick_if_asleep`](Self::kick_if_asleep) of a peer that may be asleep.
    #[inline(never)]
    fn kick(&mut self, slot: PeerSlot, one_sided: bool) {
        let Some(p) = self.peers.get_mut(slot) else { return };
        let reached = p.reached(one_sided);
        if let PeerState::Live { asleep, .. } = &mut p.state {
            let due = asleep.and(reached);
            if due.is_empty() {
                return;
            }
            *asleep = asleep.without(due);
            Counters::add(&self.counters.kicks);
            let refused = p.ctl.send(Ctl::Kick { rails: due }).err();
            self.told(slot, refused);
        }
    }

    /// Peers' one-sided ops on our memory were served since the last look, on a transport
    /// whose progress serves them without a completion (shm's checked path).
    pub(crate) fn peers_served(&mut self) -> bool {
        self.silent_refusals && self.t.remote_served()
    }

    /// Open a lane on each of `rails` for a peer about to be added; all or none.
    pub(super) fn open_lanes(&mut self, rails: Vec<usize>) -> Result<Vec<OpenedLane>, TransportError> {
        if self.phase != Phase::Running {
            return Err(self.local_error(FailureClass::Other, "the runtime is shutting down"));
        }
        let mut opened: Vec<OpenedLane> = Vec::with_capacity(rails.len());
        for rail in rails {
            match self.t.open_lane(rail) {
                Ok((lane, name)) => {
                    if self.lane_rail.len() <= lane.index() {
                        self.lane_rail.resize(lane.index() + 1, RailId(0));
                    }
                    self.lane_rail[lane.index()] = self.rail_ids.get(rail).copied().unwrap_or(RailId(rail));
                    opened.push(OpenedLane { lane, name })
                }
                Err(e) => {
                    opened.iter().for_each(|o| self.t.close_lane(o.lane));
                    return Err(e);
                }
            }
        }
        Ok(opened)
    }

    /// Connect our `lanes` to the peer's and add the peer; its slot. On failure the lanes are
    /// closed.
    pub(super) fn add_peer(
        &mut self,
        id: u64,
        link: PeerLink,
        lanes: Vec<PeerLane>,
        map: LaneMap,
        label: String,
        ctl: OutboxTx,
    ) -> Result<PeerSlot, TransportError> {
        if self.phase != Phase::Running {
            lanes.iter().for_each(|l| self.t.close_lane(l.lane));
            return Err(self.local_error(FailureClass::Other, "the runtime is shutting down"));
        }
        let res: Result<Vec<Route>, TransportError> = lanes
            .iter()
            .map(|l| {
                let peer_rail = map.rail_of(l.place);
                self.t.connect_lane(l.lane, &l.peer_name).map(|addr| Route { lane: l.lane, addr, peer_rail })
            })
            .collect();
        match res {
            Ok(connected) => Ok(self.peers.insert(Peer::new(id, link, label, connected, map.rails, ctl))),
            Err(e) => {
                lanes.iter().for_each(|l| self.t.close_lane(l.lane));
                Err(e)
            }
        }
    }

    /// The endpoint handle is gone: fail what is pending, close the lanes, forget the peer.
    pub(super) fn remove_peer(&mut self, slot: PeerSlot, link: PeerLink) {
        if self.peers.get(slot).is_some_and(|p| p.link == link) {
            self.lose_peer(slot, "endpoint closed".into());
            self.peers.remove(slot);
            // Its slot may go to the next peer added, which stopped reading nothing.
            self.backlogged.retain(|(s, _)| *s != slot);
        }
    }

    /// The peer's control connection broke: fail what is pending, close the lanes. (A loss
    /// reported after its endpoint removed it names a link no peer in the slot has.)
    pub(super) fn peer_lost(&mut self, slot: PeerSlot, link: PeerLink, reason: String) {
        if self.peers.get(slot).is_some_and(|p| p.link == link && p.lost().is_none()) {
            tracing::info!(peer = %self.peers[slot].label, %reason, "peer lost");
            self.lose_peer(slot, reason);
        }
    }

    /// Give up on a peer of our own accord (it misbehaved, or refused an op the provider leaves
    /// pending): tell it why, which ends the control connection so that it loses us too, then
    /// lose it.
    pub(super) fn drop_peer(&mut self, slot: PeerSlot, reason: String) {
        if self.peers.get(slot).is_none_or(|p| p.lost().is_some()) {
            return;
        }
        tracing::warn!(peer = %self.peers[slot].label, %reason, "giving up on a peer");
        self.tell(slot, Ctl::Goodbye { reason: reason.clone() });
        self.lose_peer(slot, reason);
    }

    /// The peer is gone: fail what it has queued, close its lanes (after reaping what already
    /// completed), and fail what was posted on them, whose buffers are ours again.
    pub(super) fn lose_peer(&mut self, slot: PeerSlot, reason: String) {
        let reason: Arc<str> = reason.into();
        let label = self.peers[slot].label.clone();
        self.fail_peer(slot, (label.clone(), reason.clone()));
        // Lost before reaping: what the reap would start for this peer (a rendezvous read)
        // fails at once instead of being queued behind the failure.
        self.peers[slot].state = PeerState::Lost(reason.clone());
        while self.reap_now() {}
        let lanes = std::mem::take(&mut self.peers[slot].lanes);
        for r in &lanes {
            self.t.close_lane(r.lane);
        }
        let ids: Vec<usize> = self.inflight.iter().filter(|(_, f)| f.peer == slot).map(|(k, _)| k).collect();
        for k in ids {
            let id = self.inflight[k].id;
            let e = TransportError {
                provider: String::new(),
                errno: 0,
                text: "lane closed".into(),
                class: FailureClass::PeerUnreachable,
            };
            self.on_completion(id, 0, None, Err(Box::new(e)));
        }
        let peer = self.peers[slot].label.clone();
        let why = |op| Error::PeerLost { op, peer: peer.clone(), reason: reason.clone() };
        self.side_machines_lost(slot, Some((&peer, &reason)), why);
    }

    /// Fail what a gone peer has queued: unposted receives at once, scheduled ops as soon as
    /// their posted chunks are back.
    pub(super) fn fail_peer(&mut self, slot: PeerSlot, (peer, reason): (Arc<str>, Arc<str>)) {
        let (gone, kept) = std::mem::take(&mut self.direct).into_iter().partition(|r| r.peer == slot);
        self.direct = kept;
        for req in gone {
            let err = Error::PeerLost { op: req.op, peer: peer.clone(), reason: reason.clone() };
            self.settle(&req.cell, Err(err));
        }
        let ids: Vec<OpId> = self.sched.ops().collect();
        for id in ids {
            let Some(h) = self.held[id.0].as_mut() else {
                continue;
            };
            if h.req.peer != slot {
                continue;
            }
            super::note_unposted(h, self.sched.first_unposted(id));
            h.error.get_or_insert(Error::PeerLost {
                op: h.req.op,
                peer: peer.clone(),
                reason: reason.clone(),
            });
            if let Some(done) = self.sched.fail(id) {
                self.settle_held(done);
            }
        }
    }
}
