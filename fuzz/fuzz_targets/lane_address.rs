//! The verbs backend's lane address decoder (QP numbers, PSNs, GID from the handshake).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmalane_verbs::fuzzing::lane_address(data);
});
