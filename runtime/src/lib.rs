//! # rdmalane
//!
//! An async RDMA runtime with io_uring-like ergonomics. Operations take registered buffers by
//! value and give them back with the result:
//!
//! ```ignore
//! let (res, buf) = ep.write_remote(buf, &remote).await;
//! ```
//!
//! A reactor (on its own pinned thread, or inline in [`Runtime::block_on`]) owns the transport,
//! posts work and polls completions in batches. Dropping an op future is always safe: an op not
//! yet posted is withdrawn; a posted op keeps its buffer in the reactor until the completion
//! arrives.
//!
//! Backends implement [`backend::Transport`]: `rdmalane-efa` (libfabric: efa, shm, tcp;ofi_rxm) and
//! `rdmalane-verbs`.
mod base;
mod bootstrap;
pub mod buf;
mod driver;
mod endpoint;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod membership;
mod op;
mod reactor;
mod recv_stream;
mod runtime;

pub use base::batch::{Piece, Pieces};
pub use base::error::{BufResult, Error, FailureClass, MembershipFailure, OpKind, Result, TransportError};
pub use base::imm::{ImmEvent, NextImm, WaitImm};
pub use base::memory::{DevicePath, DevicePolicy, DeviceRegistration, Memory};
pub use base::refusal::{Refusal, RefusalCounts, RefusalReason, Refusals};
pub use base::remote::RemoteBuf;
pub use base::stats::Stats;
pub use base::transport::{Access, Backend, Caps};
pub use base::MAX_RAILS;
pub use bootstrap::{Listener, PROTOCOL_VERSION};
#[cfg(feature = "cuda")]
pub use buf::CudaBuf;
pub use buf::{CacheStats, ExposedBuf, IoBuf, IoBufMut, RegisteredBuf, SharedBuf, Slice};
pub use endpoint::Endpoint;
pub use op::Op;
pub use recv_stream::{RecvMsg, RecvStream};
pub use runtime::{Builder, Driver, Runtime, WeakRuntime};

/// Where the runtime's part of a reply goes, stage by stage (feature `probe`; without it the
/// marks are empty and [`stages`](probe::stages) reports nothing): for benchmarks that time the
/// path from a completion to the next post.
pub mod probe {
    pub use crate::base::probe::{mark_ticks, set_clock, stages, Stage, StageTally, STAGES};
}

/// The fair-share scheduler's settings (the scheduler itself is the reactor's).
pub mod sched {
    pub use crate::base::sched::{Class, Mode, SchedConfig, Stripe, TenantId};
}

/// What a backend (a transport implementation such as `rdmalane-efa` or `rdmalane-verbs`)
/// needs: the interface it implements, the types it exchanges with the reactor, and the
/// helpers it shares with the runtime. Applications do not need this module.
pub mod backend {
    pub use crate::base::memory::{DeviceMem, DeviceRegistration, DmaBuf, Memory};
    pub use crate::base::topology::device_numa_node;
    pub use crate::base::transport::*;
}
