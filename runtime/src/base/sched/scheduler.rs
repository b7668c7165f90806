use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use slab::Slab;

use super::config::{Class, Mode, SchedConfig, Stripe, TenantId};

/// An op inside the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub usize);

pub use crate::base::transport::LaneId;

/// What the scheduler needs to know about an op.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Whose share it counts against.
    pub tenant: TenantId,
    /// Latency or bulk.
    pub class: Class,
    /// Bytes it moves.
    pub len: usize,
    /// Lanes it may use (its peer's); at least one. Shared, so pushing an op allocates no
    /// lane list.
    pub lanes: Arc<[LaneId]>,
    /// Whether it may be split (one-sided ops may; a message may not).
    pub splittable: bool,
    /// Offsets no chunk may span (sorted, ascending): where a batch's pieces that cannot share
    /// a work request meet. With `splittable` false each stretch between cuts is one chunk.
    pub cuts: Option<Arc<[usize]>>,
    /// The last `tail` bytes go out as one chunk, and only once every other chunk of the op has
    /// completed (0: no such fence). A split write with an immediate value: the piece that
    /// raises the event must not land before the rest.
    pub tail: usize,
}

/// A piece of an op to post now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The op.
    pub op: OpId,
    /// Offset of the piece within the op.
    pub offset: usize,
    /// Its length.
    pub len: usize,
    /// The lane to post it on.
    pub lane: LaneId,
}

/// An op that has nothing left in flight and is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDone {
    /// The op.
    pub op: OpId,
    /// True when every chunk completed and the op was neither failed nor cancelled.
    pub ok: bool,
}

#[derive(Debug)]
struct OpState {
    tenant: TenantId,
    class: Class,
    len: usize,
    lanes: Arc<[LaneId]>,
    splittable: bool,
    cuts: Option<Arc<[usize]>>,
    /// Where the fenced tail starts (`len` when there is none).
    body_end: usize,
    /// Next offset never issued.
    issued: usize,
    /// Ranges issued and handed back (post refused): issued again first.
    returned: Vec<(usize, usize)>,
    /// Chunks posted and not completed.
    outstanding: usize,
    failed: bool,
    cancelled: bool,
    /// Round-robin position over `lanes`.
    rr: usize,
    /// In a queue (latency, a tenant's bulk, or fifo).
    queued: bool,
}

impl OpState {
    fn has_unissued(&self) -> bool {
        !self.returned.is_empty() || self.issued < self.len
    }
    fn resolved(&self) -> bool {
        self.outstanding == 0 && (self.failed || self.cancelled || !self.has_unissued())
    }
    /// The next range to issue is the fenced tail (fresh, or handed back after a refused post).
    fn at_tail(&self) -> bool {
        self.body_end < self.len && self.returned.last().map_or(self.issued, |r| r.0) == self.body_end
    }
    /// The body is all issued and the fenced tail is not: it waits for the body to complete.
    fn fenced(&self) -> bool {
        self.at_tail() && self.returned.is_empty()
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Load {
    /// All bytes in flight (latency picks the lane with the fewest).
    bytes: usize,
    /// Bulk bytes in flight: what the byte budgets bound, so latency never blocks bulk.
    bulk: usize,
    wrs: usize,
}

/// Virtual time is bytes served times this over the weight: integer, exact across weights.
const VSCALE: u128 = 720_720;

#[derive(Debug)]
struct Tenant {
    weight: u32,
    /// Service received per unit of weight.
    vtime: u128,
    bulk: VecDeque<OpId>,
    inflight: usize,
}

/// The fair-share queue. See the module docs.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    ops: Slab<OpState>,
    latency: VecDeque<OpId>,
    fifo: VecDeque<OpId>,
    tenants: HashMap<TenantId, Tenant>,
    /// Tenants with bulk work.
    ring: Vec<TenantId>,
    /// Load per lane, indexed by lane id.
    lanes: Vec<Load>,
    nic: Load,
    /// Bytes posted per class, decayed, for the minimum bulk share.
    posted_latency: u64,
    posted_bulk: u64,
    /// Bulk chunks left before latency work counts as inactive again.
    latency_recent: u32,
}

impl Scheduler {
    /// A scheduler with these settings.
    pub fn new(cfg: SchedConfig) -> Scheduler {
        Scheduler {
            cfg,
            ops: Slab::new(),
            latency: VecDeque::new(),
            fifo: VecDeque::new(),
            tenants: HashMap::new(),
            ring: Vec::new(),
            lanes: Vec::new(),
            nic: Load::default(),
            posted_latency: 0,
            posted_bulk: 0,
            latency_recent: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Set a tenant's bulk weight (default 1; 0 is taken as 1).
    pub fn set_weight(&mut self, tenant: TenantId, weight: u32) {
        self.tenant(tenant).weight = weight.max(1);
    }

    fn tenant(&mut self, t: TenantId) -> &mut Tenant {
        self.tenants.entry(t).or_insert(Tenant { weight: 1, vtime: 0, bulk: VecDeque::new(), inflight: 0 })
    }

    /// Ops known and not yet resolved.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when no op is known.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Take an op. A zero-length op is resolved at once by the caller's first `next` (it
    /// issues one empty chunk), so every op completes through a chunk.
    pub fn push(&mut self, spec: OpSpec) -> OpId {
        assert!(!spec.lanes.is_empty(), "an op needs at least one lane");
        let tenant = spec.tenant;
        let class = spec.class;
        let id = OpId(self.ops.insert(OpState {
            tenant,
            class,
            len: spec.len,
            lanes: spec.lanes,
            splittable: spec.splittable,
            cuts: spec.cuts,
            body_end: spec.len - spec.tail.min(spec.len),
            issued: 0,
            returned: Vec::new(),
            outstanding: 0,
            failed: false,
            cancelled: false,
            rr: 0,
            queued: true,
        }));
        if class == Class::Latency {
            self.latency_recent = self.cfg.idle_after_chunks;
        }
        self.enqueue(id, false);
        id
    }

    fn enqueue(&mut self, id: OpId, front: bool) {
        let (tenant, class) = {
            let o = &mut self.ops[id.0];
            o.queued = true;
            (o.tenant, o.class)
        };
        let q = match (self.cfg.mode, class) {
            (Mode::Fifo, _) => &mut self.fifo,
            (Mode::Fair, Class::Latency) => &mut self.latency,
            (Mode::Fair, Class::Bulk) => {
                // A tenant coming back from idle starts at the least service of those active:
                // idle time earns no credit.
                let floor = self.ring.iter().map(|t| self.tenants[t].vtime).min();
                let active = self.ring.contains(&tenant);
                let t = self.tenant(tenant);
                if front {
                    t.bulk.push_front(id);
                } else {
                    t.bulk.push_back(id);
                }
                if !active {
                    if let Some(floor) = floor {
                        t.vtime = t.vtime.max(floor);
                    }
                    self.ring.push(tenant);
                }
                return;
            }
        };
        if front {
            q.push_front(id);
        } else {
            q.push_back(id);
        }
    }

    fn dequeue(&mut self, id: OpId) {
        let o = &mut self.ops[id.0];
        if !o.queued {
            return;
        }
        o.queued = false;
        let (tenant, class) = (o.tenant, o.class);
        match (self.cfg.mode, class) {
            (Mode::Fifo, _) => self.fifo.retain(|&x| x != id),
            (Mode::Fair, Class::Latency) => self.latency.retain(|&x| x != id),
            (Mode::Fair, Class::Bulk) => {
                if let Some(t) = self.tenants.get_mut(&tenant) {
                    t.bulk.retain(|&x| x != id);
                }
            }
        }
    }

    /// Append up to `max` chunks to post now, within the budgets.
    pub fn next(&mut self, out: &mut Vec<Chunk>, max: usize) {
        if self.ops.is_empty() {
            return;
        }
        let start = out.len();
        let mut bulk = 0;
        // Bulk alone may fill the round; with latency work about, it gets a chunk or so per
        // round so the reactor reaps (and serves latency) in between.
        let bulk_cap = if self.latency_active() { self.cfg.bulk_per_round } else { max };
        while out.len() - start < max {
            let progressed = match self.cfg.mode {
                Mode::Fifo => self.next_fifo(out),
                Mode::Fair => {
                    let order = if self.bulk_is_owed() {
                        [Class::Bulk, Class::Latency]
                    } else {
                        [Class::Latency, Class::Bulk]
                    };
                    order.into_iter().any(|class| match class {
                        Class::Latency => self.next_latency(out),
                        Class::Bulk if bulk < bulk_cap => {
                            let ok = self.next_bulk(out);
                            bulk += ok as usize;
                            ok
                        }
                        Class::Bulk => false,
                    })
                }
            };
            if !progressed {
                break;
            }
        }
    }

    /// Bulk is behind its minimum share while latency work waits.
    fn bulk_is_owed(&self) -> bool {
        if self.latency.is_empty() || self.ring.is_empty() {
            return false;
        }
        let total = self.posted_bulk + self.posted_latency;
        total > 0 && (self.posted_bulk as f64) < self.cfg.min_bulk_share * total as f64
    }

    fn lane_load(&self, lane: LaneId) -> Load {
        self.lanes.get(lane.index()).copied().unwrap_or_default()
    }

    fn next_fifo(&mut self, out: &mut Vec<Chunk>) -> bool {
        let Some(&id) = self.fifo.front() else {
            return false;
        };
        if self.nic.wrs >= self.cfg.nic_wrs {
            return false;
        }
        let o = &self.ops[id.0];
        let lane = o.lanes[o.rr % o.lanes.len()];
        if self.lane_load(lane).wrs >= self.cfg.lane_wrs {
            return false;
        }
        // Whole ops, in order: what raw libfabric does (in pieces only above the provider's
        // largest message, which raw libfabric would refuse).
        out.push(self.issue(id, lane, self.cfg.max_message));
        true
    }

    fn next_latency(&mut self, out: &mut Vec<Chunk>) -> bool {
        let Some(&id) = self.latency.front() else {
            return false;
        };
        if self.nic.wrs >= self.cfg.nic_wrs {
            return false;
        }
        // Latency work ignores the byte budgets: they exist to keep bulk out of its way.
        let lane = self.ops[id.0]
            .lanes
            .iter()
            .copied()
            .filter(|&l| self.lane_load(l).wrs < self.cfg.lane_wrs)
            .min_by_key(|&l| self.lane_load(l).bytes);
        let Some(lane) = lane else { return false };
        out.push(self.issue(id, lane, self.cfg.chunk_size));
        true
    }

    fn next_bulk(&mut self, out: &mut Vec<Chunk>) -> bool {
        let f = self.budget_factor();
        // The NIC budget is not relaxed when latency is idle: it is what makes tenants share.
        if self.nic.wrs >= self.cfg.nic_wrs || self.nic.bulk >= self.cfg.nic_bytes {
            return false;
        }
        // Deficit round robin in its byte-exact form: serve the eligible tenant that has had the
        // least service per unit of weight. A tenant blocked by its own budget or lanes is
        // skipped without losing its place.
        self.ring.retain(|t| !self.tenants[t].bulk.is_empty());
        let mut best: Option<(u128, TenantId, OpId, LaneId)> = None;
        for i in 0..self.ring.len() {
            let t = self.ring[i];
            let tn = &self.tenants[&t];
            // Saturating: a large weight times a large budget would wrap to a budget of none.
            let budget = self.cfg.tenant_bytes.saturating_mul(tn.weight as usize).saturating_mul(f);
            if tn.inflight >= budget {
                continue;
            }
            if best.is_some_and(|(v, ..)| v <= tn.vtime) {
                continue;
            }
            let id = *tn.bulk.front().expect("non-empty after retain");
            let vtime = tn.vtime;
            if let Some(lane) = self.bulk_lane(id) {
                best = Some((vtime, t, id, lane));
            }
        }
        let Some((_, t, id, lane)) = best else {
            return false;
        };
        let size = if self.latency_active() { self.cfg.chunk_size } else { self.cfg.idle_chunk_size };
        self.latency_recent = self.latency_recent.saturating_sub(1);
        let chunk = self.issue(id, lane, size);
        let tn = self.tenants.get_mut(&t).expect("known");
        tn.vtime += (chunk.len.max(1) as u128) * VSCALE / tn.weight as u128;
        out.push(chunk);
        true
    }

    /// Latency work went past the scheduler (the caller posted it directly because nothing was
    /// queued): it still makes bulk split finely for a while.
    pub fn note_latency(&mut self) {
        self.latency_recent = self.cfg.idle_after_chunks;
    }

    /// Latency work is queued, in flight, or was seen within the last `idle_after_chunks` bulk
    /// chunks.
    fn latency_active(&self) -> bool {
        self.cfg.idle_after_chunks == 0 || self.latency_recent > 0 || !self.latency.is_empty()
    }

    fn budget_factor(&self) -> usize {
        if self.latency_active() {
            1
        } else {
            self.cfg.idle_budget_factor.max(1)
        }
    }

    /// The op's next lane that has room: in rotation, or the least loaded by bytes.
    fn bulk_lane(&mut self, id: OpId) -> Option<LaneId> {
        let o = &self.ops[id.0];
        let n = o.lanes.len();
        let budget = self.cfg.lane_bytes.saturating_mul(self.budget_factor());
        let room = |l: Load| l.bulk < budget && l.wrs < self.cfg.lane_wrs;
        let mut open = (0..n).map(|k| o.lanes[(o.rr + k) % n]).filter(|&lane| room(self.lane_load(lane)));
        match self.cfg.stripe {
            Stripe::RoundRobin => open.next(),
            Stripe::Bytes => open.min_by_key(|&lane| self.lane_load(lane).bulk),
        }
    }

    /// Cut the next piece (at most `max` bytes) of `id` for `lane`, and account for it.
    fn issue(&mut self, id: OpId, lane: LaneId, max: usize) -> Chunk {
        let o = &mut self.ops[id.0];
        // The fenced tail is one chunk, whatever the chunk size.
        let max =
            if o.splittable && !o.at_tail() { max.clamp(1, self.cfg.max_message.max(1)) } else { usize::MAX };
        let (offset, len) = match o.returned.pop() {
            Some((off, len)) if len > max => {
                o.returned.push((off + max, len - max));
                (off, max)
            }
            Some(r) => r,
            None => {
                let off = o.issued;
                let end = match &o.cuts {
                    // The first cut past `off` ends the stretch this chunk may cover.
                    Some(cuts) => cuts.get(cuts.partition_point(|&c| c <= off)).copied().unwrap_or(o.len),
                    None => o.len,
                };
                let limit = if off < o.body_end { o.body_end } else { o.len };
                let len = (end.min(limit) - off).min(max);
                o.issued += len;
                (off, len)
            }
        };
        o.outstanding += 1;
        o.rr = o.rr.wrapping_add(1);
        // Fenced: out of the queues until its body completes (`complete` puts it back).
        let done_issuing = !o.has_unissued() || o.fenced();
        let (tenant, class) = (o.tenant, o.class);
        if done_issuing {
            self.dequeue(id);
        }
        self.account(lane, tenant, class, len as isize, 1);
        match class {
            Class::Latency => self.posted_latency += len as u64,
            Class::Bulk => self.posted_bulk += len as u64,
        }
        // Decay, so the share reflects recent traffic.
        if self.posted_latency + self.posted_bulk > 1 << 26 {
            self.posted_latency /= 2;
            self.posted_bulk /= 2;
        }
        Chunk { op: id, offset, len, lane }
    }

    fn account(&mut self, lane: LaneId, tenant: TenantId, class: Class, bytes: isize, wrs: isize) {
        let bulk = if class == Class::Bulk { bytes } else { 0 };
        if self.lanes.len() <= lane.index() {
            self.lanes.resize(lane.index() + 1, Load::default());
        }
        for l in [&mut self.lanes[lane.index()], &mut self.nic] {
            l.bytes = l.bytes.saturating_add_signed(bytes);
            l.bulk = l.bulk.saturating_add_signed(bulk);
            l.wrs = l.wrs.saturating_add_signed(wrs);
        }
        if class == Class::Bulk {
            let t = self.tenant(tenant);
            t.inflight = t.inflight.saturating_add_signed(bytes);
        }
    }

    /// A chunk `next` gave out could not be posted (queue full): take it back, to be issued
    /// again first. Of an op cancelled or failed meanwhile, it is dropped instead, and the op
    /// is done if this was its last chunk out.
    pub fn unissue(&mut self, c: Chunk) -> Option<OpDone> {
        let o = &mut self.ops[c.op.0];
        o.outstanding -= 1;
        o.rr = o.rr.wrapping_sub(1);
        let (tenant, class) = (o.tenant, o.class);
        match class {
            Class::Latency => self.posted_latency = self.posted_latency.saturating_sub(c.len as u64),
            Class::Bulk => self.posted_bulk = self.posted_bulk.saturating_sub(c.len as u64),
        }
        self.account(c.lane, tenant, class, -(c.len as isize), -1);
        let o = &mut self.ops[c.op.0];
        if o.failed || o.cancelled {
            // Cancelled or failed while this chunk was out (a future dropped between the
            // reactor's look and a post the provider refused): it may have been the last.
            return self.resolve(c.op);
        }
        o.returned.push((c.offset, c.len));
        if !o.queued {
            self.enqueue(c.op, true);
        }
        None
    }

    /// A posted chunk completed (`ok`) or failed. Returns the op once it is resolved: after its
    /// last chunk, or, on failure, once nothing of it is in flight.
    pub fn complete(&mut self, c: Chunk, ok: bool) -> Option<OpDone> {
        let o = &mut self.ops[c.op.0];
        o.outstanding -= 1;
        let (tenant, class) = (o.tenant, o.class);
        self.account(c.lane, tenant, class, -(c.len as isize), -1);
        if !ok && !self.ops[c.op.0].failed {
            self.ops[c.op.0].failed = true;
            self.withdraw(c.op);
        }
        let o = &self.ops[c.op.0];
        if o.outstanding == 0 && o.fenced() && !o.failed && !o.cancelled && !o.queued {
            // The body has landed: the tail may go.
            self.enqueue(c.op, true);
        }
        self.resolve(c.op)
    }

    /// The lowest offset of op `id` not yet posted (a range handed back counts): where a
    /// failure now would leave the op's bytes unmoved from, though no chunk of it failed.
    pub fn first_unposted(&self, id: OpId) -> Option<usize> {
        let o = self.ops.get(id.0)?;
        let back = o.returned.iter().map(|r| r.0).min();
        let fresh = (o.issued < o.len).then_some(o.issued);
        back.into_iter().chain(fresh).min()
    }

    /// The op's future is gone: withdraw what is not posted. Returns the op if that resolves it.
    pub fn cancel(&mut self, id: OpId) -> Option<OpDone> {
        self.ops[id.0].cancelled = true;
        self.withdraw(id);
        self.resolve(id)
    }

    /// Fail an op from outside (its peer is gone): like a failed chunk.
    pub fn fail(&mut self, id: OpId) -> Option<OpDone> {
        self.ops[id.0].failed = true;
        self.withdraw(id);
        self.resolve(id)
    }

    fn withdraw(&mut self, id: OpId) {
        self.dequeue(id);
        let o = &mut self.ops[id.0];
        o.returned.clear();
        o.issued = o.len;
    }

    fn resolve(&mut self, id: OpId) -> Option<OpDone> {
        let o = &self.ops[id.0];
        if !o.resolved() {
            return None;
        }
        let ok = !o.failed && !o.cancelled;
        self.ops.remove(id.0);
        Some(OpDone { op: id, ok })
    }

    /// Queued ops, oldest first per queue: for failing a lost peer's work.
    pub fn ops(&self) -> impl Iterator<Item = OpId> + '_ {
        self.ops.iter().map(|(k, _)| OpId(k))
    }
}
