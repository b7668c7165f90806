//! One reactor per rail group, on real providers: a runtime of four rails in two groups runs
//! two reactor threads, each with a transport of its own; bulk one-sided ops are split across
//! them and every byte lands once, messages (large ones by rendezvous too) stay on the first
//! group, and such a runtime meets peers of any shape.
use std::time::Duration;

use rdmalane::{Access, Pieces, Runtime};
use rdmalane_conformance::{
    bounded, drop_write_mid_flight, expose_to, filled, meet_both_ways, pair, pattern, rail_providers,
    runtime, shuffled_pages, write_and_read_back,
};

/// Four rails in two groups of two: `[[0, 1], [2, 3]]`, and no express rail (which would
/// add a group in front: `tests/express.rs` covers that layout).
fn grouped(provider: &str) -> Runtime {
    rdmalane_conformance::builder(provider)
        .rails(4)
        .rail_groups([[0, 1], [2, 3]])
        .express_rail(false)
        // Sends above 1 MiB go by rendezvous: the receiver reads them from the sender.
        .max_message(1 << 20)
        .idle_spin(Duration::from_micros(50))
        .build()
        .unwrap_or_else(|e| panic!("grouped runtime on {provider}: {e}"))
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .filter(|c| c.trim() == name)
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn groups_have_reactors_of_their_own_and_bulk_spans_them() {
    for p in rail_providers() {
        bounded(120, async {
            let (a, b) = (grouped(p), grouped(p));
            assert_eq!(a.rail_groups().iter().map(|g| g.0.clone()).collect::<Vec<_>>(), [[0, 1], [2, 3]]);
            // (Other tests of this binary may run grouped runtimes meanwhile: at least ours. A new
            // thread names itself once it runs.)
            let t = std::time::Instant::now();
            while threads_named("rdmalane-rg1") < 2 {
                assert!(t.elapsed() < Duration::from_secs(5), "{p}: a second reactor thread each");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let (ab, ba) = pair(&a, &b).await;
            const LEN: usize = 16 << 20;
            let (target, remote) = expose_to(&ba, &ab, LEN, Access::READ_WRITE).await;
            assert_eq!(remote.rails(), 4, "{p}: a key per rail, from both groups' transports");
            let (want, src) = filled(&a, LEN, 21);

            // A batch of shuffled pages, split between the groups.
            let (l, r) = shuffled_pages(256, 9);
            let pieces = Pieces::pages(&l, &r, 65536).unwrap();
            let (n, src) = ab.write_batch(src, &remote, &pieces).await;
            assert_eq!(n.unwrap(), LEN, "{p}: the parts' bytes add up");
            for (i, (&lp, &rp)) in l.iter().zip(&r).enumerate() {
                assert!(
                    target.as_slice()[rp * 65536..(rp + 1) * 65536] == want[lp * 65536..(lp + 1) * 65536],
                    "{p}: page {i}"
                );
            }
            let per_rail = a.rail_bytes();
            assert_eq!(per_rail.iter().sum::<u64>(), LEN as u64, "{p}: every byte posted once: {per_rail:?}");
            assert!(
                per_rail.iter().all(|&x| x >= LEN as u64 / 16),
                "{p}: all four rails carried a share: {per_rail:?}"
            );

            // A plain write and a read, split the same way.
            let src = write_and_read_back(&a, &ab, src, &remote, target.as_slice(), &want, p).await;
            assert!(a.rail_bytes()[2] > per_rail[2], "{p}: the second group moved part of them");

            // Pieces raising an immediate value each: counted at the target, from both groups.
            let second = |rt: &Runtime| rt.rail_bytes()[2] + rt.rail_bytes()[3];
            let before = second(&a);
            let pieces =
                Pieces::pages(&(0..64).collect::<Vec<_>>(), &(64..128).collect::<Vec<_>>(), 65536).unwrap();
            let (n, src) = ab.write_batch_with_imm(src, &remote, &pieces, 77).await;
            assert_eq!(n.unwrap(), 64 * 65536);
            tokio::time::timeout(Duration::from_secs(10), b.wait_imm(77, 64)).await.expect("64 events");
            assert!(second(&a) > before, "{p}: the second group wrote some of the pieces");
            drop(src);

            // Messages, small and by rendezvous (the receiver reads from the sender's first
            // group's rails): all on the first groups.
            let (a2, b2) = (second(&a), second(&b));
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
            assert_eq!((second(&a), second(&b)), (a2, b2), "{p}: messages stayed on the first groups");
            drop(target);
        });
    }
}

#[test]
fn a_dropped_split_op_keeps_its_buffer_until_every_part_is_done() {
    for p in rail_providers() {
        bounded(90, async {
            let (a, b) = (grouped(p), grouped(p));
            let (ab, ba) = pair(&a, &b).await;
            const LEN: usize = 32 << 20;
            let (target, remote) = expose_to(&ba, &ab, LEN, Access::WRITE).await;
            let mut held_on = 0;
            for round in 0..6u64 {
                // Polled once (the parts go to both reactors), then dropped mid-flight: kept while
                // a part is in flight (32 MiB take milliseconds to move).
                let after = Duration::from_micros(200 * round);
                let what = format!("{p}: round {round}");
                held_on += drop_write_mid_flight(&a, &ab, &remote, LEN, after, &what).await as u32;
            }
            assert!(held_on > 0, "{p}: some dropped op had parts in flight, and its buffer was kept");
            // The runtime carries on: a last write lands whole.
            let (want, src) = filled(&a, LEN, 99);
            ab.write_remote(src, &remote).await.0.unwrap();
            assert!(target.as_slice() == &want[..], "{p}");
            let s = a.stats();
            assert_eq!(s.failed, 0, "{p}: {s:?}");
        });
    }
}

#[test]
fn grouped_and_single_reactor_runtimes_meet_both_ways() {
    for p in rail_providers() {
        bounded(90, async {
            let (a, b) = (grouped(p), runtime(p));
            meet_both_ways(&a, &b, &[8 << 20], p).await;
        });
    }
}

#[test]
fn bad_rail_groups_are_refused_by_name() {
    let build =
        |groups: Vec<Vec<usize>>| rdmalane_conformance::builder("tcp").rails(2).rail_groups(groups).build();
    for (groups, want) in [
        (vec![vec![0], vec![0, 1]], "rail 0 in two rail groups"),
        (vec![vec![0]], "rail 1 is in no rail group"),
        (vec![vec![0, 1, 2]], "rail 2 in a rail group, of 2 rails"),
    ] {
        match build(groups.clone()) {
            Err(rdmalane::Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains(want), "{groups:?}: {reason}")
            }
            other => panic!("{groups:?}: {other:?}"),
        }
    }
}

#[test]
fn a_peer_lost_mid_transfer_fails_every_part_and_the_op_once() {
    for p in rail_providers() {
        bounded(60, async {
            let (a, b) = (grouped(p), grouped(p));
            let (ab, ba) = pair(&a, &b).await;
            const LEN: usize = 64 << 20;
            let (target, remote) = expose_to(&ba, &ab, LEN, Access::WRITE).await;
            let ops: Vec<_> =
                (0..4).map(|_| ab.write_remote(a.alloc(LEN).unwrap(), &remote).start()).collect();
            // The peer goes away with the writes in flight on both groups.
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop((ba, target));
            b.shutdown();
            drop(b);
            for op in ops {
                match tokio::time::timeout(Duration::from_secs(20), op).await.expect("resolves").0 {
                    Ok(n) => assert_eq!(n, LEN, "{p}: a write done before the loss is whole"),
                    Err(e) => assert!(
                        e.is_peer_lost() || matches!(e, rdmalane::Error::Transport { .. }),
                        "{p}: {e}"
                    ),
                }
            }
            // Every part is accounted for.
            let s = a.stats();
            assert_eq!(s.completed + s.failed + s.withdrawn, s.submitted, "{p}: {s:?}");
        });
    }
}
