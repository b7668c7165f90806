//! Conformance on real providers (tcp;ofi_rxm and shm), both runtimes in one process.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::{Access, Driver, Endpoint, Error, OpKind, RegisteredBuf, RemoteBuf, Runtime};
use rdmalane_conformance::{
    bounded, builder, expose_to, filled, pair, pattern, providers, runtime, watchdog,
};

const SIZES: [usize; 9] = [1, 7, 63, 4096, 4097, 65_537, (1 << 20) + 3, 9_999_991, 64 << 20];

#[test]
fn write_then_read_is_byte_exact_from_1_byte_to_64_mib() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 64 << 20, Access::READ_WRITE).await;
            for (i, &size) in SIZES.iter().enumerate() {
                let (want, src) = filled(&a, size, i as u64);
                let (r, _src) = ab.write_remote(src, &remote).await;
                r.unwrap_or_else(|e| panic!("{p}: write {size}: {e}"));
                assert!(
                    target.as_slice()[..size] == want[..],
                    "{p}: target differs after a {size}-byte write"
                );
                let (r, back) = ab.read_remote(a.alloc(size).unwrap(), &remote).await;
                assert_eq!(r.unwrap_or_else(|e| panic!("{p}: read {size}: {e}")), size);
                assert!(back[..] == want[..], "{p}: read-back differs at {size} bytes");
            }
        });
    }
}

#[test]
fn writes_into_offsets_of_a_region_land_exactly_there() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
            let piece = remote.slice(1000..1000 + 333).unwrap();
            let mut src = a.alloc(333).unwrap();
            src.fill(0xAB);
            ab.write_remote(src, &piece).await.0.unwrap();
            let t = target.as_slice();
            assert!(t[..1000].iter().all(|&x| x == 0), "{p}: bytes before the slice touched");
            assert!(t[1000..1333].iter().all(|&x| x == 0xAB), "{p}: slice not written");
            assert!(t[1333..].iter().all(|&x| x == 0), "{p}: bytes after the slice touched");
        });
    }
}

#[test]
fn ops_on_shared_and_sliced_registered_buffers_reach_the_runtime_through_them() {
    // An op on registered memory reaches its runtime through the buffer's own handle: an `Arc`
    // of a buffer and a slice of one pass it on.
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 8192, Access::WRITE).await;
            let (want, src) = filled(&a, 4096, 11);
            let src = std::sync::Arc::new(src);
            let (first, second) = futures::join!(
                ab.write_remote(src.clone(), &remote.slice(0..4096).unwrap()),
                ab.write_remote(src.clone(), &remote.slice(4096..8192).unwrap()),
            );
            assert_eq!(first.0.unwrap_or_else(|e| panic!("{p}: shared write: {e}")), 4096);
            assert_eq!(second.0.unwrap_or_else(|e| panic!("{p}: shared write: {e}")), 4096);
            let t = target.as_slice();
            assert!(t[..4096] == want[..] && t[4096..] == want[..], "{p}: shared source not written");

            let (want, msg) = filled(&b, 32, 12);
            let recv = ab.recv(a.alloc(64).unwrap().slice(8..40).unwrap()).start();
            let (r, _) = ba.send(msg).await;
            r.unwrap_or_else(|e| panic!("{p}: send: {e}"));
            let (r, got) = recv.await;
            assert_eq!(r.unwrap_or_else(|e| panic!("{p}: receive into a slice: {e}")), 32);
            assert!(got[..] == want[..], "{p}: the slice holds other bytes");
            let whole = got.into_inner();
            assert!(
                whole[..8].iter().chain(&whole[40..]).all(|&x| x == 0),
                "{p}: bytes outside the slice touched"
            );
        });
    }
}

#[test]
fn memory_shared_read_only_is_exposed_for_reads_alone() {
    // `expose` takes only memory peers may change (`IoBufMut`); bytes shared read-only go
    // through `expose_read`, whose descriptor no peer can write through.
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, _ba) = pair(&a, &b).await;
            let want = pattern(4096, 21);
            let shared = b.register_shared(bytes::Bytes::from(want.clone())).expect("register");
            let exposed = b.expose_read(shared).expect("expose for reads");
            assert_eq!(exposed.descriptor().access(), Access::READ);
            let remote = exposed.descriptor();
            let (r, read) = ab.read_remote(a.alloc(4096).unwrap(), &remote).await;
            assert_eq!(r.unwrap_or_else(|e| panic!("{p}: read: {e}")), 4096);
            assert!(read[..] == want[..], "{p}: the shared bytes");
            let (r, _) = ab.write_remote(a.alloc(4096).unwrap(), &remote).await;
            assert!(r.is_err(), "{p}: a write through a read-only descriptor");
            assert!(exposed.as_slice() == &want[..], "{p}: the shared bytes are unchanged");
        });
    }
}

#[test]
fn send_and_recv_carry_messages_of_every_size() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            for (i, &size) in SIZES[..7].iter().enumerate() {
                let (want, src) = filled(&a, size, 100 + i as u64);
                let recv = ba.recv(b.alloc(size + 16).unwrap()).start();
                let (s, _) = ab.send(src).await;
                s.unwrap_or_else(|e| panic!("{p}: send {size}: {e}"));
                let (n, got) = recv.await;
                assert_eq!(n.unwrap(), size, "{p}: received length");
                assert!(got[..size] == want[..], "{p}: message of {size} bytes differs");
            }
        });
    }
}

#[test]
fn a_message_longer_than_the_receive_buffer_fails_the_receive() {
    for p in providers() {
        bounded(30, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let recv = ba.recv(b.alloc(8).unwrap()).start();
            let _ = ab.send(a.alloc(4096).unwrap()).await;
            let (r, _) = recv.await;
            assert!(r.is_err(), "{p}: a 4096-byte message fit an 8-byte receive: {r:?}");
        });
    }
}

#[test]
fn write_with_imm_raises_each_value_once_in_any_order() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 100 * 4096, Access::WRITE).await;
            let mut ops = FuturesUnordered::new();
            for i in 0..100u64 {
                let piece = remote.slice(i * 4096..(i + 1) * 4096).unwrap();
                let mut src = a.alloc(4096).unwrap();
                src.fill(i as u8);
                ops.push(ab.write_with_imm(src, &piece, 0xC0DE_0000 + i));
            }
            while let Some((r, _)) = ops.next().await {
                r.unwrap();
            }
            let mut seen = HashSet::new();
            for _ in 0..100 {
                let ev = b.next_imm().await;
                assert!(seen.insert(ev.imm), "{p}: immediate {:#x} twice", ev.imm);
            }
            assert_eq!(seen, (0..100).map(|i| 0xC0DE_0000 + i).collect(), "{p}: immediates");
            for i in 0..100usize {
                assert!(
                    target.as_slice()[i * 4096..(i + 1) * 4096].iter().all(|&x| x == i as u8),
                    "{p}: piece {i}"
                );
            }
            assert!(b.try_next_imm().is_none(), "{p}: extra immediate");
        });
    }
}

#[test]
fn a_thousand_concurrent_writes_all_land() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 1000 * 1024, Access::WRITE).await;
            let mut ops = FuturesUnordered::new();
            for i in 0..1000u64 {
                let mut src = a.alloc(1024).unwrap();
                src.copy_from_slice(&pattern(1024, i));
                ops.push(ab.write_remote(src, &remote.slice(i * 1024..(i + 1) * 1024).unwrap()));
            }
            let mut done = 0;
            while let Some((r, _)) = ops.next().await {
                r.unwrap();
                done += 1;
            }
            assert_eq!(done, 1000);
            for i in 0..1000usize {
                assert!(
                    target.as_slice()[i * 1024..(i + 1) * 1024] == pattern(1024, i as u64)[..],
                    "{p}: write {i}"
                );
            }
        });
    }
}

#[test]
fn recv_stream_keeps_a_pool_posted() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let mut stream = ba.recv_stream(4, 64).unwrap();
            let sender = async {
                for i in 0..50u8 {
                    let mut m = a.alloc(1 + i as usize).unwrap();
                    m.fill(i);
                    ab.send(m).await.0.unwrap();
                }
            };
            let receiver = async {
                let mut got = Vec::new();
                while got.len() < 50 {
                    let m = stream.next().await.expect("stream open").unwrap();
                    got.push((m.len(), m[0]));
                }
                got
            };
            let ((), mut got) = tokio::join!(sender, receiver);
            got.sort();
            assert_eq!(got, (0..50u8).map(|i| (1 + i as usize, i)).collect::<Vec<_>>(), "{p}");
        });
    }
}

#[test]
fn a_recv_stream_whose_buffers_the_application_holds_waits_for_one_back() {
    // A server that hands each message to a task of its own can hold every buffer of the
    // pool at once: the stream then waits for a message to be dropped, and does not end. (The
    // sender runs beside it: on verbs a send waits for a posted receive.)
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let mut stream = ba.recv_stream(2, 64).unwrap();
            let sender = async {
                for i in 0..3u8 {
                    let mut m = a.alloc(8).unwrap();
                    m.fill(i);
                    ab.send(m).await.0.unwrap_or_else(|e| panic!("{p}: send {i}: {e}"));
                }
            };
            let receiver = async {
                let first = stream.next().await.expect("open").unwrap();
                let second = stream.next().await.expect("open").unwrap();
                let held = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
                assert!(
                    held.is_err(),
                    "{p}: with every buffer held the stream waits, got {:?}",
                    held.map(|m| m.is_some())
                );
                let seen = (first[0], second[0]);
                drop(first);
                let third = tokio::time::timeout(Duration::from_secs(20), stream.next())
                    .await
                    .unwrap_or_else(|_| panic!("{p}: a dropped message's buffer brings the next"))
                    .expect("open")
                    .unwrap();
                let mut all = [seen.0, seen.1, third[0]];
                all.sort();
                assert_eq!(all, [0, 1, 2], "{p}");
            };
            tokio::join!(sender, receiver);
        });
    }
}

#[test]
fn descriptors_out_of_bounds_are_refused_before_posting() {
    for p in providers() {
        bounded(30, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 4096, Access::WRITE).await;
            let before = a.stats();
            assert!(matches!(remote.slice(4000..4097), Err(Error::OutOfBounds { .. })));
            let (r, _) = ab.write_remote(a.alloc(4097).unwrap(), &remote).await;
            assert!(matches!(r, Err(Error::OutOfBounds { op: OpKind::Write, len: 4096, .. })), "{p}: {r:?}");
            // Read access was not granted.
            let (r, _) = ab.read_remote(a.alloc(16).unwrap(), &remote).await;
            assert!(matches!(r, Err(Error::InvalidArgument { op: OpKind::Read, .. })), "{p}: {r:?}");
            // A descriptor of another runtime is not this peer's.
            let other = runtime(p);
            let foreign = other.expose(other.alloc(64).unwrap(), Access::WRITE).unwrap().descriptor();
            let (r, _) = ab.write_remote(a.alloc(16).unwrap(), &foreign).await;
            assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{p}: {r:?}");
            // A zero-length one-sided op is meaningless.
            let empty = a.alloc(16).unwrap().slice(0..0).unwrap();
            let (r, _) = ab.write_remote(empty, &remote).await;
            assert!(matches!(r, Err(Error::InvalidArgument { op: OpKind::Write, .. })), "{p}: {r:?}");
            // A buffer of another runtime is refused too.
            let (r, _) = ab.send(other.alloc(16).unwrap()).await;
            assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{p}: {r:?}");
            assert_eq!(a.stats().posted, before.posted, "{p}: something was posted");
            assert!(target.as_slice().iter().all(|&x| x == 0), "{p}: target touched");
        });
    }
}

/// Wait until at least `submitted` ops were submitted (by the count `rt.stats()` keeps) and every
/// one is accounted for.
async fn settle(rt: &Runtime, submitted: u64, secs: u64) -> rdmalane::Stats {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = rt.stats();
        // The reactor counts an op when it takes it from the queue: a slow thread (under
        // qemu's TCG) may not have yet.
        if s.submitted >= submitted && s.completed + s.failed + s.withdrawn == s.submitted {
            return s;
        }
        assert!(Instant::now() < deadline, "ops unaccounted for: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn dropping_futures_in_flight_and_after_completion_is_safe() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
            let base = a.stats().submitted;
            // Dropped at once: each is withdrawn or completes in the reactor, buffer kept alive.
            for i in 0..200 {
                let mut src = a.alloc(1 << 20).unwrap();
                src.fill(i as u8);
                let mut op = ab.write_remote(src, &remote);
                let _ = futures::poll!(&mut op);
                drop(op);
            }
            // Dropped after completion, never polled again.
            let mut op = ab.write_remote(a.alloc(64).unwrap(), &remote.slice(0..64).unwrap());
            let _ = futures::poll!(&mut op);
            settle(&a, base + 201, 30).await;
            drop(op);
            // A receive dropped while posted waits for its message in the reactor. (Dropped
            // before it is posted, it would be withdrawn: on verbs the send below would then
            // wait for a receive that never comes, as RC does.)
            let posted = b.stats().posted;
            let mut op = ba.recv(b.alloc(64).unwrap());
            let _ = futures::poll!(&mut op);
            while b.stats().posted == posted {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            drop(op);
            // Never polled: never submitted.
            drop(ab.write_remote(a.alloc(64).unwrap(), &remote));
            let s = settle(&a, base + 201, 30).await;
            assert_eq!(s.submitted - base, 201, "{p}: {s:?}");
            // The endpoint still works and the bytes are right.
            let mut src = a.alloc(4096).unwrap();
            src.copy_from_slice(&pattern(4096, 9));
            ab.write_remote(src, &remote.slice(0..4096).unwrap()).await.0.unwrap();
            assert!(target.as_slice()[..4096] == pattern(4096, 9)[..], "{p}");
            let mut m = a.alloc(8).unwrap();
            m.fill(5);
            ab.send(m).await.0.unwrap();
        });
    }
}

/// `b` with its own reactor thread, `a` driven inline; `a`'s endpoint to `b`, and `region`
/// bytes of `b` exposed for writing, with the descriptor `a` uses for it.
fn inline_pair(
    p: &str,
    region: usize,
) -> (Runtime, Runtime, Endpoint, Endpoint, rdmalane::ExposedBuf<RegisteredBuf>, RemoteBuf) {
    let b = runtime(p);
    let a = inline_runtime(p);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let (ab, ba) = tokio.block_on(async {
        let l = b.listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (x, y) = tokio::join!(a.connect(addr), l.accept());
        (x.unwrap(), y.unwrap())
    });
    let target = b.expose(b.alloc(region).unwrap(), Access::WRITE).unwrap();
    // A descriptor carries a key per rail (an express rail adds one): its length varies.
    let bytes = target.descriptor().to_bytes();
    let mut msg = b.alloc(bytes.len()).unwrap();
    msg.copy_from_slice(&bytes);
    let desc_recv = ab.recv(a.alloc(rdmalane::RemoteBuf::MAX_ENCODED_LEN).unwrap());
    // The inline side must be driven while the peer sends (it may need to accept a
    // connection first), so both run under its block_on.
    let ((s, _), (n, d)) = a.block_on(futures::future::join(ba.send(msg), desc_recv));
    s.unwrap();
    let remote = rdmalane::RemoteBuf::from_bytes(&d[..n.unwrap()]).unwrap();
    (a, b, ab, ba, target, remote)
}

#[test]
fn a_loop_of_small_sends_under_the_inline_driver_does_not_starve_what_it_is_joined_with() {
    // Each small send finishes as it is posted (the provider copies it), so its future is
    // never pending: the loop must still spend the poll budget and yield to the future beside
    // it, which alone stops it.
    let _guard = watchdog(60);
    for p in providers() {
        let (a, b, ab, ba, _target, _remote) = inline_pair(p, 64);
        let recvs: Vec<_> = (0..600).map(|_| ba.recv(b.alloc(16).unwrap()).start()).collect();
        let stop = std::cell::Cell::new(false);
        let sent = std::cell::Cell::new(0u64);
        let looping = async {
            let mut buf = a.alloc(16).unwrap();
            while !stop.get() {
                let (r, back) = ab.send(buf).await;
                r.unwrap_or_else(|e| panic!("{p}: send: {e}"));
                buf = back;
                sent.set(sent.get() + 1);
                assert!(sent.get() < 600, "{p}: the loop never yielded");
            }
        };
        a.block_on(futures::future::join(looping, async { stop.set(true) }));
        assert!(sent.get() <= 2 * 128, "{p}: {} sends before the future beside them ran", sent.get());
        drop(recvs);
    }
}

#[test]
fn a_thread_driven_block_on_nested_in_an_inline_drivers_poll_is_not_held_to_its_budget() {
    // The inline driver's poll budget (128 op polls) is its own: ops under a nested block_on
    // of a thread-driven runtime must not spend it, or, once it is spent, they would yield
    // forever to an executor that never resets it.
    let _guard = watchdog(60);
    for p in providers() {
        let (a, b, ab, ba, _target, _remote) = inline_pair(p, 64);
        let (sent, got) = a.block_on(async {
            // Posted at once (this thread holds a's reactor): on verbs a send needs a posted
            // receive, and a's reactor does not turn while the nested block_on runs.
            let recvs: Vec<_> = (0..300).map(|_| ab.recv(a.alloc(16).unwrap()).start()).collect();
            let sent = b.block_on(async {
                let mut buf = b.alloc(16).unwrap();
                for i in 0..300u32 {
                    buf[..4].copy_from_slice(&i.to_le_bytes());
                    let (r, back) = ba.send(buf).await;
                    r.unwrap_or_else(|e| panic!("{p}: send {i}: {e}"));
                    buf = back;
                }
                300
            });
            // Every message once (no order assumed).
            let mut got = Vec::new();
            for (i, recv) in recvs.into_iter().enumerate() {
                let (n, m) = recv.await;
                assert_eq!(n.unwrap_or_else(|e| panic!("{p}: recv {i}: {e}")), 16);
                got.push(u32::from_le_bytes(m[..4].try_into().unwrap()));
            }
            got.sort_unstable();
            (sent, got)
        });
        assert_eq!(sent, 300, "{p}");
        assert_eq!(got, (0..300).collect::<Vec<u32>>(), "{p}: every message once");
    }
}

#[test]
fn a_future_dropped_before_posting_is_withdrawn() {
    let _guard = watchdog(60);
    for p in providers() {
        // Inline driver: nothing is posted outside block_on, so the drop comes first for sure.
        let (a, _b, ab, _ba, target, remote) = inline_pair(p, 4096);
        let mut src = a.alloc(4096).unwrap();
        src.fill(0xEE);
        // Polled once outside block_on: handed to the reactor, which nobody drives yet.
        let mut op = ab.write_remote(src, &remote);
        assert!(futures::FutureExt::now_or_never(&mut op).is_none());
        drop(op);
        let (r, _) = a.block_on(ab.write_remote(a.alloc(16).unwrap(), &remote.slice(100..116).unwrap()));
        r.unwrap();
        let s = a.stats();
        assert_eq!(s.withdrawn, 1, "{p}: {s:?}");
        assert!(target.as_slice().iter().all(|&x| x != 0xEE), "{p}: the withdrawn write happened");
    }
}

#[test]
fn a_bulk_loop_under_the_inline_driver_does_not_starve_what_it_is_joined_with() {
    // A stream keeping 1 MiB writes in flight finds one done at almost every poll: it must
    // still yield to the future beside it (small writes, one at a time), which alone stops it.
    let _guard = watchdog(60);
    const MIB: usize = 1 << 20;
    for p in providers() {
        let (a, _b, ab, _ba, target, remote) = inline_pair(p, 2 * MIB);
        let stop = std::cell::Cell::new(false);
        let looped = std::cell::Cell::new(0u64);
        let looping = async {
            let dst = remote.slice(0..MIB as u64).unwrap();
            let mut inflight = FuturesUnordered::new();
            for _ in 0..8 {
                let mut buf = a.alloc(MIB).unwrap();
                buf.fill(0x11);
                inflight.push(ab.write_remote(buf, &dst));
            }
            while let Some((r, back)) = inflight.next().await {
                r.unwrap();
                looped.set(looped.get() + 1);
                if !stop.get() {
                    inflight.push(ab.write_remote(back, &dst));
                }
            }
        };
        let small = async {
            let mut buf = a.alloc(16).unwrap();
            for i in 0..100u8 {
                buf.fill(i);
                let (r, back) =
                    ab.write_remote(buf, &remote.slice(MIB as u64..MIB as u64 + 16).unwrap()).await;
                r.unwrap();
                buf = back;
            }
            stop.set(true);
        };
        a.block_on(futures::future::join(looping, small));
        assert!(looped.get() >= 8, "{p}: {} writes", looped.get());
        assert!(target.as_slice()[..MIB].iter().all(|&x| x == 0x11), "{p}");
        assert!(target.as_slice()[MIB..MIB + 16].iter().all(|&x| x == 99), "{p}");
    }
}

#[test]
fn an_op_parked_on_one_inline_driver_completes_when_another_thread_reaps_it() {
    // Awaited directly under block_on, an op waits without a waker of its own: its completion
    // bumps a count every inline driver watches. Here a second thread drives the same runtime
    // all along and reaps many of the completions: the first driver must still see each one.
    let _guard = watchdog(60);
    for p in providers() {
        let (a, _b, ab, _ba, target, remote) = inline_pair(p, 4096);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let other = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                a.block_on(futures::future::poll_fn(|cx| {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }))
            })
        };
        let dst = remote.slice(0..16).unwrap();
        let mut buf = a.alloc(16).unwrap();
        for i in 0..300u32 {
            buf.fill(i as u8);
            let (r, back) = a.block_on(ab.write_remote(buf, &dst));
            r.unwrap();
            buf = back;
            assert!(target.as_slice()[..16].iter().all(|&x| x == i as u8), "{p}: write {i}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        other.join().unwrap();
    }
}

#[test]
fn another_thread_registers_and_stops_while_an_inline_driver_holds_the_reactor() {
    // The thread in block_on holds the reactor until it returns: another thread's registration
    // is served by its turns, and another thread's stop is carried out by it, failing what its
    // future waits for, within the stop's bound.
    let _guard = watchdog(60);
    for p in providers() {
        let (a, _b, ab, _ba, _target, _remote) = inline_pair(p, 4096);
        let (go, started) = std::sync::mpsc::channel();
        let other = {
            let a = a.clone();
            std::thread::spawn(move || {
                started.recv().unwrap();
                let buf = a.alloc(4096).expect("registered by the holder's turns");
                assert_eq!(buf.len(), 4096);
                let t = Instant::now();
                a.shutdown();
                t.elapsed()
            })
        };
        // A receive nobody answers waits under block_on until the stop fails it.
        let (r, _) = a.block_on(async {
            let op = ab.recv(a.alloc(64).unwrap());
            go.send(()).unwrap();
            op.await
        });
        assert!(matches!(r, Err(Error::Shutdown { .. })), "{p}: {r:?}");
        let took = other.join().unwrap();
        assert!(took < Duration::from_secs(4), "{p}: the stop took {took:?}");
    }
}

fn inline_runtime(p: &str) -> Runtime {
    rdmalane_conformance::builder(p).driver(Driver::Inline).build().unwrap()
}

#[test]
fn block_on_nested_in_another_inline_runtimes_still_drives_the_outer_one() {
    // A's block_on holds A's reactor; C's block_on nested in it holds C's too. Inside that,
    // A's registrations and a block_on of A again must still find A's reactor and turn it.
    let _guard = watchdog(60);
    for p in providers() {
        let (a, _b, ab, _ba, target, remote) = inline_pair(p, 4096);
        let c = inline_runtime(p);
        let dst = remote.slice(0..16).unwrap();
        let (r, _) = a.block_on(async {
            c.block_on(async {
                let mut buf = a.alloc(16).expect("A registers inside C's block_on");
                buf.fill(0x5A);
                a.block_on(ab.write_remote(buf, &dst))
            })
        });
        r.unwrap();
        assert!(target.as_slice()[..16].iter().all(|&x| x == 0x5A), "{p}: the nested write landed");
    }
}

#[test]
fn an_inline_runtime_kept_in_a_thread_local_stops_cleanly_at_thread_exit() {
    // Thread-locals are destroyed in reverse order of first use: the runtime, stored first,
    // is dropped (and stopped) after the driver's own thread-locals are gone.
    let _guard = watchdog(60);
    for p in providers() {
        thread_local! {
            static RT: std::cell::RefCell<Option<Runtime>> = const { std::cell::RefCell::new(None) };
        }
        let p = p.to_string();
        std::thread::spawn(move || {
            RT.with(|rt| *rt.borrow_mut() = Some(inline_runtime(&p)));
            RT.with(|rt| {
                let rt = rt.borrow();
                let rt = rt.as_ref().unwrap();
                let buf = rt.alloc(64).unwrap();
                rt.block_on(async { assert_eq!(buf.len(), 64) });
            });
        })
        .join()
        .expect("the thread ends without a panic");
    }
}

#[test]
fn connecting_where_nobody_listens_fails_in_time() {
    bounded(20, async {
        let a = runtime(rdmalane_conformance::main_provider());
        let t0 = Instant::now();
        // A port that was just free: bind, note, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let r = a.connect(format!("127.0.0.1:{port}")).await;
        assert!(
            matches!(r, Err(Error::Io { op: OpKind::Connect, .. }) | Err(Error::Timeout { .. })),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(6));
    });
}

#[test]
fn an_unavailable_provider_is_named_with_what_exists() {
    let r = rdmalane_conformance::builder("no-such-provider").build();
    match r {
        Err(Error::ProviderUnavailable { backend, requested, found }) => {
            assert_eq!(backend, "libfabric");
            assert_eq!(requested, "no-such-provider");
            assert!(found.contains("shm") && found.contains("tcp"), "found: {found}");
        }
        other => panic!("expected ProviderUnavailable, got {other:?}"),
    }
}

#[test]
fn settings_no_runtime_could_work_with_are_refused_naming_them() {
    let p = rdmalane_conformance::main_provider();
    let named = |r: Result<rdmalane::Runtime, Error>, what: &str| match r {
        Err(Error::InvalidArgument { reason, .. }) => assert!(reason.contains(what), "{reason}"),
        other => panic!("{what}: expected InvalidArgument, got {:?}", other.map(|_| "a runtime")),
    };
    named(
        rdmalane_conformance::builder(p).connect_timeout(std::time::Duration::ZERO).build(),
        "connect_timeout",
    );
    // Pinning past an affinity mask would have panicked the reactor's thread.
    named(rdmalane_conformance::builder(p).core(4096).build(), "core 4096");
}

#[test]
fn a_handshake_from_a_stranger_is_refused_and_the_listener_survives() {
    bounded(30, async {
        use tokio::io::AsyncWriteExt;
        let p = rdmalane_conformance::main_provider();
        let (a, b) = (runtime(p), runtime(p));
        let l = b.listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut refusals = l.refusals();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let r = refusals.next().await.unwrap();
        assert_eq!(r.reason, rdmalane::RefusalReason::BadHello, "{r}");
        assert!(r.detail.contains("bad magic"), "{r}");
        assert_eq!(b.stats().refused.bad_hello, 1);
        let (x, y) = tokio::join!(a.connect(addr), l.accept());
        x.unwrap();
        y.unwrap();
    });
}

#[test]
fn dropping_a_split_write_withdraws_its_unposted_chunks() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (_target, remote) = expose_to(&ba, &ab, 64 << 20, Access::WRITE).await;
            let before = a.stats();
            // 64 MiB goes out in 64 chunks of 1 MiB, a few at a time (the budgets).
            let mut op = ab.write_remote(a.alloc(64 << 20).unwrap(), &remote);
            let _ = futures::poll!(&mut op);
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(op);
            let s = settle(&a, before.submitted + 1, 30).await;
            assert_eq!(s.withdrawn - before.withdrawn, 1, "{p}: {s:?}");
            assert!(s.posted - before.posted < 64, "{p}: every chunk was posted: {s:?}");
            eprintln!("{p}: {} of 64 chunks posted before the drop took effect", s.posted - before.posted);
        });
    }
}

#[test]
fn reads_spaced_far_apart_or_not_at_all_still_complete_every_op() {
    // Poll spacing only delays the read after one that found nothing: with none, and with
    // 200 µs (2500 times shm's default), messages and a write still land whole, in time.
    bounded(90, async {
        for p in providers() {
            for spacing in [Duration::ZERO, Duration::from_micros(200)] {
                let make = || builder(p).poll_spacing(spacing).build().unwrap_or_else(|e| panic!("{p}: {e}"));
                let (a, b) = (make(), make());
                let (ab, ba) = pair(&a, &b).await;
                for round in 0..20u64 {
                    let want = pattern(64, round);
                    let recv = ba.recv(b.alloc(64).unwrap()).start();
                    let mut msg = a.alloc(64).unwrap();
                    msg.copy_from_slice(&want);
                    ab.send(msg).await.0.unwrap_or_else(|e| panic!("{p} {spacing:?}: send: {e}"));
                    let (n, got) = recv.await;
                    assert_eq!(n.unwrap(), 64, "{p} {spacing:?}");
                    assert!(got[..] == want[..], "{p} {spacing:?}: round {round}");
                }
                let (target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
                let (want, src) = filled(&a, 1 << 20, 7);
                ab.write_remote(src, &remote).await.0.unwrap_or_else(|e| panic!("{p} {spacing:?}: {e}"));
                assert!(target.as_slice() == &want[..], "{p} {spacing:?}: the write landed whole");
            }
        }
    });
}

#[test]
fn the_last_handle_dropped_in_a_tokio_task_does_not_stall_its_executor() {
    // On a current-thread executor the control connections' tasks run on the one thread that
    // drops the handle. A drop that waited there for the stop would wait for them: an shm
    // lane waits up to a second for its peer endpoint of this process to close, which the
    // peer's runtime does once its watch task, on this same thread, sees ours go. Each round
    // also checks that the peer learns of the loss: its sends come to fail with `PeerLost`.
    let _guard = watchdog(60);
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    for p in providers() {
        io.block_on(async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let recv = ba.recv(b.alloc(16).unwrap()).start();
            ab.send(a.alloc(16).unwrap()).await.0.unwrap_or_else(|e| panic!("{p}: send: {e}"));
            assert_eq!(recv.await.0.unwrap_or_else(|e| panic!("{p}: recv: {e}")), 16);
            drop(ab);
            let took = tokio::spawn(async move {
                let t = Instant::now();
                drop(a);
                t.elapsed()
            })
            .await
            .expect("the dropping task");
            assert!(took < Duration::from_millis(300), "{p}: dropping the last handle took {took:?}");
            let lost = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match ba.send(b.alloc(16).unwrap()).await.0 {
                        Err(e) if e.is_peer_lost() || matches!(e, Error::Shutdown { .. }) => break,
                        // Sent before the loss was known, or caught in the connection's
                        // teardown (a provider's error of its own): the loss still comes.
                        _ => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
            });
            lost.await.unwrap_or_else(|_| panic!("{p}: the peer never learned of the loss"));
        });
    }
}
