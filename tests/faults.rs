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
