//! The listener: a task of its own accepts TCP connections and runs each one's handshake in a
//! task of its own, bounded by the connect timeout, at most
//! [`Builder::max_handshakes`](crate::Builder::max_handshakes) at a time. `accept()` hands out
//! peers in the order their handshakes finished, so a slow or silent client delays no one; a
//! failed handshake is counted, logged and reported to whoever watches, never returned.
//!
//! At the cap, a new connection takes the place of the oldest stranger: a connection that had
//! its turn, found nothing to read and has sent no whole hello (holding a slot open costs it
//! nothing to lose). Where no stranger waits, it takes the place of the oldest idle one whose
//! hello is in but whose proof of the shared secret is not: a hello asks for nothing secret,
//! so hellos followed by silence must not hold the slots either. A connection whose bytes wait
//! to be read, or that proved the secret (or whose hello is in, without one), is never
//! evicted; when no slot holds one to evict, the newcomer is refused. Both count as
//! [`RefusalReason::OverCap`]. The socket listens with a backlog of [`BACKLOG`], so a burst of
//! connections waits in the kernel instead of being half-opened and lost.
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use super::drive::{drive, DriveError, Evict, Progress, Side};
use super::slots::{Slot, SlotId, Slots};
use crate::base::error::{Error, OpKind, Result};
use crate::base::refusal::{Failure, Refusal, RefusalLog, RefusalReason, Refusals, REFUSALS_KEPT};
use crate::base::wake::panic_text;
use crate::endpoint::Endpoint;
use crate::runtime::Runtime;

/// Peers whose handshake finished and that wait for `accept()`; past this, finished handshakes
/// wait in their slots (and count against the cap).
const READY_QUEUE: usize = 16;

/// The listen backlog (the kernel caps it at `net.core.somaxconn`). With the usual 128, a burst
/// overflows the accept queue and, with SYN cookies, connections the client thinks open are
/// never seen by the server.
pub const BACKLOG: u32 = 4096;

/// Accepts peers on a TCP address. Handshakes run behind it, concurrently; dropping it stops
/// them (whatever they opened is closed) and drops peers not yet accepted.
pub struct Listener {
    addr: SocketAddr,
    ready: tokio::sync::Mutex<mpsc::Receiver<Endpoint>>,
    ended: Arc<Mutex<Option<Ended>>>,
    refusals: broadcast::Sender<Refusal>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("addr", &self.addr).finish()
    }
}

/// Why the acceptor stopped.
#[derive(Debug, Clone)]
enum Ended {
    /// The socket failed in a way retrying cannot mend.
    Io(std::io::ErrorKind, String),
    /// The runtime shut down.
    Shutdown,
}

impl Listener {
    pub(super) async fn bind(rt: &Runtime, addr: impl tokio::net::ToSocketAddrs) -> Result<Listener> {
        let io = |e| Error::Io { op: OpKind::Accept, peer: "-".into(), source: e };
        let tcp = bind(addr).await.map_err(io)?;
        let local = tcp.local_addr().map_err(io)?;
        let (tx, rx) = mpsc::channel(READY_QUEUE);
        let (refusals, _) = broadcast::channel(REFUSALS_KEPT);
        let ended = Arc::new(Mutex::new(None));
        let acceptor = Acceptor {
            rt: rt.clone(),
            tcp,
            ready: tx,
            refusals: refusals.clone(),
            ended: ended.clone(),
            cap: rt.max_handshakes(),
            limit: rt.connect_timeout(),
            log: RefusalLog::new(Instant::now()),
        };
        Ok(Listener {
            addr: local,
            ready: tokio::sync::Mutex::new(rx),
            ended,
            refusals,
            acceptor: tokio::spawn(acceptor.run()),
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.addr)
    }

    /// The next peer whose handshake completed. Handshakes that fail are counted in
    /// [`Stats::refused`](crate::Stats::refused) and reported on [`refusals`](Self::refusals),
    /// never here: this errs only when the listener itself can no longer accept (its socket
    /// failed, or the runtime shut down), and then on every later call too. Cancel-safe.
    pub async fn accept(&self) -> Result<Endpoint> {
        let next = self.ready.lock().await.recv().await;
        match next {
            Some(ep) => Ok(ep),
            None => Err(self.ended()),
        }
    }

    /// Refusals from now on, as they happen: who, why, and what exactly was wrong.
    pub fn refusals(&self) -> Refusals {
        Refusals::new(self.refusals.subscribe())
    }

    fn ended(&self) -> Error {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match ended {
            Some(Ended::Shutdown) => Error::Shutdown { op: OpKind::Accept },
            Some(Ended::Io(kind, why)) => Error::Io {
                op: OpKind::Accept,
                peer: self.addr.to_string().into(),
                source: std::io::Error::new(kind, format!("the listener can no longer accept: {why}")),
            },
            None => Error::Io {
                op: OpKind::Accept,
                peer: self.addr.to_string().into(),
                source: std::io::Error::other("the listener can no longer accept: its task ended"),
            },
        }
    }
}

/// Bind the first address that binds, with SO_REUSEADDR as tokio's own bind sets it, and
/// listen with [`BACKLOG`].
async fn bind(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket =
            if a.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(BACKLOG)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")))
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// How a handshake task ended.
enum Outcome {
    /// Handed to `accept()` (or dropped with the listener).
    Accepted,
    Refused(SocketAddr, Failure),
    /// The runtime shut down under it.
    Shutdown,
}

/// What an accept error means for the listener.
#[derive(Debug, PartialEq, Eq)]
enum AcceptError {
    /// One connection's trouble (reset before it was accepted, ...): go on.
    Connection,
    /// Out of descriptors or memory: wait a little, then go on.
    Exhausted,
    /// The socket itself is broken.
    Fatal,
}

fn classify(e: &std::io::Error) -> AcceptError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted | K::WouldBlock => {
            return AcceptError::Connection
        }
        K::OutOfMemory => return AcceptError::Exhausted,
        _ => {}
    }
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => AcceptError::Exhausted,
        // accept(2): errors already pending on the new socket are reported by accept itself
        // and are to be treated like EAGAIN.
        Some(
            libc::ENETDOWN
            | libc::EPROTO
            | libc::ENOPROTOOPT
            | libc::EHOSTDOWN
            | libc::ENONET
            | libc::EHOSTUNREACH
            | libc::EOPNOTSUPP
            | libc::ENETUNREACH
            | libc::EPERM
            | libc::ETIMEDOUT,
        ) => AcceptError::Connection,
        _ => AcceptError::Fatal,
    }
}

struct Acceptor {
    rt: Runtime,
    tcp: TcpListener,
    ready: mpsc::Sender<Endpoint>,
    refusals: broadcast::Sender<Refusal>,
    ended: Arc<Mutex<Option<Ended>>>,
    cap: usize,
    limit: Duration,
    log: RefusalLog,
}

impl Acceptor {
    async fn run(mut self) {
        let mut tasks: JoinSet<(SlotId, Outcome)> = JoinSet::new();
        let mut slots = Slots::default();
        let mut backoff = Duration::from_millis(5);
        let why = loop {
            tokio::select! {
                r = self.tcp.accept() => match r {
                    Ok((s, addr)) => {
                        backoff = Duration::from_millis(5);
                        if slots.len() >= self.cap && !self.evict(&mut slots) {
                            // Handshakes not yet run cannot tell a stranger from a peer: give
                            // them a turn before refusing the newcomer.
                            tokio::task::yield_now().await;
                            if !self.evict(&mut slots) {
                                let why = format!("{} handshakes are in progress and none is an idle stranger", self.cap);
                                self.refuse(addr, Failure::new(RefusalReason::OverCap, why));
                                drop(s);
                                continue;
                            }
                        }
                        let id = slots.next_id();
                        let progress = Arc::new(Progress::default());
                        let task = handshake(self.rt.clone(), s, addr, progress.clone(), self.ready.clone(), self.limit);
                        let abort = tasks.spawn(async move { (id, task.await) });
                        slots.insert(id, Slot { addr, progress, abort });
                    }
                    Err(e) => match classify(&e) {
                        AcceptError::Connection => {}
                        AcceptError::Exhausted => {
                            tracing::warn!(
                                "listener on {:?}: {e}; accepting again in {} ms",
                                self.tcp.local_addr().ok(),
                                backoff.as_millis()
                            );
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                        }
                        AcceptError::Fatal => break Ended::Io(e.kind(), e.to_string()),
                    },
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => match done {
                    // An evicted task was aborted and its refusal already counted; one that
                    // ended just before its eviction reports a refusal that was counted too.
                    Ok((id, outcome)) => {
                        let evicted = !slots.ended(id);
                        match outcome {
                            Outcome::Accepted => {}
                            Outcome::Refused(addr, f) if !evicted => self.refuse(addr, f),
                            Outcome::Refused(..) => {}
                            Outcome::Shutdown => break Ended::Shutdown,
                        }
                    }
                    // A bug in the handshake must not hold its slot for good: what it opened
                    // was closed by its guards as it unwound.
                    Err(e) if e.is_panic() => {
                        if let Some(addr) = slots.panicked(e.id()) {
                            let why = format!("the handshake panicked: {}", panic_text(&*e.into_panic()));
                            self.refuse(addr, Failure::new(RefusalReason::Setup, why));
                        }
                    }
                    Err(_) => {}
                },
            }
        };
        tracing::warn!("listener on {:?} stopped: {why:?}", self.tcp.local_addr().ok());
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        // Dropping the tasks aborts the handshakes in progress; their guards close what they
        // opened, and with the last sender gone `accept()` returns the reason.
    }

    /// At the cap: evict the oldest idle stranger, else the oldest idle peer whose hello is in
    /// but whose proof of the shared secret is not, if there is one.
    fn evict(&mut self, slots: &mut Slots) -> bool {
        let Some((s, turn)) = slots.evict() else {
            return false;
        };
        s.abort.abort();
        let what = match turn {
            Evict::Stranger => "idle without a whole hello",
            Evict::Unproven => "idle after its hello without a proof of the shared secret",
        };
        let why = format!("evicted: {} handshakes were in progress and this one was {what}", self.cap);
        self.refuse(s.addr, Failure::new(RefusalReason::OverCap, why));
        true
    }

    fn refuse(&mut self, addr: SocketAddr, f: Failure) {
        self.rt.refusal_counters().add(f.reason);
        let r = Refusal { addr, reason: f.reason, detail: f.detail };
        self.log.log(&r);
        // Nobody watching is fine.
        let _ = self.refusals.send(r);
    }
}

/// One incoming connection's handshake, bounded by `limit`; a finished one waits for room in
/// the ready queue.
async fn handshake(
    rt: Runtime,
    s: tokio::net::TcpStream,
    addr: SocketAddr,
    progress: Arc<Progress>,
    ready: mpsc::Sender<Endpoint>,
    limit: Duration,
) -> Outcome {
    let r = tokio::time::timeout(limit, drive(&rt, s, addr, Side::Accept(Some(&progress)))).await;
    // Whatever happened, this one is no stranger to evict any more.
    progress.known();
    match r {
        Ok(Ok(ep)) => {
            // A send fails only when the listener is gone, and the endpoint with it.
            let _ = ready.send(ep).await;
            Outcome::Accepted
        }
        Ok(Err(DriveError::Refused(f))) => Outcome::Refused(addr, f),
        Ok(Err(DriveError::Runtime(Error::Shutdown { .. }))) => Outcome::Shutdown,
        Ok(Err(DriveError::Runtime(e))) => {
            Outcome::Refused(addr, Failure::new(RefusalReason::Setup, e.to_string()))
        }
        Err(_) => {
            let why = format!("no complete handshake within {} ms", limit.as_millis());
            Outcome::Refused(addr, Failure::new(RefusalReason::Timeout, why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_are_sorted_by_what_they_mean_for_the_listener() {
        let os = std::io::Error::from_raw_os_error;
        assert_eq!(classify(&os(libc::EMFILE)), AcceptError::Exhausted);
        assert_eq!(classify(&os(libc::ENFILE)), AcceptError::Exhausted);
        assert_eq!(classify(&os(libc::ECONNABORTED)), AcceptError::Connection);
        assert_eq!(classify(&os(libc::EPROTO)), AcceptError::Connection);
        assert_eq!(classify(&os(libc::EBADF)), AcceptError::Fatal);
        assert_eq!(classify(&os(libc::EINVAL)), AcceptError::Fatal);
    }
}
