use crate::base::error::Result;
use crate::base::vars::{invalid, parse};

/// A tenant: the unit fair share is computed over.
pub type TenantId = u32;

/// Traffic class of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Served first (small requests, RPCs).
    Latency,
    /// Shared across tenants by weight (transfers).
    Bulk,
}

/// How the queue orders work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Split, prioritise, share and rotate (the default).
    #[default]
    Fair,
    /// Post whole ops in arrival order, as raw libfabric does: the baseline.
    Fifo,
}

/// How bulk chunks spread over an op's lanes (and so over rails, whose lanes they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stripe {
    /// Each chunk goes to the next lane in turn that has room.
    #[default]
    RoundRobin,
    /// Each chunk goes to the lane with the fewest bulk bytes in flight (evens out rails of
    /// different speeds).
    Bytes,
}

/// Scheduler settings; environment variables override the defaults (see [`SchedConfig::from_env`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedConfig {
    /// Fair or fifo.
    pub mode: Mode,
    /// Largest piece a big op is split into.
    pub chunk_size: usize,
    /// Ops at or below this size default to `Latency`.
    pub latency_threshold: usize,
    /// Bulk bytes in flight per lane.
    pub lane_bytes: usize,
    /// Work requests in flight per lane.
    pub lane_wrs: usize,
    /// Bulk bytes in flight per tenant and unit of weight (across all its lanes).
    pub tenant_bytes: usize,
    /// Bulk bytes in flight per NIC.
    pub nic_bytes: usize,
    /// Work requests in flight per NIC.
    pub nic_wrs: usize,
    /// Smallest share of posted bytes bulk keeps while latency traffic is queued (0..1).
    pub min_bulk_share: f64,
    /// While no latency work has been seen for this many bulk chunks, bulk runs unthrottled:
    /// chunks of `idle_chunk_size` and budgets times `idle_budget_factor` (PeRF splits only
    /// when a latency tenant is active). 0 keeps bulk throttled always.
    pub idle_after_chunks: u32,
    /// Chunk size while no latency work is active.
    pub idle_chunk_size: usize,
    /// Budget multiplier (lanes and tenants) while no latency work is active. The NIC budget
    /// stays: it is what tenants compete for, so their shares hold with or without latency work.
    pub idle_budget_factor: usize,
    /// The provider's largest message: no chunk is larger, in fifo mode either (the runtime
    /// sets it from the transport).
    pub max_message: usize,
    /// Bulk chunks handed out per `next` call. Posting can cost a copy of the chunk (tcp, shm);
    /// the reactor reaps between rounds, so latency work gets in between bulk chunks.
    pub bulk_per_round: usize,
    /// Work requests posted per round at most (lazy batched posting: one doorbell for the
    /// lot where the provider defers it). While no latency work is active, bulk takes all of
    /// them; otherwise `bulk_per_round`.
    pub post_batch: usize,
    /// How bulk chunks spread over lanes and rails.
    pub stripe: Stripe,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            mode: Mode::Fair,
            chunk_size: 64 << 10,
            latency_threshold: 4096,
            lane_bytes: 256 << 10,
            lane_wrs: 256,
            tenant_bytes: 256 << 10,
            nic_bytes: 8 << 20,
            nic_wrs: 1024,
            min_bulk_share: 0.1,
            bulk_per_round: 1,
            post_batch: 32,
            stripe: Stripe::RoundRobin,
            max_message: usize::MAX,
            idle_after_chunks: 256,
            idle_chunk_size: 1 << 20,
            idle_budget_factor: 16,
        }
    }
}

impl SchedConfig {
    /// The defaults with the environment's overrides (see `from_vars`, whose variables they
    /// are): what `Builder` uses when no `scheduler` is set. A variable that does not parse is
    /// an error naming it.
    pub fn from_env() -> Result<SchedConfig> {
        SchedConfig::from_vars(&|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The scheduler's defaults with the environment's overrides: `RDMALANE_SCHEDULER`
    /// (`fair`|`fifo`), `RDMALANE_CHUNK_SIZE`, `RDMALANE_LATENCY_THRESHOLD`, `RDMALANE_LANE_BYTES`,
    /// `RDMALANE_TENANT_BYTES`, `RDMALANE_NIC_BYTES`, `RDMALANE_POST_BATCH`, `RDMALANE_STRIPE`
    /// (`rr`|`bytes`), `RDMALANE_MIN_BULK_SHARE` (0 to 1).
    pub(crate) fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<SchedConfig> {
        let mut c = SchedConfig::default();
        let num = |name: &str| parse::<usize>(name, var(name), "a count of bytes");
        if let Some(m) = var("RDMALANE_SCHEDULER") {
            c.mode = match m.trim() {
                "fifo" => Mode::Fifo,
                "fair" => Mode::Fair,
                other => return Err(invalid(format!("RDMALANE_SCHEDULER={other}: want fair or fifo"))),
            };
        }
        if let Some(v) = num("RDMALANE_CHUNK_SIZE")? {
            c.chunk_size = v.max(1);
        }
        if let Some(v) = num("RDMALANE_LATENCY_THRESHOLD")? {
            c.latency_threshold = v;
        }
        if let Some(v) = num("RDMALANE_LANE_BYTES")? {
            c.lane_bytes = v.max(1);
        }
        if let Some(v) = num("RDMALANE_TENANT_BYTES")? {
            c.tenant_bytes = v.max(1);
        }
        if let Some(v) = num("RDMALANE_NIC_BYTES")? {
            c.nic_bytes = v.max(1);
        }
        if let Some(v) = parse::<usize>("RDMALANE_POST_BATCH", var("RDMALANE_POST_BATCH"), "a count")? {
            c.post_batch = v.max(1);
        }
        if let Some(m) = var("RDMALANE_STRIPE") {
            c.stripe = match m.trim() {
                "rr" | "round-robin" => Stripe::RoundRobin,
                "bytes" => Stripe::Bytes,
                other => return Err(invalid(format!("RDMALANE_STRIPE={other}: want rr or bytes"))),
            };
        }
        if let Some(v) =
            parse::<f64>("RDMALANE_MIN_BULK_SHARE", var("RDMALANE_MIN_BULK_SHARE"), "a share from 0 to 1")?
        {
            if !v.is_finite() {
                return Err(invalid(format!("RDMALANE_MIN_BULK_SHARE={v}: want a share from 0 to 1")));
            }
            c.min_bulk_share = v.clamp(0.0, 1.0);
        }
        Ok(c)
    }

    /// Settings a scheduler can run with, or the first that it cannot, named: a budget or a
    /// count of 0 would hold bulk work (or every scheduled op) back for good, and a share that
    /// is no number would turn the least bulk keeps off. (The environment's values are made
    /// so by `from_vars`; a `SchedConfig` built by hand is checked as the runtime starts.)
    pub fn check(&self) -> Result<()> {
        let counts = [
            ("chunk_size", self.chunk_size),
            ("lane_bytes", self.lane_bytes),
            ("lane_wrs", self.lane_wrs),
            ("tenant_bytes", self.tenant_bytes),
            ("nic_bytes", self.nic_bytes),
            ("nic_wrs", self.nic_wrs),
            ("idle_chunk_size", self.idle_chunk_size),
            ("idle_budget_factor", self.idle_budget_factor),
            ("bulk_per_round", self.bulk_per_round),
            ("post_batch", self.post_batch),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(format!("scheduler: {name} is 0; it must be at least 1")));
        }
        if !(0.0..=1.0).contains(&self.min_bulk_share) {
            let v = self.min_bulk_share;
            return Err(invalid(format!("scheduler: min_bulk_share is {v}; it must be from 0 to 1")));
        }
        Ok(())
    }

    /// The class an op of `len` bytes gets when the caller names none.
    pub fn default_class(&self, len: usize) -> Class {
        if len <= self.latency_threshold {
            Class::Latency
        } else {
            Class::Bulk
        }
    }
}
