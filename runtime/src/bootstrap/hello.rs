//! The hello each side sends first: magic, version, runtime id, a nonce, whether a shared secret
//! is required, rails, provider and one fabric address per lane. Encoded whole; decoded field by
//! field from a stranger's bytes, refusing anything malformed before it allocates more than one
//! field's limit, and asking for exactly the bytes the next field needs (the socket is never
//! read past the handshake).
use crate::base::lane_map::LaneMap;
use crate::base::refusal::{Failure, RefusalReason};

pub(super) const MAGIC: &[u8; 4] = b"RDLN";

/// The handshake's protocol version: peers of another version are refused at connect.
// 4: the control connection carries framed messages (`control`), not only heartbeat bytes.
// 5: `Asleep` and `Kick`, so a reactor asleep on shm is woken for its peers' ops.
// 6: the express flag, which moves the bulk lanes off rail 0 (`LaneMap`).
pub const PROTOCOL_VERSION: u16 = 7;

/// Lanes a hello may carry.
pub(super) const MAX_LANES: usize = 64;
/// The longest lane address a hello may carry.
pub(super) const MAX_NAME: usize = 1024;
/// The longest provider name a hello may carry.
const MAX_PROVIDER: usize = 64;

/// One side's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub id: u64,
    /// Fresh random bytes the peer's proof of the shared secret must cover.
    pub nonce: [u8; 32],
    /// This side requires the shared secret.
    pub auth: bool,
    pub provider: String,
    /// Rails this side spans: its lane i runs on rail `self.map().rail_of(i)`.
    pub rails: u8,
    /// Its rail 0 is an express rail (flag bit 1).
    pub express: bool,
    /// One fabric address per lane.
    pub names: Vec<Vec<u8>>,
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.names.iter().map(|n| n.len() + 2).sum::<usize>());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        out.push(u8::from(self.auth) | u8::from(self.express) << 1);
        out.push(self.rails);
        out.extend_from_slice(&(self.provider.len() as u16).to_le_bytes());
        out.extend_from_slice(self.provider.as_bytes());
        out.push(self.names.len() as u8);
        for name in &self.names {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
        }
        out
    }

    /// How this side's lanes sit on its rails.
    pub(crate) fn map(&self) -> LaneMap {
        LaneMap { rails: usize::from(self.rails.max(1)), express: self.express }
    }
}

/// The field the reader waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Magic,
    Version,
    Id,
    Nonce,
    Flags,
    Rails,
    ProviderLen,
    Provider,
    Count,
    NameLen,
    Name,
}

impl Field {
    /// Bytes of a fixed-size field; variable ones say their length in the field before.
    fn fixed(self) -> usize {
        match self {
            Field::Magic => 4,
            Field::Version | Field::ProviderLen | Field::NameLen => 2,
            Field::Id => 8,
            Field::Nonce => 32,
            Field::Flags | Field::Rails | Field::Count => 1,
            Field::Provider | Field::Name => 0,
        }
    }
}

/// Decodes one hello from bytes that arrive in any pieces.
#[derive(Debug)]
pub(super) struct HelloReader {
    field: Field,
    /// Bytes the current field still needs.
    need: usize,
    buf: Vec<u8>,
    /// Bytes taken so far (for error messages).
    taken: usize,
    lanes: usize,
    hello: Hello,
}

impl Default for HelloReader {
    fn default() -> Self {
        HelloReader {
            field: Field::Magic,
            need: Field::Magic.fixed(),
            buf: Vec::with_capacity(32),
            taken: 0,
            lanes: 0,
            hello: Hello {
                id: 0,
                nonce: [0; 32],
                auth: false,
                provider: String::new(),
                rails: 0,
                express: false,
                names: Vec::new(),
            },
        }
    }
}

fn bad(why: String) -> Failure {
    Failure::new(RefusalReason::BadHello, why)
}

impl HelloReader {
    /// Bytes the next read may take: exactly what the current field still needs (at least 1).
    pub(super) fn wants(&self) -> usize {
        self.need
    }

    /// Bytes taken so far.
    pub(super) fn taken(&self) -> usize {
        self.taken
    }

    /// Take bytes (at most [`wants`](Self::wants) are used; the caller reads no more). Returns
    /// the hello once its last field is in.
    pub(super) fn take(&mut self, mut bytes: &[u8]) -> Result<Option<Hello>, Failure> {
        while !bytes.is_empty() {
            let n = bytes.len().min(self.need);
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.need -= n;
            self.taken += n;
            if self.need == 0 {
                if let Some(h) = self.field_done()? {
                    return Ok(Some(h));
                }
            }
        }
        Ok(None)
    }

    /// The current field is complete: check it, then move on to the next one (skipping empty
    /// variable fields). Returns the hello after the last.
    fn field_done(&mut self) -> Result<Option<Hello>, Failure> {
        let b = std::mem::take(&mut self.buf);
        let u16_at = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) as usize;
        let mut next_len = None;
        let next = match self.field {
            Field::Magic => {
                if b[..] != MAGIC[..] {
                    return Err(bad("not an rdmalane peer (bad magic)".into()));
                }
                Field::Version
            }
            Field::Version => {
                let v = u16_at(&b) as u16;
                if v != PROTOCOL_VERSION {
                    let why = format!("protocol version {v}, this build speaks {PROTOCOL_VERSION}");
                    return Err(Failure::new(RefusalReason::WrongVersion, why));
                }
                Field::Id
            }
            Field::Id => {
                self.hello.id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                Field::Nonce
            }
            Field::Nonce => {
                self.hello.nonce.copy_from_slice(&b);
                Field::Flags
            }
            Field::Flags => {
                if b[0] > 3 {
                    return Err(bad(format!("unknown hello flags {:#x}", b[0])));
                }
                self.hello.auth = b[0] & 1 == 1;
                self.hello.express = b[0] & 2 == 2;
                Field::Rails
            }
            Field::Rails => {
                if b[0] == 0 || b[0] as usize > crate::base::MAX_RAILS {
                    return Err(bad(format!("{} rails (1 to {})", b[0], crate::base::MAX_RAILS)));
                }
                self.hello.rails = b[0];
                Field::ProviderLen
            }
            Field::ProviderLen => {
                let len = u16_at(&b);
                if len > MAX_PROVIDER {
                    return Err(bad(format!(
                        "provider name of {len} bytes exceeds the limit of {MAX_PROVIDER}"
                    )));
                }
                next_len = Some(len);
                Field::Provider
            }
            Field::Provider => {
                self.hello.provider =
                    String::from_utf8(b).map_err(|_| bad("provider name is not UTF-8".into()))?;
                Field::Count
            }
            Field::Count => {
                self.lanes = b[0] as usize;
                if self.lanes == 0 || self.lanes > MAX_LANES {
                    return Err(bad(format!("{} lanes (1 to {MAX_LANES})", self.lanes)));
                }
                self.hello.names.reserve_exact(self.lanes);
                Field::NameLen
            }
            Field::NameLen => {
                let len = u16_at(&b);
                if len > MAX_NAME {
                    return Err(bad(format!("lane address of {len} bytes exceeds the limit of {MAX_NAME}")));
                }
                // No provider's address is empty (the transport checks the rest of its form).
                if len == 0 {
                    return Err(bad("an empty lane address".into()));
                }
                next_len = Some(len);
                Field::Name
            }
            Field::Name => {
                // Each lane is an endpoint of its own. Two lanes at one address would share
                // the provider's address-vector entry, which closing either frees under the
                // other (efa's and shm's count no second user): its requests would then go
                // nowhere, or to whoever takes the entry next.
                if self.hello.names.contains(&b) {
                    return Err(bad(format!(
                        "lane {} repeats an earlier lane's address",
                        self.hello.names.len()
                    )));
                }
                self.hello.names.push(b);
                if self.hello.names.len() == self.lanes {
                    return Ok(Some(std::mem::replace(&mut self.hello, HelloReader::default().hello)));
                }
                Field::NameLen
            }
        };
        self.field = next;
        self.need = next_len.unwrap_or_else(|| next.fixed());
        self.buf = Vec::with_capacity(self.need);
        if self.need == 0 {
            // An empty provider name: complete as soon as it starts.
            return self.field_done();
        }
        Ok(None)
    }
}

/// Decode one hello from `bytes` as a listener reads it from a socket: the fuzz target and the
/// property tests drive the real decoder through this. Returns the lane addresses.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decode_hello(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut r = HelloReader::default();
    let mut rest = bytes;
    loop {
        if rest.is_empty() {
            return Err(format!("reading hello: early eof after {} bytes", r.taken()));
        }
        let n = r.wants().min(rest.len());
        match r.take(&rest[..n]) {
            Ok(Some(h)) => return Ok(h.names),
            Ok(None) => rest = &rest[n..],
            Err(f) => return Err(f.detail.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample(names: Vec<Vec<u8>>, provider: String, rails: u8) -> Hello {
        Hello { id: 7, nonce: [3; 32], auth: false, provider, rails, express: rails > 1, names }
    }

    #[test]
    fn a_version_other_than_ours_is_named_as_such() {
        let mut bytes = sample(vec![vec![1]], "shm".into(), 1).encode();
        bytes[4] = 4;
        let mut r = HelloReader::default();
        let e = r.take(&bytes).unwrap_err();
        assert_eq!(e.reason, RefusalReason::WrongVersion, "{e:?}");
    }

    #[test]
    fn bad_magic_is_refused_after_four_bytes() {
        let mut r = HelloReader::default();
        assert_eq!(r.wants(), 4);
        let e = r.take(b"GET ").unwrap_err();
        assert_eq!(e.reason, RefusalReason::BadHello);
    }

    #[test]
    fn an_empty_lane_address_is_refused() {
        let bytes = sample(vec![vec![]], "tcp".into(), 1).encode();
        let e = HelloReader::default().take(&bytes).unwrap_err();
        assert!(e.detail.contains("empty lane address"), "{e:?}");
    }

    #[test]
    fn a_lane_address_given_twice_is_refused() {
        let bytes = sample(vec![vec![1, 2], vec![3], vec![1, 2]], "shm".into(), 1).encode();
        let e = HelloReader::default().take(&bytes).unwrap_err();
        assert_eq!(e.reason, RefusalReason::BadHello);
        assert!(e.detail.contains("lane 2 repeats"), "{e:?}");
    }

    #[test]
    fn an_oversized_field_is_refused_before_it_is_read() {
        let mut bytes = sample(vec![vec![1]], "tcp".into(), 1).encode();
        // The provider length field sits after magic, version, id, nonce, flags and rails.
        let at = 4 + 2 + 8 + 32 + 1 + 1;
        bytes[at..at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        let mut r = HelloReader::default();
        let e = r.take(&bytes[..at + 2]).unwrap_err();
        assert!(e.detail.contains("exceeds the limit"), "{e:?}");
    }

    proptest! {
        #[test]
        fn hellos_round_trip_in_any_pieces(
            names in proptest::collection::hash_set(proptest::collection::vec(any::<u8>(), 1..300), 1..8),
            provider in "[a-z;_]{0,40}",
            rails in 1u8..=32,
            piece in 1usize..50,
        ) {
            let names: Vec<Vec<u8>> = names.into_iter().collect();
            let h = sample(names.clone(), provider, rails);
            let bytes = h.encode();
            prop_assert_eq!(decode_hello(&bytes), Ok(names));
            let mut r = HelloReader::default();
            let mut got = None;
            for chunk in bytes.chunks(piece) {
                let mut c = chunk;
                while !c.is_empty() {
                    let n = r.wants().min(c.len());
                    if let Some(done) = r.take(&c[..n]).unwrap() {
                        got = Some(done);
                    }
                    c = &c[n..];
                }
            }
            prop_assert_eq!(got, Some(h));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_hello(&bytes);
        }

        #[test]
        fn cut_or_flipped_hellos_fail_cleanly(cut in 0usize..200, flip in 0usize..200, bit in 0u8..8) {
            let mut bytes = sample((9..12).map(|b| vec![b; 40]).collect(), "tcp;ofi_rxm".into(), 2).encode();
            let flip = flip % bytes.len();
            bytes[flip] ^= 1 << bit;
            bytes.truncate(cut.min(bytes.len()));
            let _ = decode_hello(&bytes);
        }
    }
}
