//! `bw`: one-sided write bandwidth; the client keeps `--window` writes of `--size` bytes in
//! flight into a buffer the server exposed.
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::backend::{Access, Completion, PostError, WrKind};

use crate::cli::{Common, Engine};
use crate::conn::{serve_each, with_server, BoxErr, CpuMeter, RawConn, RtConn};
use crate::report::{print, Progress, Val};

struct Outcome {
    provider: String,
    secs: f64,
    cpu_pct: f64,
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
    print(
        a.json,
        &format!("bw: {} B writes, window {}, over {}, engine {:?}", a.size, a.window, o.provider, a.engine),
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
        ],
    );
    Ok(gbps)
}

fn rt_server(c: &mut RtConn, a: &Common) -> Result<f64, BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    rt.block_on(async {
        let target = rt.expose(rt.alloc(a.size)?, Access::WRITE)?;
        let done = ep.recv(rt.alloc(8)?).start();
        let cpu = CpuMeter::start();
        ep.send_descriptor(&target.descriptor()).await?;
        let (r, _) = done.await;
        r?;
        Ok(cpu.pct())
    })
}

fn rt_client(c: &mut RtConn, a: &Common) -> Result<Outcome, BoxErr> {
    let (rt, ep) = (&c.rt, &c.ep);
    let total = a.warmup + a.iters;
    let mut progress = Progress::new(!a.json, total);
    rt.block_on(async {
        let remote = ep.recv_descriptor().await?;
        let mut free = Vec::with_capacity(a.window);
        for _ in 0..a.window {
            free.push(rt.alloc(a.size)?);
        }
        let mut inflight = FuturesUnordered::new();
        let (mut issued, mut done) = (0, 0);
        let mut started = None;
        let mut cpu = CpuMeter::start();
        while done < total {
            while issued < total && !free.is_empty() {
                inflight.push(ep.write_remote(free.pop().expect("non-empty"), &remote));
                issued += 1;
            }
            let (r, buf) = inflight.next().await.expect("writes in flight");
            r?;
            free.push(buf);
            done += 1;
            if done == a.warmup {
                started = Some(Instant::now());
                cpu = CpuMeter::start();
            }
            progress.tick(done);
        }
        let secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let cpu_pct = cpu.pct();
        progress.done();
        let (r, _) = ep.send(rt.alloc(8)?).await;
        r?;
        Ok(Outcome { provider: rt.provider().to_string(), secs, cpu_pct })
    })
}

fn raw_server(c: &mut RawConn, a: &Common) -> Result<f64, BoxErr> {
    let target = c.eng.alloc(a.size, Access::WRITE)?;
    let (addr, key) = c.eng.remote(target);
    c.put(addr)?;
    c.put(key)?;
    let cpu = CpuMeter::start();
    // Manual progress: the target drives its CQ while the writes land.
    let mut comps = Vec::new();
    c.ctl.set_nonblocking(true)?;
    loop {
        comps.clear();
        c.eng.poll(&mut comps, 16);
        let mut b = [0u8; 8];
        match std::io::Read::read(&mut c.ctl, &mut b) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(cpu.pct())
}

fn raw_client(c: &mut RawConn, a: &Common) -> Result<Outcome, BoxErr> {
    let (addr, key) = (c.get()?, c.get()?);
    let total = a.warmup + a.iters;
    let mems: Vec<usize> =
        (0..a.window).map(|_| c.eng.alloc(a.size, Access::LOCAL)).collect::<Result<_, _>>()?;
    let mut free: Vec<usize> = (0..a.window).collect();
    let mut comps = Vec::with_capacity(64);
    let (mut issued, mut done) = (0, 0);
    let mut started = None;
    let mut cpu = CpuMeter::start();
    let mut progress = Progress::new(!a.json, total);
    while done < total {
        while issued < total && !free.is_empty() {
            let slot = *free.last().expect("non-empty");
            let kind = WrKind::Write { remote_addr: addr, key, imm: None };
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
                if done == a.warmup {
                    started = Some(Instant::now());
                    cpu = CpuMeter::start();
                }
            }
        }
        progress.tick(done);
    }
    let secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let cpu_pct = cpu.pct();
    progress.done();
    c.put(1)?;
    Ok(Outcome { provider: c.eng.caps().provider.clone(), secs, cpu_pct })
}
