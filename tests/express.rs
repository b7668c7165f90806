//! The express rail on real providers: a runtime built with `express_rail(true)` runs a second
//! transport on rail 0's NIC with a reactor thread of its own. Latency-class ops and messages
//! go there and nowhere else; bulk one-sided ops go to the other group and nowhere else; every
//! byte lands once, a dropped bulk op keeps its buffer until it is done, and such a runtime
//! meets runtimes without one, either side connecting.
use std::time::Duration;

use rdmalane::{Access, Driver, Pieces, Runtime};
use rdmalane_conformance::{
    bounded, drop_write_mid_flight, expose_to, filled, meet_both_ways, pair, pattern, rail_providers,
    shuffled_pages, watchdog,
};

fn express(provider: &str) -> Runtime {
    rdmalane_conformance::builder(provider)
        .express_rail(true)
        // Sends above 1 MiB go by rendezvous: the receiver reads them from the sender.
        .max_message(1 << 20)
        .build()
        .unwrap_or_else(|e| panic!("express runtime on {provider}: {e}"))
}

fn plain(provider: &str) -> Runtime {
    rdmalane_conformance::builder(provider)
        .express_rail(false)
        .build()
        .unwrap_or_else(|e| panic!("runtime on {provider}: {e}"))
}

/// Bytes posted on the express rail (0) and on the bulk rail (1).
fn rails(rt: &Runtime) -> (u64, u64) {
    let r = rt.rail_bytes();
    (r[0], r[1])
}

#[test]
fn small_ops_and_messages_take_the_express_rail_and_bulk_the_other() {
    for p in rail_providers() {
        bounded(120, async {
            let (a, b) = (express(p), express(p));
            assert!(a.express_rail(), "{p}");
            assert_eq!(a.caps().rails, 2, "{p}: the express rail counts");
            assert_eq!(a.rail_groups().iter().map(|g| g.0.clone()).collect::<Vec<_>>(), [[0], [1]], "{p}");
            let (ab, ba) = pair(&a, &b).await;
            const LEN: usize = 8 << 20;
            let (target, remote) = expose_to(&ba, &ab, LEN, Access::READ_WRITE).await;
            assert_eq!(remote.rails(), 2, "{p}: a key on the express rail and one on the bulk rail");

            // 16 B writes: the express rail only.
            let start = rails(&a);
            for i in 0..200u64 {
                let mut src = a.alloc(16).unwrap();
                src.copy_from_slice(&pattern(16, i));
                let at = remote.slice(i * 16..(i + 1) * 16).unwrap();
                ab.write_remote(src, &at).await.0.unwrap_or_else(|e| panic!("{p}: small write {i}: {e}"));
            }
            for i in 0..200usize {
                assert!(
                    target.as_slice()[i * 16..(i + 1) * 16] == pattern(16, i as u64)[..],
                    "{p}: write {i}"
                );
            }
            let after_small = rails(&a);
            assert_eq!(after_small, (start.0 + 3200, start.1), "{p}: small writes on the express rail alone");

            // A bulk write and a read: the bulk rail only.
            let (want, src) = filled(&a, LEN, 7);
            ab.write_remote(src, &remote).await.0.unwrap_or_else(|e| panic!("{p}: bulk write: {e}"));
            assert!(target.as_slice() == &want[..], "{p}: the bulk write's bytes");
            let (n, back) = ab.read_remote(a.alloc(LEN).unwrap(), &remote).await;
            assert_eq!(n.unwrap_or_else(|e| panic!("{p}: read: {e}")), LEN);
            assert!(back[..] == want[..], "{p}: the read's bytes");
            let after_bulk = rails(&a);
            assert_eq!(
                after_bulk,
                (after_small.0, after_small.1 + 2 * LEN as u64),
                "{p}: bulk on the bulk rail alone"
            );

            // A batch of shuffled pages: bulk too.
            let (l, r) = shuffled_pages(128, 3);
            let pieces = Pieces::pages(&l, &r, 65536).unwrap();
            let (want, src) = filled(&a, LEN, 8);
            let (n, _src) = ab.write_batch(src, &remote, &pieces).await;
            assert_eq!(n.unwrap(), LEN, "{p}");
            for (i, (&lp, &rp)) in l.iter().zip(&r).enumerate() {
                assert!(
                    target.as_slice()[rp * 65536..(rp + 1) * 65536] == want[lp * 65536..(lp + 1) * 65536],
                    "{p}: page {i}"
                );
            }
            assert_eq!(rails(&a).0, after_bulk.0, "{p}: the batch stayed off the express rail");

            // Messages, small and by rendezvous: the express rails (b reads a's 3 MiB there).
            let (a1, b1) = (rails(&a).1, rails(&b).1);
            for len in [64usize, 3 << 20] {
                let recv = ba.recv(b.alloc(len).unwrap()).start();
                let msg = pattern(len, len as u64);
                let mut out = a.alloc(len).unwrap();
                out.copy_from_slice(&msg);
                ab.send(out).await.0.unwrap_or_else(|e| panic!("{p}: send {len}: {e}"));
                let (n, got) = recv.await;
                assert_eq!(n.unwrap(), len);
                assert!(got[..] == msg[..], "{p}: message of {len} bytes");
            }
            assert_eq!((rails(&a).1, rails(&b).1), (a1, b1), "{p}: messages stayed off the bulk rails");
            let s = a.stats();
            assert_eq!(s.failed, 0, "{p}: {s:?}");
        });
    }
}

#[test]
fn a_dropped_bulk_op_keeps_its_buffer_until_it_is_done() {
    for p in rail_providers() {
        bounded(90, async {
            let (a, b) = (express(p), express(p));
            let (ab, ba) = pair(&a, &b).await;
            const LEN: usize = 32 << 20;
            let (target, remote) = expose_to(&ba, &ab, LEN, Access::WRITE).await;
            for round in 0..4u64 {
                let after = Duration::from_micros(300 * round);
                drop_write_mid_flight(&a, &ab, &remote, LEN, after, &format!("{p}: round {round}")).await;
                // A small write meanwhile and after: the express rail is not held up.
                let mut s = a.alloc(16).unwrap();
                s.fill(round as u8 + 1);
                ab.write_remote(s, &remote.slice(0..16).unwrap()).await.0.unwrap();
            }
            let (want, src) = filled(&a, LEN, 99);
            ab.write_remote(src, &remote).await.0.unwrap();
            assert!(target.as_slice() == &want[..], "{p}: the last write lands whole");
            assert_eq!(a.stats().failed, 0, "{p}");
        });
    }
}

#[test]
fn express_and_plain_runtimes_meet_both_ways() {
    for p in rail_providers() {
        bounded(90, async {
            let (a, b) = (express(p), plain(p));
            assert!(!b.express_rail(), "{p}");
            meet_both_ways(&a, &b, &[16, 4 << 20], p).await;
        });
    }
}

#[test]
fn under_the_inline_driver_the_caller_turns_the_express_rail_and_bulk_has_a_thread() {
    let _guard = watchdog(90);
    for p in rail_providers() {
        let a = rdmalane_conformance::builder(p).driver(Driver::Inline).express_rail(true).build().unwrap();
        let b = express(p);
        assert!(a.express_rail(), "{p}");
        assert_eq!(a.driver(), Driver::Inline);
        let tokio = tokio::runtime::Runtime::new().unwrap();
        let (ab, _ba) = tokio.block_on(async {
            let l = b.listen("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (x, y) = tokio::join!(a.connect(addr), l.accept());
            (x.unwrap(), y.unwrap())
        });
        const LEN: usize = 8 << 20;
        let target = b.expose(b.alloc(LEN).unwrap(), Access::READ_WRITE).unwrap();
        let remote = target.descriptor();
        let start = rails(&a);
        let (want, src) = filled(&a, LEN, 4);
        let back = a.block_on(async {
            for i in 0..100u64 {
                let mut s = a.alloc(16).unwrap();
                s.copy_from_slice(&pattern(16, i));
                ab.write_remote(s, &remote.slice(i * 16..(i + 1) * 16).unwrap()).await.0.unwrap();
            }
            let small = rails(&a);
            assert_eq!(small, (start.0 + 1600, start.1), "{p}: small writes on the express rail alone");
            ab.write_remote(src, &remote).await.0.unwrap_or_else(|e| panic!("{p}: bulk write: {e}"));
            let (n, back) = ab.read_remote(a.alloc(LEN).unwrap(), &remote).await;
            assert_eq!(n.unwrap(), LEN, "{p}");
            assert_eq!(rails(&a), (small.0, small.1 + 2 * LEN as u64), "{p}: bulk on the bulk rail's thread");
            back
        });
        assert!(target.as_slice() == &want[..], "{p}: the bulk write's bytes");
        assert!(back[..] == want[..], "{p}: the read's bytes");
        drop(tokio);
    }
}

#[test]
fn express_is_off_by_default_on_few_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = rdmalane_conformance::builder("tcp").build().unwrap();
    if cores < 8 && std::env::var_os("RDMALANE_EXPRESS").is_none() {
        assert!(!rt.express_rail(), "off by default with {cores} cores");
        assert_eq!(rt.caps().rails, 1);
    }
    let rt = rdmalane_conformance::builder("tcp").express_rail(false).build().unwrap();
    assert!(!rt.express_rail());
    // Fifo serves ops in arrival order: no latency class to give a rail of its own.
    let fifo = rdmalane::sched::SchedConfig { mode: rdmalane::sched::Mode::Fifo, ..Default::default() };
    let rt = rdmalane_conformance::builder("tcp").scheduler(fifo).express_rail(true).build().unwrap();
    assert!(!rt.express_rail(), "fifo has no express rail");
}

#[test]
fn a_one_lane_connection_still_keeps_bulk_off_the_express_rail() {
    for p in rail_providers() {
        bounded(60, async {
            let (a, b) = (express(p), express(p));
            let l = b.listen("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (ab, _ba) = tokio::join!(a.connect_with_lanes(addr, 1), l.accept());
            let ab = ab.unwrap();
            const LEN: usize = 4 << 20;
            let target = b.expose(b.alloc(LEN).unwrap(), Access::WRITE).unwrap();
            let start = rails(&a);
            let (want, src) = filled(&a, LEN, 2);
            ab.write_remote(src, &target.descriptor()).await.0.unwrap();
            assert!(target.as_slice() == &want[..], "{p}");
            assert_eq!(rails(&a), (start.0, start.1 + LEN as u64), "{p}: a bulk lane was added for it");
        });
    }
}
