//! A task whose latency-class op spins turns the reactor its thread lends it
//! (`Builder::await_drive`), on real providers: ping-pongs, awaited writes and reads move
//! byte-exact with the reactor moving between the tasks and the thread, `Stats::task_holds`
//! counts the holds (none with the lend turned off), ops dropped while a task holds the
//! reactor keep their buffers until done, and a runtime stops while tasks are taking it; all
//! of it also with the lending thread napping while the reactor is out (`Builder::lend_nap`).
use std::time::Duration;

use rdmalane::{Access, Runtime};
use rdmalane_conformance::{bounded, drop_write_mid_flight, expose_to, filled, pair, providers, watchdog};

fn runtime(p: &str, drive: bool) -> Runtime {
    lending(p, drive, false)
}

/// `nap`: the lending thread parks between its looks while a task has the reactor.
fn lending(p: &str, drive: bool, nap: bool) -> Runtime {
    rdmalane_conformance::builder(p)
        .await_spin(Duration::from_micros(200))
        .await_drive(drive)
        .lend_nap(nap)
        .build()
        .unwrap_or_else(|e| panic!("runtime on {p}: {e}"))
}

/// `rounds` of: a 16 B message each way, an awaited 16 B write and a read back of it, every
/// byte checked.
async fn rounds(a: &Runtime, b: &Runtime, rounds: usize, p: &str) {
    let (ab, ba) = pair(a, b).await;
    let (target, remote) = expose_to(&ba, &ab, 4096, Access::READ_WRITE).await;
    let mut pong = b.alloc(16).expect("alloc");
    for i in 0..rounds {
        let (want, ping) = filled(a, 16, i as u64);
        let recv = ba.recv(b.alloc(16).expect("alloc")).start();
        ab.send(ping).await.0.unwrap_or_else(|e| panic!("{p}: send {i}: {e}"));
        let (n, got) = recv.await;
        assert_eq!(n.unwrap_or_else(|e| panic!("{p}: recv {i}: {e}")), 16);
        assert_eq!(got[..], want[..], "{p}: message {i}");
        pong.copy_from_slice(&got[..]);
        let back = ab.recv(a.alloc(16).expect("alloc")).start();
        let (r, p2) = ba.send(pong).await;
        r.unwrap_or_else(|e| panic!("{p}: send back {i}: {e}"));
        pong = p2;
        assert_eq!(back.await.1[..], want[..], "{p}: message back {i}");
        let at = remote.slice((i % 256) as u64 * 16..(i % 256 + 1) as u64 * 16).expect("in range");
        let (want, src) = filled(a, 16, 1000 + i as u64);
        ab.write_remote(src, &at).await.0.unwrap_or_else(|e| panic!("{p}: write {i}: {e}"));
        let off = (i % 256) * 16;
        assert_eq!(target.as_slice()[off..off + 16], want[..], "{p}: write {i} landed");
        let (n, read) = ab.read_remote(a.alloc(16).expect("alloc"), &at).await;
        assert_eq!(n.unwrap_or_else(|e| panic!("{p}: read {i}: {e}")), 16);
        assert_eq!(read[..], want[..], "{p}: read {i}");
    }
}

#[test]
fn spinning_tasks_turn_the_lent_reactor_and_every_byte_lands() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p, true), runtime(p, true));
            rounds(&a, &b, 500, p).await;
            // On a loaded 2-core host a hold can take a while to come: more rounds, bounded.
            let t = std::time::Instant::now();
            while a.stats().task_holds + b.stats().task_holds == 0 && t.elapsed() < Duration::from_secs(20) {
                rounds(&a, &b, 200, p).await;
            }
            let (sa, sb) = (a.stats(), b.stats());
            // How often depends on the cores (on 2, a busy reactor thread and a spinning task
            // share them with the peer's); that it happens does not.
            assert!(sa.task_holds + sb.task_holds > 0, "{p}: tasks held the reactors: {sa:?} {sb:?}");
            assert_eq!(sa.failed + sb.failed, 0, "{p}: nothing failed");
        });
    }
}

#[test]
fn with_the_lend_off_no_task_holds_a_reactor() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p, false), runtime(p, false));
            rounds(&a, &b, 100, p).await;
            assert_eq!(a.stats().task_holds + b.stats().task_holds, 0, "{p}: no lend");
        });
    }
}

#[test]
fn ops_dropped_while_tasks_hold_the_reactor_keep_their_buffers_until_done() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p, true), runtime(p, true));
            let (ab, ba) = pair(&a, &b).await;
            let (_target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
            // Small ops spin and take the reactor; drop them at every point of their life.
            for i in 0..200u64 {
                let at = remote.slice(0..16).expect("in range");
                let after = Duration::from_micros(i % 20);
                drop_write_mid_flight(&a, &ab, &at, 16, after, p).await;
            }
            // A ping-pong still runs, on both reactors.
            rounds(&a, &b, 50, p).await;
        });
    }
}

#[test]
fn a_lending_thread_that_naps_serves_the_same_and_finishes_a_parked_op() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (lending(p, true, true), lending(p, true, true));
            rounds(&a, &b, 300, p).await;
            let (ab, ba) = pair(&a, &b).await;
            let (_target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
            for i in 0..100u64 {
                let at = remote.slice(0..16).expect("in range");
                drop_write_mid_flight(&a, &ab, &at, 16, Duration::from_micros(i % 20), p).await;
            }
            // A receive whose message comes long after its spin: its task parks, and the
            // thread, napping while the task had the reactor, takes it back and finishes it.
            for i in 0..5u64 {
                let recv = ba.recv(b.alloc(16).expect("alloc")).start();
                let (want, ping) = filled(&a, 16, 7000 + i);
                let late = async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ab.send(ping).await.0.unwrap_or_else(|e| panic!("{p}: late send {i}: {e}"));
                };
                let ((n, got), ()) = tokio::join!(recv, late);
                assert_eq!(n.unwrap_or_else(|e| panic!("{p}: late recv {i}: {e}")), 16);
                assert_eq!(got[..], want[..], "{p}: late message {i}");
            }
            let (sa, sb) = (a.stats(), b.stats());
            assert_eq!(sa.failed + sb.failed, 0, "{p}: nothing failed");
        });
    }
}

#[test]
fn a_runtime_stops_while_other_threads_keep_taking_its_reactor() {
    for (p, nap) in providers().into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let (a, b) = (lending(p, true, nap), lending(p, true, nap));
        let (ab, remote, _kept) = bounded(60, async {
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 4096, Access::WRITE).await;
            (std::sync::Arc::new(ab), remote, (target, ba))
        });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (ab, remote, a, stop) = (ab.clone(), remote.clone(), a.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let Ok(src) = a.alloc(16) else { break };
                        let (r, _) = a.block_on(ab.write_remote(src, &remote));
                        match r {
                            Ok(_) => n += 1,
                            // Once the stop began, ops fail (as shut down, their peer told
                            // goodbye, or their lane closed under them).
                            Err(_) if stop.load(std::sync::atomic::Ordering::SeqCst) => break,
                            Err(e) => panic!("{p}: write before the stop: {e}"),
                        }
                    }
                    n
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let t = std::time::Instant::now();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        a.shutdown();
        assert!(t.elapsed() < Duration::from_secs(10), "{p}: stopped in time");
        let wrote: u64 = writers.into_iter().map(|w| w.join().expect("writer")).sum();
        assert!(wrote > 0, "{p}: the writers wrote before the stop");
    }
}

#[test]
fn a_block_on_that_keeps_the_lent_reactor_moves_every_byte_and_registers_memory_meanwhile() {
    for p in providers() {
        let (a, b) = (runtime(p, true), runtime(p, true));
        // Under `Runtime::block_on`, which keeps the lent reactor through its future's polls
        // once it has it. Every round registers fresh buffers (`alloc`), each a command the
        // reactor answers: while this thread holds that reactor, the wait for the answer turns
        // it (else the wait would never end).
        with_tokio_entered(240, |_| a.block_on(rounds(&a, &b, 200, p)));
        assert!(a.stats().task_holds > 0, "{p}: the reactor was lent");
        assert_eq!(a.stats().failed + b.stats().failed, 0, "{p}: nothing failed");
    }
}

#[test]
fn a_receive_awaited_in_another_executor_inside_such_a_block_on_finishes_when_its_message_comes_late() {
    for p in providers() {
        let (a, b) = (runtime(p, true), runtime(p, true));
        with_tokio_entered(120, |io| {
            a.block_on(async {
                // Rounds first, so that this block_on has the reactor by now.
                rounds(&a, &b, 50, p).await;
                let (ab, ba) = pair(&a, &b).await;
                let ba = std::sync::Arc::new(ba);
                for i in 0..3u64 {
                    // A send puts the reactor in the slot, and a yield right after has this
                    // block_on take it for its next poll, where the rest runs.
                    let (_, ping) = filled(&a, 16, i);
                    let got = ba.recv(b.alloc(16).expect("alloc")).start();
                    ab.send(ping).await.0.expect("send");
                    let mut yielded = false;
                    std::future::poll_fn(|cx| {
                        if std::mem::replace(&mut yielded, true) {
                            return std::task::Poll::Ready(());
                        }
                        cx.waker().wake_by_ref();
                        std::task::Poll::Pending
                    })
                    .await;
                    got.await.0.expect("recv");
                    let recv = ab.recv(a.alloc(16).expect("alloc")).start();
                    let (want, ping) = filled(&b, 16, 9000 + i);
                    // The message comes 5 ms on, long after the receive's spin.
                    let ba = ba.clone();
                    let late = io.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        ba.send(ping).await.0.expect("late send");
                    });
                    // Another executor, nested: it parks this thread until the receive's waker.
                    let (n, got) = futures::executor::block_on(recv);
                    assert_eq!(n.unwrap_or_else(|e| panic!("{p}: late recv {i}: {e}")), 16);
                    assert_eq!(got[..], want[..], "{p}: late message {i}");
                    futures::executor::block_on(late).expect("the late send ran");
                }
            })
        });
        assert_eq!(a.stats().failed + b.stats().failed, 0, "{p}: nothing failed");
    }
}

/// Run `f` with a tokio runtime entered for the bootstrap connections (its reactor runs on a
/// worker of its own) and handed to `f`, under a watchdog of `secs`: a `Runtime::block_on` in
/// `f` blocks this thread, so [`bounded`] cannot time it.
fn with_tokio_entered(secs: u64, f: impl FnOnce(&tokio::runtime::Runtime)) {
    let _guard = watchdog(secs);
    let io = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let io = io.expect("tokio");
    let _io = io.enter();
    f(&io);
}

#[test]
fn an_op_that_outlives_its_endpoint_and_runtime_fails_typed_and_in_time() {
    // A shared buffer holds no handle on its runtime, so its op takes one of its own; with the
    // endpoint and the runtime dropped before its first poll, that handle is the last. The op
    // fails (its endpoint is closed, or the runtime stopped) and the runtime stops, promptly:
    // where the poll holds the lent reactor, it lets go of the handle only after putting the
    // reactor back, so the stop does not wait out its thread's wait for it.
    // Under valgrind every thread crawls: fewer rounds, and the stop's bound scaled.
    let valgrind = std::env::var_os("RDMALANE_UNDER_VALGRIND").is_some();
    let (rounds, within) =
        if valgrind { (3, Duration::from_secs(5)) } else { (20, Duration::from_millis(150)) };
    for p in providers() {
        for i in 0..rounds {
            let (a, b) = (runtime(p, true), runtime(p, true));
            let took = bounded(60, async {
                let (ab, ba) = pair(&a, &b).await;
                // Spinning ops first, so that the reactor may sit in the slot for the next.
                rounds_on(&a, &b, &ab, &ba, 20, p).await;
                let shared = a.register_shared(bytes::Bytes::from(vec![i as u8; 4096])).expect("register");
                let op = ab.send(shared).class(rdmalane::sched::Class::Latency);
                drop(ab);
                drop(a);
                let t = std::time::Instant::now();
                let (r, _) = op.await;
                let took = t.elapsed();
                match r {
                    Err(rdmalane::Error::Shutdown { .. } | rdmalane::Error::PeerLost { .. }) => {}
                    other => panic!("{p}: round {i}: want a stop or a lost peer, got {other:?}"),
                }
                took
            });
            assert!(took < within, "{p}: round {i}: the last handle's op took {took:?}");
        }
    }
}

/// `n` 16 B ping-pongs over `ab` and `ba`.
async fn rounds_on(
    a: &Runtime,
    b: &Runtime,
    ab: &rdmalane::Endpoint,
    ba: &rdmalane::Endpoint,
    n: usize,
    p: &str,
) {
    for i in 0..n {
        let recv = ba.recv(b.alloc(16).expect("alloc")).start();
        ab.send(a.alloc(16).expect("alloc")).await.0.unwrap_or_else(|e| panic!("{p}: ping {i}: {e}"));
        recv.await.0.unwrap_or_else(|e| panic!("{p}: pong {i}: {e}"));
    }
}

/// A future joined with a loop that counts its ops up to `total` in `done`, polled as often as
/// it is let: it resolves once the count is in, to the most ops the loop ran between two of
/// its polls.
fn beside(done: &std::cell::Cell<u64>, total: u64) -> impl std::future::Future<Output = u64> + '_ {
    let (mut seen, mut most) = (0, 0);
    std::future::poll_fn(move |cx| {
        let now = done.get();
        most = most.max(now - seen);
        seen = now;
        if now == total {
            return std::task::Poll::Ready(most);
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

#[test]
fn a_run_of_spun_outcomes_yields_to_what_it_is_joined_with() {
    // Each awaited write spins to its outcome on the lent reactor, so a loop of them need never
    // wait: once its run of spun outcomes has lasted its span (20 µs), the next op yields
    // before it spins, and the future beside the loop gets polled. That future notes how many
    // writes went by since its last poll: never more than a run's worth.
    const WRITES: u64 = 3000;
    for p in providers() {
        let (a, b) = (runtime(p, true), runtime(p, true));
        with_tokio_entered(120, |tokio| {
            let (ab, ba) = tokio.block_on(pair(&a, &b));
            let (target, remote) = tokio.block_on(expose_to(&ba, &ab, 16, Access::READ_WRITE));
            let written = std::cell::Cell::new(0u64);
            let looping = async {
                let mut src = a.alloc(16).expect("alloc");
                for n in 1..=WRITES {
                    src.copy_from_slice(&n.to_le_bytes().repeat(2));
                    let (r, back) = ab.write_remote(src, &remote).await;
                    r.unwrap_or_else(|e| panic!("{p}: write {n}: {e}"));
                    src = back;
                    written.set(n);
                }
            };
            let ((), most) = a.block_on(futures::future::join(looping, beside(&written, WRITES)));
            assert_eq!(target.as_slice()[..8], WRITES.to_le_bytes(), "{p}: the last write landed");
            assert!(most <= 200, "{p}: {most} writes in a row before the future beside them ran");
        });
        assert_eq!(a.stats().failed + b.stats().failed, 0, "{p}: nothing failed");
    }
}

#[test]
fn a_run_of_sends_that_finish_as_posted_yields_to_what_it_is_joined_with() {
    // A 16 B send the provider copies as it posts finishes inside its first poll: it never
    // spins, and a loop of them never waits. Such ops count in the run as spun ones do, so
    // the loop still yields once its run has lasted its span, after a post, and the future
    // beside it gets polled: under the runtime's `block_on`, which keeps the lent reactor, and
    // under tokio's, as `#[tokio::main]` runs `main`. The peer takes every message on a thread
    // of its own.
    const SENDS: u64 = 3000;
    for (p, on_tokio) in providers().into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let (a, b) = (runtime(p, true), runtime(p, true));
        with_tokio_entered(120, |tokio| {
            let (ab, ba) = tokio.block_on(pair(&a, &b));
            let sent = std::cell::Cell::new(0u64);
            let (got, most) = std::thread::scope(|s| {
                let taker = s.spawn(|| {
                    b.block_on(async {
                        let (mut buf, mut sum) = (b.alloc(16).expect("alloc"), 0u64);
                        for i in 1..=SENDS {
                            let (n, back) = ba.recv(buf).await;
                            assert_eq!(n.unwrap_or_else(|e| panic!("{p}: recv {i}: {e}")), 16);
                            sum += u64::from_le_bytes(back[..8].try_into().expect("8 bytes"));
                            buf = back;
                        }
                        sum
                    })
                });
                let looping = async {
                    let mut src = a.alloc(16).expect("alloc");
                    for n in 1..=SENDS {
                        src.copy_from_slice(&n.to_le_bytes().repeat(2));
                        let (r, back) = ab.send(src).await;
                        r.unwrap_or_else(|e| panic!("{p}: send {n}: {e}"));
                        src = back;
                        sent.set(n);
                    }
                };
                let both = futures::future::join(looping, beside(&sent, SENDS));
                let ((), most) = if on_tokio { tokio.block_on(both) } else { a.block_on(both) };
                (taker.join().expect("the peer took every message"), most)
            });
            assert_eq!(got, SENDS * (SENDS + 1) / 2, "{p}: every message arrived once");
            let on = if on_tokio { "tokio" } else { "block_on" };
            assert!(most <= 200, "{p}, {on}: {most} sends in a row before the future beside them ran");
        });
        assert_eq!(a.stats().failed + b.stats().failed, 0, "{p}: nothing failed");
    }
}
