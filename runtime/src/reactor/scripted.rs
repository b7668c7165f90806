//! A scripted in-memory transport, for deterministic tests of the reactor. It touches no
//! memory: it records each work request, answers each post as the test told it to (queued by
//! default; completed at once, queue full, or refused), and completes what the test says, in
//! any order and with any status. The test keeps a [`Script`] to steer it while the reactor
//! owns the transport.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::base::error::{FailureClass, TransportError};
use crate::base::transport::WrId;
use crate::base::transport::{
    Access, Caps, Completion, LaneId, MemoryRegion, Notify, PeerAddr, PostError, Posted, Transport,
    WorkRequest, WrKind,
};

/// A work request as the transport saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wr {
    pub id: WrId,
    pub lane: LaneId,
    pub kind: WrKind,
    /// Bytes over all its segments.
    pub len: usize,
    /// The first segment's address.
    pub addr: usize,
    pub more: bool,
}

/// How the transport answers one post.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// In flight; completed when the test says.
    Queued,
    /// Done as posted (an inject): no completion comes.
    Completed,
    /// The queue is full.
    Again,
    /// The provider refuses it.
    Fail(TransportError),
}

#[derive(Default)]
struct State {
    /// Answers for the next posts, in order; `Queued` once they run out.
    answers: VecDeque<Answer>,
    /// Every work request posted, in order (whatever it was answered).
    posted: Vec<Wr>,
    /// Queued and not completed.
    pending: Vec<Wr>,
    /// Completions the next poll returns.
    ready: VecDeque<Completion>,
    lanes: usize,
    closed: Vec<LaneId>,
    regions: u64,
    deregistered: Vec<u64>,
    /// Deregistrations fail (the registration stays live as far as the reactor can tell).
    deregister_fails: bool,
    /// What the reactor said of serving (`Transport::serving`), in order.
    serving: Vec<bool>,
}

/// The test's hold on a [`Scripted`] transport.
#[derive(Clone, Default)]
pub(crate) struct Script(Arc<Mutex<State>>);

impl Script {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The transport, with the given largest message. `wait_fd: false` makes it a provider
    /// that cannot wake a sleeping reactor for its peers' ops (as shm): its reactor announces
    /// its naps.
    pub fn transport(&self, max_msg_size: usize, wait_fd: bool) -> Box<dyn Transport> {
        let caps = Caps {
            provider: "scripted".into(),
            max_msg_size,
            inject_size: 64,
            iov_limit: 4,
            cq_data_size: 8,
            tx_depth: 1024,
            rx_depth: 1024,
            wait_fd,
            silent_refusals: false,
            rails: 1,
            rail_numa: vec![None],
            device: crate::base::memory::DeviceRegistration::None,
        };
        Box::new(Scripted { caps, script: self.clone() })
    }

    /// Answer the next posts so, in order.
    pub fn answer(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state().answers.extend(answers);
    }

    /// What the reactor said of serving its peers only, in order.
    pub fn serving(&self) -> Vec<bool> {
        self.state().serving.clone()
    }

    /// Every work request posted so far.
    pub fn posted(&self) -> Vec<Wr> {
        self.state().posted.clone()
    }

    /// Work requests in flight.
    pub fn pending(&self) -> Vec<Wr> {
        self.state().pending.clone()
    }

    /// Complete the pending request `id`, successfully or not; `len` for a receive.
    pub fn complete(&self, id: WrId, status: Result<(), TransportError>) {
        self.complete_with(id, None, None, status);
    }

    /// As `complete`, with a received length and immediate value.
    pub fn complete_with(
        &self,
        id: WrId,
        len: Option<usize>,
        imm: Option<u64>,
        status: Result<(), TransportError>,
    ) {
        let mut s = self.state();
        let i = s.pending.iter().position(|w| w.id == id).expect("a pending work request");
        let wr = s.pending.remove(i);
        s.ready.push_back(Completion::Op {
            id,
            len: len.unwrap_or(wr.len),
            imm,
            status: status.map_err(Box::new),
        });
    }

    /// Complete every pending request successfully, newest first.
    pub fn complete_all_reversed(&self) -> usize {
        let ids: Vec<WrId> = self.pending().iter().rev().map(|w| w.id).collect();
        ids.iter().for_each(|&id| self.complete(id, Ok(())));
        ids.len()
    }

    /// Lanes closed so far.
    pub fn closed(&self) -> Vec<LaneId> {
        self.state().closed.clone()
    }

    /// Make every deregistration from now on fail.
    pub fn fail_deregistrations(&self) {
        self.state().deregister_fails = true;
    }

    /// Every region deregistered so far, in order (failed attempts too).
    pub fn deregistered(&self) -> Vec<u64> {
        self.state().deregistered.clone()
    }
}

/// A failure as a provider would report it.
pub(crate) fn failure(class: FailureClass, text: &str) -> TransportError {
    TransportError { provider: "scripted".into(), errno: 5, text: text.into(), class }
}

/// The transport a [`Script`] steers.
struct Scripted {
    caps: Caps,
    script: Script,
}

struct Quiet;
impl Notify for Quiet {
    fn notify(&self) {}
}

impl Transport for Scripted {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn open_lane(&mut self, _rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        let mut s = self.script.state();
        s.lanes += 1;
        Ok((LaneId(s.lanes - 1), format!("lane{}", s.lanes - 1).into_bytes()))
    }

    fn connect_lane(&mut self, lane: LaneId, _name: &[u8]) -> Result<PeerAddr, TransportError> {
        Ok(100 + lane.index() as PeerAddr)
    }

    fn close_lane(&mut self, lane: LaneId) {
        let mut s = self.script.state();
        s.closed.push(lane);
        // The contract: once closed, none of the lane's requests completes.
        let gone: Vec<WrId> = s.pending.iter().filter(|w| w.lane == lane).map(|w| w.id).collect();
        s.pending.retain(|w| w.lane != lane);
        s.ready.retain(|c| !matches!(c, Completion::Op { id, .. } if gone.contains(id)));
    }

    unsafe fn register(
        &mut self,
        ptr: *mut u8,
        _len: usize,
        _access: Access,
    ) -> Result<MemoryRegion, TransportError> {
        let mut s = self.script.state();
        s.regions += 1;
        let id = s.regions;
        Ok(MemoryRegion {
            id,
            desc: id as usize,
            key: 1000 + id,
            rail_keys: Vec::new(),
            remote_base: ptr as u64,
        })
    }

    fn serving(&mut self, on: bool) {
        self.script.state().serving.push(on);
    }

    fn deregister(&mut self, id: u64) -> Result<(), TransportError> {
        let mut s = self.script.state();
        s.deregistered.push(id);
        if s.deregister_fails {
            return Err(failure(FailureClass::Other, "deregister: the provider refuses"));
        }
        Ok(())
    }

    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
        let mut s = self.script.state();
        let rec = Wr {
            id: wr.id,
            lane: wr.lane,
            kind: wr.kind,
            len: wr.local.iter().map(|l| l.len).sum(),
            addr: wr.local.first().map_or(0, |l| l.ptr as usize),
            more: wr.more,
        };
        s.posted.push(rec.clone());
        match s.answers.pop_front().unwrap_or(Answer::Queued) {
            Answer::Queued => {
                s.pending.push(rec);
                Ok(Posted::Queued)
            }
            Answer::Completed => Ok(Posted::Completed),
            Answer::Again => Err(PostError::Again),
            Answer::Fail(e) => Err(PostError::failed(e)),
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut s = self.script.state();
        let n = s.ready.len().min(max);
        out.extend(s.ready.drain(..n));
        n
    }

    fn wait(&mut self, _timeout: Duration) {}

    fn notifier(&self) -> Arc<dyn Notify> {
        Arc::new(Quiet)
    }
}
