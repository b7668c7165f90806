//! `RemoteBuf::from_bytes` on a peer's bytes; what decodes must round-trip.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmalane::fuzzing::descriptor(data);
});
