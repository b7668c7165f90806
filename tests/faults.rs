//! Faults, bad input and access control on real providers: a peer's memory is reachable only as
//! it exposed it, and every failure is a typed error that leaves both sides serving.
use rdmalane::{Access, Error, RemoteBuf};
use rdmalane_conformance::{bounded, enforcing_providers, main_provider, pair, pattern, runtime, share};

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
    /// Reads a region exposed write-only (access bits forged).
    ReadWriteOnly,
    /// Reads past the end of the exposed region (length forged).
    ReadPastTheEnd,
    /// A write split into chunks, the last of which runs past the end (length forged).
    SplitPastTheEnd,
}

/// Try one forgery on a fresh connection: the op must fail and the target's memory must not
/// change; then the target must still accept and serve a new connection.
async fn attempt(p: &str, f: Forgery) -> Result<(), String> {
    let (a, b) = (runtime(p), runtime(p));
    let (ab, ba) = pair(&a, &b).await;
    let access = match f {
        Forgery::WriteReadOnly => Access::READ,
        Forgery::ReadWriteOnly => Access::WRITE,
        _ => Access::READ_WRITE,
    };
    // The split forgery's region holds its first chunks (64 KiB each): only the last is out.
    let size = if matches!(f, Forgery::SplitPastTheEnd) { 256 << 10 } else { 8192 };
    let region = b.expose(b.alloc(size).unwrap(), access).unwrap();
    let d = share(&ba, &ab, region.descriptor()).await;
    let target = match f {
        Forgery::WriteReadOnly => forge(d, None, None, Some(0b11)).slice(0..64).unwrap(),
        Forgery::PastTheEnd => forge(d, Some(1 << 30), None, None).slice(8192..8192 + 4096).unwrap(),
        Forgery::BadKey => {
            // Low bits only: the key stays a well-formed 32-bit rkey on verbs.
            forge(d.clone(), None, Some(d.key() ^ 0x5555_5555), None).slice(0..64).unwrap()
        }
        Forgery::Revoked => d.slice(0..64).unwrap(),
        Forgery::ReadWriteOnly => forge(d, None, None, Some(0b11)).slice(0..64).unwrap(),
        Forgery::ReadPastTheEnd => forge(d, Some(1 << 30), None, None).slice(8192..8192 + 4096).unwrap(),
        Forgery::SplitPastTheEnd => forge(d, Some(1 << 30), None, None).slice(0..(320 << 10)).unwrap(),
    };
    let (kept, region) = if matches!(f, Forgery::Revoked) {
        (Some(region.revoke().unwrap()), None)
    } else {
        (None, Some(region))
    };
    // On shm the initiator gives up on the target that refused it, and tells it why: the target
    // then loses the initiator too, which fails this receive.
    let told = b.caps().silent_refusals.then(|| ba.recv(b.alloc(8).unwrap()).start());
    let mut src = a.alloc(target.len() as usize).unwrap();
    src.fill(0xAA);
    let r = match f {
        Forgery::ReadWriteOnly | Forgery::ReadPastTheEnd => ab.read_remote(src, &target).await.0,
        _ => ab.write_remote(src, &target).await.0,
    };
    // Neither the revoked buffer nor the exposed region changed (a write past the end would
    // land beyond it, where the target's own state would break instead).
    // (The split write's valid chunks may land: its region holds zeros or what they wrote.)
    let landed = if matches!(f, Forgery::SplitPastTheEnd) { 0xAA } else { 0 };
    let untouched = kept.as_ref().is_none_or(|buf| buf.iter().all(|&x| x == 0))
        && region.as_ref().is_none_or(|r| r.as_slice().iter().all(|&x| x == 0 || x == landed));
    if let Some(recv) = told {
        match tokio::time::timeout(std::time::Duration::from_secs(10), recv).await {
            Ok((Err(Error::PeerLost { reason, .. }), _)) if reason.contains("gave up on us") => {}
            other => return Err(format!("{f:?}: the target should lose the initiator, got {other:?}")),
        }
    }
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
        Err(e @ Error::RemoteAccess { .. }) if untouched => {
            eprintln!("{p}: {f:?} refused: {e}");
            Ok(())
        }
        Err(e) if untouched => Err(format!("{f:?}: refused, but not as a remote access error: {e}")),
        Err(_) => Err(format!("{f:?}: refused, but the target's memory changed")),
        Ok(_) => Err(format!("{f:?}: the write succeeded")),
    }
}

#[test]
fn forged_descriptors_are_refused_by_the_provider_and_the_target_keeps_serving() {
    // tcp;ofi_rxm checks keys, ranges and access at the target, and drops the connection on a
    // violation (so each attempt gets its own): the op comes back cancelled, and rdmalane asks
    // the target's runtime whether it was allowed, to fail it as the remote access error it was. shm (1.17) does not: it writes the target with
    // process_vm_writev at the address given, checking neither key, range nor access, so the
    // same attempts there would corrupt the target's memory. The book's faults table says so.
    bounded(120, async {
        for p in enforcing_providers() {
            for f in [
                Forgery::WriteReadOnly,
                Forgery::PastTheEnd,
                Forgery::BadKey,
                Forgery::Revoked,
                Forgery::ReadWriteOnly,
                Forgery::ReadPastTheEnd,
                Forgery::SplitPastTheEnd,
            ] {
                attempt(p, f).await.unwrap();
            }
        }
    });
}

fn with_secret(p: &str, secret: Option<&str>) -> rdmalane::Runtime {
    let mut b = rdmalane_conformance::builder(p);
    if let Some(s) = secret {
        b = b.secret(s);
    }
    b.build().unwrap()
}

#[test]
fn a_shared_secret_admits_only_peers_that_know_it() {
    use rdmalane::{Error, RefusalReason};
    bounded(60, async {
        let server = with_secret(main_provider(), Some("open sesame"));
        let l = server.listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut refusals = l.refusals();
        for (secret, why) in
            [(Some("wrong"), RefusalReason::WrongSecret), (None, RefusalReason::MissingSecret)]
        {
            let client = with_secret(main_provider(), secret);
            let c = client.connect(addr).await;
            assert!(matches!(c, Err(Error::Handshake { .. })), "{c:?}");
            let r = refusals.next().await.unwrap();
            assert_eq!(r.reason, why, "{r}");
        }
        // Both sides see a wrong secret as such.
        let client = with_secret(main_provider(), Some("wrong"));
        let c = client.connect(addr).await;
        assert!(matches!(c, Err(Error::Handshake { why: RefusalReason::WrongSecret, .. })), "{c:?}");
        assert_eq!(refusals.next().await.unwrap().reason, RefusalReason::WrongSecret);
        // A peer with the secret gets in, and the link works.
        let client = with_secret(main_provider(), Some("open sesame"));
        let (c, s) = tokio::join!(client.connect(addr), l.accept());
        let (c, s) = (c.unwrap(), s.unwrap());
        let recv = s.recv(server.alloc(8).unwrap()).start();
        c.send(client.alloc(8).unwrap()).await.0.unwrap();
        assert_eq!(recv.await.0.unwrap(), 8);
        assert_eq!(server.stats().refused.wrong_secret, 2);
        assert_eq!(server.stats().refused.missing_secret, 1);
        assert_eq!(server.stats().refused.total(), 3);
        // A runtime without a secret refuses one with, in the other direction too.
        let open = with_secret(main_provider(), None);
        let l2 = open.listen("127.0.0.1:0").await.unwrap();
        let mut refused = l2.refusals();
        let c = client.connect(l2.local_addr().unwrap()).await;
        assert!(c.is_err());
        assert_eq!(refused.next().await.unwrap().reason, RefusalReason::MissingSecret);
    });
}

#[test]
fn random_bytes_on_the_control_port_never_panic_or_hang_the_listener() {
    use tokio::io::AsyncWriteExt;
    bounded(120, async {
        let server = rdmalane_conformance::builder(main_provider())
            .connect_timeout(std::time::Duration::from_millis(1500))
            .build()
            .unwrap();
        let l = server.listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut refusals = l.refusals();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A valid hello, truncated or corrupted at random points, and plain noise.
        let client = runtime(main_provider());
        let mut valid = Vec::new();
        valid.extend_from_slice(b"RDLN");
        valid.extend_from_slice(&rdmalane::PROTOCOL_VERSION.to_le_bytes());
        valid.extend_from_slice(&client.id().to_le_bytes());
        valid.extend_from_slice(&[7u8; 32]);
        valid.push(0); // no secret
        valid.push(1); // one rail
        valid.extend_from_slice(&(client.provider().len() as u16).to_le_bytes());
        valid.extend_from_slice(client.provider().as_bytes());
        valid.push(1);
        valid.extend_from_slice(&u16::MAX.to_le_bytes()); // a name claiming 64 KiB
        let mut lingering = Vec::new();
        let cases = 150u32;
        for case in 0..cases {
            let mut bytes: Vec<u8> = if case % 2 == 0 {
                let cut = (next() as usize) % (valid.len() + 1);
                valid[..cut].to_vec()
            } else {
                (0..(next() % 300)).map(|_| next() as u8).collect()
            };
            if case % 3 == 0 && !bytes.is_empty() {
                let i = (next() as usize) % bytes.len();
                bytes[i] ^= 1 << (next() % 8);
            }
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(&bytes).await;
            // Mostly the stranger hangs up after writing; a few times it stays, silent, and
            // the handshake's time limit must end it.
            if case % 50 == 8 {
                lingering.push(s);
            }
        }
        // Every stranger is refused, once, and the listener is still serving.
        for _ in 0..cases {
            let r = refusals.next().await.expect("the listener is alive");
            assert_ne!(r.reason, rdmalane::RefusalReason::OverCap, "{r}");
        }
        assert_eq!(server.stats().refused.total(), cases as u64);
        let (c, s) = tokio::join!(client.connect(addr), l.accept());
        c.unwrap();
        s.unwrap();
        drop(lingering);
    });
}

#[test]
fn one_sided_ops_above_the_largest_message_are_split_and_a_split_write_raises_its_event_after_landing() {
    // The runtime is told the provider takes 4 KiB messages at most (`max_message`), as EFA's
    // limits would: one-sided ops above it are split; a write with an immediate value raises
    // exactly one event, and only once all of its bytes are at the target. (Sends above it go
    // by rendezvous: the next test.)
    bounded(120, async {
        for p in rdmalane_conformance::providers() {
            let (a, b) = (capped(p, 4096), capped(p, 4096));
            assert_eq!(a.caps().max_msg_size, 4096, "{p}");
            let (ab, ba) = pair(&a, &b).await;
            let len = 64 * 1024 + 123;
            let region = b.expose(b.alloc(len).unwrap(), Access::READ_WRITE).unwrap();
            let d = share(&ba, &ab, region.descriptor()).await;
            for round in 0..3u64 {
                let mut src = a.alloc(len).unwrap();
                src.copy_from_slice(&pattern(len, round));
                let posted = a.stats().posted;
                let (r, _) = ab.write_with_imm(src, &d, 0x70 + round).await;
                r.unwrap_or_else(|e| panic!("{p}: split write with imm: {e}"));
                assert!(a.stats().posted - posted >= 17, "{p}: not split");
                let ev = b.next_imm().await;
                // Looked at as the event is seen: every byte must be there already.
                assert!(region.as_slice() == &pattern(len, round)[..], "{p}: event before the bytes");
                assert_eq!(ev.imm, 0x70 + round, "{p}");
                assert!(b.try_next_imm().is_none(), "{p}: more than one event for one write");
            }
            let (r, back) = ab.read_remote(a.alloc(len).unwrap(), &d).await;
            r.unwrap_or_else(|e| panic!("{p}: split read: {e}"));
            assert!(back[..] == pattern(len, 2)[..], "{p}: read back");
        }
    });
}

fn capped(p: &str, max: usize) -> rdmalane::Runtime {
    rdmalane_conformance::builder(p).max_message(max).build().unwrap()
}

#[test]
fn messages_above_the_largest_message_arrive_whole_and_in_their_place() {
    // With 4 KiB messages at most, a larger send goes by rendezvous (a marker message takes its
    // place, the receiver reads the bytes): it lands whole in the receive it would have landed
    // in, between plain messages; a receive too small fails on both sides and the link goes on;
    // a send whose future is dropped still arrives; a peer that goes away fails the send.
    use rdmalane::FailureClass;
    let truncated = |r: &Result<usize, Error>| matches!(r, Err(Error::Transport { source, .. }) if source.class == FailureClass::Truncated);
    bounded(180, async {
        for p in rdmalane_conformance::providers() {
            let (a, b) = (capped(p, 4096), capped(p, 4096));
            let (ab, ba) = pair(&a, &b).await;
            // Big, small, big, exactly the limit, one byte above it: in order, each whole.
            let sizes = [64 * 1024 + 123, 100, 20_000, 4096, 4097];
            let recvs: Vec<_> = sizes.iter().map(|_| ba.recv(b.alloc(70_000).unwrap()).start()).collect();
            for (i, &n) in sizes.iter().enumerate() {
                let mut m = a.alloc(n).unwrap();
                m.copy_from_slice(&pattern(n, i as u64));
                let (r, _) = ab.send(m).await;
                assert_eq!(r.unwrap_or_else(|e| panic!("{p}: send {i} ({n} bytes): {e}")), n, "{p}");
            }
            for (i, (f, &n)) in recvs.into_iter().zip(&sizes).enumerate() {
                let (r, got) = f.await;
                assert_eq!(r.unwrap_or_else(|e| panic!("{p}: recv {i}: {e}")), n, "{p}: recv {i}");
                assert!(got[..n] == pattern(n, i as u64)[..], "{p}: recv {i} bytes differ");
            }
            // A receive too small for the message: both sides fail, typed; nothing is read.
            let small = ba.recv(b.alloc(8192).unwrap()).start();
            let (r, _) = ab.send(a.alloc(10_000).unwrap()).await;
            assert!(truncated(&r), "{p}: send into a small receive: {r:?}");
            let (r, buf) = small.await;
            assert!(truncated(&r), "{p}: small receive: {r:?}");
            assert!(buf.iter().all(|&x| x == 0), "{p}: bytes read into a receive that failed");
            // A send whose future is dropped once its marker is posted still arrives whole
            // (dropped before the reactor took it, it would be withdrawn, as any op).
            let next = ba.recv(b.alloc(50_000).unwrap()).start();
            let mut m = a.alloc(50_000).unwrap();
            m.copy_from_slice(&pattern(50_000, 9));
            let posted = a.stats().posted;
            let send = ab.send(m).start();
            while a.stats().posted == posted {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            drop(send);
            let (r, got) = next.await;
            assert_eq!(r.unwrap_or_else(|e| panic!("{p}: after a dropped send: {e}")), 50_000, "{p}");
            assert!(got[..] == pattern(50_000, 9)[..], "{p}: dropped send's bytes differ");
            // A receiver that goes away before taking the message fails the send, in bounded time.
            let send = ab.send(a.alloc(30_000).unwrap()).start();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(ba);
            let (r, _) = tokio::time::timeout(std::time::Duration::from_secs(20), send)
                .await
                .unwrap_or_else(|_| panic!("{p}: send to a gone peer did not resolve"));
            assert!(r.as_ref().is_err_and(|e| e.is_peer_lost()), "{p}: send to a gone peer: {r:?}");
        }
    });
}

#[test]
fn a_shutdown_lets_a_peer_finish_reading_a_send() {
    // A send above the largest message goes by rendezvous: once its marker is out, the peer
    // reads the bytes when its application posts a receive. A shutdown meanwhile gives that
    // send the time posted ops get: the peer reads it whole, the send succeeds, and the stop
    // ends with the peer's answer, not at its two-second deadline.
    bounded(120, async {
        for p in rdmalane_conformance::providers() {
            let (a, b) = (capped(p, 4096), capped(p, 4096));
            let (ab, ba) = pair(&a, &b).await;
            let mut m = a.alloc(50_000).unwrap();
            m.copy_from_slice(&pattern(50_000, 3));
            let posted = a.stats().posted;
            let send = ab.send(m).start();
            while a.stats().posted == posted {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            // The offer reaches b, whose application has no receive posted yet.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let stopping = {
                let a = a.clone();
                std::thread::spawn(move || {
                    let t = std::time::Instant::now();
                    a.shutdown();
                    t.elapsed()
                })
            };
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let (r, got) = ba.recv(b.alloc(70_000).unwrap()).await;
            assert_eq!(r.unwrap_or_else(|e| panic!("{p}: the receive: {e}")), 50_000, "{p}");
            assert!(got[..50_000] == pattern(50_000, 3)[..], "{p}: the bytes read differ");
            let (r, _) = send.await;
            assert_eq!(r.unwrap_or_else(|e| panic!("{p}: the send, read whole: {e}")), 50_000, "{p}");
            let took = tokio::task::spawn_blocking(move || stopping.join().expect("the stop"))
                .await
                .expect("joined");
            assert!(took < std::time::Duration::from_millis(1900), "{p}: the stop took {took:?}");
            drop((ab, ba));
        }
    });
}

#[test]
fn shm_checks_one_sided_ops_unless_local_peers_are_trusted() {
    // By default shm routes one-sided ops through the target, which checks them (the forged
    // descriptor test above runs that way); trusting local peers takes shm's unchecked fast
    // path, which must still move bytes exactly.
    if !rdmalane_conformance::providers().contains(&"shm") {
        return;
    }
    bounded(60, async {
        let open =
            |trust: bool| rdmalane_conformance::builder("shm").trust_local_peers(trust).build().unwrap();
        assert!(open(false).caps().silent_refusals, "checked by default");
        let (a, b) = (open(true), open(true));
        assert!(!a.caps().silent_refusals, "trusted: the fast path");
        let (ab, ba) = pair(&a, &b).await;
        let region = b.expose(b.alloc(1 << 20).unwrap(), Access::READ_WRITE).unwrap();
        let d = share(&ba, &ab, region.descriptor()).await;
        for (i, n) in [1usize, 17, 4096, 65_537, 1 << 20].into_iter().enumerate() {
            let mut src = a.alloc(n).unwrap();
            src.copy_from_slice(&pattern(n, i as u64));
            ab.write_remote(src, &d.slice(0..n as u64).unwrap()).await.0.unwrap();
            assert!(region.as_slice()[..n] == pattern(n, i as u64)[..], "write of {n}");
            let (r, back) = ab.read_remote(a.alloc(n).unwrap(), &d.slice(0..n as u64).unwrap()).await;
            r.unwrap();
            assert!(back[..] == pattern(n, i as u64)[..], "read of {n}");
        }
    });
}

#[test]
fn keys_rdmalane_chooses_are_random_not_counters() {
    // tcp;ofi_rxm and shm take the keys their user asks for (no FI_MR_PROV_KEY): rdmalane draws
    // them at random, so a peer cannot guess the key of a region it was not given. (verbs and
    // efa hand out provider keys.)
    bounded(60, async {
        for p in rdmalane_conformance::providers().into_iter().filter(|p| !rdmalane_verbs::is_verbs(p)) {
            let rt = runtime(p);
            let regions: Vec<_> =
                (0..64).map(|_| rt.expose(rt.alloc(4096).unwrap(), Access::READ).unwrap()).collect();
            let mut keys: Vec<u64> = regions.iter().map(|r| r.descriptor().key()).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), 64, "{p}: keys repeat");
            // 64 random 64-bit keys: the closest two are ~2^52 apart; counters are 1 apart.
            let closest = keys.windows(2).map(|w| w[1] - w[0]).min().unwrap();
            assert!(closest > 1 << 32, "{p}: keys {closest} apart look like a counter");
        }
    });
}

/// Two runtimes of one process; one goes away with the other's one-sided ops in flight to it:
/// by dropping its endpoint and shutting down, by shutting down with its endpoint still held,
/// or both shutting down at once with ops in flight both ways. The ops resolve (done, or
/// failed with the loss or the shutdown), and nothing crashes: on shm, peers of one process
/// share memory, and an endpoint closed under a peer that still served it crashed inside
/// libfabric (rdmalane-efa's shm_peers).
#[test]
fn a_peer_runtime_of_this_process_going_away_mid_transfer_fails_the_ops_cleanly() {
    use std::time::Duration;
    for p in rdmalane_conformance::providers() {
        bounded(90, async {
            for how in ["endpoint dropped", "endpoint held", "both shut down"] {
                let (a, b) = (runtime(p), runtime(p));
                let (ab, ba) = pair(&a, &b).await;
                const LEN: usize = 32 << 20;
                let at_b = b.expose(b.alloc(LEN).unwrap(), Access::WRITE).unwrap();
                let at_a = a.expose(a.alloc(LEN).unwrap(), Access::WRITE).unwrap();
                let to_b = share(&ba, &ab, at_b.descriptor()).await;
                let to_a = share(&ab, &ba, at_a.descriptor()).await;
                let mut ops: Vec<_> =
                    (0..4).map(|_| ab.write_remote(a.alloc(LEN).unwrap(), &to_b).start()).collect();
                if how == "both shut down" {
                    ops.extend((0..4).map(|_| ba.write_remote(b.alloc(LEN).unwrap(), &to_a).start()));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                let held = match how {
                    "endpoint dropped" => {
                        drop(ba);
                        None
                    }
                    _ => Some(ba),
                };
                if how == "both shut down" {
                    let a2 = a.clone();
                    let other = std::thread::spawn(move || a2.shutdown());
                    b.shutdown();
                    other.join().unwrap();
                } else {
                    b.shutdown();
                }
                for op in ops {
                    match tokio::time::timeout(Duration::from_secs(20), op).await.expect("resolves").0 {
                        Ok(n) => assert_eq!(n, LEN, "{p}, {how}"),
                        Err(e) if e.is_peer_lost() => {}
                        Err(Error::Transport { .. } | Error::Shutdown { .. }) => {}
                        Err(e) => panic!("{p}, {how}: {e}"),
                    }
                }
                if how != "both shut down" {
                    // The survivor learns of the loss and keeps serving others.
                    let c = runtime(p);
                    let (ac, ca) = pair(&a, &c).await;
                    let recv = ca.recv(c.alloc(16).unwrap()).start();
                    ac.send(a.alloc(16).unwrap()).await.0.unwrap_or_else(|e| panic!("{p}: {e}"));
                    assert_eq!(recv.await.0.unwrap(), 16);
                }
                drop((held, at_a, at_b));
            }
        });
    }
}
