//! The reactor over the scripted transport: every post and completion is the test's to order,
//! time is passed in, and nothing sleeps. The real-provider suites prove the same paths on
//! tcp, shm and verbs; these pin down the orders a provider rarely produces.
use crate::reactor::cmd::{PeerLink, PeerSlot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::scripted::{failure, Answer, Script};
use super::{Cmd, OpReq, Phase, Reactor};
use crate::base::control::{Ctl, Pulled, Verdict};
use crate::base::control_outbox::{outbox, OutboxRx};
use crate::base::error::{Error, FailureClass, OpKind};
use crate::base::lane_map::LaneMap;
use crate::base::sched::SchedConfig;
use crate::base::stats::Counters;
use crate::base::transport::{LaneId, LocalSeg, RailId, RailSet, WrKind};
use crate::reactor::cell::OpCell;

/// A reactor with one peer, over a scripted transport (the drivers' tests drive it too).
pub(crate) struct Rig {
    pub r: Reactor,
    pub script: Script,
    counters: Arc<Counters>,
    slot: PeerSlot,
    link: PeerLink,
    pub told: OutboxRx,
    now: Instant,
    /// The memory ops name (the scripted transport never touches it).
    pub mem: Vec<u8>,
    pub tx: mpsc::Sender<Cmd>,
    pub idle: Arc<super::Idle>,
}

/// Chunks of 4 KiB, up to `per_round` bulk chunks posted per turn.
pub(crate) fn split_config(per_round: usize) -> SchedConfig {
    SchedConfig {
        chunk_size: 4096,
        idle_after_chunks: 0,
        bulk_per_round: per_round,
        post_batch: per_round.max(1),
        ..SchedConfig::default()
    }
}

pub(crate) fn rig(sched: SchedConfig, lanes: usize) -> Rig {
    rig_with(sched, lanes, 1 << 20)
}

fn rig_with(sched: SchedConfig, lanes: usize, max_msg_size: usize) -> Rig {
    rig_mapped(sched, lanes, max_msg_size, LaneMap::SINGLE, true)
}

/// A rig whose peer's rails are as `map` says (its lanes reach them as `map.rail_of` places).
/// `wait_fd: false`: its transport cannot wake it for the peer's ops (as shm).
fn rig_mapped(sched: SchedConfig, lanes: usize, max_msg_size: usize, map: LaneMap, wait_fd: bool) -> Rig {
    let script = Script::default();
    let (tx, rx) = mpsc::channel();
    let counters = Arc::new(Counters::default());
    let idle = Arc::new(super::Idle::default());
    let mut sched = sched;
    sched.max_message = max_msg_size;
    let mut r = Reactor::new(
        script.transport(max_msg_size, wait_fd),
        rx,
        Default::default(),
        counters.clone(),
        idle.clone(),
        sched,
    );
    let (slot, link, told) = add_peer(&mut r, lanes, map);
    Rig { r, script, counters, slot, link, told, now: Instant::now(), mem: vec![0; 1 << 20], tx, idle }
}

/// Open `lanes` lanes on rail 0 and add peer 7 over them as a connection of its own: its slot,
/// its link, and what the reactor tells it.
fn add_peer(r: &mut Reactor, lanes: usize, map: LaneMap) -> (PeerSlot, PeerLink, OutboxRx) {
    let (reply, got) = mpsc::sync_channel(1);
    r.handle(Cmd::OpenLanes { rails: vec![0; lanes], reply });
    let opened = got.recv().expect("a reply").expect("lanes");
    let mine = opened
        .into_iter()
        .enumerate()
        .map(|(place, o)| super::cmd::PeerLane { lane: o.lane, peer_name: o.name, place })
        .collect();
    let (ctl, told) = outbox();
    let (reply, got) = mpsc::sync_channel(1);
    let link = PeerLink::fresh();
    r.handle(Cmd::AddPeer { id: 7, link, lanes: mine, map, label: "peer".into(), ctl, reply });
    (got.recv().expect("a reply").expect("a peer"), link, told)
}

impl Rig {
    /// Submit an op over the first `len` bytes of the rig's memory.
    fn submit(&mut self, op: OpKind, kind: WrKind, len: usize) -> Arc<OpCell> {
        self.submit_at(op, kind, 0, len)
    }

    fn submit_at(&mut self, op: OpKind, kind: WrKind, offset: usize, len: usize) -> Arc<OpCell> {
        let (req, cell) = self.req(op, kind, offset, len);
        self.r.submit_now(req);
        cell
    }

    /// An op over `len` bytes at `offset` of the rig's memory, and its cell.
    pub(crate) fn req(
        &mut self,
        op: OpKind,
        kind: WrKind,
        offset: usize,
        len: usize,
    ) -> (OpReq, Arc<OpCell>) {
        let cell = OpCell::new();
        let ptr = self.mem[offset..].as_mut_ptr();
        let req = OpReq {
            peer: self.slot,
            peer_id: 7,
            op,
            kind,
            seg: LocalSeg { ptr, len, desc: 1 },
            cell: cell.clone(),
            tenant: 0,
            class: None,
            batch: None,
            rail_keys: None,
            slots: None,
            device: false,
        };
        (req, cell)
    }

    pub(crate) fn write(&mut self, len: usize) -> Arc<OpCell> {
        self.submit(OpKind::Write, WrKind::Write { remote_addr: 1 << 40, key: 9, imm: None }, len)
    }

    /// Turns, a millisecond of virtual time apart.
    fn turns(&mut self, n: usize) {
        for _ in 0..n {
            self.now += Duration::from_millis(1);
            self.r.turn_at(self.now);
        }
    }

    fn count(&self, c: fn(&Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
        c(&self.counters).load(Ordering::Relaxed)
    }

    /// Everything the reactor told the peer so far.
    fn told(&mut self) -> Vec<Ctl> {
        std::iter::from_fn(|| self.told.try_recv()).collect()
    }
}

/// A buffer that says when it is freed: the stand-in for a dropped future's buffer.
struct Tracked(Arc<AtomicBool>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Drop the op's future the way `Op`'s drop does: the buffer moves into the cell.
fn drop_future(cell: Arc<OpCell>) -> Arc<AtomicBool> {
    let freed = Arc::new(AtomicBool::new(false));
    cell.orphan(Box::new(Tracked(freed.clone())));
    cell.abandon();
    drop(cell);
    freed
}

#[test]
fn a_split_write_completes_once_every_chunk_is_in_whatever_their_order() {
    let mut g = rig(split_config(8), 1);
    let cell = g.write(16 << 10);
    g.turns(2);
    let posted = g.script.posted();
    assert_eq!(posted.len(), 4, "16 KiB in 4 KiB chunks");
    let base = g.mem.as_ptr() as usize;
    for (i, wr) in posted.iter().enumerate() {
        assert_eq!(wr.len, 4096);
        assert_eq!(wr.addr, base + i * 4096, "chunk {i}'s local memory");
        assert_eq!(wr.kind, WrKind::Write { remote_addr: (1 << 40) + i as u64 * 4096, key: 9, imm: None });
    }
    assert_eq!(posted.iter().filter(|w| w.more).count(), 3, "one doorbell for the lot");
    for (n, wr) in posted.iter().rev().enumerate() {
        assert!(cell.outcome().is_none(), "{n} of 4 chunks are in");
        g.script.complete(wr.id, Ok(()));
        g.turns(1);
    }
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 16 << 10));
    assert_eq!((g.count(|c| &c.completed), g.count(|c| &c.posted)), (1, 4));
    assert!(!g.r.busy());
}

#[test]
fn a_future_dropped_between_chunks_keeps_its_buffer_until_its_last_posted_chunk_is_in() {
    let mut g = rig(split_config(2), 1);
    let cell = g.write(16 << 10);
    let first = g.script.pending();
    assert_eq!(first.len(), 2, "two chunks a round, the first as it is submitted");
    let freed = drop_future(cell);
    g.turns(3);
    assert_eq!(g.script.posted().len(), 2, "the rest is withdrawn, never posted");
    g.script.complete(first[1].id, Ok(()));
    g.turns(1);
    assert!(!freed.load(Ordering::SeqCst), "a chunk is still with the NIC");
    g.script.complete(first[0].id, Ok(()));
    g.turns(1);
    assert!(freed.load(Ordering::SeqCst), "the buffer goes with the last completion");
    assert_eq!((g.count(|c| &c.withdrawn), g.count(|c| &c.completed), g.count(|c| &c.failed)), (1, 0, 0));
    assert!(!g.r.busy() && g.r.sched.is_empty());
}

/// da7a435: a chunk handed out with others of its op, the op ended by an earlier chunk's
/// failure, and the provider then answering the chunk "queue full". Given back, it was the
/// op's last chunk out: the op must end there (it sat in the scheduler for ever before).
#[test]
fn a_chunk_refused_for_a_full_queue_after_its_op_failed_ends_the_op() {
    let mut g = rig(split_config(2), 1);
    g.script.answer([Answer::Fail(failure(FailureClass::Other, "refused")), Answer::Again]);
    let cell = g.write(8 << 10);
    g.turns(1);
    match cell.outcome() {
        Some(Err(Error::Transport { source, .. })) => assert_eq!(source.text, "refused"),
        other => panic!("the op should fail with the refusal, got {other:?}"),
    }
    assert!(g.r.sched.is_empty() && !g.r.busy(), "nothing of the op is left");
    g.turns(3);
    assert_eq!(g.script.posted().len(), 2, "the refused chunk is not posted again");
}

#[test]
fn a_chunk_refused_for_a_full_queue_goes_first_next_turn_and_is_withdrawn_if_the_future_goes() {
    let mut g = rig(split_config(1), 1);
    g.script.answer([Answer::Queued, Answer::Again]);
    let cell = g.write(12 << 10);
    g.turns(1);
    let posted = g.script.posted();
    assert_eq!(posted.len(), 2);
    assert_eq!(posted[1].addr, posted[0].addr + 4096, "the refused chunk is the second");
    g.turns(1);
    let again = &g.script.posted()[2];
    assert_eq!(again.addr, posted[1].addr, "tried again before the third chunk");
    let pending = g.script.pending();
    let freed = drop_future(cell);
    g.turns(3);
    assert_eq!(g.script.posted().len(), 3, "the third chunk is withdrawn");
    for wr in pending {
        g.script.complete(wr.id, Ok(()));
    }
    g.turns(1);
    assert!(freed.load(Ordering::SeqCst));
    assert_eq!(g.count(|c| &c.withdrawn), 1);
}

#[test]
fn ops_complete_in_the_order_their_completions_come_not_the_order_they_were_posted() {
    let mut g = rig(SchedConfig::default(), 1);
    let send = |g: &mut Rig, off| g.submit_at(OpKind::Send, WrKind::Send { imm: None }, off, 16);
    let (a, b, c) = (send(&mut g, 0), send(&mut g, 64), send(&mut g, 128));
    let p = g.script.pending();
    assert_eq!(p.len(), 3, "small sends go straight to the provider");
    g.script.complete(p[2].id, Ok(()));
    g.script.complete(p[0].id, Err(failure(FailureClass::Other, "first failed")));
    g.turns(1);
    assert!(matches!(c.outcome(), Some(Ok(d)) if d.len == 16));
    assert!(matches!(a.outcome(), Some(Err(Error::Transport { .. }))));
    assert!(b.outcome().is_none());
    g.script.complete(p[1].id, Ok(()));
    g.turns(1);
    assert!(b.outcome().is_some_and(|r| r.is_ok()));
    assert_eq!((g.count(|c| &c.completed), g.count(|c| &c.failed)), (2, 1));
}

#[test]
fn a_send_the_provider_copies_as_it_posts_completes_with_no_completion() {
    let mut g = rig(SchedConfig::default(), 1);
    g.script.answer([Answer::Completed]);
    let cell = g.submit(OpKind::Send, WrKind::Send { imm: None }, 16);
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 16));
    assert!(g.script.pending().is_empty() && !g.r.busy());
}

#[test]
fn a_stale_completion_of_a_reused_slot_is_ignored() {
    let mut g = rig(SchedConfig::default(), 1);
    let first = g.submit(OpKind::Send, WrKind::Send { imm: None }, 16);
    let id = g.script.pending()[0].id;
    g.script.complete(id, Ok(()));
    g.turns(1);
    assert!(first.outcome().is_some());
    let second = g.submit(OpKind::Send, WrKind::Send { imm: None }, 16);
    let next = g.script.pending()[0].id;
    assert_ne!(next, id, "a reused slot gets a new id");
    assert_eq!(next.slot(), id.slot());
    // A duplicate of the old completion (a provider bug, a lane closed late): ignored.
    g.r.on_completion(id, 16, None, Ok(()));
    assert!(second.outcome().is_none(), "the old id does not complete the new op");
}

#[test]
fn a_lost_peer_fails_what_is_queued_and_posted_and_frees_buffers_once_its_lanes_are_closed() {
    let mut g = rig(split_config(1), 2);
    let recv = g.submit(OpKind::Recv, WrKind::Recv, 64);
    let bulk = g.write(64 << 10);
    g.turns(1);
    let in_flight = g.script.pending().len();
    assert!(in_flight >= 2, "a receive and a chunk are posted, {in_flight}");
    let dropped = g.write(16 << 10);
    g.turns(1);
    let freed = drop_future(dropped);
    g.r.handle(Cmd::PeerLost { slot: g.slot, link: g.link, reason: "heartbeats stopped".into() });
    let lost = |c: &Arc<OpCell>| match c.outcome() {
        Some(Err(Error::PeerLost { reason, .. })) => reason.contains("heartbeats stopped"),
        _ => false,
    };
    assert!(lost(&recv), "the posted receive fails as the peer's loss");
    assert!(lost(&bulk), "the split write, with chunks posted and queued, too");
    assert_eq!(g.script.closed().len(), 2, "both lanes closed");
    assert!(g.script.pending().is_empty());
    assert!(freed.load(Ordering::SeqCst), "closed lanes give the buffers back");
    let late = g.write(16);
    assert!(lost(&late), "a new op fails at once");
    assert!(!g.r.busy() && g.r.sched.is_empty());
}

/// A removed peer's slot goes to the next peer added. Its control connection's task may still
/// report the old connection's loss (it was finishing a read as the endpoint went), or hand on
/// a message it read: they name the old link, and the new peer in the slot stays live.
#[test]
fn what_comes_late_about_a_removed_peer_leaves_the_next_in_its_slot_alone() {
    let mut g = rig(split_config(1), 1);
    let old = g.link;
    g.r.handle(Cmd::RemovePeer { slot: g.slot, link: old });
    let (slot, new, _told) = add_peer(&mut g.r, 1, LaneMap::SINGLE);
    assert_eq!(slot, g.slot, "the freed slot is reused");
    g.r.handle(Cmd::PeerLost { slot, link: old, reason: "control connection closed".into() });
    g.r.on_control(slot, old, Ctl::Kick { rails: RailSet::of([RailId(0)]) });
    g.r.handle(Cmd::RemovePeer { slot, link: old });
    assert!(g.r.peers.get(slot).is_some_and(|p| p.link == new && p.lost().is_none()), "the new peer is live");
    let closed = g.script.closed().len();
    let cell = g.write(16);
    let posted = g.script.pending();
    assert_eq!(posted.len(), 1, "its op is posted");
    g.script.complete(posted[0].id, Ok(()));
    g.turns(1);
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 16), "and completes");
    assert_eq!(g.script.closed().len(), closed, "no lane of the new peer closed");
    // Its own loss, named by its link, still counts.
    g.r.handle(Cmd::PeerLost { slot, link: new, reason: "control connection closed".into() });
    assert!(g.r.peers.get(slot).is_some_and(|p| p.lost().is_some()), "the new peer's own loss counts");
}

#[test]
fn shutdown_fails_what_is_queued_at_once_and_what_is_posted_at_its_deadline() {
    let mut g = rig(split_config(1), 1);
    let recv = g.submit(OpKind::Recv, WrKind::Recv, 64);
    let done_in_time = g.submit_at(OpKind::Send, WrKind::Send { imm: None }, 64, 16);
    let late = g.submit_at(OpKind::Send, WrKind::Send { imm: None }, 128, 16);
    let bulk = g.write(64 << 10);
    g.turns(1);
    // An op still in the submission queue.
    let (req, queued) = g.req(OpKind::Send, WrKind::Send { imm: None }, 0, 16);
    g.tx.send(Cmd::Op(req)).expect("the reactor's queue");
    let start = g.now;
    g.r.begin_shutdown(start + Duration::from_secs(2));
    assert!(matches!(queued.outcome(), Some(Err(Error::Shutdown { op: OpKind::Send }))));
    assert!(done_in_time.outcome().is_none() && late.outcome().is_none() && bulk.outcome().is_none());
    let send_id = g.script.pending().iter().find(|w| w.addr == g.mem.as_ptr() as usize + 64).unwrap().id;
    g.script.complete(send_id, Ok(()));
    assert!(!g.r.shutdown_step(start + Duration::from_millis(1)));
    assert!(done_in_time.outcome().is_some_and(|r| r.is_ok()), "drained before the deadline");
    assert!(matches!(g.r.phase, Phase::Draining { .. }), "a send is still posted");
    assert!(!g.r.shutdown_step(start + Duration::from_secs(2)), "the deadline passes");
    assert!(g.r.shutdown_step(start + Duration::from_secs(2)));
    assert!(matches!(late.outcome(), Some(Err(Error::Shutdown { op: OpKind::Send }))));
    assert!(matches!(bulk.outcome(), Some(Err(Error::Shutdown { op: OpKind::Write }))));
    assert!(matches!(recv.outcome(), Some(Err(Error::Shutdown { op: OpKind::Recv }))));
    assert_eq!(g.script.closed(), vec![LaneId(0)]);
    assert!(g.told().iter().any(|m| matches!(m, Ctl::Goodbye { .. })), "the peer is told");
    let after = g.write(16);
    g.turns(1);
    assert!(after.outcome().is_some_and(|r| r.is_err()), "nothing starts after a shutdown");
}

#[test]
fn a_send_above_the_largest_message_goes_by_rendezvous_and_completes_once_the_peer_read_it() {
    let mut g = rig_with(SchedConfig::default(), 1, 64 << 10);
    let cell = g.submit(OpKind::Send, WrKind::Send { imm: None }, 256 << 10);
    g.turns(1);
    let told = g.told();
    let Some(Ctl::Offer { token, desc }) = told.first().cloned() else {
        panic!("the message should be offered, told {told:?}");
    };
    assert_eq!(desc.len(), 256 << 10);
    let marker = g.script.pending();
    assert_eq!(marker.len(), 1);
    assert_eq!(marker[0].kind, WrKind::Send { imm: Some(token as u64) }, "an empty marker");
    assert_eq!(marker[0].len, 0);
    g.script.complete(marker[0].id, Ok(()));
    g.turns(1);
    assert!(cell.outcome().is_none(), "the peer has not read it yet");
    g.r.on_control(g.slot, g.link, Ctl::Done { token, outcome: Pulled::Whole });
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 256 << 10));
    assert_eq!(g.script.deregistered().len(), 1, "the offered buffer is no longer exposed");
}

#[test]
fn a_shutdown_gives_a_send_the_peer_is_reading_its_time_to_finish() {
    // A 256 KiB send on a rig whose messages end at 64 KiB: offered, its marker posted.
    let offered = || {
        let mut g = rig_with(SchedConfig::default(), 1, 64 << 10);
        let cell = g.submit(OpKind::Send, WrKind::Send { imm: None }, 256 << 10);
        g.turns(1);
        let Some(Ctl::Offer { token, .. }) = g.told().first().cloned() else { panic!("offered") };
        let marker = g.script.pending()[0].id;
        (g, cell, token, marker)
    };
    let (mut g, cell, token, marker) = offered();
    g.script.complete(marker, Ok(()));
    g.turns(1);
    let start = g.now;
    g.r.begin_shutdown(start + Duration::from_secs(2));
    assert!(!g.r.shutdown_step(start + Duration::from_millis(1)));
    assert!(matches!(g.r.phase, Phase::Draining { .. }), "the peer is still reading the send");
    assert!(cell.outcome().is_none() && g.script.closed().is_empty());
    g.r.on_control(g.slot, g.link, Ctl::Done { token, outcome: Pulled::Whole });
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 256 << 10), "read whole, it succeeds");
    assert!(!g.r.shutdown_step(start + Duration::from_millis(2)), "drained");
    assert!(g.r.shutdown_step(start + Duration::from_millis(3)));
    assert_eq!(g.script.closed(), vec![LaneId(0)]);
    // The same with the marker itself still out as the stop begins (on verbs it waits for the
    // peer's receive): it is posted, so it too gets the deadline, and the send succeeds.
    let (mut g, cell, token, marker) = offered();
    let start = g.now;
    g.r.begin_shutdown(start + Duration::from_secs(2));
    assert!(!g.r.shutdown_step(start + Duration::from_millis(1)));
    g.script.complete(marker, Ok(()));
    assert!(!g.r.shutdown_step(start + Duration::from_millis(2)));
    assert!(cell.outcome().is_none(), "the marker is in, the peer reads");
    g.r.on_control(g.slot, g.link, Ctl::Done { token, outcome: Pulled::Whole });
    assert!(matches!(cell.outcome(), Some(Ok(d)) if d.len == 256 << 10), "read whole, it succeeds");
    // A send the peer never finishes reading fails with the shutdown at its deadline.
    let (mut g, cell, _, marker) = offered();
    g.script.complete(marker, Ok(()));
    g.turns(1);
    let start = g.now;
    g.r.begin_shutdown(start + Duration::from_secs(2));
    assert!(!g.r.shutdown_step(start + Duration::from_secs(1)));
    assert!(cell.outcome().is_none(), "still within the deadline");
    assert!(!g.r.shutdown_step(start + Duration::from_secs(2)), "the deadline passes");
    assert!(g.r.shutdown_step(start + Duration::from_secs(2)));
    assert!(matches!(cell.outcome(), Some(Err(Error::Shutdown { op: OpKind::Send }))));
}

#[test]
fn large_sends_past_what_the_peer_accepts_are_held_back_with_a_typed_error() {
    use super::rendezvous::MAX_OFFERS;
    let mut g = rig_with(SchedConfig::default(), 1, 64 << 10);
    let send = |g: &mut Rig| g.submit(OpKind::Send, WrKind::Send { imm: None }, 128 << 10);
    // The peer posts no receives: every marker waits there, and every offer counts.
    let first = send(&mut g);
    for _ in 1..MAX_OFFERS {
        send(&mut g);
    }
    g.turns(1);
    let over = send(&mut g);
    match over.outcome() {
        Some(Err(Error::Backpressure { op: OpKind::Send, reason, .. })) => {
            assert!(reason.contains("4096"), "{reason}")
        }
        other => panic!("one offer more would have the peer drop us, got {other:?}"),
    }
    let offers = g.told();
    assert_eq!(offers.len(), MAX_OFFERS, "the held-back send is not offered");
    assert!(first.outcome().is_none(), "the others stand");
    // Once one is read, the next goes.
    let Some(Ctl::Offer { token, .. }) = offers.first().cloned() else { panic!("an offer") };
    let marker = g.script.pending().into_iter().find(|w| w.kind == WrKind::Send { imm: Some(token as u64) });
    g.script.complete(marker.expect("its marker").id, Ok(()));
    g.turns(1);
    g.r.on_control(g.slot, g.link, Ctl::Done { token, outcome: Pulled::Whole });
    assert!(first.outcome().is_some_and(|r| r.is_ok()));
    let next = send(&mut g);
    g.turns(1);
    assert!(next.outcome().is_none(), "offered");
    assert!(matches!(g.told().as_slice(), [Ctl::Offer { .. }]));
}

#[test]
fn a_receive_that_gets_a_marker_reads_the_offered_message_and_answers_the_sender() {
    let mut g = rig_with(split_config(8), 1, 64 << 10);
    let recv = g.submit(OpKind::Recv, WrKind::Recv, 256 << 10);
    let posted = g.script.pending();
    assert_eq!(posted[0].len, 64 << 10, "a receive posts what the provider takes");
    let desc = crate::base::remote::RemoteBuf::new(
        0,
        0x5000,
        128 << 10,
        &[44],
        crate::base::transport::Access::READ,
    );
    g.r.on_control(g.slot, g.link, Ctl::Offer { token: 3, desc });
    g.script.complete_with(posted[0].id, Some(0), Some(3), Ok(()));
    let mut reads = 0;
    for _ in 0..64 {
        g.turns(1);
        let pending = g.script.pending();
        assert!(pending.iter().all(|w| matches!(w.kind, WrKind::Read { key: 44, .. })));
        reads += g.script.complete_all_reversed();
    }
    assert_eq!(reads, 32, "128 KiB read in 4 KiB chunks");
    assert!(matches!(recv.outcome(), Some(Ok(d)) if d.len == 128 << 10));
    assert_eq!(g.told(), vec![Ctl::Done { token: 3, outcome: Pulled::Whole }]);
}

#[test]
fn a_cancelled_write_is_asked_about_and_fails_as_a_refusal_when_its_target_says_so() {
    let mut g = rig(SchedConfig::default(), 1);
    let cell = g.write(64);
    let wr = g.script.pending()[0].clone();
    g.script.complete(wr.id, Err(failure(FailureClass::Cancelled, "Operation canceled")));
    g.turns(1);
    let told = g.told();
    let Some(Ctl::Check { token, key: 9, write: true, len: 64, .. }) = told.first().cloned() else {
        panic!("the target should be asked, told {told:?}");
    };
    assert!(cell.outcome().is_none(), "the op waits for the verdict");
    g.r.on_control(g.slot, g.link, Ctl::Verdict { token, verdict: Verdict::NotPermitted });
    assert!(
        matches!(cell.outcome(), Some(Err(Error::RemoteAccess { op: OpKind::Write, .. }))),
        "the refusal ends the op as one"
    );
}

#[test]
fn a_question_nobody_answers_ends_its_op_after_the_reactors_patience_in_virtual_time() {
    let mut g = rig(SchedConfig::default(), 1);
    g.r.set_peer_timeout(Duration::from_secs(3));
    let cell = g.write(64);
    let wr = g.script.pending()[0].clone();
    g.script.complete(wr.id, Err(failure(FailureClass::Cancelled, "Operation canceled")));
    g.turns(1);
    assert!(matches!(g.told().first(), Some(Ctl::Check { .. })));
    g.turns(128);
    assert!(cell.outcome().is_none(), "still within its patience");
    g.now += Duration::from_secs(10);
    g.turns(64);
    match cell.outcome() {
        Some(Err(Error::Transport { source, .. })) => assert_eq!(source.class, FailureClass::Cancelled),
        other => panic!("the op should end with its own error, got {other:?}"),
    }
}

#[test]
fn a_latency_op_behind_queued_bulk_takes_the_express_lane() {
    let mut g = rig(split_config(1), 3);
    let bulk = g.write(64 << 10);
    g.turns(1);
    let small =
        g.submit_at(OpKind::Write, WrKind::Write { remote_addr: 1 << 40, key: 9, imm: None }, 128 << 10, 64);
    g.turns(1);
    let small_wr = g.script.posted().into_iter().find(|w| w.len == 64).expect("posted");
    assert_eq!(small_wr.lane, LaneId(0), "the express lane");
    assert!(
        g.script.posted().iter().filter(|w| w.len == 4096).all(|w| w.lane != LaneId(0)),
        "bulk keeps off it"
    );
    g.script.complete(small_wr.id, Ok(()));
    g.turns(1);
    assert!(small.outcome().is_some_and(|r| r.is_ok()));
    assert!(bulk.outcome().is_none(), "the bulk op is still going");
}

#[test]
fn a_cancelled_read_of_an_offered_message_answers_its_sender_once_the_verdict_is_in() {
    let mut g = rig_with(SchedConfig::default(), 1, 64 << 10);
    let recv = g.submit(OpKind::Recv, WrKind::Recv, 64 << 10);
    let posted = g.script.pending();
    let desc =
        crate::base::remote::RemoteBuf::new(0, 0x5000, 4096, &[44], crate::base::transport::Access::READ);
    g.r.on_control(g.slot, g.link, Ctl::Offer { token: 3, desc });
    g.script.complete_with(posted[0].id, Some(0), Some(3), Ok(()));
    g.turns(1);
    let read = g.script.pending();
    assert!(matches!(read.as_slice(), [w] if matches!(w.kind, WrKind::Read { key: 44, .. })));
    // The read comes back cancelled (tcp;ofi_rxm dropped the connection): its target, the
    // sender, is asked, and the receive waits for the answer.
    g.script.complete(read[0].id, Err(failure(FailureClass::Cancelled, "Operation canceled")));
    g.turns(1);
    let Some(Ctl::Check { token, key: 44, write: false, .. }) = g.told().first().cloned() else {
        panic!("the sender should be asked about its key");
    };
    assert!(recv.outcome().is_none(), "the receive waits for the verdict");
    g.r.on_control(g.slot, g.link, Ctl::Verdict { token, verdict: Verdict::Allowed });
    assert_eq!(g.told(), vec![Ctl::Done { token: 3, outcome: Pulled::Failed }], "the sender hears once");
    match recv.outcome() {
        Some(Err(Error::Transport { source, .. })) => assert_eq!(source.class, FailureClass::Cancelled),
        other => panic!("the receive should fail with its own error, got {other:?}"),
    }
}

#[test]
fn a_sleeping_peer_reactor_is_kicked_only_by_ops_that_reach_its_rails() {
    // The peer has an express rail (its rail 0, our lane 0: messages) and a bulk rail (1).
    let mut g = rig_mapped(split_config(4), 2, 1 << 20, LaneMap { rails: 2, express: true }, false);
    let send = |g: &mut Rig| g.submit(OpKind::Send, WrKind::Send { imm: None }, 16);
    let (express, bulk) = (RailSet::of([RailId(0)]), RailSet::of([RailId(1)]));
    // Its idle bulk reactor naps.
    g.r.on_control(g.slot, g.link, Ctl::Asleep { rails: bulk });
    for _ in 0..3 {
        send(&mut g);
        g.turns(1);
    }
    assert_eq!(g.told(), vec![], "messages reach its express rail alone: nobody is kicked");
    // A one-sided op may reach the bulk rail: that reactor is kicked, once.
    g.write(64);
    g.turns(1);
    g.write(64);
    g.turns(1);
    assert_eq!(g.told(), vec![Ctl::Kick { rails: bulk }]);
    // Its express reactor naps too: the next message kicks that one.
    g.r.on_control(g.slot, g.link, Ctl::Asleep { rails: express });
    send(&mut g);
    g.turns(1);
    assert_eq!(g.told(), vec![Ctl::Kick { rails: express }]);
    assert_eq!(g.count(|c| &c.kicks), 2);
}

#[test]
fn a_reactor_about_to_sleep_names_its_rails_once_per_kick() {
    let mut g = rig_mapped(split_config(4), 1, 1 << 20, LaneMap::SINGLE, false);
    g.r.announce_sleep();
    g.r.announce_sleep();
    assert_eq!(g.told(), vec![Ctl::Asleep { rails: RailSet::of([RailId(0)]) }], "once until kicked");
    g.r.on_control(g.slot, g.link, Ctl::Kick { rails: RailSet::of([RailId(0)]) });
    g.r.announce_sleep();
    assert_eq!(g.told(), vec![Ctl::Asleep { rails: RailSet::of([RailId(0)]) }]);
}

#[test]
fn a_peer_that_leaves_its_control_messages_unread_is_dropped_once_its_outbox_is_full() {
    use crate::base::control_outbox::BACKLOG;
    let mut g = rig(SchedConfig::default(), 1);
    let write = g.write(16);
    // What piled up for a peer that reads slowly (answers to its offers and questions, ours).
    let ctl = g.r.peers[g.slot].ctl.clone();
    for token in 0..BACKLOG as u32 {
        ctl.send(Ctl::Withdrawn { token }).expect("room");
    }
    // One more message: refused, and the peer is dropped at the next turn, not half-way
    // through what told it.
    g.r.on_control(g.slot, g.link, Ctl::Check { token: 1, key: 9, addr: 0, len: 1, write: true });
    let early = write.outcome();
    assert!(early.is_none(), "nothing is dropped half-way: {early:?}");
    g.turns(1);
    match write.outcome() {
        Some(Err(Error::PeerLost { reason, .. })) => assert!(reason.contains("unread"), "{reason}"),
        other => panic!("the peer's ops should fail as lost, got {other:?}"),
    }
    let told = g.told();
    assert_eq!(told.len(), BACKLOG + 1, "what the outbox held, then the goodbye; not the verdict");
    assert!(matches!(told.last(), Some(Ctl::Goodbye { reason }) if reason.contains("unread")));
}

#[test]
fn memory_whose_deregistration_fails_is_kept_for_good_and_freed_after_one_that_succeeds() {
    let mut g = rig(SchedConfig::default(), 1);
    let deregister = |g: &mut Rig, id: u64| {
        let freed = Arc::new(AtomicBool::new(false));
        let (reply, got) = mpsc::sync_channel(1);
        let keep: Box<dyn std::any::Any + Send> = Box::new(Tracked(freed.clone()));
        g.r.handle(Cmd::Deregister { id, keep: Some(keep), reply: Some(reply) });
        (got.recv().expect("a reply"), freed)
    };
    let (res, freed) = deregister(&mut g, 3);
    assert!(res.is_ok());
    assert!(freed.load(Ordering::SeqCst), "the memory goes once nobody can reach it");
    assert_eq!(g.count(|c| &c.deregistrations_failed), 0);

    g.script.fail_deregistrations();
    let (res, freed) = deregister(&mut g, 4);
    let e = res.expect_err("the transport's failure is the caller's answer");
    assert!(e.to_string().contains("refuses"), "{e}");
    assert!(!freed.load(Ordering::SeqCst), "a registration that may be live keeps its memory");
    assert_eq!(g.count(|c| &c.deregistrations_failed), 1);
    assert_eq!(g.script.deregistered(), vec![3, 4]);
}

#[test]
fn a_stopping_reactor_still_deregisters_and_frees_the_memory_only_then() {
    let mut g = rig(SchedConfig::default(), 1);
    let _posted = g.write(1 << 10);
    g.turns(1);
    let now = g.now;
    g.r.begin_shutdown(now + Duration::from_secs(5));
    assert!(matches!(g.r.phase, Phase::Draining { .. }), "a posted write keeps it draining");
    // An exposed buffer dropped while the reactor drains: its memory comes with the command.
    let freed = Arc::new(AtomicBool::new(false));
    let keep: Box<dyn std::any::Any + Send> = Box::new(Tracked(freed.clone()));
    g.tx.send(Cmd::Deregister { id: 5, keep: Some(keep), reply: None }).expect("the reactor listens");
    g.idle.commands.fetch_add(1, Ordering::SeqCst);
    assert!(!freed.load(Ordering::SeqCst));
    assert!(!g.r.shutdown_step(now + Duration::from_millis(1)), "still draining");
    assert_eq!(g.script.deregistered(), vec![5], "deregistered while the lanes are still open");
    assert!(freed.load(Ordering::SeqCst), "and freed once deregistered");
    assert_eq!(g.idle.commands.load(Ordering::SeqCst), 0, "the command is counted as taken");
}
