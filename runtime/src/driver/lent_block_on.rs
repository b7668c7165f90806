//! `Runtime::block_on` on a runtime whose reactor thread lends its reactor (`lend`): the
//! calling thread is given to the future, so once a task of ours has put the lent reactor back
//! in the slot (its latency-class ops are in use), this `block_on` keeps it through its
//! future's polls and turns it between them, as the inline driver's does, instead of each op
//! taking it out of the slot and putting it back: two atomic swaps an op (the stage probe read
//! 20-45 ns each on the 16-core host).
//!
//! A poll after which the future woke itself (a run of ops that never waited, yielding) is
//! followed by the next at once, with no turn between, [`REPOLLS_MAX`] times in a row at most.
//!
//! The reactor goes back to its thread (which then serves everyone as before) when:
//! - a poll of the future polled no op (see [`op_polled`]); it stays with its thread then
//!   until a poll polls one;
//! - the future has been pending with nothing to do for the runtime's spin budget
//!   (`Builder::await_spin`): this thread then parks until woken;
//! - another task asks for it (they share it, as ops of two tasks do);
//! - the runtime stops;
//! - the future returns, or its poll unwinds.
//!
//! Ops polled meanwhile find it held on this thread and post and reap there, with their usual
//! waker and spin: a release at any point leaves every pending op with a waker the reactor
//! thread will wake. An op about to wait that another executor polled (its waker is not this
//! `block_on`'s: another executor's `block_on` nested in the future may park this thread) puts
//! the reactor back all the same (see `Lease::release`), and this `block_on` takes it again at
//! its next poll; one this `block_on` polled leaves it here, turned until the wake. Code the future runs between two awaits runs with the reactor held, as
//! under the inline driver, and what waits for that reactor meanwhile (another task's op, a
//! peer's one-sided op that needs this side's progress on tcp or shm) waits that long. So a
//! poll that ran [`LONG_POLL`] or more with the reactor held makes the next [`LONG_POLL_SKIP`]
//! polls run without it (their ops take it and put it back each, as under tokio): a future that
//! computes between awaits holds the reactor through one such stretch, not through each.
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::driver::inline;
use crate::driver::lend::Lend;

/// Turns between two looks at the clock while the future waits.
const LOOK: u32 = 64;

/// A poll this long with the reactor held computed between its awaits (see the module's doc).
/// Far above what a run of ops takes (a run yields after 20 µs, and an op's spin lasts 50 µs
/// at most): on a loaded 2-core host, a bound of 50 µs caught ping-pong polls stretched by
/// preemption and left the reactor to the ops in most polls (`Stats::task_holds` 37,000-46,000
/// for 20,000 round trips, against 84-764 with this bound, shm).
const LONG_POLL: Duration = Duration::from_millis(1);

/// Polls of the future that run without the reactor after a long one.
const LONG_POLL_SKIP: u32 = 64;

/// Polls in a row of a future that woke itself, held, run with no turn between them (see
/// [`block_on`]); the next one turns all the same, so a future that keeps waking itself
/// without turning still leaves the reactor turned every so often.
const REPOLLS_MAX: u32 = 8;

thread_local! {
    /// The runtime whose reactor this thread's keeping `block_on` may hold, and its future's
    /// waker (see [`keeps_for`]).
    static KEEPER: RefCell<Option<(u64, Waker)>> = const { RefCell::new(None) };
    /// Op polls on this thread so far (wrapping), so that a `block_on` sees whether its
    /// future's poll used any (see [`op_polled`]).
    static OP_POLLS: Cell<u32> = const { Cell::new(0) };
}

/// An op is being polled on this thread. A keeping `block_on` whose future's poll polled none
/// gives the reactor back: the future waits on something else (a target that only serves
/// peers' one-sided ops and watches its memory, as `lat --op write-await`'s does), and the
/// reactor thread, which turns it without pause, serves the peers better than turns between
/// polls of such a future (on 16 cores, shm: that write-await read 1.39x the raw engine kept,
/// against 1.10x).
#[inline]
pub(crate) fn op_polled() {
    OP_POLLS.set(OP_POLLS.get().wrapping_add(1));
}

/// Is `cx` the waker of a keeping `block_on` of runtime `rt` on this thread? An op it polls
/// that waits may leave the reactor held here: the `block_on` turns it until the wake.
pub(crate) fn keeps_for(rt: u64, cx: &Context<'_>) -> bool {
    KEEPER.with_borrow(|k| matches!(k, Some((id, w)) if *id == rt && cx.waker().will_wake(w)))
}

/// What a `block_on` found in [`KEEPER`], put back when it returns or unwinds (a nested one).
struct Keeper(Option<(u64, Waker)>);

impl Keeper {
    fn enter(rt: u64, waker: Waker) -> Keeper {
        Keeper(KEEPER.replace(Some((rt, waker))))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        KEEPER.set(self.0.take());
    }
}

/// The `block_on` thread's waker: raises its flag, and unparks the thread where the flag was
/// down (it may be parked then).
struct Wakeup {
    woken: AtomicBool,
    thread: Thread,
}

impl Wakeup {
    /// Was the future woken since the last look? (Lowers the flag.)
    fn take(&self) -> bool {
        self.woken.load(Ordering::Relaxed) && self.woken.swap(false, Ordering::Acquire)
    }
}

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            self.thread.unpark();
        }
    }
}

/// Run `fut` to completion on this thread, keeping runtime `rt`'s lent reactor (`lend`) while
/// it can be had and is of use (see the module's doc); `idle_for`: how long the future may wait
/// with the reactor held and nothing to do before it goes back.
pub(crate) fn block_on<F: Future>(lend: &Lend, rt: u64, idle_for: Duration, fut: F) -> F::Output {
    let _outer = inline::Driving::elsewhere();
    let mut fut = std::pin::pin!(fut);
    let wakeup = Arc::new(Wakeup { woken: AtomicBool::new(true), thread: std::thread::current() });
    let waker = Waker::from(wakeup.clone());
    let mut cx = Context::from_waker(&waker);
    let _keeper = Keeper::enter(rt, waker.clone());
    // Put back should anything here unwind.
    let mut lease = lend.lease();
    // When the future last did something (was polled, or a turn found work), looked at once per
    // `LOOK` turns.
    let mut since: Option<Instant> = None;
    let mut turns = 0u32;
    // Polls left to run without the reactor, after a long one.
    let mut skip = 0u32;
    // The last poll polled an op (else the reactor went back, and stays with its thread until
    // a poll polls one again: taken back at once, it would go back and forth at each poll of a
    // future that only watches memory, each time waking the thread).
    let mut used_ops = true;
    // Polls in a row just run again at once, having woken themselves.
    let mut repolls = 0u32;
    loop {
        if wakeup.take() {
            // In the slot means a task of ours put it back lately: take it for the poll, unless
            // another waits for it or the future lately computed long between awaits.
            if skip > 0 {
                skip -= 1;
                lease.release(true);
            } else if used_ops && !lend.wanted() {
                lease.hold(false);
            }
            let started = lease.held().then(Instant::now);
            let ops = OP_POLLS.get();
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                lease.release(true);
                return v;
            }
            if started.is_some_and(|t| t.elapsed() >= LONG_POLL) {
                skip = LONG_POLL_SKIP;
            }
            used_ops = OP_POLLS.get() != ops;
            if !used_ops && lease.held() {
                // Waiting on something else: the reactor thread serves from here.
                lease.release(false);
            }
            since = None;
            // A future that polled ops and woke itself is polled again at once: a run of
            // outcomes its ops took by spinning yields so that what it is joined with runs
            // (`handoff::yield_due`), and those ops turned the reactor as they spun. A turn
            // here adds a provider read to each such yield, which on tcp comes every two or
            // three ops of a ping-pong: with it, the stage probe read 0.4-0.7 µs from the turn
            // that completed an op to the op's result (inline driver: 0.04-0.09 µs), and
            // tcp's 16 B `lat` sat 0.6 µs higher (see the book's benchmarks).
            let again = used_ops && wakeup.woken.load(Ordering::Acquire);
            if again && repolls < REPOLLS_MAX && lease.held() && !lend.wanted() && !lend.stopping() {
                repolls += 1;
                continue;
            }
            repolls = 0;
        }
        if lease.held() {
            if lend.wanted() || lend.stopping() {
                // Shared, or due back to stop: its thread (or the asker) has it from here.
                lease.release(true);
                continue;
            }
            let mut work = false;
            inline::turn_held(rt, |r| work = r.turn());
            turns = turns.wrapping_add(1);
            if work {
                since = None;
            } else if turns.is_multiple_of(LOOK) {
                let now = Instant::now();
                if now.saturating_duration_since(*since.get_or_insert(now)) >= idle_for {
                    // Nothing for a while: the thread serves from here, and this one parks.
                    lease.release(false);
                }
            }
            continue;
        }
        // Not held: woken by the ops' wakers as any executor is. Never parked with the reactor
        // on this thread (an outer `block_on`'s hold, this one nested in its future): its turns
        // would stop with this future's completions in it.
        if inline::holds(rt) && !wakeup.woken.load(Ordering::Acquire) {
            let mut outer = lend.lease();
            outer.hold(false);
            outer.release(false);
        }
        while !wakeup.woken.load(Ordering::Acquire) {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::transport::Notify;
    use crate::reactor::tests::{rig, split_config};

    struct Quiet;
    impl Notify for Quiet {
        fn notify(&self) {}
    }

    /// Run `f` on a lend of runtime `rt` whose reactor (a scripted one) waits in the slot, with
    /// no lending thread; the reactor must be back in the slot when `f` returns.
    fn with_lent(rt: u64, f: impl FnOnce(&Lend)) {
        let rig = rig(split_config(8), 1);
        let lend = Lend::new(rt, rig.idle.clone(), Arc::new(Quiet), false);
        lend.put_for_test(Box::new(rig.r));
        f(&lend);
        let r = lend.take_for_test().expect("back in the slot");
        drop((r, rig.script, rig.told, rig.mem, rig.tx));
    }

    /// Run a future under `block_on` whose `n`th poll (from 1) runs `poll(cx, n)` and, unless
    /// that says the future is done, wakes itself again; which of its polls began with the
    /// reactor held on this thread.
    fn held_in_polls(
        lend: &Lend,
        rt: u64,
        idle_for: Duration,
        mut poll: impl FnMut(&mut Context<'_>, usize) -> bool,
    ) -> Vec<bool> {
        let mut held = Vec::new();
        block_on(
            lend,
            rt,
            idle_for,
            std::future::poll_fn(|cx| {
                held.push(inline::holds(rt));
                if poll(cx, held.len()) {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }),
        );
        held
    }

    #[test]
    fn it_keeps_a_reactor_found_in_the_slot_across_polls_and_gives_it_back_once_idle_and_on_return() {
        let rt = u64::MAX - 21;
        with_lent(rt, |lend| {
            let mut polls = 0;
            let held_in_polls = std::cell::Cell::new(0);
            let out = block_on(
                lend,
                rt,
                Duration::from_millis(1),
                std::future::poll_fn(|cx| {
                    op_polled();
                    polls += 1;
                    if inline::holds(rt) {
                        held_in_polls.set(held_in_polls.get() + 1);
                    }
                    if polls < 3 {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    Poll::Ready(polls)
                }),
            );
            assert_eq!(out, 3);
            assert_eq!(held_in_polls.get(), 3, "every poll ran with the reactor held");
            assert!(!inline::holds(rt), "given back on return");
            assert_eq!(lend.holds(), 1, "taken once, put back once");

            // Pending with nothing to do: the reactor goes back after the idle budget, and a wake
            // from another thread still ends the wait.
            let waker = std::sync::Mutex::new(None::<Waker>);
            let t0 = Instant::now();
            let back_while_waiting = std::thread::scope(|s| {
                let waking = s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    let back = lend.holds();
                    let w = waker.lock().expect("not poisoned").take().expect("the future waits");
                    w.wake();
                    back
                });
                let mut first = true;
                block_on(
                    lend,
                    rt,
                    Duration::from_millis(1),
                    std::future::poll_fn(|cx| {
                        op_polled();
                        if std::mem::take(&mut first) {
                            *waker.lock().expect("not poisoned") = Some(cx.waker().clone());
                            return Poll::Pending;
                        }
                        Poll::Ready(())
                    }),
                );
                waking.join().expect("the waking thread ends")
            });
            assert!(t0.elapsed() >= Duration::from_millis(50));
            assert!(t0.elapsed() < Duration::from_secs(5));
            assert_eq!(back_while_waiting, 2, "given back once idle, before the wake");
            assert_eq!(lend.holds(), 3, "taken again for the woken poll, given back on return");
        });
    }

    #[test]
    fn a_future_that_polls_ops_and_wakes_itself_is_polled_again_with_no_turn_between_until_the_cap() {
        let rt = u64::MAX - 24;
        with_lent(rt, |lend| {
            let turns = || inline::with_held(rt, (), |r, ()| r.turns()).expect("held in the poll");
            let n = (REPOLLS_MAX as usize + 1) * 2 + 1;
            let mut seen = Vec::new();
            block_on(
                lend,
                rt,
                Duration::from_millis(100),
                std::future::poll_fn(|cx| {
                    op_polled();
                    seen.push(turns());
                    if seen.len() < n {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    Poll::Ready(())
                }),
            );
            // Turns between each poll and the next: none for `REPOLLS_MAX` in a row, then one.
            let between: Vec<u32> = seen.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
            let mut want = vec![0; REPOLLS_MAX as usize];
            want.push(1);
            assert_eq!(between[..want.len()], want[..], "{between:?}");
            assert_eq!(between[want.len()..want.len() * 2], want[..], "{between:?}");
            assert!(!inline::holds(rt), "given back on return");
        });
    }

    #[test]
    fn a_poll_that_computes_long_with_the_reactor_makes_the_next_ones_run_without_it() {
        let rt = u64::MAX - 23;
        with_lent(rt, |lend| {
            let budget = Duration::from_millis(1);
            // Which polls ran with the reactor held: the first computes for long.
            let held = held_in_polls(lend, rt, budget, |_, n| {
                op_polled();
                if n == 1 {
                    std::thread::sleep(LONG_POLL * 2);
                }
                n == LONG_POLL_SKIP as usize + 3
            });
            let skipped = LONG_POLL_SKIP as usize;
            assert!(held[0], "the first poll had it");
            assert!(held[1..=skipped].iter().all(|h| !h), "the next {skipped} ran without it: {held:?}");
            assert!(held[skipped + 1], "then it is kept again");
            assert!(!inline::holds(rt));
        });
    }

    #[test]
    fn a_future_whose_poll_polled_no_op_gives_the_reactor_back_and_leaves_it_until_it_polls_one() {
        let rt = u64::MAX - 24;
        with_lent(rt, |lend| {
            // Which polls ran with the reactor held: the third polls an op.
            let held = held_in_polls(lend, rt, Duration::from_secs(10), |_, n| {
                if n == 3 {
                    op_polled();
                }
                n == 4
            });
            assert_eq!(held, [true, false, false, true], "back after a poll with no op, kept after one with");
            assert_eq!(lend.holds(), 2, "given back after the first, and on return");
        });
    }

    #[test]
    fn an_op_another_executor_polls_puts_a_kept_reactor_back_before_it_waits_and_one_of_ours_keeps_it() {
        let rt = u64::MAX - 25;
        with_lent(rt, |lend| {
            // Which polls ran with the reactor held; in each, a pending op's poll as `Op::poll`
            // makes it: a nested lease, let go of as the op waits.
            let held = held_in_polls(lend, rt, Duration::from_secs(10), |cx, n| {
                op_polled();
                let mut lease = lend.lease();
                match n {
                    1 => {
                        // Polled with this block_on's waker: it turns the reactor until the wake.
                        assert!(lease.hold(false) && lease.is_nested(), "inside the kept hold");
                        assert!(keeps_for(rt, cx));
                        lease.release(keeps_for(rt, cx));
                        assert!(inline::holds(rt), "kept while our op waits");
                    }
                    2 => {
                        // Polled by another executor nested here, which may park the thread.
                        let noop = futures::task::noop_waker();
                        let other = Context::from_waker(&noop);
                        assert!(lease.hold(false) && lease.is_nested(), "inside the kept hold");
                        assert!(!keeps_for(rt, &other));
                        lease.release(keeps_for(rt, &other));
                        assert!(!inline::holds(rt), "back in the slot before that op waits");
                    }
                    _ => return true,
                }
                false
            });
            assert_eq!(held, [true, true, true], "taken again from the slot for the next poll");
            assert_eq!(lend.holds(), 2, "put back by the nested op, and on return");
            assert!(!inline::holds(rt));
        });
    }

    #[test]
    fn it_leaves_the_reactor_to_a_task_that_asks() {
        let rt = u64::MAX - 22;
        with_lent(rt, |lend| {
            let asked = AtomicBool::new(false);
            std::thread::scope(|s| {
                let other = s.spawn(|| {
                    let t0 = Instant::now();
                    while !asked.load(Ordering::Acquire) {
                        assert!(t0.elapsed() < Duration::from_secs(5), "the block_on holds it");
                        std::thread::yield_now();
                    }
                    let mut lease = lend.lease();
                    while !lease.hold(true) {
                        assert!(t0.elapsed() < Duration::from_secs(5), "the block_on lets it go");
                        std::thread::yield_now();
                    }
                    lease.release(true);
                });
                block_on(
                    lend,
                    rt,
                    Duration::from_secs(10),
                    std::future::poll_fn(|cx| {
                        op_polled();
                        if inline::holds(rt) {
                            asked.store(true, Ordering::Release);
                        }
                        if other.is_finished() {
                            return Poll::Ready(());
                        }
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }),
                );
            });
            assert!(lend.holds() >= 2, "the block_on's and the task's holds went back");
        });
    }
}
