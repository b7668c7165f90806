//! The control plane: peers meet over TCP, exchange a versioned, length-limited hello (runtime
//! id, provider, endpoint address), insert each other, and keep the socket open as a liveness
//! signal: when it closes, the peer is lost.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};

use tokio::sync::mpsc::UnboundedReceiver;

use crate::control::Ctl;
use crate::endpoint::Endpoint;
use crate::error::{Error, OpKind, Result};
use crate::runtime::{Lane, Runtime, Slots};

const MAGIC: &[u8; 4] = b"RDLN";
// 4: the control connection carries framed messages (`control`), not only heartbeat bytes.
// 5: `Asleep` and `Kick`, so a reactor asleep on shm is woken for its peers' ops.
const VERSION: u16 = PROTOCOL_VERSION;

/// The handshake's protocol version: peers of another version are refused at connect.
pub const PROTOCOL_VERSION: u16 = 5;

const MAX_FIELD: usize = 1024;
const READY: u8 = 0x52;

struct Hello {
    id: u64,
    /// Fresh random bytes the peer's proof of the shared secret must cover.
    nonce: [u8; 32],
    /// This side requires the shared secret.
    auth: bool,
    provider: String,
    /// Rails this side spans: its lane i runs on rail `rail_of(i, rails)`.
    rails: u8,
    /// One fabric address per lane.
    names: Vec<Vec<u8>>,
}

/// Lanes a hello may carry.
const MAX_LANES: usize = 64;

/// Accepts peers on a TCP address.
#[derive(Debug)]
pub struct Listener {
    rt: Runtime,
    tcp: TcpListener,
}

impl Listener {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.tcp.local_addr().map_err(|e| Error::Io { op: OpKind::Accept, peer: "-".into(), source: e })
    }

    /// Wait for the next peer and complete the handshake with it. A peer that fails the
    /// handshake yields an error; the listener stays usable.
    pub async fn accept(&self) -> Result<Endpoint> {
        let (stream, addr) = self.tcp.accept().await.map_err(|e| Error::Io {
            op: OpKind::Accept,
            peer: "-".into(),
            source: e,
        })?;
        let limit = self.rt.connect_timeout();
        with_timeout(
            OpKind::Accept,
            &addr.to_string(),
            limit,
            handshake(&self.rt, stream, addr, OpKind::Accept, 0),
        )
        .await
    }
}

impl Runtime {
    /// Listen for peers on `addr` (`"127.0.0.1:0"` picks a port).
    pub async fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        let tcp = TcpListener::bind(addr).await.map_err(|e| Error::Io {
            op: OpKind::Accept,
            peer: "-".into(),
            source: e,
        })?;
        Ok(Listener { rt: self.clone(), tcp })
    }

    /// Connect to a listening peer; fails within the connect timeout when nobody answers.
    pub async fn connect(&self, addr: impl ToSocketAddrs + std::fmt::Display) -> Result<Endpoint> {
        self.connect_with_lanes(addr, self.lanes()).await
    }

    /// Connect with `lanes` lanes (1 to 64) instead of the runtime's default; the peer opens as
    /// many.
    pub async fn connect_with_lanes(
        &self,
        addr: impl ToSocketAddrs + std::fmt::Display,
        lanes: usize,
    ) -> Result<Endpoint> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(Error::invalid(OpKind::Connect, format!("{lanes} lanes (1 to {MAX_LANES})")));
        }
        let label = addr.to_string();
        let limit = self.connect_timeout();
        with_timeout(OpKind::Connect, &label, limit, async {
            let stream = TcpStream::connect(addr).await.map_err(|e| Error::Io {
                op: OpKind::Connect,
                peer: label.clone(),
                source: e,
            })?;
            let peer = stream.peer_addr().map_err(|e| Error::Io {
                op: OpKind::Connect,
                peer: label.clone(),
                source: e,
            })?;
            handshake(self, stream, peer, OpKind::Connect, lanes).await
        })
        .await
    }
}

async fn with_timeout<T>(
    op: OpKind,
    peer: &str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout { op, peer: peer.to_string(), after_ms: limit.as_millis() as u64 }),
    }
}

fn encode(h: &Hello) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + h.names.iter().map(|n| n.len() + 2).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&h.id.to_le_bytes());
    out.extend_from_slice(&h.nonce);
    out.push(u8::from(h.auth));
    out.push(h.rails);
    out.extend_from_slice(&(h.provider.len() as u16).to_le_bytes());
    out.extend_from_slice(h.provider.as_bytes());
    out.push(h.names.len() as u8);
    for name in &h.names {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
    }
    out
}

fn hello(rt: &Runtime, names: Vec<Vec<u8>>) -> Hello {
    Hello {
        id: rt.id(),
        nonce: rand::random(),
        auth: rt.secret().is_some(),
        provider: rt.provider().to_string(),
        rails: rt.caps().rails.max(1) as u8,
        names,
    }
}

/// HMAC-SHA256 over the peer's nonce, our nonce and our id: it answers the peer's challenge,
/// cannot be replayed to another connection, and is bound to its direction.
fn prove(secret: &[u8], their_nonce: &[u8; 32], my_nonce: &[u8; 32], my_id: u64) -> [u8; 32] {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(b"rdmalane-auth-v1");
    mac.update(their_nonce);
    mac.update(my_nonce);
    mac.update(&my_id.to_le_bytes());
    mac.finalize().into_bytes().into()
}

/// Read one hello, refusing anything malformed before allocating more than `MAX_FIELD`.
async fn read_hello<R: AsyncRead + Unpin>(s: &mut R) -> std::result::Result<Hello, String> {
    let mut head = [0u8; 14];
    s.read_exact(&mut head).await.map_err(|e| format!("reading hello: {e}"))?;
    if &head[0..4] != MAGIC {
        return Err("not an rdmalane peer (bad magic)".into());
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if version != VERSION {
        return Err(format!("protocol version {version}, this build speaks {VERSION}"));
    }
    let id = u64::from_le_bytes(head[6..14].try_into().expect("8 bytes"));
    let mut nonce = [0u8; 32];
    s.read_exact(&mut nonce).await.map_err(|e| format!("reading hello: {e}"))?;
    let mut flags = [0u8; 1];
    s.read_exact(&mut flags).await.map_err(|e| format!("reading hello: {e}"))?;
    if flags[0] > 1 {
        return Err(format!("unknown hello flags {:#x}", flags[0]));
    }
    let auth = flags[0] == 1;
    let mut rails = [0u8; 1];
    s.read_exact(&mut rails).await.map_err(|e| format!("reading hello: {e}"))?;
    if rails[0] == 0 || rails[0] as usize > crate::runtime::MAX_RAILS {
        return Err(format!("{} rails (1 to {})", rails[0], crate::runtime::MAX_RAILS));
    }
    let rails = rails[0];
    let provider = read_field(s, 64).await?;
    let provider = String::from_utf8(provider).map_err(|_| "provider name is not UTF-8".to_string())?;
    let mut count = [0u8; 1];
    s.read_exact(&mut count).await.map_err(|e| format!("reading hello: {e}"))?;
    let count = count[0] as usize;
    if count == 0 || count > MAX_LANES {
        return Err(format!("{count} lanes (1 to {MAX_LANES})"));
    }
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        names.push(read_field(s, MAX_FIELD).await?);
    }
    Ok(Hello { id, nonce, auth, provider, rails, names })
}

async fn read_field<R: AsyncRead + Unpin>(s: &mut R, max: usize) -> std::result::Result<Vec<u8>, String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.map_err(|e| format!("reading hello: {e}"))?;
    let len = u16::from_le_bytes(len) as usize;
    if len > max {
        return Err(format!("field of {len} bytes exceeds the limit of {max}"));
    }
    let mut v = vec![0u8; len];
    s.read_exact(&mut v).await.map_err(|e| format!("reading hello: {e}"))?;
    Ok(v)
}

/// The connector opens its lanes and speaks first; the acceptor opens as many lanes as the
/// connector asked for and answers; both connect lane i to lane i.
async fn handshake(
    rt: &Runtime,
    mut s: TcpStream,
    addr: SocketAddr,
    op: OpKind,
    lanes: usize,
) -> Result<Endpoint> {
    let peer = addr.to_string();
    let fail = |reason: String| Error::Handshake { op, peer: peer.clone(), reason };
    let _ = s.set_nodelay(true);
    let (opened, them, mine) = if op == OpKind::Connect {
        let opened = rt.open_lanes(&peer, lanes)?;
        let names = opened.iter().map(|(_, n)| n.clone()).collect();
        let me = hello(rt, names);
        let mine = me.nonce;
        let res = async {
            s.write_all(&encode(&me)).await.map_err(|e| fail(format!("sending hello: {e}")))?;
            read_hello(&mut s).await.map_err(&fail)
        }
        .await;
        match res {
            Ok(them) => (opened, them, mine),
            Err(e) => {
                rt.close_lanes(opened.into_iter().map(|(l, _)| l).collect());
                return Err(e);
            }
        }
    } else {
        let them = read_hello(&mut s).await.map_err(&fail)?;
        let opened = rt.open_lanes(&peer, them.names.len())?;
        let names = opened.iter().map(|(_, n)| n.clone()).collect();
        let me = hello(rt, names);
        if let Err(e) = s.write_all(&encode(&me)).await {
            rt.close_lanes(opened.into_iter().map(|(l, _)| l).collect());
            return Err(fail(format!("sending hello: {e}")));
        }
        (opened, them, me.nonce)
    };
    let ids: Vec<_> = opened.iter().map(|(l, _)| *l).collect();
    match meet(rt, s, addr, op, ids.clone(), them, mine).await {
        Ok(ep) => Ok(ep),
        Err((e, added)) => {
            match added {
                Some(slots) => rt.remove_peer(&slots),
                None => rt.close_lanes(ids),
            }
            Err(e)
        }
    }
}

/// Check the peer's hello, add it, and agree that both sides are ready; on failure says
/// whether the peer was already added (then removing it closes the lanes).
async fn meet(
    rt: &Runtime,
    mut s: TcpStream,
    addr: SocketAddr,
    op: OpKind,
    lanes: Vec<Lane>,
    them: Hello,
    mine: [u8; 32],
) -> std::result::Result<Endpoint, (Error, Option<Slots>)> {
    let peer = addr.to_string();
    let fail = |reason: String| Error::Handshake { op, peer: peer.clone(), reason };
    if them.provider != rt.provider() {
        let why = format!("peer uses provider {:?}, this runtime {:?}", them.provider, rt.provider());
        return Err((fail(why), None));
    }
    if them.id == rt.id() {
        return Err((fail("peer has this runtime's id (connected to itself?)".into()), None));
    }
    match (rt.secret(), them.auth) {
        (None, false) => {}
        (Some(_), false) => {
            return Err((fail("this runtime requires a shared secret; the peer has none".into()), None))
        }
        (None, true) => {
            return Err((fail("the peer requires a shared secret; this runtime has none".into()), None))
        }
        (Some(secret), true) => {
            let proof = prove(secret, &them.nonce, &mine, rt.id());
            let mut theirs = [0u8; 32];
            let exchange = async {
                s.write_all(&proof).await?;
                s.read_exact(&mut theirs).await
            };
            if let Err(e) = exchange.await {
                return Err((fail(format!("exchanging proofs of the shared secret: {e}")), None));
            }
            let expected = prove(secret, &mine, &them.nonce, them.id);
            if !bool::from(subtle::ConstantTimeEq::ct_eq(&theirs[..], &expected[..])) {
                return Err((fail("the peer does not know the shared secret".into()), None));
            }
        }
    }
    if them.names.len() != lanes.len() {
        let why = format!("peer answered with {} lanes for {}", them.names.len(), lanes.len());
        return Err((fail(why), None));
    }
    let label = format!("{addr}#{:x}", them.id);
    let (ctl, outbox) = tokio::sync::mpsc::unbounded_channel();
    // A failed add has closed the lanes itself: nothing is left to undo (an empty set of
    // slots), and closing them again could close lanes another handshake opened since.
    let slots = rt
        .add_peer(them.id, lanes, them.names, them.rails as usize, label.clone(), ctl)
        .map_err(|e| (e, Some(Slots::default())))?;
    // Both sides must know each other before the first message, or a message could reach a
    // lane not yet connected.
    let sync = async {
        s.write_all(&[READY]).await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        Ok::<u8, std::io::Error>(b[0])
    };
    match sync.await {
        Ok(READY) => {}
        Ok(b) => return Err((fail(format!("unexpected byte {b:#x} instead of ready")), Some(slots))),
        Err(e) => return Err((fail(format!("waiting for ready: {e}")), Some(slots))),
    }
    let watch = watch_peer(rt.clone(), slots.clone(), them.id, s, outbox);
    Ok(Endpoint::new(rt.clone(), slots, them.rails as usize, them.id, label, Some(watch)))
}

/// The control socket stays open for the endpoint's life: it carries what the reactor has to
/// tell the peer (`outbox`) and heartbeats, and brings the peer's messages to the reactor. EOF,
/// an error, silence or a malformed message means the peer is gone.
fn watch_peer(
    rt: Runtime,
    slots: Slots,
    peer_id: u64,
    s: TcpStream,
    mut outbox: UnboundedReceiver<Ctl>,
) -> tokio::task::JoinHandle<()> {
    let weak = rt.downgrade();
    let timeout = rt.peer_timeout();
    drop(rt);
    let (rd, mut wr) = s.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    tokio::spawn(async move {
        // Both sides send a heartbeat a few times per timeout, so a peer whose host or network
        // went away (no FIN, no RST) is noticed too.
        let beat = timeout / 3;
        // Wake-ups are one byte each, and each costs the reactor a command and a wake: only
        // those an honest peer sends are handed on. It announces its sleep once per kick of
        // ours, and kicks us once per announcement of ours; repeats are dropped.
        let peer_asleep = AtomicBool::new(false);
        let we_announced = AtomicBool::new(false);
        let writer = async {
            let mut open = true;
            loop {
                let next = async {
                    match open {
                        true => outbox.recv().await,
                        false => std::future::pending().await,
                    }
                };
                let msg = tokio::select! {
                    _ = tokio::time::sleep(beat) => Some(Ctl::Heartbeat),
                    m = next => m,
                };
                // The reactor dropped its sender (the peer was removed): heartbeats only.
                let Some(msg) = msg else {
                    open = false;
                    continue;
                };
                // A peer that stops reading would otherwise stall this writer for good while
                // its own heartbeats keep the reader content, and our messages pile up.
                match tokio::time::timeout(timeout, wr.write_all(&msg.encode())).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return format!("control connection: {e}"),
                    Err(_) => return format!("the peer read nothing for {} ms", timeout.as_millis()),
                }
                match msg {
                    Ctl::Goodbye { reason } => return reason,
                    Ctl::Kick => peer_asleep.store(false, Ordering::Relaxed),
                    Ctl::Asleep => we_announced.store(true, Ordering::Relaxed),
                    _ => {}
                }
            }
        };
        let reader = async {
            loop {
                match tokio::time::timeout(timeout, Ctl::read(&mut rd)).await {
                    Err(_) => return format!("no heartbeat for {} ms", timeout.as_millis()),
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return "control connection closed".to_string()
                    }
                    Ok(Err(e)) => return format!("control connection: {e}"),
                    Ok(Ok(Err(why))) => return format!("control protocol violated: {why}"),
                    Ok(Ok(Ok(Ctl::Heartbeat))) => {}
                    Ok(Ok(Ok(Ctl::Goodbye { reason }))) => {
                        return format!("the peer gave up on us: {reason}")
                    }
                    Ok(Ok(Ok(Ctl::Asleep))) if peer_asleep.swap(true, Ordering::Relaxed) => {}
                    Ok(Ok(Ok(Ctl::Kick))) if !we_announced.swap(false, Ordering::Relaxed) => {}
                    Ok(Ok(Ok(msg))) => match weak.upgrade() {
                        Some(rt) => rt.control(&slots, peer_id, msg),
                        None => return "runtime gone".to_string(),
                    },
                }
            }
        };
        let reason = tokio::select! {
            r = writer => r,
            r = reader => r,
        };
        if let Some(rt) = weak.upgrade() {
            rt.peer_lost(&slots, reason);
        }
    })
}

/// Decode one hello from `bytes` as the listener would read it from a socket: the fuzz target
/// and the property tests drive the real decoder through this. Returns the lane addresses.
pub(crate) fn decode_hello(mut bytes: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
    futures::executor::block_on(read_hello(&mut bytes)).map(|h| h.names)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample(names: Vec<Vec<u8>>, provider: String, rails: u8) -> Hello {
        Hello { id: 7, nonce: [3; 32], auth: false, provider, rails, names }
    }

    proptest! {
        #[test]
        fn hellos_round_trip(
            names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8),
            provider in "[a-z;_]{0,40}",
            rails in 1u8..=32,
        ) {
            let bytes = encode(&sample(names.clone(), provider, rails));
            prop_assert_eq!(decode_hello(&bytes), Ok(names));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_hello(&bytes);
        }

        #[test]
        fn cut_or_flipped_hellos_fail_cleanly(cut in 0usize..200, flip in 0usize..200, bit in 0u8..8) {
            let mut bytes = encode(&sample(vec![vec![9; 40]; 3], "tcp;ofi_rxm".into(), 2));
            let flip = flip % bytes.len();
            bytes[flip] ^= 1 << bit;
            bytes.truncate(cut.min(bytes.len()));
            let _ = decode_hello(&bytes);
        }
    }
}
