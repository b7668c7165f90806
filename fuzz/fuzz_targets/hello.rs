//! The handshake's hello decoder, as the listener runs it on a stranger's bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rdmalane::fuzzing::hello(data);
});
