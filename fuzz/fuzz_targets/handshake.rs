//! The listener's whole handshake state machine on a stranger's bytes, read in pieces the
//! input chooses, with and without a shared secret: it must refuse or finish, never panic, ask
//! for more than a field's limit, or answer with more than a handshake's bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmalane::fuzzing::handshake(data);
});
