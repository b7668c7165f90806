//! Device memory on real providers: writes, reads, page batches and messages between host and
//! device memory, in every direction, land byte-exact; the target reads only through the
//! documented sync (the write's immediate event, then `settle`; `publish` before peers read);
//! dropping ops at any point is safe; device memory a runtime cannot move is refused at once
//! with a typed error. Everywhere on the emulated device (the staging path with host copies),
//! in one process and two; with the `cuda` feature and `RDMALANE_GPU=1`, on CUDA memory too
//! (on the path the runtime picks: native with FI_HMEM, staged without).
use std::process::Command;

use rdmalane::buf::EmulatedDeviceBuf;
use rdmalane::{DevicePolicy, Error, Memory, RegisteredBuf, Runtime};
use rdmalane_conformance::device::{drop_storm, initiator, initiator_to, target, TestBuf};
use rdmalane_conformance::{bounded, builder, pair, providers, runtime, spawn_listening};

/// `S` at `a` to and from `T` exposed at `b`, both in this process.
async fn suite<S: TestBuf, T: TestBuf>(p: &str, a: &Runtime, b: &Runtime) {
    let what = format!("{p}: {} -> {}", S::KIND, T::KIND);
    let (ab, ba) = pair(a, b).await;
    tokio::join!(initiator::<S>(&ab, &what), target::<T>(&ba));
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

/// The suite against a target in a process of its own (`device_peer PROVIDER KIND`), with
/// memory of kind `S` here; then again on a second connection after a drop storm.
async fn across_processes<S: TestBuf>(p: &str, kind: &str) {
    // A prebuilt test binary carried elsewhere (the GPU machine) names its peer's path.
    let peer =
        std::env::var("RDMALANE_DEVICE_PEER").unwrap_or_else(|_| env!("CARGO_BIN_EXE_device_peer").into());
    let (child, _out, addr) = spawn_listening({
        let mut c = Command::new(&peer);
        c.args([p, kind]);
        c
    });
    // Killed however this ends, a failed assertion included.
    let _child = Reaped(child);
    let what = format!("{p}: {} -> {kind} in another process", S::KIND);
    let rt = runtime(p);
    let ep = rt.connect(addr.as_str()).await.expect("connect");
    initiator::<S>(&ep, &what).await;
    drop(ep);
    let ep = rt.connect(addr.as_str()).await.expect("connect again");
    let remote = ep.recv_descriptor().await.expect("descriptor");
    drop_storm::<S>(&ep, &remote, &what).await;
    initiator_to::<S>(&ep, &remote, &format!("{what}, after a drop storm")).await;
}

/// A child process killed when this drops.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn device_memory_moves_byte_exact_between_processes_and_survives_a_drop_storm() {
    for p in providers() {
        bounded(300, async {
            across_processes::<EmulatedDeviceBuf>(p, "emulated").await;
            across_processes::<EmulatedDeviceBuf>(p, "host").await;
            across_processes::<RegisteredBuf>(p, "emulated").await;
        });
    }
}

/// CUDA memory in every direction, two processes on one GPU, on the path the runtime picks
/// (`RDMALANE_GPU=1`).
#[cfg(feature = "cuda")]
#[test]
fn cuda_memory_moves_byte_exact_between_processes_and_survives_a_drop_storm() {
    if std::env::var("RDMALANE_GPU").as_deref() != Ok("1") {
        eprintln!("cuda memory tests: RDMALANE_GPU=1 runs them on a GPU");
        return;
    }
    use rdmalane::CudaBuf;
    for p in providers() {
        bounded(300, async {
            let path = runtime(p).device_path(Memory::Cuda { device: 0 }).expect("a device path");
            eprintln!("{p}: CUDA memory takes the {path} path");
            across_processes::<CudaBuf>(p, "cuda").await;
            across_processes::<CudaBuf>(p, "host").await;
            across_processes::<RegisteredBuf>(p, "cuda").await;
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
