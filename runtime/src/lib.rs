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
//! Backends implement [`Transport`]: `rdmalane-efa` (libfabric: efa, shm, tcp;ofi_rxm) and
//! `rdmalane-verbs`.
mod batch;
mod bootstrap;
pub mod buf;
mod control;
mod endpoint;
mod error;
mod fanout;
#[doc(hidden)]
pub mod fuzzing;
mod imm;
mod op;
mod reactor;
mod recv_stream;
mod remote;
mod runtime;
pub mod sched;
mod stats;
pub mod topology;
pub mod transport;

pub use batch::{Piece, Pieces};
pub use bootstrap::{Listener, Refusal, RefusalCounts, RefusalReason, Refusals, PROTOCOL_VERSION};
pub use buf::{CacheStats, ExposedBuf, IoBuf, IoBufMut, RegisteredBuf, SharedBuf, Slice};
pub use endpoint::Endpoint;
pub use error::{BufResult, Error, FailureClass, OpKind, Result, TransportError};
pub use imm::{ImmEvent, NextImm, WaitImm};
pub use op::Op;
pub use recv_stream::{RecvMsg, RecvStream};
pub use remote::RemoteBuf;
pub use runtime::{Builder, Driver, Runtime, WeakRuntime, MAX_RAILS};
pub use stats::Stats;
pub use transport::{Access, Backend, Caps, Transport, TransportConfig};
