//! The control connection's decoder on a peer's bytes (after the handshake): a stream of
//! messages, read until it ends or a message is malformed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmalane::fuzzing::control(data);
});
