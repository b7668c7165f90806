//! Stopping: a reactor's shutdown, as named phases a driver steps through with the time.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cmd::Cmd;
use super::cmd::GroupId;
use super::Reactor;
use crate::base::control::Ctl;
use crate::base::error::Error;
use crate::base::sched::OpId;
use crate::base::stats::Counters;

/// Where a reactor is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Serving ops.
    Running,
    /// Stopping: nothing new starts, queued ops have failed, posted ones (sends a peer is
    /// reading by rendezvous among them) get until `deadline` to complete.
    Draining { deadline: Instant },
    /// Drained. The first group waits (until `deadline`) for the others to drain before it
    /// tells the peers goodbye.
    Parting { deadline: Instant },
    /// Lanes closed, every op resolved.
    Stopped,
}

impl Reactor {
    /// Fail everything queued, wait (bounded by `limit`) for posted ops, then close every lane
    /// (after which no NIC touches a posted buffer) and fail what never completed. Once: later
    /// calls return at once.
    pub(crate) fn shutdown(&mut self, limit: Duration) {
        self.begin_shutdown(Instant::now() + limit);
        while !self.shutdown_step(Instant::now()) {
            if matches!(self.phase, Phase::Parting { .. }) {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Stop taking work: fail what is queued (commands included) and start draining what is
    /// posted, until `deadline`. Does nothing once begun.
    pub(crate) fn begin_shutdown(&mut self, deadline: Instant) {
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::Draining { deadline };
        self.commands_while_stopping();
        for req in std::mem::take(&mut self.direct) {
            self.settle(&req.cell, Err(Error::Shutdown { op: req.op }));
        }
        let ids: Vec<OpId> = self.sched.ops().collect();
        for id in ids {
            // Every chunk of it posted (a rendezvous send's marker the peer has yet to take,
            // say): a posted op, which gets the deadline as any other does.
            if self.sched.first_unposted(id).is_none() {
                continue;
            }
            if let Some(h) = self.held[id.0].as_mut() {
                h.error.get_or_insert(Error::Shutdown { op: h.req.op });
            }
            if let Some(done) = self.sched.fail(id) {
                self.settle_held(done);
            }
        }
    }

    /// Commands that came in: ops fail with `Shutdown`, the rest are served. Deregistrations
    /// still come while the reactor stops (the runtime lets them through): the transport may
    /// let peers reach their memory until it is closed, so the memory goes only after them.
    fn commands_while_stopping(&mut self) {
        while let Ok(cmd) = self.rx.try_recv() {
            self.idle.commands.fetch_sub(1, Ordering::AcqRel);
            match cmd {
                Cmd::Op(req) => {
                    Counters::add(&self.counters.submitted);
                    self.settle(&req.cell, Err(Error::Shutdown { op: req.op }))
                }
                other => self.handle(other),
            }
        }
    }

    /// One step of a shutdown at time `now` (begun now if it was not); true once stopped.
    pub(crate) fn shutdown_step(&mut self, now: Instant) -> bool {
        self.now = now;
        self.now_read = true;
        if matches!(self.phase, Phase::Draining { .. } | Phase::Parting { .. }) {
            self.commands_while_stopping();
        }
        match self.phase {
            Phase::Running => {
                self.begin_shutdown(now);
                false
            }
            Phase::Draining { deadline } => {
                if !self.backlogged.is_empty() {
                    self.drop_backlogged();
                }
                // A send the peer is still reading (its offer taken, its answer to come) is
                // posted too: it gets the same time, its answer a command served meanwhile.
                if (self.active > 0 || self.rndv.open()) && now < deadline {
                    self.reap();
                    return false;
                }
                self.drained.fetch_add(1, Ordering::AcqRel);
                self.phase = Phase::Parting { deadline };
                false
            }
            Phase::Parting { deadline } => {
                // The first group tells the peers (the control connection is the runtime's),
                // once every group has drained: a peer told early would fail the ops the
                // others still drain.
                let others = self.drained.load(Ordering::Acquire) < self.groups as usize;
                if self.group == GroupId::FIRST && others && now < deadline {
                    return false;
                }
                self.part();
                self.phase = Phase::Stopped;
                true
            }
            Phase::Stopped => true,
        }
    }

    /// The end of a shutdown: tell the peers, close every lane, fail what never completed.
    pub(super) fn part(&mut self) {
        // Told, the peers close their lanes to us as we close ours (on shm in one process,
        // ours wait for theirs: see rdmalane-efa's shm_peers).
        let slots = self.peers.slots();
        if self.group == GroupId::FIRST {
            for &slot in &slots {
                if self.peers[slot].lost().is_none() {
                    self.tell(slot, Ctl::Goodbye { reason: "its runtime shut down".into() });
                }
            }
        }
        // Close every lane: after that no request touches memory, so what is still posted
        // (receives, ops the deadline cut short) can give its buffer back.
        for slot in slots {
            for r in std::mem::take(&mut self.peers[slot].lanes) {
                self.t.close_lane(r.lane);
            }
        }
        for (_, f) in std::mem::take(&mut self.inflight) {
            let err = Error::Shutdown { op: f.op };
            match f.chunk {
                Some(c) => {
                    if let Some(h) = self.held[c.op.0].as_mut() {
                        h.error.get_or_insert(err);
                    }
                    if let Some(done) = self.sched.complete(c, false) {
                        self.settle_held(done);
                    }
                }
                None => self.settle(&f.cell, Err(err)),
            }
        }
        for slot in self.peers.slots() {
            self.side_machines_lost(slot, None, |op| Error::Shutdown { op });
        }
        self.active = 0;
        self.idle.stopped.store(true, Ordering::Release);
    }
}
