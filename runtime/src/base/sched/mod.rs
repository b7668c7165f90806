//! The fair-share submission queue, sans-IO: no FFI, no threads, no clock. The reactor pushes
//! ops, asks for the next chunks to post within the in-flight budgets, and reports chunk
//! completions; tests drive it the same way (see `tests.rs`).
//!
//! - Flows are (tenant, class). `Latency` is served first; `Bulk` is shared across tenants by
//!   deficit round robin with weights (in its byte-exact form: the tenant with the least service
//!   per unit of weight goes next), with a minimum share so latency traffic cannot starve it.
//! - Ops larger than the chunk size are split into contiguous chunks; small ops never are.
//! - Budgets per lane, per tenant and per NIC (bytes and work requests) keep the hardware queue
//!   short, so a latency op waits for about one chunk per active bulk flow.
//! - Bulk chunks rotate over the op's lanes; a latency op takes its least-loaded lane. Shares are
//!   per tenant, whatever the number of lanes (PeRF's QP throttling).
mod config;
mod scheduler;
#[cfg(test)]
mod tests;

pub use config::{Class, Mode, SchedConfig, Stripe, TenantId};
pub use scheduler::{Chunk, OpDone, OpId, OpSpec, Scheduler};
