//! The one error type every rdmalane operation returns.
use std::fmt;
use std::io;
use std::sync::Arc;

/// Which operation an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// One-sided RDMA write.
    Write,
    /// One-sided RDMA write carrying an immediate value.
    WriteImm,
    /// One-sided RDMA read.
    Read,
    /// Two-sided send.
    Send,
    /// Two-sided receive.
    Recv,
    /// Memory registration.
    Register,
    /// Exposing a region to peers, or revoking it.
    Expose,
    /// Opening the transport.
    Open,
    /// Establishing a connection (handshake).
    Connect,
    /// Accepting a connection.
    Accept,
    /// Waiting for immediate-data events.
    Imm,
    /// Joining a cluster, publishing to or watching its membership directory.
    Join,
    /// A copy between host and device memory.
    Copy,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            OpKind::Write => "write_remote",
            OpKind::WriteImm => "write_with_imm",
            OpKind::Read => "read_remote",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::Register => "register",
            OpKind::Expose => "expose",
            OpKind::Open => "open",
            OpKind::Connect => "connect",
            OpKind::Accept => "accept",
            OpKind::Imm => "imm",
            OpKind::Copy => "copy",
            OpKind::Join => "join",
        };
        f.write_str(s)
    }
}

/// How a transport failure should be read by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The peer refused the access (bad key, out of range, no permission).
    RemoteAccess,
    /// The peer cannot be reached any more (connection reset, process gone).
    PeerUnreachable,
    /// The operation was cancelled by the provider (flushed).
    Cancelled,
    /// A message did not fit the receive buffer posted for it.
    Truncated,
    /// Anything else the provider reported.
    Other,
}

/// A failure as the transport (provider) reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError {
    /// Provider name, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// The provider's errno (positive), 0 when not applicable.
    pub errno: i32,
    /// The provider's text for it (libfabric's `fi_strerror`, verbs' status string, ...).
    pub text: String,
    /// How to read it.
    pub class: FailureClass,
}

impl std::error::Error for TransportError {}

impl TransportError {
    /// A failure the runtime reports itself, in the provider's name (no errno).
    pub(crate) fn local(provider: &str, class: FailureClass, text: impl Into<String>) -> TransportError {
        TransportError { provider: provider.to_string(), errno: 0, text: text.into(), class }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} reported: {} (errno {})", self.provider, self.text, self.errno)
    }
}

/// Every error an rdmalane call can return. Each variant names the operation and, where there
/// is one, the peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The provider failed the operation.
    #[error("{op} with peer {peer}: {source}")]
    Transport {
        /// The operation.
        op: OpKind,
        /// The peer, as `addr#runtime-id`, or `-` when there is none.
        peer: Arc<str>,
        /// What the provider said.
        source: TransportError,
    },
    /// The peer refused a one-sided access: bad key, revoked region, outside what it exposed.
    #[error("{op} with peer {peer}: remote access refused: {source}")]
    RemoteAccess {
        /// The operation.
        op: OpKind,
        /// The peer.
        peer: Arc<str>,
        /// What the provider said.
        source: TransportError,
    },
    /// The peer went away (process exited, connection lost) while the op was pending.
    #[error("{op} with peer {peer}: peer lost ({reason})")]
    PeerLost {
        /// The operation.
        op: OpKind,
        /// The peer.
        peer: Arc<str>,
        /// How the loss was noticed.
        reason: Arc<str>,
    },
    /// The requested provider is not available on this machine.
    #[error("{backend} provider {requested:?} is not available; it found: [{found}]")]
    ProviderUnavailable {
        /// The backend that looked (`libfabric`, `verbs`).
        backend: &'static str,
        /// What was asked for.
        requested: String,
        /// The providers the backend did find.
        found: String,
    },
    /// A remote range outside the descriptor; refused before anything was posted.
    #[error("{op}: range {offset}..{end} is outside the remote buffer of {len} bytes", end = offset.saturating_add(*want))]
    OutOfBounds {
        /// The operation.
        op: OpKind,
        /// Start of the requested range.
        offset: u64,
        /// Its length.
        want: u64,
        /// The descriptor's length.
        len: u64,
    },
    /// An argument that cannot be right; nothing was posted.
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation.
        op: OpKind,
        /// What was wrong.
        reason: String,
    },
    /// The op would go past a limit the peer keeps to protect itself; nothing was posted. It
    /// may be tried again once earlier ops to the peer complete.
    #[error("{op} with peer {peer}: held back: {reason}")]
    Backpressure {
        /// The operation.
        op: OpKind,
        /// The peer.
        peer: Arc<str>,
        /// Which limit, and what would lift it.
        reason: Arc<str>,
    },
    /// The peer did not answer in time.
    #[error("{op} with {peer}: timed out after {after_ms} ms")]
    Timeout {
        /// The operation.
        op: OpKind,
        /// The peer address.
        peer: Arc<str>,
        /// The limit that passed.
        after_ms: u64,
    },
    /// The control-plane handshake failed.
    #[error("{op} with {peer}: handshake failed ({why}): {reason}")]
    Handshake {
        /// Connect or accept.
        op: OpKind,
        /// The peer address.
        peer: Arc<str>,
        /// Why, as a kind: wrong secret, other version, ...
        why: crate::base::refusal::RefusalReason,
        /// What exactly was wrong.
        reason: Arc<str>,
    },
    /// A socket error on the control plane.
    #[error("{op} with {peer}: {source}")]
    Io {
        /// The operation.
        op: OpKind,
        /// The peer address.
        peer: Arc<str>,
        /// The I/O error.
        source: io::Error,
    },
    /// A batch transfer failed at one of its pieces (the first that failed).
    #[error("piece {piece} of the batch: {source}")]
    Batch {
        /// Index of the piece in the batch.
        piece: usize,
        /// What went wrong with it.
        source: Box<Error>,
    },
    /// The membership directory could not be used, or a member's entry could not be trusted.
    #[error("{op} {member}: {why}: {detail}")]
    Membership {
        /// Join (the directory) or connect (to a member).
        op: OpKind,
        /// The member (`id` or `label`) or, for the directory itself, its address.
        member: Arc<str>,
        /// What was wrong, as a kind.
        why: MembershipFailure,
        /// What exactly was wrong.
        detail: Arc<str>,
    },
    /// Device memory this runtime cannot move, refused when it is registered (never accepted
    /// and failed later): what the provider lacks, or what this build or host lacks.
    #[error("{op}: {memory} refused on provider {provider}: {lacks}")]
    DeviceMemory {
        /// The operation (register, expose).
        op: OpKind,
        /// The memory that was refused.
        memory: crate::base::memory::Memory,
        /// The provider in use.
        provider: Arc<str>,
        /// What is missing.
        lacks: Arc<str>,
    },
    /// A call into the CUDA driver failed.
    #[error("{op}: CUDA {call} failed: {detail}")]
    Cuda {
        /// The operation.
        op: OpKind,
        /// The driver call.
        call: &'static str,
        /// The driver's error name and text.
        detail: Arc<str>,
    },
    /// The runtime shut down before the operation completed.
    #[error("{op}: runtime shut down")]
    Shutdown {
        /// The operation.
        op: OpKind,
    },
}

impl Error {
    /// The operation this error belongs to.
    pub fn op(&self) -> OpKind {
        match self {
            Error::Transport { op, .. }
            | Error::RemoteAccess { op, .. }
            | Error::PeerLost { op, .. }
            | Error::OutOfBounds { op, .. }
            | Error::InvalidArgument { op, .. }
            | Error::Backpressure { op, .. }
            | Error::Timeout { op, .. }
            | Error::Handshake { op, .. }
            | Error::Io { op, .. }
            | Error::Membership { op, .. }
            | Error::DeviceMemory { op, .. }
            | Error::Cuda { op, .. }
            | Error::Shutdown { op } => *op,
            Error::ProviderUnavailable { .. } => OpKind::Open,
            Error::Batch { source, .. } => source.op(),
        }
    }

    /// True for errors that mean the peer is gone.
    pub fn is_peer_lost(&self) -> bool {
        match self {
            Error::Batch { source, .. } => source.is_peer_lost(),
            e => matches!(e, Error::PeerLost { .. }),
        }
    }

    pub(crate) fn from_transport(op: OpKind, peer: &str, e: TransportError) -> Error {
        match e.class {
            FailureClass::RemoteAccess => Error::RemoteAccess { op, peer: peer.into(), source: e },
            FailureClass::PeerUnreachable => {
                Error::PeerLost { op, peer: peer.into(), reason: e.to_string().into() }
            }
            _ => Error::Transport { op, peer: peer.into(), source: e },
        }
    }

    /// An `InvalidArgument` error for `op`.
    pub fn invalid(op: OpKind, reason: impl Into<String>) -> Error {
        Error::InvalidArgument { op, reason: reason.into() }
    }
}

/// Why a membership call failed ([`Error::Membership`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MembershipFailure {
    /// The directory (etcd) did not answer within the connect timeout.
    DirectoryUnreachable,
    /// The directory answered with an error.
    Directory,
    /// No member with that id or label is in the directory.
    UnknownMember,
    /// A newer runtime published the same label: this entry is a restarted runtime's old one.
    Superseded,
    /// The entry names a provider other than ours: its addresses would mean nothing to us.
    ProviderMismatch,
    /// The runtime that answered at the entry's address is not the one the entry names.
    IdMismatch,
}

impl fmt::Display for MembershipFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MembershipFailure::DirectoryUnreachable => "membership directory unreachable",
            MembershipFailure::Directory => "membership directory failed",
            MembershipFailure::UnknownMember => "no such member",
            MembershipFailure::Superseded => "entry superseded by a newer runtime",
            MembershipFailure::ProviderMismatch => "provider mismatch",
            MembershipFailure::IdMismatch => "runtime id mismatch",
        })
    }
}

/// Result alias for rdmalane.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What every buffer-taking operation returns: the result and the buffer, whatever happened.
pub type BufResult<T, B> = (Result<T>, B);
