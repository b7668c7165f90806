//! What reaches the reactor through its submission queue.
use std::any::Any;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use crate::error::{OpKind, TransportError};
use crate::op::Complete;
use crate::sched::{Class, TenantId};
use crate::transport::{Access, LocalSeg, MemoryRegion, WrKind};

/// One data operation, validated, waiting to be posted.
pub(crate) struct OpReq {
    pub peer: usize,
    pub op: OpKind,
    pub kind: WrKind,
    pub seg: LocalSeg,
    pub cell: Arc<dyn Complete>,
    pub tenant: TenantId,
    /// `None`: by size (the scheduler's latency threshold).
    pub class: Option<Class>,
}

/// A reply channel for control commands.
pub(crate) type Reply<T> = SyncSender<T>;

pub(crate) enum Cmd {
    Op(OpReq),
    Register {
        ptr: usize,
        len: usize,
        access: Access,
        reply: Reply<Result<MemoryRegion, TransportError>>,
    },
    /// Deregister; then drop `keep` (memory peers could reach until now); then reply.
    Deregister {
        id: u64,
        keep: Option<Box<dyn Any + Send>>,
        reply: Option<Reply<Result<(), TransportError>>>,
    },
    AddPeer {
        name: Vec<u8>,
        label: String,
        reply: Reply<Result<usize, TransportError>>,
    },
    /// The endpoint handle is gone: forget the peer once its ops are done.
    RemovePeer {
        slot: usize,
    },
    /// Set a tenant's bulk weight.
    SetWeight {
        tenant: TenantId,
        weight: u32,
    },
    /// The control connection to the peer broke: fail what is pending.
    PeerLost {
        slot: usize,
        reason: String,
    },
}
