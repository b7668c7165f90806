//! What travels on a peer's control connection once the handshake is done: heartbeats, the two
//! halves of a large-message rendezvous, questions about refused one-sided ops, why a runtime
//! gave up on its peer, and wake-ups for a reactor asleep on a provider that cannot wake it.
//! Each message is a kind byte and a fixed or length-limited body; anything else is a protocol
//! violation and ends the connection (the peer is then lost), so a misbehaving peer can
//! neither make us allocate without bound nor stall us.
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::base::remote::RemoteBuf;
use crate::base::transport::RailSet;

const HEARTBEAT: u8 = 0x48;
const OFFER: u8 = 0x4F;
const DONE: u8 = 0x44;
const CHECK: u8 = 0x43;
const VERDICT: u8 = 0x56;
const GOODBYE: u8 = 0x47;
const WITHDRAWN: u8 = 0x57;
const ASLEEP: u8 = 0x53;
const KICK: u8 = 0x4B;

/// The longest reason a goodbye carries; longer ones are cut.
pub(crate) const MAX_REASON: usize = 256;

/// One control message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ctl {
    /// Nothing to say: the connection is alive.
    Heartbeat,
    /// A send above the largest message: the marker message carrying `token` as immediate data
    /// takes the message's place among the others, and the receiver reads the bytes from `desc`
    /// (the sender's memory, exposed read-only until the receiver says it is done).
    Offer {
        /// Names the send between the two runtimes.
        token: u32,
        /// Where the message is.
        desc: RemoteBuf,
    },
    /// The sender's marker for offer `token` failed (its send failed): no marker will come,
    /// so the receiver forgets the offer.
    Withdrawn {
        /// The offer's token.
        token: u32,
    },
    /// The receiver is done with the offer `token`: the sender may have its buffer back.
    Done {
        /// The offer's token.
        token: u32,
        /// How it went.
        outcome: Pulled,
    },
    /// A one-sided op of ours on this peer's memory was cancelled by the provider (tcp;ofi_rxm
    /// drops the connection on an access fault and reports every pending op as cancelled):
    /// was it allowed?
    Check {
        /// Names the question.
        token: u32,
        /// The key the op used.
        key: u64,
        /// Its remote address, as the descriptor gave it.
        addr: u64,
        /// Bytes it covered.
        len: u64,
        /// A write (else a read).
        write: bool,
    },
    /// The answer to `Check` `token`.
    Verdict {
        /// The question's token.
        token: u32,
        /// What the peer found.
        verdict: Verdict,
    },
    /// The sender's reactor serving `rails` (the sender's) is going to sleep, and its provider
    /// (shm) cannot wake it for the receiver's ops: the receiver kicks it (`Kick`) along with
    /// its next op on those rails, else that op would wait out the sender's nap (up to several
    /// milliseconds). An op on the sender's other rails (another reactor's: with an express
    /// rail, the latency class beside an idle bulk reactor) kicks nobody.
    Asleep {
        /// The sender's rails that reactor serves.
        rails: RailSet,
    },
    /// Wake up the reactor serving `rails` (the receiver's): an op of the sender's on them
    /// needs its progress.
    Kick {
        /// The receiver's rails the op reaches.
        rails: RailSet,
    },
    /// The sender lost this peer of its own accord (it misbehaved, or refused an op that shm
    /// leaves pending): the connection ends after this, and the receiver loses the sender.
    Goodbye {
        /// Why, for the receiver's error (at most `MAX_REASON` bytes).
        reason: String,
    },
}

/// What a peer found when asked whether a one-sided op was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The key, range and access were valid: the failure was the link's.
    Allowed,
    /// No region is exposed under the key (never was, or revoked).
    UnknownKey,
    /// The range is outside the region exposed under the key.
    OutOfRange,
    /// The region is not exposed for that access (a write to a read-only region).
    NotPermitted,
}

impl Verdict {
    /// Why the peer refused, for the error text; `None` when it did not.
    pub(crate) fn refusal(self) -> Option<&'static str> {
        match self {
            Verdict::Allowed => None,
            Verdict::UnknownKey => Some("no region is exposed under that key (never, or revoked)"),
            Verdict::OutOfRange => Some("the range is outside the region exposed under that key"),
            Verdict::NotPermitted => Some("the region is not exposed for that access"),
        }
    }
}

/// How the receiver of an offer dealt with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pulled {
    /// The whole message is in the receive buffer.
    Whole,
    /// The receive buffer (this many bytes) was too small; nothing was read.
    TooSmall(u64),
    /// Reading failed; the receive failed with the reason.
    Failed,
}

impl Ctl {
    /// The wire form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Ctl::Heartbeat => vec![HEARTBEAT],
            Ctl::Asleep { rails } => [&[ASLEEP][..], &rails.0.to_le_bytes()].concat(),
            Ctl::Kick { rails } => [&[KICK][..], &rails.0.to_le_bytes()].concat(),
            Ctl::Offer { token, desc } => {
                let d = desc.to_bytes();
                let mut out = Vec::with_capacity(7 + d.len());
                out.push(OFFER);
                out.extend_from_slice(&token.to_le_bytes());
                out.extend_from_slice(&(d.len() as u16).to_le_bytes());
                out.extend_from_slice(&d);
                out
            }
            Ctl::Withdrawn { token } => {
                let mut out = vec![WITHDRAWN];
                out.extend_from_slice(&token.to_le_bytes());
                out
            }
            Ctl::Done { token, outcome } => {
                let (code, extra) = match outcome {
                    Pulled::Whole => (0u8, 0u64),
                    Pulled::TooSmall(n) => (1, *n),
                    Pulled::Failed => (2, 0),
                };
                let mut out = Vec::with_capacity(14);
                out.push(DONE);
                out.extend_from_slice(&token.to_le_bytes());
                out.push(code);
                out.extend_from_slice(&extra.to_le_bytes());
                out
            }
            Ctl::Check { token, key, addr, len, write } => {
                let mut out = Vec::with_capacity(30);
                out.push(CHECK);
                out.extend_from_slice(&token.to_le_bytes());
                for v in [key, addr, len] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.push(u8::from(*write));
                out
            }
            Ctl::Verdict { token, verdict } => {
                let mut out = vec![VERDICT];
                out.extend_from_slice(&token.to_le_bytes());
                out.push(*verdict as u8);
                out
            }
            Ctl::Goodbye { reason } => {
                let reason = cut_reason(reason);
                let mut out = vec![GOODBYE];
                out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                out.extend_from_slice(reason.as_bytes());
                out
            }
        }
    }

    /// Read one message. The outer error is the socket's; the inner one names a protocol
    /// violation.
    pub(crate) async fn read<R: AsyncRead + Unpin>(rd: &mut R) -> std::io::Result<Result<Ctl, String>> {
        let kind = rd.read_u8().await?;
        Ok(match kind {
            HEARTBEAT => Ok(Ctl::Heartbeat),
            ASLEEP => Ok(Ctl::Asleep { rails: RailSet(rd.read_u32_le().await?) }),
            KICK => Ok(Ctl::Kick { rails: RailSet(rd.read_u32_le().await?) }),
            OFFER => {
                let token = rd.read_u32_le().await?;
                let n = rd.read_u16_le().await? as usize;
                if n > RemoteBuf::MAX_ENCODED_LEN {
                    return Ok(Err(format!("an offer of {n} descriptor bytes")));
                }
                let mut d = vec![0u8; n];
                rd.read_exact(&mut d).await?;
                RemoteBuf::from_bytes(&d)
                    .map(|desc| Ctl::Offer { token, desc })
                    .map_err(|e| format!("offer {token}: {e}"))
            }
            DONE => {
                let token = rd.read_u32_le().await?;
                let code = rd.read_u8().await?;
                let extra = rd.read_u64_le().await?;
                match code {
                    0 => Ok(Ctl::Done { token, outcome: Pulled::Whole }),
                    1 => Ok(Ctl::Done { token, outcome: Pulled::TooSmall(extra) }),
                    2 => Ok(Ctl::Done { token, outcome: Pulled::Failed }),
                    c => Err(format!("done {token} with outcome {c}")),
                }
            }
            CHECK => {
                let token = rd.read_u32_le().await?;
                let key = rd.read_u64_le().await?;
                let addr = rd.read_u64_le().await?;
                let len = rd.read_u64_le().await?;
                match rd.read_u8().await? {
                    w @ (0 | 1) => Ok(Ctl::Check { token, key, addr, len, write: w == 1 }),
                    w => Err(format!("check {token} with access {w}")),
                }
            }
            VERDICT => {
                let token = rd.read_u32_le().await?;
                match rd.read_u8().await? {
                    0 => Ok(Ctl::Verdict { token, verdict: Verdict::Allowed }),
                    1 => Ok(Ctl::Verdict { token, verdict: Verdict::UnknownKey }),
                    2 => Ok(Ctl::Verdict { token, verdict: Verdict::OutOfRange }),
                    3 => Ok(Ctl::Verdict { token, verdict: Verdict::NotPermitted }),
                    v => Err(format!("verdict {token} of {v}")),
                }
            }
            WITHDRAWN => Ok(Ctl::Withdrawn { token: rd.read_u32_le().await? }),
            GOODBYE => {
                let n = rd.read_u16_le().await? as usize;
                if n > MAX_REASON {
                    return Ok(Err(format!("a goodbye of {n} bytes")));
                }
                let mut r = vec![0u8; n];
                rd.read_exact(&mut r).await?;
                Ok(Ctl::Goodbye { reason: String::from_utf8_lossy(&r).into_owned() })
            }
            k => Err(format!("unknown message kind {k:#x}")),
        })
    }
}

/// The part of a goodbye's reason that goes on the wire: its first `MAX_REASON` bytes, cut on a
/// character boundary.
fn cut_reason(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Decode `bytes` as a stream of control messages until it ends or a message is malformed:
/// the fuzz target and the property tests drive the real decoder through this.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decode_all(mut bytes: &[u8]) -> Result<Vec<Ctl>, String> {
    futures::executor::block_on(async {
        let mut out = Vec::new();
        loop {
            match Ctl::read(&mut bytes).await {
                Ok(Ok(m)) => out.push(m),
                Ok(Err(why)) => return Err(why),
                Err(_) => return Ok(out),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::base::transport::Access;

    fn offer(token: u32, len: u64, keys: &[u64]) -> Ctl {
        Ctl::Offer { token, desc: RemoteBuf::new(9, 4096, len, keys, Access::READ) }
    }

    proptest! {
        #[test]
        fn messages_round_trip(
            token in any::<u32>(),
            len in 1u64..1 << 40,
            keys in proptest::collection::vec(any::<u64>(), 1..8),
            small in any::<u64>(),
            reason in ".{0,300}",
        ) {
            let msgs = vec![
                Ctl::Heartbeat,
                Ctl::Asleep { rails: RailSet(small as u32) },
                Ctl::Kick { rails: RailSet((small >> 32) as u32) },
                offer(token, len, &keys),
                Ctl::Withdrawn { token },
                Ctl::Done { token, outcome: Pulled::Whole },
                Ctl::Done { token, outcome: Pulled::TooSmall(small) },
                Ctl::Done { token, outcome: Pulled::Failed },
                Ctl::Check { token, key: small, addr: len, len: small ^ len, write: token % 2 == 0 },
                Ctl::Verdict { token, verdict: Verdict::Allowed },
                Ctl::Verdict { token, verdict: Verdict::UnknownKey },
                Ctl::Verdict { token, verdict: Verdict::OutOfRange },
                Ctl::Verdict { token, verdict: Verdict::NotPermitted },
                Ctl::Goodbye { reason: reason.clone() },
            ];
            let bytes: Vec<u8> = msgs.iter().flat_map(|m| m.encode()).collect();
            let mut expected = msgs;
            // A reason is cut to its first MAX_REASON bytes (on a character boundary).
            let cut = cut_reason(&reason);
            prop_assert!(cut.len() <= MAX_REASON && reason.starts_with(cut));
            prop_assert!(reason.len() <= MAX_REASON || cut.len() + 4 > MAX_REASON);
            *expected.last_mut().unwrap() = Ctl::Goodbye { reason: cut.to_string() };
            prop_assert_eq!(decode_all(&bytes), Ok(expected));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_all(&bytes);
        }
    }

    #[test]
    fn an_oversized_offer_is_refused_before_its_body_is_read() {
        let mut b = vec![OFFER, 1, 0, 0, 0];
        b.extend_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_all(&b).unwrap_err().contains("65535 descriptor bytes"));
        assert!(decode_all(&[0x00]).unwrap_err().contains("unknown message kind"));
        assert!(decode_all(&[GOODBYE, 0xff, 0xff]).unwrap_err().contains("a goodbye of 65535 bytes"));
    }
}
