//! Verbs-only behaviour on a real verbs device (rxe0 inside the Soft-RoCE VM:
//! `scripts/test-verbs.sh`). Where the host has no device, each test says so and checks only
//! that the backend refuses plainly: no device is faked.
use rdmalane::backend::{Access, Completion, WrKind};
use rdmalane::{Error, RemoteBuf};
use rdmalane_conformance::{bounded, pair, pattern, runtime, share};
use rdmalane_efa::raw::RawEngine;
use rdmalane_verbs::{DeviceSpec, VerbsTransport};

/// The device to test on, or `None` (said once per test) where the host has none.
fn device(test: &str) -> Option<String> {
    let d = rdmalane_verbs::devices().into_iter().next();
    if d.is_none() {
        eprintln!(
            "{test}: no verbs device on this host; the verbs suite runs in the VM (scripts/test-verbs.sh)"
        );
    }
    d
}

#[test]
fn without_a_device_the_backend_says_so_plainly() {
    if !rdmalane_verbs::devices().is_empty() {
        // With a device: a name that is not there is refused with the list of those that are.
        let r = rdmalane_conformance::builder("verbs:no_such_dev").build();
        let Err(e) = r else { panic!("opened a device that does not exist") };
        assert!(e.to_string().contains("no device named 'no_such_dev'"), "{e}");
        return;
    }
    let r = rdmalane_conformance::builder("verbs").build();
    let Err(e) = r else { panic!("opened a verbs device on a host without one") };
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("no RDMA device"), "{e}");
}

#[test]
fn provider_strings_and_environment_pick_the_device() {
    assert_eq!(DeviceSpec::parse(Some("verbs:mlx5_0")).unwrap().name.as_deref(), Some("mlx5_0"));
    assert!(DeviceSpec::parse(Some("verbs:")).is_err());
    assert!(DeviceSpec::parse(Some("tcp")).is_err());
    assert!(rdmalane_verbs::is_verbs("verbs") && !rdmalane_verbs::is_verbs("verbs;ofi_rxm"));
}

/// Two raw engines on the device, their lanes connected to each other.
fn engines() -> (RawEngine, RawEngine, u64, u64) {
    let spec = DeviceSpec::parse(Some("verbs")).unwrap();
    let mut a = RawEngine::on(Box::new(VerbsTransport::open(&spec, false).unwrap())).unwrap();
    let mut b = RawEngine::on(Box::new(VerbsTransport::open(&spec, false).unwrap())).unwrap();
    let pa = a.insert_peer(&b.name()).unwrap();
    let pb = b.insert_peer(&a.name()).unwrap();
    (a, b, pa, pb)
}

/// Poll `e` until `n` completions came (at most 20 s).
fn collect(e: &mut RawEngine, n: usize) -> Vec<Completion> {
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        e.poll(&mut out, 64);
        assert!(t0.elapsed().as_secs() < 20, "{} of {n} completions: {out:?}", out.len());
    }
    out
}

#[test]
fn linked_unsignalled_writes_each_complete_in_order_and_land() {
    let Some(_) = device("linked writes") else { return };
    let (mut a, mut b, pa, _) = engines();
    let n = 100usize;
    let dst = b.alloc(n * 256, Access::WRITE).unwrap();
    let (addr, key) = b.remote(dst);
    let src = a.alloc(n * 256, Access::LOCAL).unwrap();
    a.bytes(src)[..n * 256].copy_from_slice(&pattern(n * 256, 11));
    // One list of 100 (posted 32 at a time), most without a completion of their own; sizes
    // alternate around the inline limit.
    for i in 0..n {
        let len = if i % 2 == 0 { 16 } else { 256 };
        let kind = WrKind::Write { remote_addr: addr + (i * 256) as u64, key, imm: None };
        a.post_more(i as u64 + 1, pa, kind, (src, i * 256, len), i + 1 < n).unwrap();
    }
    let got = collect(&mut a, n);
    let ids: Vec<u64> = got
        .iter()
        .map(|c| match c {
            Completion::Op { id, status: Ok(()), .. } => id.to_raw(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, (1..=n as u64).collect::<Vec<_>>(), "every request completes once, in order");
    let want = pattern(n * 256, 11);
    for i in 0..n {
        let len = if i % 2 == 0 { 16 } else { 256 };
        assert_eq!(b.bytes(dst)[i * 256..i * 256 + len], want[i * 256..i * 256 + len], "write {i}");
    }
}

#[test]
fn immediates_go_to_their_own_queue_and_never_take_a_posted_receive() {
    let Some(_) = device("immediates") else { return };
    let (mut a, mut b, pa, pb) = engines();
    let dst = b.alloc(4096, Access::WRITE).unwrap();
    let (addr, key) = b.remote(dst);
    let rbuf = b.alloc(64, Access::LOCAL).unwrap();
    // A receive for a message is posted first; three writes with immediates arrive before
    // the message, and must leave it alone.
    b.post(1, pb, WrKind::Recv, rbuf, 0, 64).unwrap();
    let src = a.alloc(4096, Access::LOCAL).unwrap();
    a.bytes(src).copy_from_slice(&pattern(4096, 2));
    for (i, imm) in [7u64, 0xdead_beef, 9].into_iter().enumerate() {
        let kind = WrKind::Write { remote_addr: addr + (i * 1024) as u64, key, imm: Some(imm) };
        a.post(10 + i as u64, pa, kind, src, i * 1024, 1024).unwrap();
    }
    a.bytes(src)[..5].copy_from_slice(b"hello");
    a.post(20, pa, WrKind::Send { imm: Some(0x1234_5678) }, src, 0, 5).unwrap();
    collect(&mut a, 4);
    let got = collect(&mut b, 4);
    let imms: Vec<u64> = got
        .iter()
        .filter_map(|c| match c {
            Completion::RemoteWrite { imm, len } => {
                assert_eq!(*len, 1024);
                Some(*imm)
            }
            _ => None,
        })
        .collect();
    assert_eq!(imms, vec![7, 0xdead_beef, 9]);
    let msg = got.iter().find_map(|c| match c {
        Completion::Op { id, len, imm, status: Ok(()) } if id.to_raw() == 1 => Some((*len, *imm)),
        _ => None,
    });
    assert_eq!(msg, Some((5, Some(0x1234_5678))), "the send (with its immediate) took the receive: {got:?}");
    assert_eq!(&b.bytes(rbuf)[..5], b"hello");
    assert_eq!(b.bytes(dst)[..3072], pattern(4096, 2)[..3072]);
}

#[test]
fn a_bad_rkey_is_a_remote_access_error_and_the_endpoint_can_be_established_again() {
    let Some(_) = device("bad rkey") else { return };
    bounded(120, async {
        let (a, b) = (runtime("verbs"), runtime("verbs"));
        let (ab, ba) = pair(&a, &b).await;
        // A second endpoint between the same runtimes, opened before the fault.
        let (ab2, ba2) = pair(&a, &b).await;
        let region = b.expose(b.alloc(8192).unwrap(), Access::WRITE).unwrap();
        let d = share(&ba, &ab, region.descriptor()).await;
        let mut bytes = d.to_bytes();
        let bad_key = (d.key() ^ 0x00ff_ff00).to_le_bytes();
        bytes[32..40].copy_from_slice(&bad_key);
        let forged = RemoteBuf::from_bytes(&bytes).unwrap();
        let (r, _) = ab.write_remote(a.alloc(64).unwrap(), &forged.slice(0..64).unwrap()).await;
        assert!(matches!(&r, Err(Error::RemoteAccess { .. })), "{r:?}");
        // The queue pair is in the error state now: the next op on this endpoint fails at once,
        // saying so.
        let (r, _) = ab.write_remote(a.alloc(64).unwrap(), &d.slice(0..64).unwrap()).await;
        let e = r.expect_err("a failed lane refuses new work");
        assert!(e.is_peer_lost() && e.to_string().contains("error state"), "{e}");
        // The other endpoint is untouched.
        let d2 = share(&ba2, &ab2, region.descriptor()).await;
        let mut src = a.alloc(4096).unwrap();
        src.copy_from_slice(&pattern(4096, 4));
        ab2.write_remote(src, &d2.slice(0..4096).unwrap()).await.0.unwrap();
        assert_eq!(region.as_slice()[..4096], pattern(4096, 4)[..]);
        // Established again, the link works.
        drop((ab, ba));
        let (ab, ba) = pair(&a, &b).await;
        let d = share(&ba, &ab, region.descriptor()).await;
        let mut src = a.alloc(8192).unwrap();
        src.copy_from_slice(&pattern(8192, 5));
        ab.write_remote(src, &d).await.0.unwrap();
        assert_eq!(region.as_slice(), &pattern(8192, 5)[..]);
    });
}

#[test]
fn immediates_wider_than_the_device_carries_are_refused_before_posting() {
    let Some(_) = device("wide immediates") else { return };
    bounded(60, async {
        let (a, b) = (runtime("verbs"), runtime("verbs"));
        let (ab, ba) = pair(&a, &b).await;
        let region = b.expose(b.alloc(64).unwrap(), Access::WRITE).unwrap();
        let d = share(&ba, &ab, region.descriptor()).await;
        let (r, _) = ab.write_with_imm(a.alloc(64).unwrap(), &d, 1 << 40).await;
        let e = r.expect_err("a 41-bit immediate on verbs");
        assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("4-byte"), "{e}");
        ab.write_with_imm(a.alloc(64).unwrap(), &d, u32::MAX as u64).await.0.unwrap();
        b.wait_imm(u32::MAX as u64, 1).await;
    });
}
