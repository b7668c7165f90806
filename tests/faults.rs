//! Faults, bad input and access control on real providers: a peer's memory is reachable only as
//! it exposed it, and every failure is a typed error that leaves both sides serving.
use rdmalane::{Access, RemoteBuf};
use rdmalane_conformance::{bounded, pair, pattern, runtime, share};

/// The descriptor with its length, key or access bits changed, as a misbehaving peer could
/// forge it (the wire format is public).
fn forge(d: RemoteBuf, len: Option<u64>, key: Option<u64>, access: Option<u8>) -> RemoteBuf {
    let mut b = d.to_bytes();
    if let Some(a) = access {
        b[5] = a;
    }
    if let Some(l) = len {
        b[24..32].copy_from_slice(&l.to_le_bytes());
    }
    if let Some(k) = key {
        b[32..40].copy_from_slice(&k.to_le_bytes());
    }
    RemoteBuf::from_bytes(&b).expect("still well-formed")
}

/// What a misbehaving peer tries.
#[derive(Debug, Clone, Copy)]
enum Forgery {
    /// Writes a region exposed read-only (access bits forged).
    WriteReadOnly,
    /// Writes past the end of the exposed region (length forged).
    PastTheEnd,
    /// Uses a key never handed out.
    BadKey,
    /// Writes a region after it was revoked.
    Revoked,
}

/// Try one forgery on a fresh connection: the op must fail and the target's memory must not
/// change; then the target must still accept and serve a new connection.
async fn attempt(p: &str, f: Forgery) -> Result<(), String> {
    let (a, b) = (runtime(p), runtime(p));
    let (ab, ba) = pair(&a, &b).await;
    let access = if matches!(f, Forgery::WriteReadOnly) { Access::READ } else { Access::READ_WRITE };
    let region = b.expose(b.alloc(8192).unwrap(), access).unwrap();
    let d = share(&ba, &ab, region.descriptor()).await;
    let target = match f {
        Forgery::WriteReadOnly => forge(d, None, None, Some(0b11)).slice(0..64).unwrap(),
        Forgery::PastTheEnd => forge(d, Some(1 << 30), None, None).slice(8192..8192 + 4096).unwrap(),
        Forgery::BadKey => forge(d, None, Some(d.key() ^ 0x5555_5555_5555_5555), None).slice(0..64).unwrap(),
        Forgery::Revoked => d.slice(0..64).unwrap(),
    };
    let kept = if matches!(f, Forgery::Revoked) { Some(region.revoke().unwrap()) } else { None };
    let mut src = a.alloc(target.len() as usize).unwrap();
    src.fill(0xAA);
    let (r, _) = ab.write_remote(src, &target).await;
    let untouched = kept.as_ref().is_none_or(|buf| buf.iter().all(|&x| x == 0));
    drop((ab, ba));
    // The target still serves: a new connection moves bytes.
    let (ab, ba) = pair(&a, &b).await;
    let fresh = b.expose(b.alloc(4096).unwrap(), Access::WRITE).unwrap();
    let d = share(&ba, &ab, fresh.descriptor()).await;
    let mut src = a.alloc(4096).unwrap();
    src.copy_from_slice(&pattern(4096, 3));
    ab.write_remote(src, &d).await.0.map_err(|e| format!("after {f:?}: {e}"))?;
    if fresh.as_slice() != &pattern(4096, 3)[..] {
        return Err(format!("after {f:?}: bytes differ"));
    }
    match r {
        Err(e) if untouched => {
            eprintln!("{p}: {f:?} refused: {e}");
            Ok(())
        }
        Err(_) => Err(format!("{f:?}: refused, but the revoked region changed")),
        Ok(_) => Err(format!("{f:?}: the write succeeded")),
    }
}

#[test]
fn forged_descriptors_are_refused_by_the_provider_and_the_target_keeps_serving() {
    // tcp;ofi_rxm checks keys, ranges and access at the target (and drops the connection on a
    // violation, so each attempt gets its own). shm (1.17) does not: it writes the target with
    // process_vm_writev at the address given, checking neither key, range nor access, so the
    // same attempts there would corrupt the target's memory. The book's faults table says so.
    bounded(120, async {
        for f in [Forgery::WriteReadOnly, Forgery::PastTheEnd, Forgery::BadKey, Forgery::Revoked] {
            attempt("tcp", f).await.unwrap();
        }
    });
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4096
}

#[test]
fn a_drop_storm_then_a_shutdown_with_ops_queued_resolves_every_op() {
    use futures::stream::{FuturesUnordered, StreamExt};
    use rdmalane::Error;

    for p in rdmalane_conformance::PROVIDERS {
        bounded(180, async {
            let baseline = rss();
            {
                let (a, b) = (runtime(p), runtime(p));
                let (ab, ba) = pair(&a, &b).await;
                let target = b.expose(b.alloc(1 << 20).unwrap(), Access::READ_WRITE).unwrap();
                let remote = share(&ba, &ab, target.descriptor()).await;
                let mut x = 0x2545_f491_4f6c_dd1du64;
                let mut rand = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut kept = FuturesUnordered::new();
                let (mut completed_seen, mut polled) = (0, 0);
                for _ in 0..10_000 {
                    let len = 1 + (rand() % 65_536) as usize;
                    let off = rand() % ((1 << 20) - len as u64);
                    let piece = remote.slice(off..off + len as u64).unwrap();
                    let buf = a.alloc(len).unwrap();
                    let mut op = if rand() % 2 == 0 {
                        ab.write_remote(buf, &piece)
                    } else {
                        ab.read_remote(buf, &piece)
                    };
                    match rand() % 4 {
                        // Dropped before it was ever polled: never submitted.
                        0 => drop(op),
                        // Submitted, dropped at once: withdrawn or completed in the reactor.
                        1 => {
                            polled += 1;
                            let _ = futures::poll!(&mut op);
                            drop(op);
                        }
                        // Submitted, dropped a little later: likely posted, in flight.
                        2 => {
                            polled += 1;
                            let _ = futures::poll!(&mut op);
                            tokio::task::yield_now().await;
                            drop(op);
                        }
                        // Awaited.
                        _ => {
                            polled += 1;
                            kept.push(op.start());
                        }
                    }
                    while kept.len() > 64 {
                        let (r, _) = kept.next().await.unwrap();
                        r.unwrap_or_else(|e| panic!("{p}: {e}"));
                        completed_seen += 1;
                    }
                }
                while let Some((r, _)) = kept.next().await {
                    r.unwrap();
                    completed_seen += 1;
                }
                // Every submitted op is accounted for: completed, failed or withdrawn.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                let s = loop {
                    let s = a.stats();
                    if s.completed + s.failed + s.withdrawn == s.submitted {
                        break s;
                    }
                    assert!(std::time::Instant::now() < deadline, "{p}: ops unaccounted for: {s:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                };
                assert!(s.submitted as usize >= polled, "{p}: {s:?}");
                assert_eq!(s.failed, 0, "{p}: {s:?}");
                eprintln!("{p}: drop storm: {s:?}, {completed_seen} awaited");

                // Shutdown with ops queued and in flight: each resolves, completed or Shutdown.
                let pending: Vec<_> =
                    (0..200).map(|_| ab.write_remote(a.alloc(1 << 20).unwrap(), &remote).start()).collect();
                let late = a.alloc(64).unwrap();
                a.shutdown();
                let (mut ok, mut shut) = (0, 0);
                for op in pending {
                    match op.await.0 {
                        Ok(_) => ok += 1,
                        Err(Error::Shutdown { .. }) => shut += 1,
                        Err(e) => panic!("{p}: after shutdown: {e}"),
                    }
                }
                assert_eq!(ok + shut, 200);
                let (r, _) = ab.write_remote(late, &remote.slice(0..64).unwrap()).await;
                assert!(matches!(r, Err(Error::Shutdown { .. })), "{p}: an op after shutdown: {r:?}");
                assert!(matches!(a.alloc(64), Err(Error::Shutdown { op: rdmalane::OpKind::Register })));
                eprintln!("{p}: shutdown: {ok} completed, {shut} failed with Shutdown");
            }
            let grown = rss().saturating_sub(baseline);
            assert!(grown < 128 << 20, "{p}: resident memory grew by {} MiB", grown >> 20);
        });
    }
}
