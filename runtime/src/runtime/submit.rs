//! Handing ops and commands to the rail groups' reactors: an op goes to the first group (posted
//! at once where this thread holds its reactor), or with several groups as `submit_groups`
//! routes it: with an express rail, messages and the latency class go to it whole and bulk to
//! the other groups; without one, a one-sided op of `fan_min` bytes or more is split over every
//! group.
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::Runtime;
use crate::base::error::{Error, OpKind, Result};
use crate::base::sched::Class;
use crate::base::stats::Counters;
use crate::base::transport::LocalSeg;
use crate::driver::inline::{self, with_held};
use crate::reactor::cell::OpCell;
use crate::reactor::cmd::{Cmd, Draft, GroupId, OpReq};
use crate::reactor::{AtOnce, Reactor};

impl Runtime {
    /// Hand a command to the first group's reactor (the only one, mostly).
    pub(super) fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.inner.groups[0].send(cmd)
    }

    /// Hand an op to the reactor; on shutdown the op fails at once.
    /// `polled`: the op's cell, when its future is being polled: an op not done at posting then
    /// reaps at once, in the same reach of the held reactor (the inline turn its poll would
    /// take next).
    /// The op's own handle on the runtime, where it has one, goes once the op is posted (off
    /// the latency path).
    pub(crate) fn submit(&self, req: OpReq, polled: Option<&OpCell>) {
        let req = match self.inner.groups.len() {
            1 => req,
            // What goes whole to the first group takes the path below (the inline driver's
            // hold included: under it, the first group is the one driven inline).
            _ => match self.submit_groups(req) {
                Some(req) => req,
                None => return,
            },
        };
        if self.inner.groups[0].idle.shutdown.load(Ordering::Acquire) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
            return;
        }
        // Inside the inline driver's block_on, which holds the reactor: post at once, skipping
        // the queue hop. Elsewhere ops wait for the driver like any other.
        let req = match self.inner.inline.is_some() || self.inner.lend.is_some() {
            true => {
                let posted = with_held(self.inner.id, req, |r, req| {
                    r.submit_now(req);
                    if polled.is_some_and(|c| !c.is_done()) && inline::take_reap() {
                        r.turn();
                    }
                });
                let Err(req) = posted else { return };
                req
            }
            false => req,
        };
        if let Err(Cmd::Op(req)) = self.send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }

    /// On the thread whose inline `block_on` holds this runtime's reactor: post `draft` over
    /// `seg` now if the reactor would post it straight away (see `Reactor::post_at_once`).
    /// `None` anywhere else, for [`submit`](Self::submit).
    /// With an express rail the held reactor is the first group's, which takes what it would
    /// post at once (the latency class, whole); bulk ops are left to the other groups.
    pub(crate) fn post_at_once(&self, draft: &Draft, mut seg: LocalSeg) -> Option<AtOnce> {
        let inner = &self.inner;
        if (inner.inline.is_none() && inner.lend.is_none())
            || inner.groups[0].idle.shutdown.load(Ordering::Acquire)
        {
            return None;
        }
        if inner.groups.len() > 1 {
            seg.desc = self.group_desc(seg.desc, GroupId::FIRST);
        }
        with_held(inner.id, (), |r, ()| r.post_at_once(draft, seg)).ok().flatten()
    }

    /// Run a control command on the first group's reactor and wait for its reply.
    pub(super) fn call<T>(&self, op: OpKind, make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd) -> Result<T> {
        self.call_on(GroupId::FIRST, op, make)
    }

    /// Run a control command on group `g`'s reactor and wait for its reply.
    pub(super) fn call_on<T>(
        &self,
        g: GroupId,
        op: OpKind,
        make: impl FnOnce(mpsc::SyncSender<T>) -> Cmd,
    ) -> Result<T> {
        let (reply, rx) = mpsc::sync_channel(1);
        let cmd = make(reply);
        if self.group(g).send(cmd).is_err() {
            return Err(Error::Shutdown { op });
        }
        loop {
            // The inline driver may be nobody right now, and a lent reactor may be held by this
            // very thread (a `block_on` keeps it through its future's polls): turn it ourselves.
            let turned = match &self.inner.inline {
                Some(slot) => {
                    // Held by another thread's `block_on`, which turns it: let it run.
                    if slot.with(self.inner.id, Reactor::turn).is_none() {
                        std::thread::yield_now();
                    }
                    true
                }
                None => g == GroupId::FIRST && with_held(self.inner.id, (), |r, ()| r.turn()).is_ok(),
            };
            if turned {
                match rx.try_recv() {
                    Ok(v) => return Ok(v),
                    Err(mpsc::TryRecvError::Empty) => continue,
                    Err(mpsc::TryRecvError::Disconnected) => return Err(Error::Shutdown { op }),
                }
            }
            return rx.recv().map_err(|_| Error::Shutdown { op });
        }
    }

    /// An op on several groups. With an express rail (the first group holds it alone), a bulk
    /// one-sided op the endpoint let fan out goes to the other groups, split in proportion to
    /// their rails, and everything else (messages, the latency class) to the first, whose
    /// reactor then never waits behind a bulk chunk's copy. Without one, a bulk one-sided op
    /// of `fan_min` bytes or more is split across every group, and the rest goes to the first.
    /// Either way each part names its group's descriptor for the local memory. Hands back
    /// the op when it goes whole to the first group, for the caller to post there.
    fn submit_groups(&self, mut req: OpReq) -> Option<OpReq> {
        let express = self.inner.map.express;
        let bulk = match req.class {
            Some(c) => c == Class::Bulk,
            None => req.len() > self.inner.latency_threshold,
        };
        let fan = req.slots.take().filter(|_| bulk && (express || req.len() >= self.inner.fan_min));
        let Some(slots) = fan else {
            return Some(self.to_first(req));
        };
        let weights: Vec<usize> = self
            .groups()
            .zip(slots.by_group.iter())
            .map(|((g, group), s)| match s {
                Some(_) if !(express && g == GroupId::FIRST) => group.rails.len(),
                _ => 0,
            })
            .collect();
        if weights.iter().all(|&w| w == 0) {
            // A peer whose lanes all sit in the first group (it asked for one lane).
            return Some(self.to_first(req));
        }
        for (g, part) in crate::runtime::fanout::split(req, &slots.by_group, &weights) {
            self.submit_to(g, part);
        }
        None
    }

    /// An op going whole to the first group: it names that group's descriptor.
    fn to_first(&self, mut req: OpReq) -> OpReq {
        req.seg.desc = self.group_desc(req.seg.desc, GroupId::FIRST);
        req
    }

    /// Hand an op (or a part) to group `g`'s reactor, naming the group's own descriptor.
    fn submit_to(&self, g: GroupId, mut req: OpReq) {
        req.seg.desc = self.group_desc(req.seg.desc, g);
        if let Err(Cmd::Op(req)) = self.group(g).send(Cmd::Op(req)) {
            Counters::add_shared(&self.inner.counters[0].rejected);
            req.cell.complete(Err(Error::Shutdown { op: req.op }));
        }
    }
}
