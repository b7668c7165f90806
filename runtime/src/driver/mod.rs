//! Who turns the reactor: a thread of its own ([`thread`]), or the caller of
//! `Runtime::block_on` between polls of its future ([`inline`]); how a task waits for a reactor
//! thread's completion ([`handoff`]), or turns the thread's reactor itself ([`lend`]), as a
//! `block_on` does through its future's polls ([`lent_block_on`]); and how
//! long an idle reactor thread spins before it sleeps ([`spin_window`]).
pub(crate) mod handoff;
pub(crate) mod inline;
pub(crate) mod lend;
pub(crate) mod lent_block_on;
pub(crate) mod spin_window;
pub(crate) mod thread;
