//! The control plane: peers meet over TCP, exchange a versioned, length-limited hello (runtime
//! id, provider, endpoint addresses), prove a shared secret if one is set, insert each other,
//! and keep the socket open as a liveness signal: when it closes, the peer is lost.
//!
//! - `hello`: the hello's wire format and its field-by-field decoder;
//! - `handshake`: the handshake as a sans-IO state machine;
//! - `drive`: that machine run over a socket against the runtime, with guards for what it opens;
//! - `listener`: concurrent handshakes behind a [`Listener`], with a cap and eviction;
//! - `slots`: the listener's handshakes in progress, and which one eviction takes;
//! - `refusal`: why a handshake was refused, counted, logged and reported;
//! - `watch`: the control connection after the handshake.
mod drive;
mod handshake;
mod hello;
mod listener;
mod slots;
mod watch;

use tokio::net::{TcpStream, ToSocketAddrs};

#[cfg(feature = "fuzzing")]
pub(crate) use handshake::drive_acceptor_with;
#[cfg(feature = "fuzzing")]
pub(crate) use hello::decode_hello;
pub use hello::PROTOCOL_VERSION;
pub use listener::Listener;
pub(crate) use watch::LossSwitch;

use crate::base::error::{Error, OpKind, Result};
use crate::endpoint::Endpoint;
use crate::runtime::Runtime;
use drive::{drive, DriveError, LanesGuard, Side};
use hello::MAX_LANES;

impl Runtime {
    /// Listen for peers on `addr` (`"127.0.0.1:0"` picks a port). Must be called within a tokio
    /// runtime: the listener's handshakes run as tokio tasks.
    pub async fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        Listener::bind(self, addr).await
    }

    /// Connect to a listening peer; fails within the connect timeout when nobody answers.
    pub async fn connect(&self, addr: impl ToSocketAddrs + std::fmt::Display) -> Result<Endpoint> {
        self.connect_with_lanes(addr, self.lanes()).await
    }

    /// Connect with `lanes` lanes (1 to 64) instead of the runtime's default; the peer opens as
    /// many. With an express rail there are 2 at least: the express lane, and one on the bulk
    /// rail for bulk ops (which would otherwise share the express rail's reactor). A refused
    /// handshake is an [`Error::Handshake`] naming the reason.
    pub async fn connect_with_lanes(
        &self,
        addr: impl ToSocketAddrs + std::fmt::Display,
        lanes: usize,
    ) -> Result<Endpoint> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(Error::invalid(OpKind::Connect, format!("{lanes} lanes (1 to {MAX_LANES})")));
        }
        let lanes = if self.express_rail() { lanes.max(2) } else { lanes };
        let label = addr.to_string();
        let limit = self.connect_timeout();
        let io = |e| Error::Io { op: OpKind::Connect, peer: label.as_str().into(), source: e };
        let attempt = async {
            let (opened, names) = LanesGuard::open(self, &label, lanes).await?;
            let stream = TcpStream::connect(addr).await.map_err(io)?;
            let peer = stream.peer_addr().map_err(io)?;
            drive(self, stream, peer, Side::Connect(opened, names)).await.map_err(|e| match e {
                DriveError::Runtime(e) => e,
                DriveError::Refused(f) => Error::Handshake {
                    op: OpKind::Connect,
                    peer: peer.to_string().into(),
                    why: f.reason,
                    reason: f.detail.to_string().into(),
                },
            })
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                op: OpKind::Connect,
                peer: label.into(),
                after_ms: limit.as_millis() as u64,
            }),
        }
    }
}
