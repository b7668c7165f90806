//! Device memory for `bw` and `pages` (`--memory cuda`, the `cuda` feature): buffers, and the
//! baselines measured beside them in the same run: `cudaMemcpy` device to device at the same
//! footprint, and the staging path's own ceiling, the pinned copies between device and host.
#[cfg(feature = "cuda")]
use std::time::Instant;

#[cfg(feature = "cuda")]
use rdmalane::{Access, DevicePath, DevicePolicy, Runtime};

use crate::conn::BoxErr;

/// The device the benchmarks use.
#[cfg(feature = "cuda")]
pub const DEVICE: u32 = 0;

/// `len` bytes of device memory registered with `rt`.
#[cfg(feature = "cuda")]
pub fn buffer(rt: &Runtime, len: usize) -> Result<rdmalane::CudaBuf, BoxErr> {
    Ok(rt.alloc_cuda(DEVICE, len)?)
}

/// The path buffer `b` took, as a word for the report.
#[cfg(feature = "cuda")]
pub fn path_of(b: &rdmalane::CudaBuf) -> String {
    match b.path() {
        DevicePath::Native(_) => "native".into(),
        DevicePath::Staged => "staged".into(),
    }
}

/// Device-to-device copy rate of `len` bytes at a time, Gb/s (best of 3 rounds of about
/// 1 GiB each).
#[cfg(feature = "cuda")]
pub fn d2d_gbps(rt: &Runtime, len: usize) -> Result<f64, BoxErr> {
    let src = buffer(rt, len)?;
    let mut dst = buffer(rt, len)?;
    let reps = ((1usize << 30) / len).clamp(4, 4096);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            dst.copy_from_device(&src)?;
        }
        best = best.max((len * reps) as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(best)
}

/// The staging path's copy rates at `len` bytes, device to pinned host and back, Gb/s: a
/// staged buffer's `publish` and `settle` are exactly its copies (best of 3 rounds).
#[cfg(feature = "cuda")]
pub fn pinned_gbps(provider: &str, len: usize) -> Result<(f64, f64), BoxErr> {
    let rt = Runtime::builder()
        .backend(rdmalane_efa::Libfabric)
        .provider(provider)
        .device_memory(DevicePolicy::Staged)
        .build()?;
    let ex = rt.expose(buffer(&rt, len)?, Access::READ_WRITE)?;
    let reps = ((1usize << 30) / len).clamp(4, 1024);
    let (mut d2h, mut h2d) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            ex.publish(..)?;
        }
        d2h = d2h.max((len * reps) as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        for _ in 0..reps {
            ex.settle(..)?;
        }
        h2d = h2d.max((len * reps) as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok((d2h, h2d))
}

/// Without the `cuda` feature there is no device memory to measure.
#[cfg(not(feature = "cuda"))]
pub fn unavailable() -> BoxErr {
    "--memory cuda needs a build with the cuda feature (cargo build -p rdmalane-perf --features cuda)".into()
}
