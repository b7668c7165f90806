//! The narrow interface every backend implements (libfabric in `rdmalane-efa`, verbs in
//! `rdmalane-verbs`). The reactor is its only caller in the runtime; it owns the transport and
//! calls it from one thread.
use std::sync::Arc;
use std::time::Duration;

use crate::base::error::TransportError;
use crate::base::memory::{DeviceMem, DeviceRegistration};

/// A peer's address in the transport's address vector.
pub type PeerAddr = u64;

/// A lane: one transport endpoint (a libfabric endpoint, a verbs QP) serving one peer, named
/// by the transport that opened it (a small index it may reuse once the lane is closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub usize);

impl std::fmt::Display for LaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl LaneId {
    /// The index, for tables kept per lane.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A rail (a NIC, or a domain on one) by its index among all the rails a runtime spans. A
/// transport serving one rail group numbers its own rails 0, 1, ... (`TransportConfig::rail_ids`
/// maps those to these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub(crate) struct RailId(pub(crate) usize);

/// A set of a runtime's rails (`RailId`s below `MAX_RAILS`): the rails one reactor serves, or
/// those of a peer's whose reactors sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RailSet(pub(crate) u32);

// A rail set is a bit per rail.
const _: () = assert!(crate::base::MAX_RAILS <= u32::BITS as usize);

impl RailSet {
    /// No rail.
    pub(crate) const EMPTY: RailSet = RailSet(0);

    /// The set of `rails` (ids of `MAX_RAILS` or more are left out).
    pub(crate) fn of(rails: impl IntoIterator<Item = RailId>) -> RailSet {
        RailSet(rails.into_iter().filter(|r| r.0 < crate::base::MAX_RAILS).fold(0, |m, r| m | 1 << r.0))
    }

    /// Whether it holds no rail.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The rails in both.
    pub(crate) fn and(self, other: RailSet) -> RailSet {
        RailSet(self.0 & other.0)
    }

    /// The rails in either.
    pub(crate) fn or(self, other: RailSet) -> RailSet {
        RailSet(self.0 | other.0)
    }

    /// The rails of `self` not in `other`.
    pub(crate) fn without(self, other: RailSet) -> RailSet {
        RailSet(self.0 & !other.0)
    }
}

/// Access a memory registration grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Peers may read it with one-sided reads.
    pub remote_read: bool,
    /// Peers may write it with one-sided writes.
    pub remote_write: bool,
}

impl Access {
    /// Local use only: sends, receives, sources and targets of our own one-sided ops.
    pub const LOCAL: Access = Access { remote_read: false, remote_write: false };
    /// Peers may read it.
    pub const READ: Access = Access { remote_read: true, remote_write: false };
    /// Peers may write it.
    pub const WRITE: Access = Access { remote_read: false, remote_write: true };
    /// Peers may read and write it.
    pub const READ_WRITE: Access = Access { remote_read: true, remote_write: true };

    /// True when peers get any access.
    pub fn is_remote(self) -> bool {
        self.remote_read || self.remote_write
    }
}

/// What a transport can do, read once when it opens.
#[derive(Debug, Clone)]
pub struct Caps {
    /// Provider (or device) name, e.g. `tcp;ofi_rxm`, `shm`, `efa`, `rxe0`.
    pub provider: String,
    /// Largest single message or RMA the provider accepts.
    pub max_msg_size: usize,
    /// Largest payload posted inline (copied at post time).
    pub inject_size: usize,
    /// Scatter-gather entries per work request.
    pub iov_limit: usize,
    /// Bytes of immediate data a write or send may carry (0: none).
    pub cq_data_size: usize,
    /// Work requests the transmit queue holds.
    pub tx_depth: usize,
    /// Work requests the receive queue holds.
    pub rx_depth: usize,
    /// Whether the transport can sleep on a file descriptor until completions arrive.
    pub wait_fd: bool,
    /// The provider drops a one-sided op its target refuses (bad key, range or access) without
    /// ever completing it (shm): the runtime asks the target about one-sided ops that stay
    /// silent, and fails those it refused itself.
    pub silent_refusals: bool,
    /// Rails (NICs, domains) the transport spans; lanes are opened on one each.
    pub rails: usize,
    /// The NUMA node of each rail's NIC, where the host has several and sysfs tells.
    pub rail_numa: Vec<Option<usize>>,
    /// How it registers device (GPU) memory, if it can.
    pub device: DeviceRegistration,
}

/// The result of registering memory (on every rail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Transport-local handle, passed back to `deregister`.
    pub id: u64,
    /// The local descriptor to pass with work requests (0 when the provider needs none). With
    /// several rails, a handle the transport resolves to the descriptor of the lane's rail.
    pub desc: usize,
    /// The key a peer uses to reach this region (on rail 0).
    pub key: u64,
    /// The keys on rails 1, 2, ... (empty with one rail).
    pub rail_keys: Vec<u64>,
    /// The remote address of the region's first byte as a peer must name it: the virtual
    /// address where the provider uses virtual addressing, 0 where it uses offsets.
    pub remote_base: u64,
}

/// One piece of local memory in a work request.
#[derive(Debug, Clone, Copy)]
pub struct LocalSeg {
    /// Address of the first byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// The registration's local descriptor.
    pub desc: usize,
}

// SAFETY: a LocalSeg is an address, not a reference; who may touch the memory is governed by the
// op lifecycle (the reactor keeps the owning buffer alive until the completion arrives).
unsafe impl Send for LocalSeg {}

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// Write the local segments to `remote_addr` under `key`; `imm` raises an event at the peer.
    Write {
        /// Remote address (as [`MemoryRegion::remote_base`] defines it).
        remote_addr: u64,
        /// Remote key.
        key: u64,
        /// Immediate data delivered to the peer's completion queue.
        imm: Option<u64>,
    },
    /// Read from `remote_addr` into the local segments.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        key: u64,
    },
    /// Send the local segments as one message.
    Send {
        /// Immediate data delivered with the message.
        imm: Option<u64>,
    },
    /// Receive one message from the peer into the local segments.
    Recv,
}

/// A work request's id, built and read only here. Its low 24 bits name a slot the caller
/// reuses only after that request's completion (a transport may keep per-slot state there);
/// the bits above are a generation that makes each id unique, so that a stale completion (of a
/// request failed when its lane closed) is told from the slot's next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrId(u64);

impl WrId {
    /// Bits of the slot.
    const SLOT_BITS: u32 = 24;
    /// Slots there are.
    pub const SLOTS: usize = 1 << Self::SLOT_BITS;

    /// The id of `slot` (below [`SLOTS`](Self::SLOTS)) in `generation`.
    pub fn new(slot: usize, generation: u64) -> WrId {
        debug_assert!(slot < Self::SLOTS, "slot {slot} out of range");
        WrId((generation << Self::SLOT_BITS) | (slot & (Self::SLOTS - 1)) as u64)
    }

    /// The slot.
    pub fn slot(self) -> usize {
        (self.0 & (Self::SLOTS as u64 - 1)) as usize
    }

    /// The generation.
    pub fn generation(self) -> u64 {
        self.0 >> Self::SLOT_BITS
    }

    /// The id as one word, for a provider's context field.
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// The id a provider gave back from its context field.
    pub fn from_raw(raw: u64) -> WrId {
        WrId(raw)
    }
}

/// One work request for [`Transport::post`].
#[derive(Debug)]
pub struct WorkRequest<'a> {
    /// Returned in the completion.
    pub id: WrId,
    /// The lane to post on.
    pub lane: LaneId,
    /// The peer (as `connect_lane` returned it for this lane).
    pub peer: PeerAddr,
    /// What to do.
    pub kind: WrKind,
    /// Local memory (at most `Caps::iov_limit` segments).
    pub local: &'a [LocalSeg],
    /// More work requests follow at once: the provider may defer ringing the doorbell.
    pub more: bool,
}

/// One completion from [`Transport::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// A posted work request finished.
    Op {
        /// Its id.
        id: WrId,
        /// Bytes moved (received length for receives).
        len: usize,
        /// Immediate data that came with a received message.
        imm: Option<u64>,
        /// Success, or what went wrong (boxed: completions are moved by the batch, and the
        /// rare failure would otherwise make every one of them some 90 bytes).
        status: Result<(), Box<TransportError>>,
    },
    /// A peer's write with immediate data landed in our memory.
    RemoteWrite {
        /// The immediate value.
        imm: u64,
        /// Bytes written, where the provider reports it.
        len: usize,
    },
}

/// What a successful post did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The request is with the NIC; its completion will come from `poll`.
    Queued,
    /// The payload was copied inline and the request is complete already; no completion will
    /// come for it (small sends on providers with inject).
    Completed,
}

/// Why a post did not happen. One word: a post's result comes back in registers (the error is
/// boxed on its rare path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full: reap completions and try again.
    Again,
    /// The provider refused the work request.
    Failed(Box<TransportError>),
}

impl PostError {
    /// The provider refused the work request with `e`.
    pub fn failed(e: TransportError) -> PostError {
        PostError::Failed(Box::new(e))
    }
}

/// Wakes a transport sleeping in [`Transport::wait`], from any thread.
pub trait Notify: Send + Sync {
    /// Make the current or next `wait` return promptly.
    fn notify(&self);
}

/// A backend: devices or a libfabric domain, one endpoint, its completion queue, its peers.
pub trait Transport: Send {
    /// What the transport can do.
    fn caps(&self) -> &Caps;

    /// Open a lane (an endpoint of its own) on `rail` and return it with its address for the
    /// peer.
    fn open_lane(&mut self, rail: usize) -> Result<(LaneId, Vec<u8>), TransportError>;

    /// Point a lane at the peer's lane with address `name`; returns the peer's address to post
    /// to on this lane.
    fn connect_lane(&mut self, lane: LaneId, name: &[u8]) -> Result<PeerAddr, TransportError>;

    /// Close a lane. Once this returns, no request posted on it touches memory again and none
    /// of their completions will come: the caller owns their buffers again.
    fn close_lane(&mut self, lane: LaneId);

    /// Register `len` bytes at `ptr`.
    ///
    /// # Safety
    /// Memory registered with remote access must stay allocated until `deregister(region.id)`
    /// has returned: a peer may reach it until then. Memory registered for local use alone
    /// may be freed once no posted request names it any more, before its deregistration has
    /// run (a dropped `RegisteredBuf` does so: the deregistration is queued to the reactor).
    /// A transport must then neither read nor write the memory on its own (the pages a NIC
    /// pinned stay pinned until the deregistration, whatever the allocator does with them).
    unsafe fn register(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, TransportError>;

    /// Register `len` bytes of device memory at `ptr` (a device address) as `mem` describes,
    /// where [`Caps::device`] says the transport can; the default refuses.
    ///
    /// # Safety
    /// As [`register`](Self::register): the device memory must stay allocated until
    /// `deregister(region.id)` has returned.
    unsafe fn register_device(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        mem: DeviceMem,
    ) -> Result<MemoryRegion, TransportError> {
        let _ = (ptr, len, access);
        Err(TransportError::local(
            &self.caps().provider,
            crate::base::error::FailureClass::Other,
            format!("this transport cannot register {}", mem.memory),
        ))
    }

    /// Release a registration. Peers can no longer reach the memory once this returns `Ok`.
    /// On `Err` the registration may still be live: the reactor then keeps the memory a peer
    /// could reach through it for good (never frees or reuses it).
    fn deregister(&mut self, id: u64) -> Result<(), TransportError>;

    /// Post one work request.
    ///
    /// # Safety
    /// Every segment's memory must stay valid (and, for receives and reads, not be accessed by
    /// anyone else) until `poll` returns the request's completion.
    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError>;

    /// Drive progress and append up to `max` completions to `out`; returns how many. A
    /// backend may skip reading its queues right after a read that found nothing (see
    /// [`TransportConfig::poll_spacing`]): callers poll again, or use
    /// [`poll_now`](Self::poll_now).
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize;

    /// As [`poll`](Self::poll), reading the queues now whatever the spacing: for a drain,
    /// which must see what has already arrived.
    fn poll_now(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.poll(out, max)
    }

    /// Whether peers' one-sided ops on our memory were served since the last call, on a
    /// transport whose progress serves them (shm's checked path): they raise no completion, so
    /// this is how an idle reactor learns it has a peer to keep polling for. False by default.
    fn remote_served(&mut self) -> bool {
        false
    }

    /// The reactor has nothing of its own out and only serves its peers (their one-sided ops
    /// on our memory, messages into posted receives) while `on`: a transport that spaces its
    /// empty completion-queue reads may space them further meanwhile, so that its reads slow
    /// the peers' posts into it less. Nothing by default.
    fn serving(&mut self, _on: bool) {}

    /// Sleep until completions may be ready, a [`Notify`] fires, or `timeout` passes.
    fn wait(&mut self, timeout: Duration);

    /// A handle that interrupts `wait`.
    fn notifier(&self) -> Arc<dyn Notify>;
}

/// Opens transports; a backend crate provides one.
pub trait Backend: Send + Sync {
    /// Open a transport for `config`.
    fn open(&self, config: &TransportConfig) -> crate::base::error::Result<Box<dyn Transport>>;

    /// Whether this backend serves the provider (or device) name `provider`; the builder asks
    /// each backend it was given in turn.
    fn accepts(&self, provider: &str) -> bool {
        let _ = provider;
        true
    }
}

/// What the runtime asks a backend to open.
#[derive(Debug, Clone, Default)]
pub struct TransportConfig {
    /// Provider or device name; `None` lets the backend choose (and log) its preference.
    pub provider: Option<String>,
    /// Local address (node) to bind to, where the provider needs one (tcp).
    pub node: Option<String>,
    /// Open the completion queues without a wait object the reactor could sleep on: for a
    /// driver that never sleeps (the inline one).
    pub no_wait_object: bool,
    /// Go without a wait object where it costs on the busy path (libfabric's FI_WAIT_FD: on
    /// tcp about 1 µs a message); keep one that costs only when armed for a sleep (a verbs
    /// completion channel). For reactor threads told to nap instead (`Builder::cq_wait`).
    pub no_costly_wait_object: bool,
    /// Rails to span (NICs, domains); 0 is taken as 1.
    pub rails: usize,
    /// Per-rail local addresses (tcp: one loopback or NIC address per rail), by the rail's
    /// index on the host. Missing entries are the backend's choice.
    pub rail_nodes: Vec<String>,
    /// The host's rails to open, by index, in order (a rail group: its reactor's share of the
    /// runtime's rails); empty opens rails `0..rails`. The transport's rail `r` is then host
    /// rail `rail_ids[r]`: the backend picks its NIC or address by that index.
    pub rail_ids: Vec<usize>,
    /// Peers on this host are trusted with this process's memory: a provider may let their
    /// one-sided ops skip the target's checks of key, range and access (shm's fast path, about
    /// 4x faster for small ones), so a stale or forged descriptor reaches wherever it points.
    pub trust_local_peers: bool,
    /// Leave at least this long between a completion-queue read that found nothing and the
    /// next read. A reader polling back to back can slow the peer posting to it (shm: both
    /// take the reader's region lock). `None`: the backend's default (libfabric: 80 ns on shm
    /// and tcp, none elsewhere, at most 1 ms; verbs: none).
    pub poll_spacing: Option<Duration>,
    /// Ask the provider for device-memory support (libfabric: FI_HMEM in the hints, falling
    /// back to a provider without it): what [`Caps::device`] then reports.
    pub device_memory: bool,
    /// Take device-memory support even from a provider that completes ops before its copies
    /// land (libfabric's shm and its CUDA IPC path): only where native registration is
    /// demanded (`DevicePolicy::Native`); elsewhere such a provider is not asked for it.
    pub device_early_completion: bool,
}

/// `RDMALANE_POLL_SPACING_NS` (see [`TransportConfig::poll_spacing`]), for a backend opened
/// without a runtime (the raw benchmark engine), parsed as the builder parses it. A value that
/// does not parse is logged and ignored (the builder refuses it).
pub fn poll_spacing_env() -> Option<Duration> {
    from_env("RDMALANE_POLL_SPACING_NS", crate::base::vars::poll_spacing).flatten()
}

/// `RDMALANE_TRUST_LOCAL_PEERS` (see [`TransportConfig::trust_local_peers`]), for a backend
/// opened without a runtime (the raw benchmark engine), parsed as the builder parses it. A
/// value that does not parse is logged and counts as no trust (the builder refuses it).
pub fn trust_local_peers_env() -> bool {
    from_env("RDMALANE_TRUST_LOCAL_PEERS", crate::base::vars::trust_local_peers).flatten().unwrap_or(false)
}

/// Variable `name` through `parse`; `None` (logged) where it does not parse.
fn from_env<T>(name: &str, parse: fn(Option<String>) -> crate::base::error::Result<T>) -> Option<T> {
    let v = std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    parse(v).map_err(|e| tracing::warn!(error = %e, "{name} ignored")).ok()
}
