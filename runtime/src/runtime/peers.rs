//! A peer's lanes across the rail groups: opened, given to the reactors as a peer, closed,
//! and the control messages that reach it routed to the groups they concern.
use std::sync::Arc;

use super::{Lane, Runtime, Slots};
use crate::base::control::Ctl;
use crate::base::control_inbox::Credit;
use crate::base::control_outbox::OutboxTx;
use crate::base::error::{Error, OpKind, Result};
use crate::base::lane_map::LaneMap;
use crate::base::transport::{LaneId, RailSet};
use crate::reactor::cmd::{Cmd, GroupId, PeerLane, PeerLink, PeerSlot, PeerSlots};

impl Runtime {
    /// Open `n` lanes for a new peer: lane i on rail `map.rail_of(i)`, by that rail's group.
    /// Returns them in lane order with their addresses.
    pub(crate) fn open_lanes(&self, peer: &str, n: usize) -> Result<Vec<(Lane, Vec<u8>)>> {
        let map = self.inner.map;
        let at: Vec<(GroupId, usize)> = (0..n).map(|i| self.group_of_rail(map.rail_of(i))).collect();
        let mut out: Vec<Option<(Lane, Vec<u8>)>> = vec![None; n];
        let mut failure = None;
        for (g, _) in self.groups() {
            let local: Vec<usize> = at.iter().filter(|(x, _)| *x == g).map(|&(_, r)| r).collect();
            if local.is_empty() {
                continue;
            }
            let res = self
                .call_on(g, OpKind::Connect, |reply| Cmd::OpenLanes { rails: local, reply })
                .and_then(|r| r.map_err(|e| Error::from_transport(OpKind::Connect, peer, e)));
            match res {
                Ok(opened) => {
                    let slots = (0..n).filter(|&i| at[i].0 == g);
                    for (i, o) in slots.zip(opened) {
                        out[i] = Some((Lane { group: g, lane: o.lane }, o.name));
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let out: Vec<(Lane, Vec<u8>)> = out.into_iter().flatten().collect();
        match failure {
            Some(e) => {
                self.close_lanes(out.into_iter().map(|(l, _)| l).collect());
                Err(e)
            }
            None => Ok(out),
        }
    }

    /// Connect our lanes to the peer's (pairwise, in lane order) and add the peer to every
    /// group that holds one of them. Returns its slot in each group.
    pub(crate) fn add_peer(
        &self,
        id: u64,
        lanes: Vec<Lane>,
        names: Vec<Vec<u8>>,
        map: LaneMap,
        label: String,
        ctl: OutboxTx,
    ) -> Result<Slots> {
        let mut slots: Vec<Option<PeerSlot>> = vec![None; self.inner.groups.len()];
        let link = PeerLink::fresh();
        for (g, _) in self.groups() {
            let mine: Vec<PeerLane> = (0..lanes.len())
                .filter(|&i| lanes[i].group == g)
                .map(|i| PeerLane { lane: lanes[i].lane, peer_name: names[i].clone(), place: i })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let (l, c) = (label.clone(), ctl.clone());
            let res = self
                .call_on(g, OpKind::Connect, |reply| Cmd::AddPeer {
                    id,
                    link,
                    lanes: mine,
                    map,
                    label: l,
                    ctl: c,
                    reply,
                })
                .and_then(|r| r.map_err(|e| Error::from_transport(OpKind::Connect, &label, e)));
            match res {
                Ok(slot) => slots[g.0] = Some(slot),
                Err(e) => {
                    // Undo: the groups done lose the peer (closing its lanes), the others'
                    // lanes close (this group's failed add closed its own).
                    self.each_slot(&slots, |slot| Cmd::RemovePeer { slot, link });
                    let rest = lanes.into_iter().filter(|l| l.group > g).collect();
                    self.close_lanes(rest);
                    return Err(e);
                }
            }
        }
        let Some(first) = slots[0] else {
            // Lane 0 (the express lane) is on rail 0, which the first group holds.
            self.each_slot(&slots, |slot| Cmd::RemovePeer { slot, link });
            return Err(Error::invalid(
                OpKind::Connect,
                "the first rail group holds none of the peer's lanes",
            ));
        };
        Ok(Arc::new(PeerSlots { first, by_group: slots, link }))
    }

    pub(crate) fn close_lanes(&self, lanes: Vec<Lane>) {
        for (g, group) in self.groups() {
            let mine: Vec<LaneId> = lanes.iter().filter(|l| l.group == g).map(|l| l.lane).collect();
            if !mine.is_empty() {
                let _ = group.send(Cmd::CloseLanes { lanes: mine });
            }
        }
    }

    pub(crate) fn remove_peer(&self, slots: &Slots) {
        let link = slots.link;
        self.each_slot(&slots.by_group, |slot| Cmd::RemovePeer { slot, link });
    }

    pub(crate) fn peer_lost(&self, slots: &Slots, reason: String) {
        let link = slots.link;
        self.each_slot(&slots.by_group, |slot| Cmd::PeerLost { slot, link, reason: reason.clone() });
    }

    /// Send `make(slot)` to each group's reactor that holds the peer.
    fn each_slot(&self, slots: &[Option<PeerSlot>], mut make: impl FnMut(PeerSlot) -> Cmd) {
        for (group, slot) in self.inner.groups.iter().zip(slots) {
            if let Some(slot) = *slot {
                let _ = group.send(make(slot));
            }
        }
    }

    /// A message the peer (at `slots`) sent on its control connection, to
    /// the reactor it concerns: an answer to a question goes to the group that asked (named
    /// in the token's high bits), a peer's sleep to every group (any may post to the rails
    /// it names), a kick to the groups serving the rails it names, the rest to the first
    /// group (which keeps messages and answers questions about our memory). `credit` is the
    /// message's place in the peer's inbox, held until it is handled (a sleep or kick, which
    /// the connection passes on only once per announcement of ours, goes without).
    pub(crate) fn control(&self, slots: &Slots, msg: Ctl, credit: Credit) {
        let link = slots.link;
        let to = match &msg {
            Ctl::Asleep { .. } if slots.by_group.len() > 1 => {
                return self.each_slot(&slots.by_group, |slot| Cmd::Control {
                    slot,
                    link,
                    msg: msg.clone(),
                    credit: None,
                });
            }
            Ctl::Kick { rails } if slots.by_group.len() > 1 => {
                for (group, slot) in self.inner.groups.iter().zip(&slots.by_group) {
                    let mine = rails.and(RailSet::of(group.rails.iter().copied()));
                    if let (Some(slot), false) = (*slot, mine.is_empty()) {
                        let msg = Ctl::Kick { rails: mine };
                        let _ = group.send(Cmd::Control { slot, link, msg, credit: None });
                    }
                }
                return;
            }
            Ctl::Verdict { token, .. } => GroupId((*token >> crate::reactor::TOKEN_GROUP_SHIFT) as usize),
            _ => GroupId::FIRST,
        };
        if let Some(slot) = slots.of(to) {
            let _ = self.group(to).send(Cmd::Control { slot, link, msg, credit: Some(credit) });
        }
    }
}
