//! A reactor over a transport with nothing behind it, for unit tests of the reactor's
//! bookkeeping (the audit, the rendezvous), which needs no real transport.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{Peer, Reactor};
use crate::control::Ctl;
use crate::error::{Error, FailureClass, OpKind, TransportError};
use crate::transport::{
    Access, Caps, Completion, LaneId, MemoryRegion, Notify, PeerAddr, PostError, Posted, Transport,
    WorkRequest,
};

fn no(text: &str) -> TransportError {
    TransportError { provider: "nothing".into(), errno: 0, text: text.into(), class: FailureClass::Other }
}

struct Nothing(Caps);
struct Quiet;
impl Notify for Quiet {
    fn notify(&self) {}
}
impl Transport for Nothing {
    fn caps(&self) -> &Caps {
        &self.0
    }
    fn open_lane(&mut self, _: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        Err(no("no lanes"))
    }
    fn connect_lane(&mut self, _: LaneId, _: &[u8]) -> Result<PeerAddr, TransportError> {
        Err(no("no lanes"))
    }
    fn close_lane(&mut self, _: LaneId) {}
    unsafe fn register(&mut self, _: *mut u8, _: usize, _: Access) -> Result<MemoryRegion, TransportError> {
        Err(no("no memory"))
    }
    fn deregister(&mut self, _: u64) -> Result<(), TransportError> {
        Ok(())
    }
    unsafe fn post(&mut self, _: &WorkRequest<'_>) -> Result<Posted, PostError> {
        Err(PostError::Again)
    }
    fn poll(&mut self, _: &mut Vec<Completion>, _: usize) -> usize {
        0
    }
    fn wait(&mut self, _: Duration) {}
    fn notifier(&self) -> Arc<dyn Notify> {
        Arc::new(Quiet)
    }
}

/// A reactor whose transport refuses everything.
pub(super) fn reactor() -> Reactor {
    let caps = Caps {
        provider: "nothing".into(),
        max_msg_size: 1 << 20,
        inject_size: 0,
        iov_limit: 1,
        cq_data_size: 0,
        tx_depth: 16,
        rx_depth: 16,
        wait_fd: false,
        silent_refusals: false,
        rails: 1,
        rail_numa: vec![None],
    };
    let (_tx, rx) = std::sync::mpsc::channel();
    Reactor::new(
        Box::new(Nothing(caps)),
        rx,
        Default::default(),
        Default::default(),
        Default::default(),
        Default::default(),
    )
}

/// A peer with no lanes; what the reactor tells it arrives on the receiver.
pub(super) fn peer(r: &mut Reactor) -> (usize, UnboundedReceiver<Ctl>) {
    let (ctl, rx) = unbounded_channel();
    let now = Instant::now();
    let p = Peer {
        id: 7,
        label: "peer".into(),
        lanes: Vec::new(),
        lane_ids: Arc::from(Vec::new()),
        rails: 1,
        msg_lane: Arc::from(Vec::new()),
        bulk_lanes: Arc::from(Vec::new()),
        lost: None,
        inflight: 0,
        ctl,
        checks: (now, 0),
        refused: (now, 0),
        asked: (now, 0),
        asleep: false,
        announced: false,
    };
    (r.peers.insert(p), rx)
}

/// A write the provider cancelled.
pub(super) fn cancelled() -> Error {
    Error::Transport {
        op: OpKind::Write,
        peer: "peer".into(),
        source: TransportError {
            provider: "nothing".into(),
            errno: 125,
            text: "Operation canceled".into(),
            class: FailureClass::Cancelled,
        },
    }
}
