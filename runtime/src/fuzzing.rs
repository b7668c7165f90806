//! Entry points for the fuzz targets (`fuzz/`, `scripts/fuzz.sh`): the decoders a peer's bytes
//! reach, driven exactly as the runtime drives them. Not part of the API.

/// Decode a handshake hello from raw bytes; `Ok` with the lane addresses it carried.
pub fn hello(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    crate::bootstrap::decode_hello(bytes)
}

/// Run a listener's handshake state machine on a stranger's bytes, read in the pieces `cuts`
/// gives (one byte each: the length of the next read), with and without a shared secret. Panics
/// if the machine breaks a rule it must keep whatever the bytes (see `drive_acceptor_with`).
pub fn handshake(bytes: &[u8]) {
    let (cuts, bytes) = match bytes.split_first() {
        Some((&n, rest)) => rest.split_at((n as usize % 16).min(rest.len())),
        None => (&[][..], bytes),
    };
    let _ = crate::bootstrap::drive_acceptor_with(bytes, cuts, None);
    let _ = crate::bootstrap::drive_acceptor_with(bytes, cuts, Some(b"secret"));
}

/// Decode a descriptor; a decoded one must encode back to the same bytes and decode again to
/// an equal descriptor (panics otherwise, which the fuzzer reports).
pub fn descriptor(bytes: &[u8]) {
    if let Ok(d) = crate::RemoteBuf::from_bytes(bytes) {
        let again = crate::RemoteBuf::from_bytes(&d.to_bytes()).expect("a decoded descriptor re-encodes");
        assert_eq!(again.to_bytes(), d.to_bytes(), "descriptor round trip");
    }
}

/// Decode a stream of control-connection messages (what a peer sends after the handshake).
pub fn control(bytes: &[u8]) {
    let _ = crate::base::control::decode_all(bytes);
}
