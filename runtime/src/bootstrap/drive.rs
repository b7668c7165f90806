//! Runs the handshake machine over a TCP socket against the runtime: reads exactly what it
//! asks for, opens lanes and adds the peer when it says so. What it opens is held by guards
//! that close it again if the handshake fails or its future is dropped (a timeout, a listener
//! evicting a stranger, a listener dropped), so no failed or abandoned handshake leaves lanes or
//! a half-added peer behind.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::handshake::{Handshake, Local, Next};
use super::hello::MAX_NAME;
use super::watch::{watch_peer, LossSwitch};
use crate::base::control_outbox;
use crate::base::error::{Error, OpKind};
use crate::base::refusal::{Failure, RefusalReason};
use crate::driver::inline;
use crate::endpoint::Endpoint;
use crate::runtime::{Lane, Runtime, Slots};

/// How a handshake driven here ended, when it did not end in a peer.
#[derive(Debug)]
pub(super) enum DriveError {
    /// The handshake refused the peer (or the peer us).
    Refused(Failure),
    /// The runtime could not open or connect lanes (it may have shut down).
    Runtime(Error),
}

impl From<Failure> for DriveError {
    fn from(f: Failure) -> Self {
        DriveError::Refused(f)
    }
}

/// How far a handshake has come, as a listener choosing whom to evict sees it. One waiting on
/// an empty socket may go while the peer has shown nothing that cost it a secret: first a
/// stranger (no whole hello), then a peer whose hello is in but whose proof of the shared
/// secret is not (a hello asks for nothing secret, so a flood of them must not hold the slots
/// either). One whose bytes are waiting to be read, or that is trusted, stays.
#[derive(Debug, Default)]
pub(super) struct Progress(AtomicU8);

/// Which connections a listener at its cap evicts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Evict {
    /// No whole hello yet.
    Stranger,
    /// A hello, and no proof of the shared secret yet.
    Unproven,
}

impl Progress {
    /// Waiting on an empty socket (else busy).
    const IDLE: u8 = 1;
    /// Its hello is in, its proof not.
    const HELLO: u8 = 2;
    /// Trusted, or over: never evicted.
    const KNOWN: u8 = 4;

    pub(super) fn idle(&self) {
        self.0.fetch_or(Self::IDLE, Ordering::Relaxed);
    }

    fn busy(&self) {
        self.0.fetch_and(!Self::IDLE, Ordering::Relaxed);
    }

    /// The peer's hello is in, and what it proves is not checked yet.
    pub(super) fn hello_in(&self) {
        self.0.fetch_or(Self::HELLO, Ordering::Relaxed);
    }

    /// The peer is trusted, or the handshake is over (a listener must not evict it while its
    /// outcome is on the way): not to be evicted any more.
    pub(super) fn known(&self) {
        self.0.store(Self::KNOWN, Ordering::Relaxed);
    }

    /// Whether a listener at its cap may evict it, and in which turn.
    pub(super) fn evictable(&self) -> Option<Evict> {
        let v = self.0.load(Ordering::Relaxed);
        match (v & Self::KNOWN != 0, v & Self::IDLE != 0, v & Self::HELLO != 0) {
            (false, true, false) => Some(Evict::Stranger),
            (false, true, true) => Some(Evict::Unproven),
            _ => None,
        }
    }
}

/// Lanes opened for a handshake, closed on drop unless handed on.
pub(super) struct LanesGuard<'a> {
    rt: &'a Runtime,
    lanes: Vec<Lane>,
}

impl<'a> LanesGuard<'a> {
    /// Open `n` lanes for a peer: the guard and the lanes' addresses.
    pub(super) async fn open(
        rt: &'a Runtime,
        peer: &str,
        n: usize,
    ) -> Result<(LanesGuard<'a>, Vec<Vec<u8>>), Error> {
        let (mine, undo, peer) = (rt.clone(), rt.clone(), peer.to_string());
        let opened = off_worker(
            rt,
            move || mine.open_lanes(&peer, n),
            move |lanes: Vec<(Lane, Vec<u8>)>| undo.close_lanes(lanes.into_iter().map(|(l, _)| l).collect()),
        )
        .await?;
        let (lanes, names) = opened.into_iter().unzip();
        Ok((LanesGuard { rt, lanes }, names))
    }

    fn take(&mut self) -> Vec<Lane> {
        std::mem::take(&mut self.lanes)
    }
}

impl Drop for LanesGuard<'_> {
    fn drop(&mut self) {
        if !self.lanes.is_empty() {
            self.rt.close_lanes(self.take());
        }
    }
}

/// Run `work`, a call on runtime `rt` that waits for its reactor's answer, on a blocking
/// thread: opening a lane takes the reactor tens of milliseconds on some providers
/// (tcp;ofi_rxm's endpoint), which would stall every task of a current-thread runtime (and a
/// worker of any other) meanwhile. Should the handshake be gone by the time it returns (timed
/// out, dropped), `undo` takes back what it made. Where this thread holds the reactor itself
/// (a `block_on` waiting on the handshake), only this thread can turn it: `work` runs here.
async fn off_worker<T: Send + 'static, U: FnOnce(T) + Send + Clone + 'static>(
    rt: &Runtime,
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
    undo: U,
) -> Result<T, Error> {
    if inline::holds(rt.id()) {
        return work();
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut waiting = Waiting { rx, undo: Some(undo.clone()) };
    tokio::task::spawn_blocking(move || {
        if let Err(Ok(made)) = tx.send(work()) {
            undo(made);
        }
    });
    // The sender goes unanswered only where `work` panicked.
    (&mut waiting.rx).await.unwrap_or(Err(Error::Shutdown { op: OpKind::Connect }))
}

/// The handshake's end of an [`off_worker`] call: dropped before it took the answer (the
/// handshake timed out, or was dropped), it takes back what the answer made.
struct Waiting<T, U: FnOnce(T)> {
    rx: tokio::sync::oneshot::Receiver<Result<T, Error>>,
    undo: Option<U>,
}

impl<T, U: FnOnce(T)> Drop for Waiting<T, U> {
    fn drop(&mut self) {
        // Closed first: from here the worker's send fails, and it undoes what it made itself.
        self.rx.close();
        if let (Ok(Ok(made)), Some(undo)) = (self.rx.try_recv(), self.undo.take()) {
            undo(made);
        }
    }
}

/// A peer added during a handshake, removed on drop unless handed on to its endpoint.
struct PeerGuard<'a> {
    rt: &'a Runtime,
    slots: Option<Slots>,
}

impl Drop for PeerGuard<'_> {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            self.rt.remove_peer(&slots);
        }
    }
}

fn local(rt: &Runtime) -> Local {
    Local {
        id: rt.id(),
        provider: rt.provider().to_string(),
        rails: rt.caps().rails.max(1) as u8,
        express: rt.express_rail(),
        secret: rt.secret().map(Arc::from),
        nonce: rand::random(),
    }
}

fn io_failure(what: &str, e: std::io::Error) -> Failure {
    Failure::new(RefusalReason::Io, format!("{what}: {e}"))
}

/// Which end of the handshake this side is.
pub(super) enum Side<'a> {
    /// The connector, with its lanes open (before the TCP connect, so that its hello follows
    /// the connect at once: a listener may take a connection that stays quiet for a stranger's).
    Connect(LanesGuard<'a>, Vec<Vec<u8>>),
    /// The acceptor, telling `progress` how far it got.
    Accept(Option<&'a Progress>),
}

/// Run one handshake on `s`.
pub(super) async fn drive(
    rt: &Runtime,
    mut s: TcpStream,
    addr: SocketAddr,
    side: Side<'_>,
) -> Result<Endpoint, DriveError> {
    let peer = addr.to_string();
    let _ = s.set_nodelay(true);
    let (mut opened, mut hs, progress) = match side {
        Side::Connect(opened, names) => (opened, Handshake::connect(local(rt), names), None),
        Side::Accept(progress) => {
            (LanesGuard { rt, lanes: Vec::new() }, Handshake::accept(local(rt)), progress)
        }
    };
    let mut added = PeerGuard { rt, slots: None };
    let mut outbox = None;
    let mut label = String::new();
    let mut buf = vec![0u8; MAX_NAME];
    loop {
        if let Some(out) = hs.transmit() {
            s.write_all(&out).await.map_err(|e| io_failure("sending", e))?;
        }
        match hs.next()? {
            Next::Read(max) => {
                let n = read(&s, &mut buf[..max.min(MAX_NAME)], progress).await?;
                hs.received(&buf[..n]);
                if let Some(p) = progress {
                    if hs.is_trusted() {
                        p.known();
                    } else if hs.has_hello() {
                        p.hello_in();
                    }
                }
            }
            Next::OpenLanes(n) => {
                let (lanes, names) = LanesGuard::open(rt, &peer, n).await.map_err(DriveError::Runtime)?;
                opened = lanes;
                hs.lanes_opened(names);
            }
            Next::AddPeer => {
                let them = hs.peer().expect("a hello before adding");
                label = format!("{addr}#{:x}", them.id);
                let (ctl, rx) = control_outbox::outbox();
                outbox = Some(rx);
                // A failed add closes the lanes itself: the guard lets go of them first.
                let (mine, undo, lanes) = (rt.clone(), rt.clone(), opened.take());
                let (id, names, map, l) = (them.id, them.names.clone(), them.map(), label.clone());
                let slots = off_worker(
                    rt,
                    move || mine.add_peer(id, lanes, names, map, l, ctl),
                    move |slots: Slots| undo.remove_peer(&slots),
                )
                .await
                .map_err(DriveError::Runtime)?;
                added.slots = Some(slots);
                hs.peer_added();
            }
            Next::Done => break,
        }
    }
    let them = hs.peer().expect("a hello before done");
    let slots = added.slots.take().expect("added before done");
    let switch = Arc::new(LossSwitch::default());
    let outbox = outbox.expect("added before done");
    let watch = watch_peer(rt.clone(), slots.clone(), s, outbox, switch.clone());
    Ok(Endpoint::new(rt.clone(), slots, them.rails as usize, them.id, label, Some((watch, switch))))
}

/// Read what is there (0 at the end of the stream); while the socket is empty the handshake
/// counts as idle.
async fn read(s: &TcpStream, buf: &mut [u8], progress: Option<&Progress>) -> Result<usize, Failure> {
    loop {
        match s.try_read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                progress.map(Progress::idle);
                s.readable().await.map_err(|e| io_failure("reading", e))?;
                progress.map(Progress::busy);
            }
            // A reset is the peer closing, as far as the handshake is concerned.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_failure("reading", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_is_evictable_while_idle_and_untrusted_strangers_first() {
        let p = Progress::default();
        assert_eq!(p.evictable(), None, "busy at first");
        p.idle();
        assert_eq!(p.evictable(), Some(Evict::Stranger));
        p.busy();
        assert_eq!(p.evictable(), None, "its bytes are being read");
        p.hello_in();
        assert_eq!(p.evictable(), None);
        p.idle();
        assert_eq!(p.evictable(), Some(Evict::Unproven));
        assert!(Evict::Stranger < Evict::Unproven, "strangers go first");
        p.known();
        assert_eq!(p.evictable(), None);
        p.idle();
        assert_eq!(p.evictable(), None, "a trusted peer waiting stays");
    }
}
