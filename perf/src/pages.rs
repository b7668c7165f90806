//! `pages`: scattered fixed-size pages (a KV cache's) written to a peer as batches, the
//! transfer the Perplexity engine is built around. Each batch moves `--batch` pages chosen at
//! random on both sides; `--window` batches are in flight. Prints the rate next to this
//! machine's memcpy rate (the ceiling for shm, which copies).
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rdmalane::{Access, IoBuf, IoBufMut, Pieces};

use crate::cli::{MemoryArg, PagesArgs};
use crate::conn::{build_rt_with, serve_each, BoxErr, CpuMeter, RtConn, RtServer};
use crate::report::{print, Progress, Val};

/// Immediate value every page carries with `--imm`.
const TAG: u64 = 0x9A6E;

fn pool_pages(p: &PagesArgs) -> usize {
    (p.pool_bytes / p.page_size).max(1)
}

pub fn run(p: &PagesArgs) -> Result<(), BoxErr> {
    let a = &p.common;
    if p.page_size == 0 || p.batch == 0 || a.window == 0 || p.total < p.page_size as u64 {
        return Err("--page-size, --batch and --window must be at least 1, --total at least a page".into());
    }
    let pages = (p.total / p.page_size as u64) as usize;
    // A batch cannot hold more distinct pages than the pool has.
    let batches = pages.div_ceil(p.batch.min(pool_pages(p)));
    if a.server {
        return server(p, pages);
    }
    let extra = server_args(p);
    let (secs, server_cpu) = match &a.connect {
        Some(addr) => (client(p, addr, pages, batches)?, None),
        None => {
            let (child, addr) = crate::conn::ServerChild::spawn_with("pages", a, &extra)?;
            let secs = client(p, &addr, pages, batches)?;
            (secs, Some(child.finish()?))
        }
    };
    let bytes = (pages * p.page_size) as f64;
    let gbps = bytes * 8.0 / secs.0 / 1e9;
    let memcpy = memcpy_gbps(p.page_size, pool_pages(p) * p.page_size);
    let device = match a.memory {
        MemoryArg::Host => Vec::new(),
        MemoryArg::Cuda => device_baselines(p, gbps)?,
    };
    print(
        a.json,
        &format!(
            "pages: {} B pages, {} per batch, {} batches in flight, {} rail(s), over {}",
            p.page_size, p.batch, a.window, p.rails, secs.1
        ),
        &[
            ("bench", Val::S("pages".into())),
            ("provider", Val::S(secs.1.clone())),
            ("page_size", Val::I(p.page_size as u64)),
            ("pages", Val::I(pages as u64)),
            ("batch", Val::I(p.batch as u64)),
            ("window", Val::I(a.window as u64)),
            ("rails", Val::I(p.rails as u64)),
            ("imm", Val::I(p.imm as u64)),
            ("gbps", Val::F(gbps)),
            ("memcpy_gbps", Val::F(memcpy)),
            ("of_memcpy", Val::F(gbps / memcpy)),
            ("cpu_pct", Val::F(secs.2)),
            ("server_cpu_pct", Val::F(server_cpu.unwrap_or(f64::NAN))),
            ("memory", Val::S(format!("{:?}", a.memory).to_lowercase())),
        ]
        .into_iter()
        .chain(device)
        .collect::<Vec<_>>(),
    );
    Ok(())
}

/// Beside pages of device memory: the path, cudaMemcpy device to device of the whole pool
/// (the same footprint) and the pinned copies that bound the staging path.
#[cfg(feature = "cuda")]
fn device_baselines(p: &PagesArgs, gbps: f64) -> Result<Vec<(&'static str, Val)>, BoxErr> {
    let rt = runtime(p)?;
    let len = pool_pages(p) * p.page_size;
    let d2d = crate::gpu::d2d_gbps(&rt, len)?;
    let (d2h, h2d) = crate::gpu::pinned_gbps(&p.common.provider, len)?;
    Ok(vec![
        ("path", Val::S(crate::gpu::path_of(&crate::gpu::buffer(&rt, p.page_size)?))),
        ("d2d_gbps", Val::F(d2d)),
        ("of_d2d", Val::F(gbps / d2d)),
        ("pinned_d2h_gbps", Val::F(d2h)),
        ("pinned_h2d_gbps", Val::F(h2d)),
    ])
}

#[cfg(not(feature = "cuda"))]
fn device_baselines(_: &PagesArgs, _: f64) -> Result<Vec<(&'static str, Val)>, BoxErr> {
    Err(crate::gpu::unavailable())
}

fn server_args(p: &PagesArgs) -> Vec<String> {
    let mut v = vec![
        "--page-size".into(),
        p.page_size.to_string(),
        "--total".into(),
        p.total.to_string(),
        "--batch".into(),
        p.batch.to_string(),
        "--rails".into(),
        p.rails.to_string(),
        "--pool-bytes".into(),
        p.pool_bytes.to_string(),
    ];
    if p.imm {
        v.push("--imm".into());
    }
    v
}

fn runtime(p: &PagesArgs) -> Result<rdmalane::Runtime, BoxErr> {
    build_rt_with(&p.common, crate::conn::sched_from_env(), 1, p.rails)
}

/// Serve client after client; each one's CPU share is printed as it ends.
fn server(p: &PagesArgs, pages: usize) -> Result<(), BoxErr> {
    let srv = RtServer::bind(runtime(p)?, &p.common)?;
    serve_each(
        &p.common,
        || srv.accept(),
        |c| {
            println!("SERVER_CPU {:.2}", serve_one(p, pages, &c)?);
            Ok(())
        },
    )
}

fn serve_one(p: &PagesArgs, pages: usize, c: &RtConn) -> Result<f64, BoxErr> {
    let len = pool_pages(p) * p.page_size;
    match p.common.memory {
        MemoryArg::Host => serve_on(p, pages, c, c.rt.alloc(len)?),
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => serve_on(p, pages, c, crate::gpu::buffer(&c.rt, len)?),
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err(crate::gpu::unavailable()),
    }
}

fn serve_on<B: IoBufMut>(p: &PagesArgs, pages: usize, c: &RtConn, buf: B) -> Result<f64, BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    rt.block_on(async {
        let target = rt.expose(buf, Access::WRITE)?;
        let done = ep.recv(rt.alloc(8)?).start();
        let cpu = CpuMeter::start();
        ep.send_descriptor(&target.descriptor()).await?;
        if p.imm {
            // The receiver's view: every page announced itself, in whatever order.
            rt.wait_imm(TAG, pages).await;
            // Device memory: the provider's copies may still run (see `bw`).
            target.settle(..)?;
            // The client's clock stops here: every page is visible.
            ep.send(rt.alloc(8)?).await.0?;
        }
        done.await.0?;
        Ok(cpu.pct())
    })
}

/// Returns (seconds, provider, client CPU %).
fn client(p: &PagesArgs, addr: &str, pages: usize, batches: usize) -> Result<(f64, String, f64), BoxErr> {
    let c = RtConn::client_on(runtime(p)?, addr)?;
    let len = pool_pages(p) * p.page_size;
    match p.common.memory {
        MemoryArg::Host => client_on(p, &c, pages, batches, c.rt.alloc(len)?),
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => client_on(p, &c, pages, batches, crate::gpu::buffer(&c.rt, len)?),
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err(crate::gpu::unavailable()),
    }
}

fn client_on<B: IoBuf + Sync>(
    p: &PagesArgs,
    c: &RtConn,
    pages: usize,
    batches: usize,
    source: B,
) -> Result<(f64, String, f64), BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    let pool = pool_pages(p);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    // A handful of layouts, reused: building them is not what is measured.
    let layouts: Vec<Pieces> = (0..8)
        .map(|_| {
            let mut l: Vec<usize> = (0..pool).collect();
            let mut r = l.clone();
            l.shuffle(&mut rng);
            r.shuffle(&mut rng);
            let n = p.batch.min(pool);
            Pieces::pages(&l[..n], &r[..n], p.page_size).expect("valid pages")
        })
        .collect();
    let mut progress = Progress::new(!p.common.json, batches);
    rt.block_on(async {
        let remote = ep.recv_descriptor().await?;
        let seen = if p.imm { Some(ep.recv(rt.alloc(8)?).start()) } else { None };
        // One source pool all batches read from, as a KV cache is one region.
        let source = std::sync::Arc::new(source);
        let mut free = vec![source; p.common.window];
        let mut inflight = FuturesUnordered::new();
        let (mut issued, mut done, mut sent, mut moved) = (0usize, 0usize, 0usize, 0u64);
        let start = Instant::now();
        let cpu = CpuMeter::start();
        while done < batches {
            while issued < batches && !free.is_empty() {
                let buf = free.pop().expect("non-empty");
                let mut layout = layouts[issued % layouts.len()].clone();
                let left = pages - sent;
                if left < layout.len() {
                    layout = layout.iter().take(left).copied().collect::<Vec<_>>().into();
                }
                sent += layout.len();
                let op = if p.imm {
                    ep.write_batch_with_imm(buf, &remote, &layout, TAG)
                } else {
                    ep.write_batch(buf, &remote, &layout)
                };
                inflight.push(op);
                issued += 1;
            }
            let (r, buf) = inflight.next().await.expect("batches in flight");
            moved += r? as u64;
            free.push(buf);
            done += 1;
            progress.tick(done);
        }
        // With `--imm`, the clock runs until the server has seen every page land (on shm's
        // CUDA IPC path a batch completes here before the target's copies are done).
        if let Some(seen) = seen {
            seen.await.0?;
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu_pct = cpu.pct();
        progress.done();
        ep.send(rt.alloc(8)?).await.0?;
        if moved != (pages * p.page_size) as u64 {
            return Err(format!("moved {moved} bytes, meant to move {}", pages * p.page_size).into());
        }
        Ok((secs, rt.provider().to_string(), cpu_pct))
    })
}

/// Single-thread memcpy rate over a pool of `pool` bytes in `page`-sized copies, in Gb/s: what
/// shm (which copies) could reach at the same memory footprint.
fn memcpy_gbps(page: usize, pool: usize) -> f64 {
    let page = page.max(1);
    let len = pool.max(page);
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let reps = ((256usize << 20) / len).max(1);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            for (d, s) in dst.chunks_mut(page).zip(src.chunks(page)) {
                d.copy_from_slice(s);
            }
            std::hint::black_box(&mut dst);
        }
        best = best.max((len * reps) as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}
