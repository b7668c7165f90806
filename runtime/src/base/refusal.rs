//! Why a handshake was refused: the reason as a type, the counts a listener keeps of them, the
//! stream an application may watch them on, and a log that a flood cannot turn into a flood of
//! lines.
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

/// Why a handshake did not end in a connected peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The connection closed before the handshake finished (a port scan, a health probe, a
    /// peer that gave up).
    Closed,
    /// The bytes are not a well-formed hello: bad magic, unknown flags, a field over its limit,
    /// an unexpected byte where the ready mark belongs.
    BadHello,
    /// The peer speaks another protocol version.
    WrongVersion,
    /// The peer's proof of the shared secret is wrong.
    WrongSecret,
    /// One side requires a shared secret and the other has none.
    MissingSecret,
    /// The peer is well-formed but cannot be this runtime's peer: another provider, this
    /// runtime's own id, a lane count other than the one asked for.
    Mismatch,
    /// The handshake did not finish within the connect timeout.
    Timeout,
    /// More handshakes were in progress than the listener allows
    /// ([`Builder::max_handshakes`](crate::Builder::max_handshakes)).
    OverCap,
    /// Opening lanes for the peer or connecting them failed on this side.
    Setup,
    /// A socket error while the handshake ran.
    Io,
}

impl RefusalReason {
    /// Every reason, in the order [`RefusalCounts`] lists them.
    pub fn all() -> &'static [RefusalReason] {
        &ALL
    }

    /// The reason's name in logs and metrics (`bad_hello`, `over_cap`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RefusalReason::Closed => "closed",
            RefusalReason::BadHello => "bad_hello",
            RefusalReason::WrongVersion => "wrong_version",
            RefusalReason::WrongSecret => "wrong_secret",
            RefusalReason::MissingSecret => "missing_secret",
            RefusalReason::Mismatch => "mismatch",
            RefusalReason::Timeout => "timeout",
            RefusalReason::OverCap => "over_cap",
            RefusalReason::Setup => "setup",
            RefusalReason::Io => "io",
        }
    }

    fn index(self) -> usize {
        ALL.iter().position(|&r| r == self).expect("every reason is listed")
    }
}

const ALL: [RefusalReason; 10] = [
    RefusalReason::Closed,
    RefusalReason::BadHello,
    RefusalReason::WrongVersion,
    RefusalReason::WrongSecret,
    RefusalReason::MissingSecret,
    RefusalReason::Mismatch,
    RefusalReason::Timeout,
    RefusalReason::OverCap,
    RefusalReason::Setup,
    RefusalReason::Io,
];

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A handshake that failed: the reason and what exactly was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub reason: RefusalReason,
    pub detail: Arc<str>,
}

impl Failure {
    pub(crate) fn new(reason: RefusalReason, detail: impl Into<Arc<str>>) -> Failure {
        Failure { reason, detail: detail.into() }
    }
}

/// One refused connection, as [`Listener::refusals`](crate::Listener::refusals) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The address the connection came from.
    pub addr: SocketAddr,
    /// Why it was refused.
    pub reason: RefusalReason,
    /// What exactly was wrong, in words.
    pub detail: Arc<str>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handshake with {} refused ({}): {}", self.addr, self.reason, self.detail)
    }
}

/// How many handshakes a runtime's listeners refused, by reason (in [`Stats::refused`]).
///
/// [`Stats::refused`]: crate::Stats::refused
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusalCounts {
    /// [`RefusalReason::Closed`].
    pub closed: u64,
    /// [`RefusalReason::BadHello`].
    pub bad_hello: u64,
    /// [`RefusalReason::WrongVersion`].
    pub wrong_version: u64,
    /// [`RefusalReason::WrongSecret`].
    pub wrong_secret: u64,
    /// [`RefusalReason::MissingSecret`].
    pub missing_secret: u64,
    /// [`RefusalReason::Mismatch`].
    pub mismatch: u64,
    /// [`RefusalReason::Timeout`].
    pub timeout: u64,
    /// [`RefusalReason::OverCap`].
    pub over_cap: u64,
    /// [`RefusalReason::Setup`].
    pub setup: u64,
    /// [`RefusalReason::Io`].
    pub io: u64,
}

impl RefusalCounts {
    /// The count for one reason.
    pub fn of(&self, reason: RefusalReason) -> u64 {
        match reason {
            RefusalReason::Closed => self.closed,
            RefusalReason::BadHello => self.bad_hello,
            RefusalReason::WrongVersion => self.wrong_version,
            RefusalReason::WrongSecret => self.wrong_secret,
            RefusalReason::MissingSecret => self.missing_secret,
            RefusalReason::Mismatch => self.mismatch,
            RefusalReason::Timeout => self.timeout,
            RefusalReason::OverCap => self.over_cap,
            RefusalReason::Setup => self.setup,
            RefusalReason::Io => self.io,
        }
    }

    /// Every refusal, whatever its reason.
    pub fn total(&self) -> u64 {
        ALL.iter().map(|&r| self.of(r)).sum()
    }
}

/// The runtime's refusal counters, written by its listeners.
#[derive(Debug, Default)]
pub(crate) struct RefusalCounters([AtomicU64; ALL.len()]);

impl RefusalCounters {
    pub(crate) fn add(&self, reason: RefusalReason) {
        self.0[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RefusalCounts {
        let n = |r: RefusalReason| self.0[r.index()].load(Ordering::Relaxed);
        RefusalCounts {
            closed: n(RefusalReason::Closed),
            bad_hello: n(RefusalReason::BadHello),
            wrong_version: n(RefusalReason::WrongVersion),
            wrong_secret: n(RefusalReason::WrongSecret),
            missing_secret: n(RefusalReason::MissingSecret),
            mismatch: n(RefusalReason::Mismatch),
            timeout: n(RefusalReason::Timeout),
            over_cap: n(RefusalReason::OverCap),
            setup: n(RefusalReason::Setup),
            io: n(RefusalReason::Io),
        }
    }
}

/// Refusals as they happen, from [`Listener::refusals`](crate::Listener::refusals). Only those
/// after the call; a receiver that falls more than 1024 behind skips the oldest (and says how
/// many in [`skipped`](Self::skipped)): watching can never slow the listener.
#[derive(Debug)]
pub struct Refusals {
    rx: broadcast::Receiver<Refusal>,
    skipped: u64,
}

/// How many refusals the broadcast keeps for a slow watcher.
pub(crate) const REFUSALS_KEPT: usize = 1024;

impl Refusals {
    pub(crate) fn new(rx: broadcast::Receiver<Refusal>) -> Refusals {
        Refusals { rx, skipped: 0 }
    }

    /// The next refusal; `None` once the listener is gone.
    pub async fn next(&mut self) -> Option<Refusal> {
        loop {
            match self.rx.recv().await {
                Ok(r) => return Some(r),
                Err(broadcast::error::RecvError::Lagged(n)) => self.skipped += n,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Refusals this watcher missed because it fell behind.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Turn into a [`futures::Stream`] of refusals.
    pub fn into_stream(self) -> impl futures::Stream<Item = Refusal> + Send + Unpin {
        Box::pin(futures::stream::unfold(self, |mut r| async move { r.next().await.map(|x| (x, r)) }))
    }
}

/// Logs refusals at `warn` up to a few a second and the rest at `debug`, with a line that says
/// how many were held back: a port scan or a flood is visible without filling the log.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    window: Instant,
    in_window: u32,
    held_back: u64,
}

/// Refusals logged at `warn` per second.
const WARN_PER_SEC: u32 = 10;

impl RefusalLog {
    pub(crate) fn new(now: Instant) -> RefusalLog {
        RefusalLog { window: now, in_window: 0, held_back: 0 }
    }

    /// Whether this refusal goes out at `warn`; on the first of a new second, also how many
    /// the last window held back.
    pub(crate) fn admit(&mut self, now: Instant) -> (bool, Option<u64>) {
        let mut summary = None;
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            if self.held_back > 0 {
                summary = Some(std::mem::take(&mut self.held_back));
            }
            self.window = now;
            self.in_window = 0;
        }
        self.in_window += 1;
        let loud = self.in_window <= WARN_PER_SEC;
        if !loud {
            self.held_back += 1;
        }
        (loud, summary)
    }

    pub(crate) fn log(&mut self, r: &Refusal) {
        let (loud, summary) = self.admit(Instant::now());
        if let Some(n) = summary {
            tracing::warn!(
                "{n} more handshakes were refused in the last second (logged at debug; see Stats::refused)"
            );
        }
        if loud {
            tracing::warn!("{r}");
        } else {
            tracing::debug!("{r}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_says_ten_a_second_out_loud_then_how_many_it_held_back() {
        let t0 = Instant::now();
        let mut log = RefusalLog::new(t0);
        let loud = (0..50).filter(|_| log.admit(t0).0).count();
        assert_eq!(loud, 10);
        let (loud, summary) = log.admit(t0 + Duration::from_millis(1001));
        assert!(loud);
        assert_eq!(summary, Some(40));
        assert_eq!(log.admit(t0 + Duration::from_millis(1002)).1, None);
    }

    #[test]
    fn counts_are_kept_per_reason() {
        let c = RefusalCounters::default();
        for (i, &r) in ALL.iter().enumerate() {
            for _ in 0..=i {
                c.add(r);
            }
        }
        let s = c.snapshot();
        for (i, &r) in ALL.iter().enumerate() {
            assert_eq!(s.of(r), i as u64 + 1, "{r}");
        }
        assert_eq!(s.total(), 55);
    }
}
