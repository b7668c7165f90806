//! The leaves: what every layer above may use and which uses nothing above it. The backend
//! interface, errors, the sans-IO scheduler, control messages, descriptors, counters.
pub(crate) mod batch;
pub(crate) mod control;
pub(crate) mod control_inbox;
pub(crate) mod control_outbox;
pub(crate) mod error;
pub(crate) mod imm;
pub(crate) mod lane_map;
pub(crate) mod memory;
pub(crate) mod probe;
pub(crate) mod refusal;
pub(crate) mod remote;
pub(crate) mod sched;
pub(crate) mod stage_plan;
pub(crate) mod stats;
pub(crate) mod topology;
pub(crate) mod transport;
pub(crate) mod vars;
pub(crate) mod wake;

/// Most rails one runtime spans (a p5 host has 32 EFA NICs).
pub const MAX_RAILS: usize = 32;
