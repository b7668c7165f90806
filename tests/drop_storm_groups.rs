//! The drop storm on a runtime of two rail groups: reads split across two reactors, dropped at
//! random points, then a shutdown with split writes in flight. Its own test binary, apart from
//! `drop_storm`'s memory bound; CI runs it under valgrind too.
use std::time::Duration;

use rdmalane::{Access, Runtime};
use rdmalane_conformance::{bounded, expose_to, pair, pattern};

/// Two rails, one reactor each, with 8 KiB chunks: one-sided ops of 16 KiB and more are split
/// across the two reactors.
fn grouped(provider: &str) -> Runtime {
    let sched = rdmalane::sched::SchedConfig { chunk_size: 8192, ..Default::default() };
    rdmalane_conformance::builder(provider)
        .rails(2)
        .rail_groups([[0], [1]])
        .scheduler(sched)
        .idle_spin(Duration::from_micros(50))
        .build()
        .unwrap_or_else(|e| panic!("grouped runtime on {provider}: {e}"))
}

#[test]
fn a_drop_storm_of_ops_split_across_rail_groups_keeps_every_buffer_until_its_parts_are_done() {
    use futures::stream::{FuturesUnordered, StreamExt};
    let valgrind = std::env::var_os("RDMALANE_UNDER_VALGRIND").is_some();
    let limit = if valgrind { 900 } else { 240 };
    for p in rdmalane_conformance::rail_providers() {
        bounded(limit, async {
            let (a, b) = (grouped(p), grouped(p));
            let (ab, ba) = pair(&a, &b).await;
            const REGION: usize = 1 << 20;
            let (target, remote) = expose_to(&ba, &ab, REGION, Access::READ_WRITE).await;
            let want = pattern(REGION, 3);
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut rand = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            // Reads of a region nobody writes meanwhile: each read that completes must hold it.
            let mut src = a.alloc(REGION).unwrap();
            src.copy_from_slice(&want);
            ab.write_remote(src, &remote).await.0.unwrap();
            let mut kept = FuturesUnordered::new();
            for _ in 0..if valgrind { 1500 } else { 4000 } {
                let len = 1 + (rand() % 65_536) as usize;
                let off = (rand() % (REGION - len) as u64) as usize;
                let piece = remote.slice(off as u64..(off + len) as u64).unwrap();
                let mut op = ab.read_remote(a.alloc(len).unwrap(), &piece);
                match rand() % 4 {
                    0 => drop(op),
                    1 => {
                        let _ = futures::poll!(&mut op);
                        drop(op);
                    }
                    2 => {
                        let _ = futures::poll!(&mut op);
                        tokio::task::yield_now().await;
                        drop(op);
                    }
                    _ => kept.push(async move { (op.await, off, len) }),
                }
                while kept.len() > 32 {
                    let ((r, buf), off, len) = kept.next().await.unwrap();
                    assert_eq!(r.unwrap_or_else(|e| panic!("{p}: {e}")), len);
                    assert!(buf[..] == want[off..off + len], "{p}: read of {len} at {off}");
                }
            }
            while let Some(((r, buf), off, len)) = kept.next().await {
                assert_eq!(r.unwrap(), len);
                assert!(buf[..] == want[off..off + len], "{p}: read of {len} at {off}");
            }
            // Every part is accounted for, and some ops were split.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let s = loop {
                let s = a.stats();
                if s.completed + s.failed + s.withdrawn == s.submitted {
                    break s;
                }
                assert!(std::time::Instant::now() < deadline, "{p}: parts unaccounted for: {s:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            assert_eq!(s.failed, 0, "{p}: {s:?}");
            let rails = a.rail_bytes();
            assert!(rails.iter().all(|&r| r > 0), "{p}: both groups read: {rails:?}");
            // Shutdown with split writes queued and in flight: each resolves once.
            let pending: Vec<_> =
                (0..64).map(|_| ab.write_remote(a.alloc(REGION).unwrap(), &remote).start()).collect();
            a.shutdown();
            for op in pending {
                match op.await.0 {
                    Ok(n) => assert_eq!(n, REGION, "{p}"),
                    Err(rdmalane::Error::Shutdown { .. }) => {}
                    Err(e) => panic!("{p}: after shutdown: {e}"),
                }
            }
            drop(target);
        });
    }
}
