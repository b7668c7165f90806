//! What reaches the reactor through its submission queue.
use std::any::Any;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use crate::base::batch::Layout;
use crate::base::control::Ctl;
use crate::base::control_inbox::Credit;
use crate::base::control_outbox::OutboxTx;
use crate::base::error::{OpKind, TransportError};
use crate::base::lane_map::LaneMap;
use crate::base::memory::DeviceMem;
use crate::base::sched::{Class, TenantId};
use crate::base::transport::{Access, LaneId, LocalSeg, MemoryRegion, WrKind};
use crate::reactor::cell::OpCell;

/// A peer's slot in its reactor's table: ops name their peer by it (and by the peer's id, so
/// that a reused slot is never mistaken for the peer an op was made for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PeerSlot(pub(crate) usize);

/// A rail group (one reactor and the rails its transport spans) by its place in the runtime.
/// The first holds rail 0: messages, the express lane and the audit's answers go there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub(crate) struct GroupId(pub(crate) usize);

impl GroupId {
    /// The group holding rail 0.
    pub(crate) const FIRST: GroupId = GroupId(0);
}

/// One connection to a peer, as this runtime added it. A removed peer's slot goes to the next
/// peer added, so what is said about a peer after its removal (a loss its control connection's
/// task reports late, a message that task read) names the connection too, and finds no peer
/// of that link in the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerLink(pub(crate) u64);

impl PeerLink {
    /// A link no other connection of this process has had.
    pub(crate) fn fresh() -> PeerLink {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        PeerLink(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Where a peer sits in each rail group's reactor.
#[derive(Debug)]
pub(crate) struct PeerSlots {
    /// Its slot in the first group's reactor, which holds its express lane (messages and
    /// small ops go there).
    pub first: PeerSlot,
    /// Its slot in each group's reactor, `None` where the group holds none of its lanes
    /// (`by_group[0]` is `Some(first)`); index it with [`PeerSlots::of`].
    pub by_group: Vec<Option<PeerSlot>>,
    /// The connection these slots hold.
    pub link: PeerLink,
}

impl PeerSlots {
    /// Its slot in group `g`'s reactor, if that group holds one of its lanes.
    pub(crate) fn of(&self, g: GroupId) -> Option<PeerSlot> {
        self.by_group.get(g.0).copied().flatten()
    }
}

/// A peer's slots, shared (a thin pointer: ops carry it).
pub(crate) type Slots = Arc<PeerSlots>;

/// One data operation, validated, waiting to be posted.
pub(crate) struct OpReq {
    pub peer: PeerSlot,
    pub peer_id: u64,
    pub op: OpKind,
    pub kind: WrKind,
    pub seg: LocalSeg,
    pub cell: Arc<OpCell>,
    pub tenant: TenantId,
    /// `None`: by size (the scheduler's latency threshold).
    pub class: Option<Class>,
    /// The pieces of a batch transfer; `None` for a plain op over all of `seg`.
    pub batch: Option<Arc<Layout>>,
    /// The remote region's keys on the peer's rails 1, 2, ... (`None`: one rail).
    pub rail_keys: Option<Arc<[u64]>>,
    /// The peer's slot in each rail group's reactor, where the op may be split across the
    /// groups (a one-sided op whose descriptor has a key for each of the peer's rails, on a
    /// runtime with several groups); `None` otherwise. Taken by the runtime before the op
    /// reaches a reactor.
    pub slots: Option<crate::reactor::cmd::Slots>,
    /// The local memory is device memory the transport registered itself: the GPU's copy
    /// engine or the NIC moves it, not the provider call, so the op goes whole where it fits
    /// (a chunk costs a copy launch, and buys no room for small ops).
    pub device: bool,
}

/// An op as its future holds it before submission: the request without its memory (the
/// buffer's, added then) and cell (made then).
#[derive(Clone)]
pub(crate) struct Draft {
    pub peer: PeerSlot,
    pub peer_id: u64,
    pub op: OpKind,
    pub kind: WrKind,
    pub tenant: TenantId,
    pub class: Option<Class>,
    pub batch: Option<Arc<Layout>>,
    pub rail_keys: Option<Arc<[u64]>>,
    pub slots: Option<crate::reactor::cmd::Slots>,
    pub device: bool,
}

impl Draft {
    /// The request, over `seg` (the buffer's memory), completing `cell`.
    pub fn into_req(self, seg: LocalSeg, cell: Arc<OpCell>) -> OpReq {
        let Draft { peer, peer_id, op, kind, tenant, class, batch, rail_keys, slots, device } = self;
        OpReq { peer, peer_id, op, kind, seg, cell, tenant, class, batch, rail_keys, slots, device }
    }
}

impl OpReq {
    /// Bytes the op moves.
    pub fn len(&self) -> usize {
        self.batch.as_ref().map_or(self.seg.len, |b| b.total)
    }
}

/// A lane just opened, with its address for the peer.
#[derive(Debug, Clone)]
pub(crate) struct OpenedLane {
    pub lane: LaneId,
    /// Its address, for the peer to connect its lane to.
    pub name: Vec<u8>,
}

/// One of our lanes to a new peer.
#[derive(Debug, Clone)]
pub(crate) struct PeerLane {
    pub lane: LaneId,
    /// The address of the peer's lane to connect it to.
    pub peer_name: Vec<u8>,
    /// Its place among the connection's lanes (0: the express lane).
    pub place: usize,
}

/// A reply channel for control commands.
pub(crate) type Reply<T> = SyncSender<T>;

pub(crate) enum Cmd {
    Op(OpReq),
    Register {
        ptr: usize,
        len: usize,
        access: Access,
        /// Device memory, registered as such.
        device: Option<DeviceMem>,
        reply: Reply<Result<MemoryRegion, TransportError>>,
    },
    /// A region registered on every rail group, whose keys peers may name in their questions
    /// to this reactor: `mr.id` is this reactor's own registration of it.
    Exposed {
        mr: MemoryRegion,
        len: usize,
        access: Access,
    },
    /// Deregister; then drop `keep` (memory peers could reach until now); then reply.
    Deregister {
        id: u64,
        keep: Option<Box<dyn Any + Send>>,
        reply: Option<Reply<Result<(), TransportError>>>,
    },
    /// Open lanes for a peer about to be added, one on each of these rails (of this reactor's
    /// transport); replies with their addresses.
    OpenLanes {
        rails: Vec<usize>,
        reply: Reply<Result<Vec<OpenedLane>, TransportError>>,
    },
    /// Connect our lanes to the peer's and add the peer.
    AddPeer {
        /// The peer runtime's id: ops name their peer by slot and id, so a reused slot is
        /// never mistaken for the peer an op was made for.
        id: u64,
        /// The connection (see [`PeerLink`]).
        link: PeerLink,
        lanes: Vec<PeerLane>,
        /// The peer's rails: its lane with place i runs on `map.rail_of(i)`.
        map: LaneMap,
        label: String,
        /// Where the reactor's messages to the peer go (its control connection).
        ctl: OutboxTx,
        reply: Reply<Result<PeerSlot, TransportError>>,
    },
    /// A handshake failed after `OpenLanes`: close them.
    CloseLanes {
        lanes: Vec<LaneId>,
    },
    /// The endpoint handle is gone: fail what is pending and close the lanes.
    RemovePeer {
        slot: PeerSlot,
        link: PeerLink,
    },
    /// Set a tenant's bulk weight.
    SetWeight {
        tenant: TenantId,
        weight: u32,
    },
    /// The control connection to the peer broke: fail what is pending.
    PeerLost {
        slot: PeerSlot,
        link: PeerLink,
        reason: String,
    },
    /// The peer in `slot` (connection `link`) sent a message on its control connection. The
    /// credit, held until the message is handled, bounds what one peer has queued.
    Control {
        slot: PeerSlot,
        link: PeerLink,
        msg: Ctl,
        credit: Option<Credit>,
    },
}
