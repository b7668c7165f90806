//! The handshake as a sans-IO state machine: it takes the peer's bytes, says what it needs next
//! and what to send, and decides; the caller owns the socket, the clock and the fabric. The
//! listener and the connector drive the same machine (`drive.rs`), the fuzz target and the
//! tests drive it with bytes of their choosing.
//!
//! The exchange, on the wire (protocol version [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION)):
//! 1. the connector opens its lanes and sends its hello;
//! 2. the acceptor reads it and checks what it can before spending anything: version, provider,
//!    id, and that both sides agree on a shared secret;
//! 3. with a secret, the acceptor challenges the connector before it spends anything on it (a
//!    hello asks for nothing secret): its nonce, its id and its HMAC over both nonces and its
//!    id. The connector answers with its own HMAC, then checks the acceptor's; the acceptor
//!    checks the connector's;
//! 4. the acceptor, the connector proven (or no secret set), opens as many lanes and answers
//!    with its own hello, whose nonce and id are the challenge's;
//! 5. each side adds the peer (connecting lane i to lane i), sends the ready mark and waits for
//!    the other's: after it, the socket is the control connection.
//!
//! Driving it, in order: [`transmit`](Handshake::transmit) whatever is queued, then act on
//! [`next`](Handshake::next): read at most the bytes it asks for and pass them to
//! [`received`](Handshake::received) (an empty read is the end of the stream), open lanes and
//! pass their addresses to [`lanes_opened`](Handshake::lanes_opened), add the peer and call
//! [`peer_added`](Handshake::peer_added) — until it says `Done` or fails.
use std::sync::Arc;

#[cfg(any(test, feature = "fuzzing"))]
use super::hello::MAX_LANES;
use super::hello::{Hello, HelloReader};
use crate::base::refusal::{Failure, RefusalReason};

/// The ready mark that ends the handshake.
pub(super) const READY: u8 = 0x52;

/// What this side brings to a handshake.
#[derive(Debug, Clone)]
pub(crate) struct Local {
    pub id: u64,
    pub provider: String,
    pub rails: u8,
    /// Its rail 0 is an express rail.
    pub express: bool,
    pub secret: Option<Arc<[u8]>>,
    /// The nonce this side's hello carries (fresh per handshake).
    pub nonce: [u8; 32],
}

/// Which end of the connection this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Connect,
    Accept,
}

/// What the handshake needs from its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Read at most this many bytes (at least 1) and pass them to `received`.
    Read(usize),
    /// (Acceptor) open this many lanes and pass their addresses to `lanes_opened`.
    OpenLanes(usize),
    /// Add the peer (its hello is [`Handshake::peer`]) and call `peer_added`.
    AddPeer,
    /// The peer is in: the socket is the control connection from here on.
    Done,
}

#[derive(Debug)]
enum State {
    /// Reading the peer's hello.
    Hello(HelloReader),
    /// (Acceptor) the peer's hello is good; waiting for our lanes.
    OpenLanes,
    /// (Acceptor) reading the connector's proof of the shared secret.
    Proof {
        got: Vec<u8>,
    },
    /// (Connector, with a secret) reading the acceptor's challenge: its nonce, id and proof.
    Challenge {
        got: Vec<u8>,
    },
    /// Waiting for the driver to add the peer.
    AddPeer,
    /// Waiting for the peer's ready mark.
    Ready,
    Done,
    Failed(Failure),
}

/// One side of one handshake.
#[derive(Debug)]
pub(crate) struct Handshake {
    role: Role,
    local: Local,
    /// Lanes this side asked for (connector) or opened (acceptor).
    lanes: usize,
    state: State,
    out: Vec<u8>,
    them: Option<Hello>,
    /// (Connector) the nonce and id of the acceptor's challenge, which its hello must carry.
    challenger: Option<([u8; 32], u64)>,
}

/// The acceptor's challenge: its nonce, its id and its proof.
const CHALLENGE: usize = 32 + 8 + 32;

impl Handshake {
    /// The connector, whose lanes are open: its hello goes out first.
    pub(crate) fn connect(local: Local, names: Vec<Vec<u8>>) -> Handshake {
        let lanes = names.len();
        let out = hello_of(&local, names).encode();
        Handshake {
            role: Role::Connect,
            state: match local.secret {
                Some(_) => State::Challenge { got: Vec::with_capacity(CHALLENGE) },
                None => State::Hello(HelloReader::default()),
            },
            local,
            lanes,
            out,
            them: None,
            challenger: None,
        }
    }

    /// The acceptor: it reads first.
    pub(crate) fn accept(local: Local) -> Handshake {
        Handshake {
            role: Role::Accept,
            local,
            lanes: 0,
            state: State::Hello(HelloReader::default()),
            out: Vec::new(),
            them: None,
            challenger: None,
        }
    }

    /// Bytes to send before acting on [`next`](Self::next), if any.
    pub(crate) fn transmit(&mut self) -> Option<Vec<u8>> {
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out))
    }

    /// What to do next, or why the handshake failed.
    pub(crate) fn next(&self) -> Result<Next, Failure> {
        Ok(match &self.state {
            State::Hello(r) => Next::Read(r.wants()),
            State::OpenLanes => Next::OpenLanes(self.them.as_ref().map_or(0, |h| h.names.len())),
            State::Proof { got } => Next::Read(32 - got.len()),
            State::Challenge { got } => Next::Read(CHALLENGE - got.len()),
            State::AddPeer => Next::AddPeer,
            State::Ready => Next::Read(1),
            State::Done => Next::Done,
            State::Failed(f) => return Err(f.clone()),
        })
    }

    /// The peer's hello has arrived whole (a listener evicts the connection after the
    /// strangers' from here on, until the peer is trusted).
    pub(crate) fn has_hello(&self) -> bool {
        self.them.is_some()
    }

    /// The peer has shown all this side can check before spending anything on it: its hello
    /// is in and, with a shared secret, its proof of it too. (Until then a listener may evict
    /// it, after the strangers: a hello asks for nothing secret.)
    pub(crate) fn is_trusted(&self) -> bool {
        self.them.is_some()
            && matches!(self.state, State::OpenLanes | State::AddPeer | State::Ready | State::Done)
    }

    /// The peer's hello, once it has arrived.
    pub(crate) fn peer(&self) -> Option<&Hello> {
        self.them.as_ref()
    }

    /// Bytes the driver read (no more than `next` asked for); empty when the stream ended.
    pub(crate) fn received(&mut self, bytes: &[u8]) {
        if let Err(f) = self.take(bytes) {
            self.state = State::Failed(f);
        }
    }

    fn take(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        if bytes.is_empty() {
            let at = match &self.state {
                State::Hello(r) if r.taken() == 0 => "before sending anything".to_string(),
                State::Hello(r) => format!("after {} bytes of its hello", r.taken()),
                State::Proof { .. } => "during the proof of the shared secret".into(),
                State::Challenge { .. } => "before its challenge was whole".into(),
                State::Ready => "before the ready mark".into(),
                _ => return Ok(()),
            };
            return Err(Failure::new(RefusalReason::Closed, format!("the peer closed the connection {at}")));
        }
        match &mut self.state {
            State::Hello(r) => {
                let Some(h) = r.take(bytes)? else { return Ok(()) };
                self.check(&h)?;
                self.them = Some(h);
                match self.role {
                    Role::Accept => self.challenge_or_open(),
                    Role::Connect => self.state = State::AddPeer,
                }
            }
            State::Proof { got } => {
                let n = bytes.len().min(32 - got.len());
                got.extend_from_slice(&bytes[..n]);
                if got.len() == 32 {
                    let theirs = std::mem::take(got);
                    self.verify(&theirs)?;
                    self.state = State::OpenLanes;
                }
            }
            State::Challenge { got } => {
                let n = bytes.len().min(CHALLENGE - got.len());
                got.extend_from_slice(&bytes[..n]);
                if got.len() == CHALLENGE {
                    let c = std::mem::take(got);
                    self.answer(&c)?;
                    self.state = State::Hello(HelloReader::default());
                }
            }
            State::Ready => {
                if bytes[0] != READY {
                    let why = format!("unexpected byte {:#x} instead of the ready mark", bytes[0]);
                    return Err(Failure::new(RefusalReason::BadHello, why));
                }
                self.state = State::Done;
            }
            // Bytes nobody asked for: a driver bug, not the peer's; refuse rather than guess.
            _ => return Err(Failure::new(RefusalReason::BadHello, "bytes where none were expected")),
        }
        Ok(())
    }

    /// (Acceptor) our lanes are open: answer with our hello.
    pub(crate) fn lanes_opened(&mut self, names: Vec<Vec<u8>>) {
        if !matches!(self.state, State::OpenLanes) {
            return;
        }
        self.lanes = names.len();
        self.out.extend_from_slice(&hello_of(&self.local, names).encode());
        self.state = State::AddPeer;
    }

    /// The peer is added: send the ready mark and wait for the peer's.
    pub(crate) fn peer_added(&mut self) {
        if matches!(self.state, State::AddPeer) {
            self.out.push(READY);
            self.state = State::Ready;
        }
    }

    /// What can be checked of the peer's hello before anything is spent on it.
    fn check(&self, h: &Hello) -> Result<(), Failure> {
        let mismatch = |why: String| Err(Failure::new(RefusalReason::Mismatch, why));
        if h.provider != self.local.provider {
            return mismatch(format!(
                "peer uses provider {:?}, this runtime {:?}",
                h.provider, self.local.provider
            ));
        }
        if h.id == self.local.id {
            return mismatch("peer has this runtime's id (connected to itself?)".into());
        }
        if self.role == Role::Connect && h.names.len() != self.lanes {
            return mismatch(format!("peer answered with {} lanes for {}", h.names.len(), self.lanes));
        }
        if let Some((nonce, id)) = self.challenger {
            if h.nonce != nonce || h.id != id {
                return Err(Failure::new(RefusalReason::BadHello, "the hello is not the challenger's"));
            }
        }
        let missing = |why: &str| Err(Failure::new(RefusalReason::MissingSecret, why.to_string()));
        match (&self.local.secret, h.auth) {
            (Some(_), false) => missing("this runtime requires a shared secret; the peer has none"),
            (None, true) => missing("the peer requires a shared secret; this runtime has none"),
            _ => Ok(()),
        }
    }

    /// (Acceptor) the peer's hello is good. With a secret, challenge it before spending
    /// anything on it; without, open the lanes.
    fn challenge_or_open(&mut self) {
        let them = self.them.as_ref().expect("the peer's hello is in");
        match &self.local.secret {
            Some(secret) => {
                self.out.extend_from_slice(&self.local.nonce);
                self.out.extend_from_slice(&self.local.id.to_le_bytes());
                self.out.extend_from_slice(&prove(secret, &them.nonce, &self.local.nonce, self.local.id));
                self.state = State::Proof { got: Vec::with_capacity(32) };
            }
            None => self.state = State::OpenLanes,
        }
    }

    /// (Connector) the acceptor's challenge `c` is in: answer it with our proof, then check its
    /// own (ours goes out either way, so that an acceptor with another secret sees why too).
    fn answer(&mut self, c: &[u8]) -> Result<(), Failure> {
        let Some(secret) = self.local.secret.clone() else {
            return Err(Failure::new(RefusalReason::BadHello, "a challenge without a secret"));
        };
        let nonce: [u8; 32] = c[..32].try_into().expect("32 bytes");
        let id = u64::from_le_bytes(c[32..40].try_into().expect("8 bytes"));
        self.out.extend_from_slice(&prove(&secret, &nonce, &self.local.nonce, self.local.id));
        self.challenger = Some((nonce, id));
        let expected = prove(&secret, &self.local.nonce, &nonce, id);
        if bool::from(subtle::ConstantTimeEq::ct_eq(&c[40..], &expected[..])) {
            Ok(())
        } else {
            Err(Failure::new(RefusalReason::WrongSecret, "the peer does not know the shared secret"))
        }
    }

    fn verify(&self, theirs: &[u8]) -> Result<(), Failure> {
        let (Some(secret), Some(them)) = (&self.local.secret, &self.them) else {
            return Err(Failure::new(RefusalReason::BadHello, "a proof without a secret"));
        };
        let expected = prove(secret, &self.local.nonce, &them.nonce, them.id);
        if bool::from(subtle::ConstantTimeEq::ct_eq(theirs, &expected[..])) {
            Ok(())
        } else {
            Err(Failure::new(RefusalReason::WrongSecret, "the peer does not know the shared secret"))
        }
    }
}

fn hello_of(local: &Local, names: Vec<Vec<u8>>) -> Hello {
    Hello {
        id: local.id,
        nonce: local.nonce,
        auth: local.secret.is_some(),
        provider: local.provider.clone(),
        rails: local.rails,
        express: local.express,
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

/// Drive an acceptor with a stranger's bytes, cut into reads as `cuts` says, answering every
/// request at once: what the fuzz target runs. Checks what must hold whatever the bytes: no
/// read asks for more than a field's limit, the acceptor never sends more than its hello, a
/// challenge and the ready mark, and it never finishes without the bytes of a whole handshake.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn drive_acceptor_with(bytes: &[u8], cuts: &[u8], secret: Option<&[u8]>) -> Result<(), Failure> {
    const PROVIDER: &str = "tcp;ofi_rxm";
    // Magic, version, id, nonce, flags, rails, provider length, lane count; a lane address's
    // length; the ready mark.
    const LEAST: usize = 4 + 2 + 8 + 32 + 1 + 1 + 2 + 1 + PROVIDER.len() + 2 + 1;
    let local = Local {
        id: 1,
        provider: PROVIDER.into(),
        rails: 1,
        express: false,
        secret: secret.map(Arc::from),
        nonce: [7; 32],
    };
    let mut hs = Handshake::accept(local);
    let (mut rest, mut cut) = (bytes, cuts.iter().cycle());
    let mut sent = 0usize;
    loop {
        sent += hs.transmit().map_or(0, |o| o.len());
        assert!(sent <= 2 + 64 * (2 + 16) + 64 + 48 + CHALLENGE + 1, "the acceptor sent {sent} bytes");
        match hs.next()? {
            Next::Read(max) => {
                assert!((1..=super::hello::MAX_NAME).contains(&max), "a read of {max} bytes");
                let want = cut.next().map_or(max, |&c| (c as usize).clamp(1, max));
                let n = want.min(rest.len());
                hs.received(&rest[..n]);
                rest = &rest[n..];
            }
            Next::OpenLanes(n) => {
                assert!((1..=MAX_LANES).contains(&n), "{n} lanes asked for");
                hs.lanes_opened((0..n).map(|i| vec![i as u8; 16]).collect());
            }
            Next::AddPeer => {
                assert!(hs.peer().is_some(), "adding a peer whose hello never came");
                hs.peer_added();
            }
            Next::Done => {
                assert!(bytes.len() - rest.len() >= LEAST, "done after too few bytes");
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(id: u64, secret: Option<&str>) -> Local {
        Local {
            id,
            provider: "shm".into(),
            rails: 1,
            express: false,
            secret: secret.map(|s| Arc::from(s.as_bytes())),
            nonce: [id as u8; 32],
        }
    }

    /// Run both sides against each other in memory, in pieces of `piece` bytes, as the driver
    /// does: what a side queued goes out, also when it then fails; returns how each ended,
    /// once both have (a side whose peer stopped reads the close).
    fn meet(c: Local, a: Local, lanes: usize, piece: usize) -> (Result<(), Failure>, Result<(), Failure>) {
        let mut conn = Handshake::connect(c, (0..lanes).map(|i| vec![i as u8; 8]).collect());
        let mut acc = Handshake::accept(a);
        let (mut to_acc, mut to_conn) = (Vec::<u8>::new(), Vec::<u8>::new());
        let mut c_end: Option<Result<(), Failure>> = None;
        let mut a_end: Option<Result<(), Failure>> = None;
        for _ in 0..10_000 {
            if let Some(o) = conn.transmit() {
                to_acc.extend(o);
            }
            if let Some(o) = acc.transmit() {
                to_conn.extend(o);
            }
            if let (Some(c), Some(a)) = (&c_end, &a_end) {
                return (c.clone(), a.clone());
            }
            // `other_done`: the peer ended, so an empty inbox is the end of the stream.
            let step =
                |hs: &mut Handshake, inbox: &mut Vec<u8>, other_done: bool| -> Option<Result<(), Failure>> {
                    match hs.next() {
                        Err(e) => return Some(Err(e)),
                        Ok(Next::Read(max)) if !inbox.is_empty() => {
                            let n = max.min(piece).min(inbox.len());
                            let bytes: Vec<u8> = inbox.drain(..n).collect();
                            hs.received(&bytes);
                        }
                        Ok(Next::Read(_)) if other_done => hs.received(&[]),
                        Ok(Next::Read(_)) => {}
                        Ok(Next::OpenLanes(n)) => {
                            hs.lanes_opened((0..n).map(|i| vec![0x80 | i as u8; 8]).collect())
                        }
                        Ok(Next::AddPeer) => hs.peer_added(),
                        Ok(Next::Done) => return Some(Ok(())),
                    }
                    None
                };
            let (c_done, a_done) = (c_end.is_some(), a_end.is_some());
            if !c_done {
                let closed = a_done && to_conn.is_empty();
                c_end = step(&mut conn, &mut to_conn, closed);
            }
            if !a_done {
                let closed = c_done && to_acc.is_empty();
                a_end = step(&mut acc, &mut to_acc, closed);
            }
        }
        panic!("the two sides never finished");
    }

    #[test]
    fn two_sides_meet_in_any_pieces_with_and_without_a_secret() {
        for piece in [1, 3, 32, 4096] {
            for secret in [None, Some("s3cret")] {
                let (c, a) = meet(local(1, secret), local(2, secret), 3, piece);
                assert!(c.is_ok() && a.is_ok(), "piece {piece}, secret {secret:?}: {c:?} {a:?}");
            }
        }
    }

    #[test]
    fn a_wrong_secret_is_refused_by_both_sides_as_such() {
        let (c, a) = meet(local(1, Some("right")), local(2, Some("wrong")), 1, 4096);
        assert_eq!(c.unwrap_err().reason, RefusalReason::WrongSecret);
        assert_eq!(a.unwrap_err().reason, RefusalReason::WrongSecret);
    }

    #[test]
    fn a_missing_secret_is_refused_before_the_acceptor_opens_lanes() {
        let mut acc = Handshake::accept(local(2, Some("s")));
        let mut conn = Handshake::connect(local(1, None), vec![vec![1; 8]]);
        let hello = conn.transmit().unwrap();
        acc.received(&hello[..4]);
        let mut rest = &hello[4..];
        while let Ok(Next::Read(max)) = acc.next() {
            let n = max.min(rest.len());
            acc.received(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(acc.next().unwrap_err().reason, RefusalReason::MissingSecret);
        assert!(acc.transmit().is_none(), "the acceptor answered a peer it refused");
    }

    #[test]
    fn an_acceptor_opens_lanes_only_for_a_peer_it_trusts() {
        for secret in [None, Some("s")] {
            let mut conn = Handshake::connect(local(1, secret), vec![vec![1; 8]]);
            let mut acc = Handshake::accept(local(2, secret));
            let hello = conn.transmit().unwrap();
            let mut rest = &hello[..];
            while let (Ok(Next::Read(max)), false) = (acc.next(), rest.is_empty()) {
                assert!(!acc.is_trusted(), "trusted before its hello is whole");
                let n = max.min(rest.len());
                acc.received(&rest[..n]);
                rest = &rest[n..];
            }
            assert!(acc.has_hello());
            if secret.is_some() {
                // A hello proves nothing secret: the acceptor challenges before opening lanes.
                assert_eq!(acc.next(), Ok(Next::Read(32)));
                assert!(!acc.is_trusted(), "trusted before the proof");
                conn.received(&acc.transmit().expect("a challenge"));
                acc.received(&conn.transmit().expect("a proof"));
            }
            assert_eq!(acc.next(), Ok(Next::OpenLanes(1)), "secret {secret:?}");
            assert!(acc.is_trusted(), "secret {secret:?}: trusted once proven");
            acc.lanes_opened(vec![vec![2; 8]]);
            assert_eq!(acc.next(), Ok(Next::AddPeer));
        }
    }

    #[test]
    fn another_provider_or_our_own_id_is_a_mismatch() {
        let mut other = local(1, None);
        other.provider = "tcp".into();
        let (_, a) = meet(other, local(2, None), 1, 4096);
        assert_eq!(a.unwrap_err().reason, RefusalReason::Mismatch);
        let (_, a) = meet(local(2, None), local(2, None), 1, 4096);
        assert_eq!(a.unwrap_err().reason, RefusalReason::Mismatch);
    }

    #[test]
    fn an_early_close_is_closed_and_says_where() {
        let mut acc = Handshake::accept(local(2, None));
        acc.received(&[]);
        let e = acc.next().unwrap_err();
        assert_eq!(e.reason, RefusalReason::Closed);
        assert!(e.detail.contains("before sending anything"), "{e:?}");
        let mut acc = Handshake::accept(local(2, None));
        acc.received(b"RD");
        acc.received(&[]);
        assert!(acc.next().unwrap_err().detail.contains("after 2 bytes"));
    }

    #[test]
    fn a_wrong_ready_mark_fails_the_handshake() {
        let mut conn = Handshake::connect(local(1, None), vec![vec![1; 8]]);
        let mut acc = Handshake::accept(local(2, None));
        let hello = conn.transmit().unwrap();
        let mut rest = &hello[..];
        while let Ok(Next::Read(max)) = acc.next() {
            let n = max.min(rest.len());
            acc.received(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(acc.next(), Ok(Next::OpenLanes(1)));
        acc.lanes_opened(vec![vec![2; 8]]);
        assert_eq!(acc.next(), Ok(Next::AddPeer));
        acc.peer_added();
        assert_eq!(acc.next(), Ok(Next::Read(1)));
        acc.received(&[0]);
        assert_eq!(acc.next().unwrap_err().reason, RefusalReason::BadHello);
    }

    #[test]
    fn the_fuzz_driver_finishes_a_valid_handshake() {
        let mut conn = Handshake::connect(local(9, None), vec![vec![1; 8]]);
        let mut bytes = conn.transmit().unwrap();
        // The hello carries provider "shm"; the fuzz acceptor speaks tcp;ofi_rxm.
        let (p, r) = (b"shm", b"tcp;ofi_rxm");
        let at = bytes.windows(3).position(|w| w == p).unwrap();
        bytes.splice(at - 2..at + 3, [(r.len() as u16).to_le_bytes().to_vec(), r.to_vec()].concat());
        bytes.push(READY);
        drive_acceptor_with(&bytes, &[1, 5, 200], None).unwrap();
        assert_eq!(drive_acceptor_with(&bytes[..20], &[], None).unwrap_err().reason, RefusalReason::Closed);
    }
}
