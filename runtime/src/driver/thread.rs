//! The dedicated reactor thread: pinned to a core, busy-polls while ops are in flight, spins a
//! little when idle, then sleeps on the transport's wait object (or short timed naps where the
//! provider has none, or it was opened without one: `Builder::cq_wait`) until a submitter, the
//! NIC or a peer's kick wakes it.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::driver::lend::Lend;
use crate::driver::spin_window::SpinWindow;
use crate::reactor::{Idle, Reactor};

/// How the thread idles.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdlePolicy {
    /// Busy-spin this long after the last work before sleeping: the set window, which
    /// `SpinWindow` widens while peers' traffic ends each sleep at once.
    pub spin: Duration,
    /// The longest single sleep (bounds the latency of noticing work on providers without a
    /// wait object).
    pub max_sleep: Duration,
    /// The transport sleeps on a wait object its traffic signals (tcp's CQ fd, verbs'
    /// completion channel): a sleep that ends early was ended by traffic.
    pub woken_by_traffic: bool,
}

/// The first nap after the idle spin.
const NAP_MIN: Duration = Duration::from_micros(50);

/// Idle turns between two looks at the clock while the reactor spins idle.
const SPIN_LOOK: u32 = 16;

/// Start the thread of the reactor of rail group `group` (named `rdmalane-reactor`, or
/// `rdmalane-rg<group>` past the first: the kernel keeps 15 bytes of a thread's name).
/// `lend`: spinning tasks may turn this reactor themselves (see `lend`).
pub(crate) fn spawn(
    reactor: Reactor,
    group: usize,
    core: Option<usize>,
    idle: Arc<Idle>,
    policy: IdlePolicy,
    lend: Option<Arc<Lend>>,
) -> std::io::Result<JoinHandle<()>> {
    let mut reactor = Box::new(reactor);
    let name = if group == 0 { "rdmalane-reactor".to_string() } else { format!("rdmalane-rg{group}") };
    std::thread::Builder::new().name(name).spawn(move || {
        if let Some(l) = &lend {
            l.set_thread(std::thread::current());
        }
        if let Some(core) = core {
            if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                tracing::debug!(core, "reactor pinned");
            } else {
                tracing::warn!(core, "could not pin the reactor thread");
            }
        }
        // Since when nothing happened: read once work stops, not on each busy turn, and looked
        // at every `SPIN_LOOK` idle turns (a clock read costs a good part of an idle turn).
        let mut idle_since: Option<Instant> = None;
        let mut idle_turns = 0u32;
        // Idle, the reactor only serves peers: its transport may space its reads further (a
        // shm target read back to back slowed the writes into it: 16 B awaited writes on 16
        // cores took 2.2-2.5 µs against 1.9-2.1 with reads spaced three times as far).
        let mut serving = false;
        // Naps grow from short to `max_sleep` while nothing happens: a provider without a wait
        // object (shm) cannot wake us for an incoming message, so right after traffic we nap
        // briefly, and only a long-idle reactor sleeps long.
        let mut nap = NAP_MIN;
        let mut window = SpinWindow::new(policy.spin);
        loop {
            if idle.shutdown.load(Ordering::Acquire) {
                break;
            }
            if let Some(lend) = lend.as_ref().filter(|l| l.wanted()) {
                // The task that takes it spins for an op of its own.
                if std::mem::take(&mut serving) {
                    reactor.set_serving(false);
                }
                match lend.lend_out(reactor) {
                    Some(r) => reactor = r,
                    // Stopping while a task holds it: that task stops it.
                    None => return,
                }
                if idle_since.take().is_some() {
                    window.work();
                }
                nap = NAP_MIN;
                continue;
            }
            if reactor.turn() || reactor.busy() {
                if idle_since.take().is_some() {
                    window.work();
                }
                nap = NAP_MIN;
                if reactor.busy() && std::mem::take(&mut serving) {
                    reactor.set_serving(false);
                }
                continue;
            }
            if idle.shutdown.load(Ordering::Acquire) || reactor.orphaned() {
                break;
            }
            let since = *idle_since.get_or_insert_with(|| {
                idle_turns = 0;
                window.begin();
                Instant::now()
            });
            if !serving {
                serving = true;
                reactor.set_serving(true);
            }
            idle_turns = idle_turns.wrapping_add(1);
            if !idle_turns.is_multiple_of(SPIN_LOOK) || window.spin_on(since.elapsed()) {
                std::hint::spin_loop();
                continue;
            }
            // Peers' one-sided ops served meanwhile count as work: shm's checked path serves
            // them in our progress and raises no completion, so without this look a stream of
            // them would wait out a nap each. Looked at once a spin window, not every turn:
            // the look is a progress call of its own.
            if reactor.peers_served() {
                idle_since = None;
                nap = NAP_MIN;
                continue;
            }
            // Announce the sleep, then look once more: a submitter either sees the flag and
            // notifies, or its command is already in the queue for this turn.
            idle.sleeping.store(true, Ordering::SeqCst);
            // A task that asked for the reactor either sees the flag and notifies, or is seen
            // here (both sides order their store before their look).
            let wanted = lend.as_ref().is_some_and(|l| l.wanted());
            if !wanted && !reactor.turn() && !idle.shutdown.load(Ordering::SeqCst) {
                reactor.announce_sleep();
                let longest = reactor.longest_nap().unwrap_or(policy.max_sleep).min(policy.max_sleep);
                let asked = nap.min(longest);
                let slept = Instant::now();
                reactor.transport_mut().wait(asked);
                let slept = slept.elapsed();
                let woken = policy.woken_by_traffic && slept < asked / 2;
                // A submitter's notify or a task's ask ends the sleep the same way: no stream.
                let local =
                    idle.commands.load(Ordering::Acquire) > 0 || lend.as_ref().is_some_and(|l| l.wanted());
                window.slept(slept, woken && !local);
                if woken {
                    // Woken by the wait object, not by the time: traffic. A peer's one-sided op
                    // our progress serves raises no completion here, so without this each of a
                    // stream of them would find the reactor asleep again and pay a wake-up
                    // (tcp, 16 B awaited writes: 24 µs a write instead of 11). Spin again.
                    idle_since = None;
                    nap = NAP_MIN;
                } else {
                    nap = (nap * 2).min(longest);
                }
            }
            // The next round's turn looks right away; it starts the spin window only when
            // something happened. (No turn of its own here: on a provider without a wait object
            // each turn is a progress call, and an idle reactor wakes hundreds of times a second.)
            idle.sleeping.store(false, Ordering::SeqCst);
        }
        reactor.shutdown(crate::reactor::SHUTDOWN_LIMIT);
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::base::error::OpKind;
    use crate::base::transport::WrKind;
    use crate::reactor::cmd::Cmd;
    use crate::reactor::tests::{rig, split_config, Rig};

    #[test]
    fn a_reactor_thread_says_it_only_serves_once_idle_and_not_while_its_ops_are_out() {
        use std::sync::atomic::Ordering;
        let mut rig = rig(split_config(8), 1);
        let first = rig.write(16);
        let (req, second) =
            rig.req(OpKind::Write, WrKind::Write { remote_addr: 1 << 40, key: 9, imm: None }, 0, 16);
        let Rig { r, script, idle, tx, mem, told, .. } = rig;
        let policy = IdlePolicy {
            spin: Duration::from_millis(1),
            max_sleep: Duration::from_millis(1),
            woken_by_traffic: false,
        };
        let thread = spawn(r, 0, None, idle.clone(), policy, None).expect("a thread");
        let until = |what: &str, f: &dyn Fn() -> bool| {
            let t0 = Instant::now();
            while !f() {
                assert!(t0.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(script.serving(), Vec::<bool>::new(), "busy with its write, it never serves only");
        let id = script.pending()[0].id;
        script.complete(id, Ok(()));
        until("the idle reactor to serve only", &|| script.serving() == [true]);
        assert!(first.is_done());
        // An op of its own out again: reads go back to the plain spacing.
        tx.send(Cmd::Op(req)).expect("the reactor listens");
        idle.commands.fetch_add(1, Ordering::SeqCst);
        until("the write to be posted", &|| script.pending().len() == 1);
        until("serving to end", &|| script.serving() == [true, false]);
        let id = script.pending()[0].id;
        script.complete(id, Ok(()));
        until("the reactor to serve only again", &|| script.serving() == [true, false, true]);
        assert!(second.is_done());
        idle.shutdown.store(true, Ordering::SeqCst);
        thread.join().expect("the reactor thread ends");
        drop((mem, told));
    }
}
