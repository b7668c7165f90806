//! Runs the handshake machine over a TCP socket against the runtime: reads exactly what it
//! asks for, opens lanes and adds the peer when it says so. What it opens is held by guards
//! that close it again if the handshake fails or its future is dropped (a timeout, a listener
//! evicting a stranger, a listener dropped), so no failed or abandoned handshake leaves lanes or
//! a half-added peer behind.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::handshake::{Handshake, Local, Next, Role};
use super::hello::MAX_NAME;
use super::refusal::{Failure, RefusalReason};
use super::watch::watch_peer;
use crate::endpoint::Endpoint;
use crate::error::Error;
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

/// Lanes opened for a handshake, closed on drop unless handed on.
struct LanesGuard<'a> {
    rt: &'a Runtime,
    lanes: Vec<Lane>,
}

impl LanesGuard<'_> {
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
        secret: rt.secret().map(Arc::from),
        nonce: rand::random(),
    }
}

fn io_failure(what: &str, e: std::io::Error) -> Failure {
    Failure::new(RefusalReason::Io, format!("{what}: {e}"))
}

/// Run one handshake on `s` as `role` (a connector asks for `lanes` lanes). `hello_seen` is set
/// once the peer's hello has arrived whole.
pub(super) async fn drive(
    rt: &Runtime,
    mut s: TcpStream,
    addr: SocketAddr,
    role: Role,
    lanes: usize,
    hello_seen: Option<&AtomicBool>,
) -> Result<Endpoint, DriveError> {
    let peer = addr.to_string();
    let _ = s.set_nodelay(true);
    let mut opened = LanesGuard { rt, lanes: Vec::new() };
    let mut hs = match role {
        Role::Connect => {
            let lanes = rt.open_lanes(&peer, lanes).map_err(DriveError::Runtime)?;
            let (ids, names): (Vec<Lane>, Vec<Vec<u8>>) = lanes.into_iter().unzip();
            opened.lanes = ids;
            Handshake::connect(local(rt), names)
        }
        Role::Accept => Handshake::accept(local(rt)),
    };
    let mut added = PeerGuard { rt, slots: None };
    let mut outbox = None;
    let mut buf = vec![0u8; MAX_NAME];
    loop {
        if let Some(out) = hs.transmit() {
            s.write_all(&out).await.map_err(|e| io_failure("sending", e))?;
        }
        match hs.next()? {
            Next::Read(max) => {
                let n = match s.read(&mut buf[..max.min(MAX_NAME)]).await {
                    Ok(n) => n,
                    // A reset is the peer closing, as far as the handshake is concerned.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
                    Err(e) => return Err(io_failure("reading", e).into()),
                };
                hs.received(&buf[..n]);
                if let (Some(flag), true) = (hello_seen, hs.has_hello()) {
                    flag.store(true, Ordering::Relaxed);
                }
            }
            Next::OpenLanes(n) => {
                let lanes = rt.open_lanes(&peer, n).map_err(DriveError::Runtime)?;
                let (ids, names): (Vec<Lane>, Vec<Vec<u8>>) = lanes.into_iter().unzip();
                opened.lanes = ids;
                hs.lanes_opened(names);
            }
            Next::AddPeer => {
                let them = hs.peer().expect("a hello before adding");
                let label = format!("{addr}#{:x}", them.id);
                let (ctl, rx) = tokio::sync::mpsc::unbounded_channel();
                outbox = Some(rx);
                // A failed add closes the lanes itself: the guard lets go of them first.
                let slots = rt
                    .add_peer(them.id, opened.take(), them.names.clone(), them.rails as usize, label, ctl)
                    .map_err(DriveError::Runtime)?;
                added.slots = Some(slots);
                hs.peer_added();
            }
            Next::Done => break,
        }
    }
    let them = hs.peer().expect("a hello before done");
    let slots = added.slots.take().expect("added before done");
    let label = format!("{addr}#{:x}", them.id);
    let watch = watch_peer(rt.clone(), slots.clone(), them.id, s, outbox.expect("added before done"));
    Ok(Endpoint::new(rt.clone(), slots, them.rails as usize, them.id, label, Some(watch)))
}
