//! Who turns the reactor: a thread of its own ([`thread`]), or the caller of
//! `Runtime::block_on` between polls of its future ([`inline`]).
pub(crate) mod inline;
pub(crate) mod thread;
