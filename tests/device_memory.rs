//! Device memory on real providers: writes, reads, page batches and messages between host and
//! device memory, in every direction, land byte-exact; the target reads only through the
//! documented sync (the write's immediate event, then `settle`; `publish` before peers read);
//! dropping staged ops at any point is safe; device memory a runtime cannot move is refused at
//! once with a typed error. Everywhere on the emulated device (the staging path with host
//! copies); with the `cuda` feature and `RDMALANE_GPU=1`, on CUDA memory too (the path the
//! runtime picks: native with FI_HMEM, staged without).
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdmalane::buf::EmulatedDeviceBuf;
use rdmalane::{Access, DevicePolicy, Error, Memory, Pieces, RegisteredBuf, Runtime};
use rdmalane_conformance::device::TestBuf;
use rdmalane_conformance::{bounded, builder, pair, pattern, providers, runtime, share};

/// Sizes across the staging chunk (2 MiB): one small op, one of a few pages, one of 3 chunks.
const SIZES: [usize; 3] = [16, 3 * 4096 + 5, (5 << 20) + 123];

/// `S` at runtime `a` to and from `T` exposed at runtime `b`.
async fn suite<S: TestBuf, T: TestBuf>(p: &str, a: &Runtime, b: &Runtime) {
    let what = format!("{p}: {} -> {}", S::KIND, T::KIND);
    let (ab, ba) = pair(a, b).await;
    let region = *SIZES.iter().max().unwrap();
    let exposed = b.expose(T::make(b, region), Access::READ_WRITE).expect("expose");
    let remote = share(&ba, &ab, exposed.descriptor()).await;
    if T::KIND != "host" {
        assert!(remote.memory().is_device(), "{what}: the descriptor says device memory");
    }
    for (k, &n) in SIZES.iter().enumerate() {
        let want = pattern(n, k as u64 + 1);
        let mut src = S::make(a, n);
        src.put(0, &want);
        let at = remote.slice(0..n as u64).unwrap();
        let tag = 0x100 + k as u64;
        let (sent, _) = ab.write_with_imm(src, &at, tag).await;
        sent.unwrap_or_else(|e| panic!("{what}: write of {n}: {e}"));
        // The target knows the bytes are there by the write's immediate event, then settles.
        let ev = tokio::time::timeout(Duration::from_secs(20), b.next_imm()).await.expect("imm event");
        assert_eq!(ev.imm, tag, "{what}");
        exposed.settle(..n).expect("settle");
        assert!(exposed.get_ref().get()[..n] == want[..], "{what}: {n} bytes written");
        // Back: the target publishes, the initiator reads into fresh memory of its kind.
        exposed.publish(..n).expect("publish");
        let (got, back) = ab.read_remote(S::make(a, n), &at).await;
        assert_eq!(got.unwrap_or_else(|e| panic!("{what}: read of {n}: {e}")), n);
        assert!(back.get() == want, "{what}: {n} bytes read back");
    }
    // Scattered pages, as a KV cache moves them: 64 of 32 KiB, shuffled on both sides.
    let page = 32 << 10;
    let pages = 64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut l: Vec<usize> = (0..pages).collect();
    let mut r: Vec<usize> = (0..region / page).collect();
    l.shuffle(&mut rng);
    r.shuffle(&mut rng);
    let pieces = Pieces::pages(&l[..40], &r[..40], page).unwrap();
    let want = pattern(pages * page, 77);
    let mut src = S::make(a, pages * page);
    src.put(0, &want);
    let (moved, _) = ab.write_batch_with_imm(src, &remote, &pieces, 0x900).await;
    assert_eq!(moved.unwrap_or_else(|e| panic!("{what}: batch: {e}")) as u64, pieces.bytes());
    tokio::time::timeout(Duration::from_secs(20), b.wait_imm(0x900, pieces.len()))
        .await
        .expect("every piece's event");
    exposed.settle(..).expect("settle");
    let target = exposed.get_ref().get();
    for (i, pc) in pieces.iter().enumerate() {
        let at = pc.remote as usize;
        assert!(target[at..at + pc.len] == want[pc.local..pc.local + pc.len], "{what}: page {i} written");
    }
    exposed.publish(..).expect("publish");
    let (moved, back) = ab.read_batch(S::make(a, pages * page), &remote, &pieces).await;
    assert_eq!(moved.unwrap_or_else(|e| panic!("{what}: read batch: {e}")) as u64, pieces.bytes());
    let back = back.get();
    for (i, pc) in pieces.iter().enumerate() {
        assert!(
            back[pc.local..pc.local + pc.len] == want[pc.local..pc.local + pc.len],
            "{what}: page {i} read"
        );
    }
    // A message from `S` into `T`: the receive resolves to its length, the bytes are there.
    let want = pattern(1000, 5);
    let mut msg = S::make(a, 1000);
    msg.put(0, &want);
    let recv = ba.recv(T::make(b, 4096)).start();
    ab.send(msg).await.0.unwrap_or_else(|e| panic!("{what}: send: {e}"));
    let (n, got) = recv.await;
    assert_eq!(n.unwrap(), 1000, "{what}: message length");
    assert!(got.get()[..1000] == want[..], "{what}: message bytes");
}

#[test]
fn host_and_device_memory_move_byte_exact_in_every_direction() {
    for p in providers() {
        bounded(240, async {
            let (a, b) = (runtime(p), runtime(p));
            suite::<EmulatedDeviceBuf, RegisteredBuf>(p, &a, &b).await;
            suite::<RegisteredBuf, EmulatedDeviceBuf>(p, &a, &b).await;
            suite::<EmulatedDeviceBuf, EmulatedDeviceBuf>(p, &a, &b).await;
            let s = a.stats();
            assert!(s.device_staged > 0 && s.staged_bytes >= (5 << 20), "{p}: staging counted: {s:?}");
        });
    }
}

/// CUDA memory in every direction, on the path the runtime picks (`RDMALANE_GPU=1` on a GPU).
#[cfg(feature = "cuda")]
#[test]
fn cuda_memory_moves_byte_exact_in_every_direction() {
    if std::env::var("RDMALANE_GPU").as_deref() != Ok("1") {
        eprintln!("cuda_memory_moves_byte_exact_in_every_direction: RDMALANE_GPU=1 runs it on a GPU");
        return;
    }
    use rdmalane::CudaBuf;
    for p in providers() {
        bounded(240, async {
            let (a, b) = (runtime(p), runtime(p));
            let path = a.device_path(Memory::Cuda { device: 0 }).expect("a device path");
            eprintln!("{p}: CUDA memory takes the {path} path");
            suite::<CudaBuf, RegisteredBuf>(p, &a, &b).await;
            suite::<RegisteredBuf, CudaBuf>(p, &a, &b).await;
            suite::<CudaBuf, CudaBuf>(p, &a, &b).await;
        });
    }
}

/// Start staged writes of random sizes, drop each at a random point (before its first poll,
/// after a few, mid-transfer), then check the target still takes a write byte-exact and the
/// runtime let go of every op.
async fn drop_storm<S: TestBuf>(p: &str, a: &Runtime, b: &Runtime) {
    let (ab, ba) = pair(a, b).await;
    let region = 6 << 20;
    let exposed = b.expose(S::make(b, region), Access::READ_WRITE).expect("expose");
    let remote = share(&ba, &ab, exposed.descriptor()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for i in 0..120 {
        let n = rng.gen_range(1..=region);
        let mut src = S::make(a, n);
        src.put(0, &pattern(n.min(64), i));
        let mut op = if i % 3 == 0 {
            ab.read_remote(src, &remote.slice(0..n as u64).unwrap())
        } else {
            ab.write_remote(src, &remote.slice(0..n as u64).unwrap())
        };
        for _ in 0..rng.gen_range(0..4) {
            if futures::poll!(&mut op).is_ready() {
                break;
            }
            if rng.gen_bool(0.5) {
                tokio::time::sleep(Duration::from_micros(rng.gen_range(0..300))).await;
            }
        }
        drop(op);
    }
    let want = pattern(region, 99);
    let mut src = S::make(a, region);
    src.put(0, &want);
    ab.write_with_imm(src, &remote, 1).await.0.unwrap_or_else(|e| panic!("{p}: write after the storm: {e}"));
    let _ = tokio::time::timeout(Duration::from_secs(20), b.next_imm()).await.expect("imm");
    exposed.settle(..).expect("settle");
    assert!(exposed.get_ref().get() == want, "{p}: the write after the storm landed");
    let t = std::time::Instant::now();
    loop {
        let s = a.stats();
        if s.submitted == s.completed + s.failed + s.withdrawn {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{p}: ops never accounted for: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn dropping_staged_ops_at_any_point_is_safe() {
    for p in providers() {
        bounded(240, async {
            let (a, b) = (runtime(p), runtime(p));
            drop_storm::<EmulatedDeviceBuf>(p, &a, &b).await;
        });
    }
}

#[cfg(feature = "cuda")]
#[test]
fn dropping_ops_on_cuda_memory_at_any_point_is_safe() {
    if std::env::var("RDMALANE_GPU").as_deref() != Ok("1") {
        eprintln!("dropping_ops_on_cuda_memory_at_any_point_is_safe: RDMALANE_GPU=1 runs it on a GPU");
        return;
    }
    for p in providers() {
        bounded(240, async {
            let (a, b) = (runtime(p), runtime(p));
            drop_storm::<rdmalane::CudaBuf>(p, &a, &b).await;
        });
    }
}

#[test]
fn device_memory_a_runtime_cannot_move_is_refused_at_once() {
    let p = providers()[0];
    let cuda = Memory::Cuda { device: 0 };
    let off = builder(p).device_memory(DevicePolicy::Off).build().expect("runtime");
    match off.device_path(cuda) {
        Err(Error::DeviceMemory { memory, provider, lacks, .. }) => {
            assert_eq!(memory, cuda);
            assert!(!provider.is_empty() && lacks.contains("off"), "{provider}: {lacks}");
        }
        other => panic!("{p}: device memory with the policy off: {other:?}"),
    }
    let native = builder(p).device_memory(DevicePolicy::Native).build().expect("runtime");
    if !native.caps().device.is_some() {
        // Debian's libfabric has no FI_HMEM: native-only refuses, naming what is missing.
        let e = native.device_path(cuda).unwrap_err();
        assert!(matches!(e, Error::DeviceMemory { .. }) && e.to_string().contains("FI_HMEM"), "{e}");
        #[cfg(feature = "cuda")]
        {
            let e = native.alloc_cuda(0, 4096).unwrap_err();
            assert!(matches!(e, Error::DeviceMemory { .. }), "refused before any CUDA call: {e}");
        }
    }
    let staged = builder(p).device_memory(DevicePolicy::Staged).build().expect("runtime");
    assert_eq!(staged.device_path(cuda).unwrap(), rdmalane::DevicePath::Staged);
    assert!(staged.device_path(Memory::Host).is_err(), "host memory takes no device path");
    // Without a GPU (CI), a CUDA buffer is a typed error, never a panic.
    #[cfg(feature = "cuda")]
    if std::env::var("RDMALANE_GPU").as_deref() != Ok("1") {
        match staged.alloc_cuda(0, 4096) {
            Err(Error::Cuda { call, .. }) => eprintln!("no GPU here: {call} refused, as it should"),
            Ok(b) => eprintln!("a GPU after all: {b:?}"),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}
