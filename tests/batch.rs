//! Batch transfers on real providers: pages and scatter lists land byte-exact, immediate counts
//! add up whatever order pieces land in, and a batch failing part-way names its piece.
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdmalane::{Access, Error, Pieces, RemoteBuf};
use rdmalane_conformance::{bounded, expose_to, filled, pair, pattern, providers, runtime};

/// Random pieces with non-overlapping remote ranges (so every target byte has one writer) and
/// local ranges anywhere in `local_len`.
fn scatter(rng: &mut impl Rng, n: usize, local_len: usize, remote_len: usize) -> Pieces {
    let slot = remote_len / n;
    let mut slots: Vec<usize> = (0..n).collect();
    slots.shuffle(rng);
    slots
        .into_iter()
        .map(|s| {
            let len = rng.gen_range(1..=slot.min(local_len));
            let remote = s * slot + rng.gen_range(0..=slot - len);
            let local = rng.gen_range(0..=local_len - len);
            (local, remote as u64, len)
        })
        .collect()
}

/// Every piece's bytes are at its remote offset, and nothing outside the pieces was written.
fn check(p: &str, what: &str, target: &[u8], src: &[u8], pieces: &Pieces) {
    let mut covered = vec![false; target.len()];
    for (i, pc) in pieces.iter().enumerate() {
        let r = pc.remote as usize;
        assert!(
            target[r..r + pc.len] == src[pc.local..pc.local + pc.len],
            "{p}: {what}: piece {i} ({pc:?}) differs at the target"
        );
        covered[r..r + pc.len].iter_mut().for_each(|c| *c = true);
    }
    let stray = target.iter().zip(&covered).position(|(&b, &c)| !c && b != 0);
    assert_eq!(stray, None, "{p}: {what}: a byte outside every piece was written");
}

#[test]
fn pages_and_scatter_lists_land_byte_exact_in_any_layout() {
    for p in providers() {
        bounded(120, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            const LEN: usize = 8 << 20;
            let (want, mut src) = filled(&a, LEN, 1);
            for round in 0..12 {
                let (target, remote) = expose_to(&ba, &ab, LEN, Access::READ_WRITE).await;
                let pieces = match round % 3 {
                    // Shuffled pages of 4 KiB to 256 KiB.
                    0 | 1 => {
                        let page = 4096 << (round % 7);
                        let n = LEN / page;
                        let mut l: Vec<usize> = (0..n).collect();
                        let mut r = l.clone();
                        l.shuffle(&mut rng);
                        r.shuffle(&mut rng);
                        let k = rng.gen_range(1..=n);
                        Pieces::pages(&l[..k], &r[..k], page).unwrap()
                    }
                    // Scatter lists of odd sizes, including runs that touch remotely.
                    _ => {
                        let n = rng.gen_range(1..600);
                        scatter(&mut rng, n, LEN, LEN)
                    }
                };
                let (n, back) = ab.write_batch(src, &remote, &pieces).await;
                src = back;
                assert_eq!(n.unwrap_or_else(|e| panic!("{p}: round {round}: {e}")) as u64, pieces.bytes());
                check(p, &format!("write round {round}"), target.as_slice(), &want, &pieces);
                // And back: read the same pieces into a fresh buffer.
                let (n, got) = ab.read_batch(a.alloc(LEN).unwrap(), &remote, &pieces).await;
                assert_eq!(n.unwrap() as u64, pieces.bytes());
                for (i, pc) in pieces.iter().enumerate() {
                    let r = pc.remote as usize;
                    assert!(
                        got[pc.local..pc.local + pc.len] == target.as_slice()[r..r + pc.len],
                        "{p}: read piece {i}"
                    );
                }
            }
        });
    }
}

#[test]
fn immediate_counts_add_up_whatever_order_pieces_land_in() {
    for p in providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 4 << 20, Access::WRITE).await;
            let mut src = a.alloc(4 << 20).unwrap();
            src.copy_from_slice(&pattern(4 << 20, 9));
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let mut l: Vec<usize> = (0..256).collect();
            l.shuffle(&mut rng);
            let mut r: Vec<usize> = (0..256).collect();
            r.shuffle(&mut rng);
            // Two batches under two tags, over several lanes, in flight together.
            let even = Pieces::pages(&l[..128], &r[..128], 16384).unwrap();
            let odd = Pieces::pages(&l[128..], &r[128..], 16384).unwrap();
            let mut src2 = a.alloc(4 << 20).unwrap();
            src2.copy_from_slice(&pattern(4 << 20, 9));
            let w1 = ab.write_batch_with_imm(src, &remote, &even, 0xA1).start();
            let w2 = ab.write_batch_with_imm(src2, &remote, &odd, 0xB2).start();
            // The target counts; it does not care which order they come in.
            tokio::time::timeout(Duration::from_secs(20), b.wait_imm(0xB2, 128)).await.expect("tag B2");
            tokio::time::timeout(Duration::from_secs(20), b.wait_imm(0xA1, 128)).await.expect("tag A1");
            let ((r1, s), (r2, _)) = tokio::join!(w1, w2);
            r1.unwrap();
            r2.unwrap();
            assert_eq!(b.imm_count(0xA1) + b.imm_count(0xB2), 0, "{p}: more events than pieces");
            assert!(b.try_next_imm().is_none(), "{p}: counted events also came out of next_imm");
            check(p, "with imm", target.as_slice(), &s, &{
                let mut all: Vec<_> = even.iter().copied().collect();
                all.extend(odd.iter().copied());
                Pieces::from(all)
            });
        });
    }
}

#[test]
fn bad_batches_are_refused_before_posting_with_the_piece_named() {
    let p = rdmalane_conformance::main_provider();
    bounded(30, async {
        let (a, b) = (runtime(p), runtime(p));
        let (ab, ba) = pair(&a, &b).await;
        let (_t, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
        let before = a.stats().posted;
        let mut ps = Pieces::new();
        ps.push(0, 0, 4096).push(4096, (1 << 20) - 100, 4096);
        let (r, _) = ab.write_batch(a.alloc(1 << 20).unwrap(), &remote, &ps).await;
        match r {
            Err(Error::Batch { piece: 1, source }) => assert!(matches!(*source, Error::OutOfBounds { .. })),
            other => panic!("past the remote end: {other:?}"),
        }
        let mut ps = Pieces::new();
        ps.push(1 << 20, 0, 1);
        let (r, _) = ab.write_batch(a.alloc(1 << 20).unwrap(), &remote, &ps).await;
        assert!(matches!(r, Err(Error::Batch { piece: 0, .. })), "past the local end: {r:?}");
        let (r, _) = ab.write_batch(a.alloc(64).unwrap(), &remote, &Pieces::new()).await;
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "empty batch: {r:?}");
        assert!(Pieces::pages(&[0, 1], &[0], 4096).is_err(), "page lists of different lengths");
        assert!(Pieces::pages_strided(&[0], 100, &[0], 4096, 4096).is_err(), "stride below the page size");
        assert_eq!(a.stats().posted, before, "nothing was posted for refused batches");
    });
}

/// A peer's descriptor with a forged length: the pieces past the real region are refused by the
/// provider at the target (tcp;ofi_rxm checks; shm 1.17 does not, see the book's faults chapter).
fn stretched(d: RemoteBuf, len: u64) -> RemoteBuf {
    let mut b = d.to_bytes().to_vec();
    b[24..32].copy_from_slice(&len.to_le_bytes());
    RemoteBuf::from_bytes(&b).expect("well-formed")
}

#[test]
fn a_batch_failing_part_way_names_the_piece_and_keeps_what_landed() {
    for p in rdmalane_conformance::enforcing_providers() {
        bounded(60, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            let (target, remote) = expose_to(&ba, &ab, 1 << 20, Access::WRITE).await;
            let remote = stretched(remote, 2 << 20);
            // Pieces 0..16 inside the region, piece 16 past it, the rest inside again.
            let mut ps = Pieces::new();
            for i in 0..16usize {
                ps.push(i * 4096, (i * 4096) as u64, 4096);
            }
            ps.push(0, (1 << 20) + 8192, 4096);
            for i in 17..24usize {
                ps.push(i * 4096, (i * 4096) as u64, 4096);
            }
            let mut src = a.alloc(24 * 4096).unwrap();
            src.copy_from_slice(&pattern(24 * 4096, 5));
            let (res, src) = ab.write_batch(src, &remote, &ps).await;
            // The error names the first piece that did not land. On one lane that is the forged
            // one; with several (an express rail adds lanes), pieces before it may still have
            // been queued, or in flight on another lane, when its failure closed the connection.
            let first = match res {
                Err(Error::Batch { piece, source }) => {
                    assert!(piece <= 16, "{p}: piece {piece} named, past the forged one: {source}");
                    if !a.express_rail() {
                        assert_eq!(
                            piece, 16,
                            "{p}: with one lane the forged piece is the first that failed: {source}"
                        );
                    }
                    piece
                }
                other => panic!("a piece past the region must fail the batch: {other:?}"),
            };
            assert!(
                target.as_slice()[..first * 4096] == src[..first * 4096],
                "{p}: the pieces before piece {first} landed"
            );
        });
    }
}
