//! The registration cache on real providers: the same memory registered twice is one
//! registration, idle entries go least recently used first under the byte cap, entries in use
//! (by handles or ops in flight) are never evicted, and bytes sent from cached memory are right.
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::{Access, Runtime};
use rdmalane_conformance::{bounded, expose_to, pair, pattern, providers};

/// How many registrations one region takes on `rt`: one per transport it spans (an express
/// rail, the default on hosts of 8 cores or more, adds one).
fn per_region(rt: &Runtime) -> u64 {
    let before = rt.stats().registrations;
    let probe = rt.alloc(4096).expect("alloc");
    let n = rt.stats().registrations - before;
    drop(probe);
    assert!(n >= 1, "a region takes a registration");
    n
}

fn cached_runtime(p: &str, cap: usize) -> Runtime {
    rdmalane_conformance::builder(p)
        .mr_cache_bytes(cap)
        .idle_spin(Duration::from_micros(50))
        .build()
        .expect("runtime")
}

#[test]
fn registering_cached_memory_again_reuses_the_registration() {
    for p in providers() {
        bounded(30, async {
            let rt = cached_runtime(p, 1 << 30);
            let mem = Bytes::from(pattern(1 << 20, 1));
            let per = per_region(&rt);
            let regs = rt.stats().registrations;
            let a = rt.register_shared(mem.clone()).unwrap();
            let b = rt.register_shared(mem.clone()).unwrap();
            drop((a, b));
            let c = rt.register_shared(mem.clone()).unwrap();
            let s = rt.mr_cache_stats();
            assert_eq!((s.hits, s.misses, s.entries), (2, 1, 1), "{p}: {s:?}");
            assert_eq!(rt.stats().registrations, regs + per, "{p}: one registration for three calls");
            // A different slice of the same allocation is different memory: its own entry.
            let _d = rt.register_shared(mem.slice(4096..8192)).unwrap();
            assert_eq!(rt.mr_cache_stats().misses, 2, "{p}");
            assert!(rt.stats().registration_ns > 0, "{p}: registration time is measured");
            assert_eq!(&c[..16], &mem[..16]);
            assert!(rt.register_shared(Bytes::new()).is_err(), "{p}: empty memory is refused");
        });
    }
}

#[test]
fn idle_entries_are_evicted_lru_under_the_cap_and_busy_ones_never() {
    for p in providers() {
        bounded(60, async {
            // Room for four 1 MiB entries.
            let a = cached_runtime(p, 4 << 20);
            let b = cached_runtime(p, 4 << 20);
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 8 << 20, Access::WRITE).await;
            let mems: Vec<Bytes> = (0..8).map(|i| Bytes::from(pattern(1 << 20, 10 + i))).collect();
            // Entry 0 stays in use: a write from it is in flight while the others churn.
            let busy = a.register_shared(mems[0].clone()).unwrap();
            let write = ab.write_remote(busy, &remote.slice(0..1 << 20).unwrap()).start();
            for m in &mems[1..] {
                drop(a.register_shared(m.clone()).unwrap());
            }
            let s = a.mr_cache_stats();
            assert!(s.bytes <= 4 << 20 || s.entries == 1, "{p}: over the cap with idle entries: {s:?}");
            assert!(s.evictions >= 4, "{p}: {s:?}");
            // The newest idle ones are still cached; the oldest idle ones went.
            let hits = s.hits;
            drop(a.register_shared(mems[7].clone()).unwrap());
            assert_eq!(a.mr_cache_stats().hits, hits + 1, "{p}: most recent entry kept");
            let misses = a.mr_cache_stats().misses;
            drop(a.register_shared(mems[1].clone()).unwrap());
            assert_eq!(a.mr_cache_stats().misses, misses + 1, "{p}: least recent entry evicted");
            // The in-flight write's memory was never deregistered under it.
            let (r, buf) = write.await;
            r.unwrap();
            assert!(target.as_slice()[..1 << 20] == mems[0][..], "{p}: bytes from the busy entry");
            drop(buf);
        });
    }
}

#[test]
fn many_tasks_sending_the_same_cached_memory_get_one_registration_and_right_bytes() {
    for p in providers() {
        bounded(60, async {
            let a = cached_runtime(p, 64 << 20);
            let b = cached_runtime(p, 64 << 20);
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 64 * 65536, Access::WRITE).await;
            let mem = Bytes::from(pattern(65536, 77));
            let per = per_region(&a);
            let regs = a.stats().registrations;
            let mut ops = FuturesUnordered::new();
            for i in 0..64u64 {
                let buf = a.register_shared(mem.clone()).unwrap();
                ops.push(ab.write_remote(buf, &remote.slice(i * 65536..(i + 1) * 65536).unwrap()));
            }
            while let Some((r, _)) = ops.next().await {
                r.unwrap();
            }
            assert_eq!(a.stats().registrations, regs + per, "{p}: one registration for 64 sends");
            assert_eq!(a.mr_cache_stats().hits, 63, "{p}");
            for i in 0..64 {
                assert!(target.as_slice()[i * 65536..(i + 1) * 65536] == mem[..], "{p}: copy {i}");
            }
        });
    }
}
