//! Who turns the reactor: a thread of its own ([`thread`]), or the caller of
//! `Runtime::block_on` between polls of its future ([`inline`]); and how a task waits for a
//! reactor thread's completion ([`handoff`]), or turns the thread's reactor itself ([`lend`]).
pub(crate) mod handoff;
pub(crate) mod inline;
pub(crate) mod lend;
pub(crate) mod thread;
