//! Multi-rail on real providers: tcp over two loopback addresses and shm over two domains. Bulk
//! stripes over the rails' lanes, every byte lands once, and peers with different rail counts
//! still meet.
use rdmalane::sched::Stripe;
use rdmalane::{Access, Pieces};
use rdmalane_conformance::{
    bounded, expose_to, filled, pair, rail_providers, runtime, runtime_with_rails, shuffled_pages,
    write_and_read_back,
};

#[test]
fn batches_and_writes_stripe_over_rails_and_cover_every_byte_once() {
    for p in rail_providers() {
        for stripe in [Stripe::RoundRobin, Stripe::Bytes] {
            bounded(90, async {
                let (a, b) = (runtime_with_rails(p, 2, stripe), runtime_with_rails(p, 2, stripe));
                // An express rail (the default on 8 cores or more) is one rail more, in front,
                // and carries no bulk.
                let ex = usize::from(a.express_rail());
                assert_eq!(a.caps().rails, 2 + ex, "{p}: the host's two rails, and the express one");
                assert!(a.lanes() >= 3, "{p}: one express lane and a bulk lane per rail");
                let (ab, ba) = pair(&a, &b).await;
                const LEN: usize = 16 << 20;
                let (target, remote) = expose_to(&ba, &ab, LEN, Access::READ_WRITE).await;
                assert_eq!(remote.rails(), 2 + ex, "{p}: the descriptor carries a key per rail");
                let (want, src) = filled(&a, LEN, 11);
                let (l, r) = shuffled_pages(256, 5);
                let pieces = Pieces::pages(&l, &r, 65536).unwrap();
                let before: u64 = a.rail_bytes().iter().sum();
                let (n, src) = ab.write_batch(src, &remote, &pieces).await;
                assert_eq!(n.unwrap(), LEN, "{p}/{stripe:?}");
                for (i, (&lp, &rp)) in l.iter().zip(&r).enumerate() {
                    assert!(
                        target.as_slice()[rp * 65536..(rp + 1) * 65536] == want[lp * 65536..(lp + 1) * 65536],
                        "{p}/{stripe:?}: page {i}"
                    );
                }
                let per_rail = a.rail_bytes();
                let moved: u64 = per_rail.iter().sum::<u64>() - before;
                assert_eq!(moved, LEN as u64, "{p}/{stripe:?}: every byte posted once: {per_rail:?}");
                assert!(
                    per_rail[ex..].iter().all(|&x| x >= LEN as u64 / 8),
                    "{p}/{stripe:?}: both rails carried a share: {per_rail:?}"
                );
                // A plain large write and a read back stripe the same way.
                let what = format!("{p}/{stripe:?}");
                write_and_read_back(&a, &ab, src, &remote, target.as_slice(), &want, &what).await;
                // Messages still flow on the express lane.
                let recv = ba.recv(b.alloc(64).unwrap()).start();
                ab.send(a.alloc(64).unwrap()).await.0.unwrap();
                assert_eq!(recv.await.0.unwrap(), 64);
            });
        }
    }
}

#[test]
fn peers_with_different_rail_counts_meet_and_move_bytes() {
    for p in rail_providers() {
        bounded(60, async {
            let (a, b) = (runtime_with_rails(p, 3, Stripe::RoundRobin), runtime(p));
            for (x, y) in [(&a, &b), (&b, &a)] {
                let (xy, yx) = pair(x, y).await;
                let (target, remote) = expose_to(&yx, &xy, 4 << 20, Access::WRITE).await;
                let (want, src) = filled(x, 4 << 20, 2);
                xy.write_remote(src, &remote).await.0.unwrap_or_else(|e| panic!("{p}: {e}"));
                assert!(target.as_slice() == &want[..], "{p}: bytes across rail counts");
            }
        });
    }
}
