//! Raw libfabric bindings, generated at build time by bindgen from the system headers.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
