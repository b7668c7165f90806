//! Counters every op passes through, so tests and metrics can account for each one.
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the runtime's op counters. On a runtime with several rail groups, each part
/// of an op split across them counts as an op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops handed to the reactor.
    pub submitted: u64,
    /// Work requests posted to the transport.
    pub posted: u64,
    /// Ops that completed successfully.
    pub completed: u64,
    /// Ops that failed (provider error, peer lost, shutdown).
    pub failed: u64,
    /// Ops withdrawn before posting because their future was dropped.
    pub withdrawn: u64,
    /// Memory registrations made.
    pub registrations: u64,
    /// Deregistrations the transport failed. Such a registration may still be live, so memory
    /// a peer could reach through it is kept for good, never freed or reused.
    pub deregistrations_failed: u64,
    /// Time spent registering memory, in nanoseconds (round trip through the reactor).
    pub registration_ns: u64,
    /// Peers woken on the control connection for an op of ours: their reactor slept on a
    /// provider that cannot wake it (shm).
    pub kicks: u64,
    /// Device buffers registered natively (the transport reaches device memory itself).
    pub device_native: u64,
    /// Device buffers registered through a staging mirror in host memory.
    pub device_staged: u64,
    /// Bytes copied between device memory and staging mirrors.
    pub staged_bytes: u64,
    /// Handshakes this runtime's listeners refused, by reason.
    pub refused: crate::base::refusal::RefusalCounts,
    /// Polls in which a task held the reactor its thread lent it (see
    /// [`Builder::await_drive`](crate::Builder::await_drive)) to post or reap its op.
    pub task_holds: u64,
    /// Times a task found the lent reactor with its thread and asked for it: each costs the
    /// task a wait for the thread's next turn.
    pub task_asks: u64,
    /// Times the thread took the lent reactor back (no task had it for a while, a command
    /// waited, or a task parked).
    pub thread_retakes: u64,
}

/// On lines of their own: whoever holds the reactor writes them every op, and their
/// neighbours in the heap may be what another thread polls (see `Idle`).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Counters {
    pub submitted: AtomicU64,
    pub posted: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub withdrawn: AtomicU64,
    pub registrations: AtomicU64,
    pub deregistrations_failed: AtomicU64,
    /// Nanoseconds spent registering, from any thread.
    pub registration_ns: AtomicU64,
    /// Bytes posted per rail (ours), for striping checks and metrics.
    pub rail_bytes: [AtomicU64; crate::base::MAX_RAILS],
    /// Ops refused on the submitting thread (runtime shut down): counted as submitted and
    /// failed. Written by any thread, so kept apart from the reactor's own counters.
    pub rejected: AtomicU64,
    /// Sleeping peers kicked awake.
    pub kicks: AtomicU64,
    /// Device buffers by path, and bytes staged (any thread).
    pub device_native: AtomicU64,
    pub device_staged: AtomicU64,
    pub staged_bytes: AtomicU64,
}

impl Counters {
    /// Count one on a counter only the reactor writes (whoever drives it holds its lock): a
    /// plain load and store, no locked instruction on the hot path.
    pub(crate) fn add(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Count bytes posted on `rail` (reactor only, as `add`).
    pub(crate) fn add_rail_bytes(&self, rail: crate::base::transport::RailId, n: usize) {
        if let Some(c) = self.rail_bytes.get(rail.0) {
            c.store(c.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
        }
    }

    /// Count one from any thread.
    pub(crate) fn add_shared(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts of several reactors' counters together (one per rail group: each reactor
    /// writes only its own).
    pub(crate) fn snapshot(all: &[std::sync::Arc<Counters>]) -> Stats {
        let l =
            |f: fn(&Counters) -> &AtomicU64| all.iter().map(|c| f(c).load(Ordering::Relaxed)).sum::<u64>();
        Stats {
            submitted: l(|c| &c.submitted) + l(|c| &c.rejected),
            posted: l(|c| &c.posted),
            completed: l(|c| &c.completed),
            failed: l(|c| &c.failed) + l(|c| &c.rejected),
            withdrawn: l(|c| &c.withdrawn),
            registrations: l(|c| &c.registrations),
            deregistrations_failed: l(|c| &c.deregistrations_failed),
            registration_ns: l(|c| &c.registration_ns),
            kicks: l(|c| &c.kicks),
            device_native: l(|c| &c.device_native),
            device_staged: l(|c| &c.device_staged),
            staged_bytes: l(|c| &c.staged_bytes),
            refused: Default::default(),
            task_holds: 0,
            task_asks: 0,
            thread_retakes: 0,
        }
    }
}
