//! Endpoints of one process that are shm peers share memory: libfabric's shm maps a peer
//! endpoint of the same process by pointer to that endpoint's own region (it finds the name in
//! its process-wide list of endpoints) rather than mapping it anew. Closing an endpoint frees
//! its region, so a peer endpoint of this process that is progressed afterwards (answering ops
//! we queued with it, sending to us) writes into freed memory and crashes inside libfabric: two
//! runtimes of one process, one losing the other with one-sided ops in flight, crashed 9 runs
//! in 10.
//!
//! So an endpoint whose peer is an open endpoint of this process waits, when it is closed, for
//! that peer to close first, up to [`PATIENCE`]. The peer's runtime closes it as soon as it
//! learns of the loss (the control connection ends for both), without waiting in turn: it finds
//! ours closing. Meanwhile ours is progressed only here, under the registry's lock, while the
//! peer is still open (it cannot start closing, let alone free its region, without the lock):
//! a peer draining its own ops to us before it closes (a shutdown) needs that progress. Once
//! the peer is closing, ours is never progressed again. Until our close returns the peer may
//! still serve the ops we posted, whose buffers the caller keeps until then.
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a close waits for a peer endpoint of this process to close first; past it, ours
/// closes anyway (as it did before this wait existed).
pub(crate) const PATIENCE: Duration = Duration::from_secs(1);

/// The shm endpoints of this process, by name: closing or not.
static OPEN: Mutex<Option<HashMap<Vec<u8>, bool>>> = Mutex::new(None);
/// Signalled whenever an endpoint is closed.
static CLOSED: Condvar = Condvar::new();

fn open() -> MutexGuard<'static, Option<HashMap<Vec<u8>, bool>>> {
    OPEN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Our endpoint `name` was opened.
pub(crate) fn opened(name: &[u8]) {
    open().get_or_insert_with(HashMap::new).insert(name.to_vec(), false);
}

/// How a wait before closing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The peer is not an open endpoint of this process (any more), or is closing itself.
    Clear,
    /// The patience ran out with the peer still open.
    TimedOut,
    /// The process is exiting: libfabric is not to be called any more.
    Exiting,
}

/// Our endpoint `me`, whose peer is `peer`, is about to close: mark it closing and wait (up to
/// `patience`) while `peer` is an endpoint of this process that is open and not closing itself,
/// calling `progress` (which progresses ours) between looks.
pub(crate) fn before_close(
    me: &[u8],
    peer: Option<&[u8]>,
    patience: Duration,
    progress: &mut dyn FnMut(),
) -> Wait {
    let mut guard = open();
    if let Some(closing) = guard.get_or_insert_with(HashMap::new).get_mut(me) {
        *closing = true;
    }
    let Some(peer) = peer else { return Wait::Clear };
    let deadline = Instant::now() + patience;
    loop {
        if crate::exit_guard::exiting() {
            return Wait::Exiting;
        }
        let serving = guard.as_ref().and_then(|m| m.get(peer)).is_some_and(|closing| !closing);
        if !serving {
            return Wait::Clear;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Wait::TimedOut;
        }
        // The peer is open and cannot start closing while we hold the lock: ours may be
        // progressed (the peer's region is alive).
        progress();
        guard = CLOSED.wait_timeout(guard, left.min(SLICE)).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// Between two looks at a peer being waited for: how often ours is progressed meanwhile, and
/// how soon the exit of the process is noticed.
const SLICE: Duration = Duration::from_millis(1);

/// Our endpoint `name` is closed.
pub(crate) fn closed(name: &[u8]) {
    if let Some(m) = open().as_mut() {
        m.remove(name);
    }
    CLOSED.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_waits_for_a_serving_peer_of_this_process_and_not_for_a_closing_one() {
        let (a, b) = (b"test-a".as_slice(), b"test-b".as_slice());
        opened(a);
        opened(b);
        // Nobody closes b: a's close waits it out, progressing a meanwhile.
        let t = Instant::now();
        let mut turns = 0;
        assert_eq!(before_close(a, Some(b), Duration::from_millis(50), &mut || turns += 1), Wait::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(turns > 0, "progressed while waiting");
        // a is closing now: b's close does not wait for it, nor progress b.
        let t = Instant::now();
        let mut turns = 0;
        assert_eq!(before_close(b, Some(a), Duration::from_secs(5), &mut || turns += 1), Wait::Clear);
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(turns, 0);
        // A waiting close ends as soon as its peer is closed.
        opened(b"test-c");
        opened(b"test-d");
        let waiter = std::thread::spawn(|| {
            before_close(b"test-c", Some(b"test-d"), Duration::from_secs(10), &mut || {})
        });
        std::thread::sleep(Duration::from_millis(20));
        closed(b"test-d");
        assert_eq!(waiter.join().unwrap(), Wait::Clear);
        // Peers of other processes (unknown names) never wait.
        assert_eq!(
            before_close(b"test-c", Some(b"elsewhere"), Duration::from_secs(10), &mut || {}),
            Wait::Clear
        );
        for n in [a, b, b"test-c".as_slice()] {
            closed(n);
        }
    }
}
