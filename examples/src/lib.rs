//! Examples live beside this crate: see .
