//! `bw`: one-sided write bandwidth; the client keeps `--window` writes of `--size` bytes in
//! flight into a buffer the server exposed. The clock stops when the server has seen every
//! write land (each carries an immediate value) and made them visible (`settle`: on shm's CUDA
//! IPC path the events come before the target's copies are done), not at the client's last
//! completion, which on that path also comes first.
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::backend::{Access, Completion, PostError, WrKind};
use rdmalane::{IoBuf, IoBufMut};

use crate::cli::{Common, Engine, MemoryArg};
use crate::conn::{serve_each, with_server, BoxErr, CpuMeter, RawConn, RtConn};
use crate::report::{print, Progress, Val};

/// The immediate value every measured write carries.
const TAG: u64 = 0xb3;

struct Outcome {
    provider: String,
    secs: f64,
    cpu_pct: f64,
    /// With device memory: the path it took ("native", "staged").
    path: Option<String>,
}

pub fn run(a: &Common) -> Result<(), BoxErr> {
    if a.sizes.is_empty() || a.server {
        return run_one(a).map(|_| ());
    }
    // A sweep: one run per size (each with its own server), then the plot.
    let mut pts = Vec::new();
    for &size in &a.sizes {
        let one = Common { size, sizes: Vec::new(), svg: None, ..a.clone() };
        pts.push((size as f64, run_one(&one)?));
    }
    if let Some(path) = &a.svg {
        let title = format!("one-sided write bandwidth over {}, window {}", a.provider, a.window);
        let name = format!("{:?}", a.engine).to_lowercase();
        crate::svg::save(path, &crate::svg::bandwidth(&title, &[(&name, pts)]))?;
    }
    Ok(())
}

/// One size; returns Gb/s (0 on the server side).
fn run_one(a: &Common) -> Result<f64, BoxErr> {
    if a.window == 0 || a.size == 0 {
        return Err("--window and --size must be at least 1".into());
    }
    if a.server {
        let report = |cpu: f64| {
            println!("SERVER_CPU {cpu:.2}");
            Ok(())
        };
        match a.engine {
            Engine::Runtime => {
                let srv = RtConn::server(a)?;
                serve_each(a, || srv.accept(), |mut c| report(rt_server(&mut c, a)?))?
            }
            Engine::Raw => {
                let l = RawConn::listen(a)?;
                serve_each(a, || RawConn::accept(&l, a), |mut c| report(raw_server(&mut c, a)?))?
            }
        }
        return Ok(0.0);
    }
    let (o, server_cpu) = with_server("bw", a, |addr| match a.engine {
        Engine::Runtime => rt_client(&mut RtConn::client(a, addr)?, a),
        Engine::Raw => raw_client(&mut RawConn::client(a, addr)?, a),
    })?;
    let bytes = (a.size * a.iters) as f64;
    let gbps = bytes * 8.0 / o.secs / 1e9;
    let mut extra = Vec::new();
    if a.memory == MemoryArg::Cuda {
        extra = device_baselines(a, gbps, o.path.clone())?;
    }
    print(
        a.json,
        &format!(
            "bw: {} B writes, window {}, over {}, engine {:?}, {:?} memory",
            a.size, a.window, o.provider, a.engine, a.memory
        ),
        &[
            ("bench", Val::S("bw".into())),
            ("provider", Val::S(o.provider)),
            ("engine", Val::S(format!("{:?}", a.engine).to_lowercase())),
            ("size", Val::I(a.size as u64)),
            ("iters", Val::I(a.iters as u64)),
            ("window", Val::I(a.window as u64)),
            ("gbps", Val::F(gbps)),
            ("mb_per_s", Val::F(bytes / o.secs / 1e6)),
            ("cpu_pct", Val::F(o.cpu_pct)),
            ("server_cpu_pct", Val::F(server_cpu.unwrap_or(f64::NAN))),
            ("memory", Val::S(format!("{:?}", a.memory).to_lowercase())),
        ]
        .into_iter()
        .chain(extra)
        .collect::<Vec<_>>(),
    );
    Ok(gbps)
}

/// Beside a run on device memory, in the same process: cudaMemcpy device to device at the same
/// footprint, and (for the staging path) the pinned copies that bound it.
#[cfg(feature = "cuda")]
fn device_baselines(a: &Common, gbps: f64, path: Option<String>) -> Result<Vec<(&'static str, Val)>, BoxErr> {
    let rt = crate::conn::build_rt(a)?;
    let d2d = crate::gpu::d2d_gbps(&rt, a.size)?;
    let (d2h, h2d) = crate::gpu::pinned_gbps(&a.provider, a.size)?;
    Ok(vec![
        ("path", Val::S(path.unwrap_or_else(|| "raw".into()))),
        ("d2d_gbps", Val::F(d2d)),
        ("of_d2d", Val::F(gbps / d2d)),
        ("pinned_d2h_gbps", Val::F(d2h)),
        ("pinned_h2d_gbps", Val::F(h2d)),
    ])
}

#[cfg(not(feature = "cuda"))]
fn device_baselines(_: &Common, _: f64, _: Option<String>) -> Result<Vec<(&'static str, Val)>, BoxErr> {
    Err(crate::gpu::unavailable())
}

fn rt_server(c: &mut RtConn, a: &Common) -> Result<f64, BoxErr> {
    match a.memory {
        MemoryArg::Host => {
            let b = c.rt.alloc(a.size)?;
            rt_server_on(c, b)
        }
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => {
            let b = crate::gpu::buffer(&c.rt, a.size)?;
            rt_server_on(c, b)
        }
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err(crate::gpu::unavailable()),
    }
}

fn rt_server_on<B: IoBufMut>(c: &mut RtConn, buf: B) -> Result<f64, BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    rt.block_on(async {
        let total = ep.recv(rt.alloc(8)?).await;
        let (n, b) = total;
        let total = u64::from_le_bytes(b[..n?].try_into()?) as usize;
        let target = rt.expose(buf, Access::WRITE)?;
        let cpu = CpuMeter::start();
        ep.send_descriptor(&target.descriptor()).await?;
        rt.wait_imm(TAG, total).await;
        // Device memory: the provider's copies into it may still run (shm's CUDA IPC path
        // raises the events first), and a staged buffer's writes sit in its mirror. The
        // documented sync, inside the clock: what is measured is bytes in device memory.
        target.settle(..)?;
        // The client says when its own writes have completed: leaving before that would close
        // the connection under writes this side has seen land, whose completions the client
        // is still waiting for (they fail then as the peer's loss).
        let bye = ep.recv(rt.alloc(8)?).start();
        let (r, _) = ep.send(rt.alloc(8)?).await;
        r?;
        let cpu = cpu.pct();
        bye.await.0?;
        Ok(cpu)
    })
}

fn rt_client(c: &mut RtConn, a: &Common) -> Result<Outcome, BoxErr> {
    match a.memory {
        MemoryArg::Host => {
            let free = (0..a.window).map(|_| c.rt.alloc(a.size)).collect::<Result<Vec<_>, _>>()?;
            rt_client_on(c, a, free)
        }
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => {
            let free =
                (0..a.window).map(|_| crate::gpu::buffer(&c.rt, a.size)).collect::<Result<Vec<_>, _>>()?;
            // The path the buffers took (a transport may refuse device memory it claims).
            let path = crate::gpu::path_of(&free[0]);
            let mut o = rt_client_on(c, a, free)?;
            o.path = Some(path);
            Ok(o)
        }
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err(crate::gpu::unavailable()),
    }
}

fn rt_client_on<B: IoBuf>(c: &mut RtConn, a: &Common, mut free: Vec<B>) -> Result<Outcome, BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    let total = a.warmup_writes() + a.iters;
    let mut progress = Progress::new(!a.json, total);
    rt.block_on(async {
        let mut count = rt.alloc(8)?;
        count[..].copy_from_slice(&(total as u64).to_le_bytes());
        ep.send(count).await.0?;
        let remote = ep.recv_descriptor().await?;
        let seen = ep.recv(rt.alloc(8)?).start();
        let mut inflight = FuturesUnordered::new();
        let (mut issued, mut done) = (0, 0);
        let mut started = None;
        let mut cpu = CpuMeter::start();
        while done < total {
            while issued < total && !free.is_empty() {
                inflight.push(ep.write_with_imm(free.pop().expect("non-empty"), &remote, TAG));
                issued += 1;
            }
            let (r, buf) = inflight.next().await.expect("writes in flight");
            r?;
            free.push(buf);
            done += 1;
            if done == a.warmup_writes() {
                started = Some(Instant::now());
                cpu = CpuMeter::start();
            }
            progress.tick(done);
        }
        // Every write is visible at the server once it says so.
        seen.await.0?;
        let secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let cpu_pct = cpu.pct();
        // Every write has completed here too: the server may go.
        ep.send(rt.alloc(8)?).await.0?;
        progress.done();
        Ok(Outcome { provider: rt.provider().to_string(), secs, cpu_pct, path: None })
    })
}

/// The raw engine's `n` buffers of `len` bytes with `access`: its own host memory, or device
/// memory (allocated through a runtime, registered by the engine's transport with FI_HMEM) kept
/// alive in the returned holder until the engine is done.
fn raw_buffers(
    c: &mut RawConn,
    a: &Common,
    n: usize,
    len: usize,
    access: Access,
) -> Result<(Vec<usize>, Keep), BoxErr> {
    match a.memory {
        MemoryArg::Host => {
            Ok(((0..n).map(|_| c.eng.alloc(len, access)).collect::<Result<_, _>>()?, Keep::default()))
        }
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => {
            if !c.eng.caps().device.is_some() {
                return Err(format!(
                    "raw fi_write of device memory needs FI_HMEM, which {} lacks here",
                    c.eng.caps().provider
                )
                .into());
            }
            let rt = rdmalane::Runtime::builder()
                .backend(rdmalane_efa::Libfabric)
                .provider(&a.provider)
                .device_memory(rdmalane::DevicePolicy::Staged)
                .build()?;
            let mut keep = Keep::default();
            let mut ids = Vec::with_capacity(n);
            for _ in 0..n {
                let b = crate::gpu::buffer(&rt, len)?;
                let mem = rdmalane::backend::DeviceMem {
                    memory: rdmalane::Memory::Cuda { device: crate::gpu::DEVICE },
                    dmabuf: None,
                };
                // SAFETY: the device memory lives in `keep`, which the caller holds until the
                // engine is done with it.
                ids.push(unsafe {
                    c.eng.register_external(b.device_ptr() as *mut u8, len, access, Some(mem))?
                });
                keep.bufs.push(b);
            }
            keep.rt = Some(rt);
            Ok((ids, keep))
        }
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err(crate::gpu::unavailable()),
    }
}

/// Device memory the raw engine registered, kept until it is done.
#[derive(Default)]
struct Keep {
    #[cfg(feature = "cuda")]
    bufs: Vec<rdmalane::CudaBuf>,
    #[cfg(feature = "cuda")]
    rt: Option<rdmalane::Runtime>,
}

fn raw_server(c: &mut RawConn, a: &Common) -> Result<f64, BoxErr> {
    let (ids, _keep) = raw_buffers(c, a, 1, a.size, Access::WRITE)?;
    let target = ids[0];
    let (addr, key) = c.eng.remote(target);
    c.put(addr)?;
    c.put(key)?;
    let total = c.get()?;
    let cpu = CpuMeter::start();
    // Manual progress: the target drives its CQ while the writes land, and counts them.
    let mut comps = Vec::new();
    let mut seen = 0;
    while seen < total {
        comps.clear();
        c.eng.poll(&mut comps, 16);
        seen += comps.iter().filter(|c| matches!(c, Completion::RemoteWrite { imm: TAG, .. })).count() as u64;
    }
    // Device memory: wait for the provider's copies into it, as the runtime's server does.
    #[cfg(feature = "cuda")]
    if let Some(b) = _keep.bufs.first() {
        b.copy_to_host(0, &mut [0u8; 1])?;
    }
    c.put(seen)?;
    Ok(cpu.pct())
}

fn raw_client(c: &mut RawConn, a: &Common) -> Result<Outcome, BoxErr> {
    let (addr, key) = (c.get()?, c.get()?);
    let total = a.warmup_writes() + a.iters;
    c.put(total as u64)?;
    let (mems, _keep) = raw_buffers(c, a, a.window, a.size, Access::LOCAL)?;
    let mut free: Vec<usize> = (0..a.window).collect();
    let mut comps = Vec::with_capacity(64);
    let (mut issued, mut done) = (0, 0);
    let mut started = None;
    let mut cpu = CpuMeter::start();
    let mut progress = Progress::new(!a.json, total);
    while done < total {
        while issued < total && !free.is_empty() {
            let slot = *free.last().expect("non-empty");
            let kind = WrKind::Write { remote_addr: addr, key, imm: Some(TAG) };
            match c.eng.post(slot as u64, c.peer, kind, mems[slot], 0, a.size) {
                Ok(_) => {
                    free.pop();
                    issued += 1;
                }
                Err(PostError::Again) => break,
                Err(PostError::Failed(e)) => return Err(e.into()),
            }
        }
        comps.clear();
        c.eng.poll(&mut comps, 64);
        for comp in &comps {
            if let Completion::Op { id, status, .. } = comp {
                status.clone()?;
                free.push(id.to_raw() as usize);
                done += 1;
                if done == a.warmup_writes() {
                    started = Some(Instant::now());
                    cpu = CpuMeter::start();
                }
            }
        }
        progress.tick(done);
    }
    // Every write is visible at the server once it says so.
    c.get()?;
    let secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let cpu_pct = cpu.pct();
    progress.done();
    Ok(Outcome { provider: c.eng.caps().provider.clone(), secs, cpu_pct, path: None })
}
