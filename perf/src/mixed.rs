//! `mixed`: the head-of-line test. On ONE connection: a 16 B ping-pong alone, then a stream
//! of 1 MiB writes (8 in flight) alone and the stream beside the pings, taking turns in four
//! rounds, `--secs` of each in all (and at least `--iters` pings beside it). With `--scheduler fifo` the ping waits
//! behind the writes; with `fair` it should not, while the stream keeps its throughput.
//! By default the two run on threads of their own, as an application's tasks would: the
//! pings on the thread that drives the runtime (under the inline driver, the one turning the
//! reactor), the stream on a worker thread whose writes reach the reactor through its queue.
//! `--layout joined` puts them in one task, where each waits while the other is polled.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use rdmalane::sched::{Mode, SchedConfig};
use rdmalane::{Access, Endpoint, RemoteBuf, Runtime};

use crate::cli::{Layout, Mixed, Sched};
use crate::conn::{build_rt_with, control_plane, serve_each, BoxErr, CpuMeter, RtServer, ServerChild};
use crate::lat::pingpong;
use crate::report::{print, Progress, Val};

fn quiet() -> Progress {
    Progress::new(false, 0)
}

pub const PING: usize = 16;

pub fn sched_config(m: &Mixed) -> SchedConfig {
    let mode = match m.scheduler {
        Sched::Fair => Mode::Fair,
        Sched::Fifo => Mode::Fifo,
    };
    let mut c = SchedConfig { mode, ..crate::conn::sched_from_env() };
    if let Some(v) = m.chunk_size {
        c.chunk_size = v;
    }
    if let Some(v) = m.lane_bytes {
        c.lane_bytes = v;
        c.tenant_bytes = v;
    }
    c
}

/// Flags that make the child server run with the same settings.
pub fn server_args(m: &Mixed) -> Vec<String> {
    let mut v = vec![
        "--scheduler".into(),
        format!("{:?}", m.scheduler).to_lowercase(),
        "--bulk-size".into(),
        m.bulk_size.to_string(),
    ];
    if let Some(c) = m.chunk_size {
        v.extend(["--chunk-size".into(), c.to_string()]);
    }
    v
}

/// Serve client after client, each with `conns` connections: expose the bulk target to each
/// connection, send it the descriptor, echo pings until each sends its 1-byte stop.
pub fn serve(m: &Mixed, conns: usize) -> Result<(), BoxErr> {
    let a = &m.common;
    let srv = RtServer::bind(build_rt_with(a, sched_config(m), 1, 1)?, a)?;
    let rt = &srv.rt;
    serve_each(
        a,
        || srv.accept_n(conns),
        |eps: Vec<Endpoint>| {
            let cpu = CpuMeter::start();
            rt.block_on(async {
                let target = rt.expose(rt.alloc(m.bulk_size)?, Access::WRITE)?;
                let desc = target.descriptor();
                let all: Vec<_> = eps.iter().map(|ep| echo(rt, ep, desc.clone())).collect();
                for r in futures::future::join_all(all).await {
                    r?;
                }
                Ok::<(), BoxErr>(())
            })?;
            println!("SERVER_CPU {:.2}", cpu.pct());
            Ok(())
        },
    )
}

/// Send the bulk target's descriptor, then answer pings until the 1-byte stop. As `lat`'s
/// server: two receives stay posted (this ping's and the next's), and a ping's buffer is
/// posted again after the answer, off the round trip's path.
async fn echo(rt: &Runtime, ep: &Endpoint, desc: RemoteBuf) -> Result<(), BoxErr> {
    let mut posted = std::collections::VecDeque::new();
    for _ in 0..2 {
        posted.push_back(ep.recv(rt.alloc(PING)?).start());
    }
    ep.send_descriptor(&desc).await?;
    let mut out = rt.alloc(PING)?;
    loop {
        let (n, b) = posted.pop_front().expect("a receive is posted").await;
        if n? == 1 {
            return Ok(());
        }
        let (r, o) = ep.send(out).await;
        r?;
        out = o;
        posted.push_back(ep.recv(b).start());
    }
}

/// Run `fg` and the stream `bulk` beside each other as `layout` says; `fg` (or a time
/// limit) must end the stream.
fn beside<T>(
    rt: &Runtime,
    layout: Layout,
    fg: impl std::future::Future<Output = T>,
    bulk: impl std::future::Future<Output = Result<Streamed, BoxErr>> + Send,
) -> (T, Result<Streamed, BoxErr>) {
    match layout {
        Layout::Joined => rt.block_on(async { futures::join!(fg, bulk) }),
        Layout::Tasks => {
            let drained = AtomicBool::new(false);
            std::thread::scope(|s| {
                // Not `rt.block_on`: under the inline driver that would contend for the reactor.
                let b = s.spawn(|| {
                    let r = futures::executor::block_on(bulk);
                    drained.store(true, Ordering::Release);
                    r
                });
                let out = rt.block_on(async {
                    let out = fg.await;
                    // The inline driver's reactor turns only in here: keep it turning until the
                    // stream's last writes are in.
                    while !drained.load(Ordering::Acquire) {
                        yield_once().await;
                    }
                    out
                });
                (out, b.join().unwrap_or_else(|_| Err("the bulk thread panicked".into())))
            })
        }
    }
}

/// Pending once, woken at once: lets the driver turn between two polls.
async fn yield_once() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// Rounds each of bulk alone and bulk beside the pings (see `run`).
const ROUNDS: usize = 4;

/// The client's CPU over one phase: cores busy (every thread of the process), and CPU-seconds
/// per GB of bulk written in it.
struct PhaseCpu {
    cores: f64,
    s_per_gb: f64,
}

/// What the rounds of one phase (bulk alone, or beside the pings) added up to.
#[derive(Default)]
struct Rounds {
    bytes: u64,
    /// Seconds the stream ran, over the rounds.
    secs: f64,
    lat: Option<Histogram<u64>>,
    cpu_secs: f64,
    wall: f64,
}

impl Rounds {
    /// A round's stream, and the CPU its phase took (`phase`, started with it).
    fn add(&mut self, s: Streamed, phase: &CpuMeter) {
        self.cpu_secs += phase.secs();
        self.wall += phase.wall();
        self.bytes += s.bytes;
        self.secs += s.bytes as f64 / s.bps.max(1e-9);
        match &mut self.lat {
            Some(h) => {
                // Same bounds (both auto-resizing histograms of 3 digits): cannot fail.
                let _ = h.add(&s.lat);
            }
            None => self.lat = Some(s.lat),
        }
    }

    /// The phase as one stream (its rate over the rounds' time), and its CPU.
    fn total(self) -> Result<(Streamed, PhaseCpu), BoxErr> {
        let lat = self.lat.ok_or("no round ran")?;
        let gb = (self.bytes as f64 / 1e9).max(1e-9);
        let cpu = PhaseCpu { cores: self.cpu_secs / self.wall.max(1e-9), s_per_gb: self.cpu_secs / gb };
        Ok((Streamed { bps: self.bytes as f64 / self.secs.max(1e-9), bytes: self.bytes, lat }, cpu))
    }
}

/// What a bulk stream got: its rate, and each write's time from submission to completion.
pub struct Streamed {
    /// Bytes written per second.
    pub bps: f64,
    /// Bytes written.
    pub bytes: u64,
    /// Per-write latency in ns.
    pub lat: Histogram<u64>,
}

impl Streamed {
    /// The write latency at quantile `q`, in µs.
    pub fn us(&self, q: f64) -> f64 {
        self.lat.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Keep `window` writes of the bulk size in flight until `stop` (or `until`), as `tenant`.
pub async fn stream(
    rt: &Runtime,
    ep: &Endpoint,
    remote: &RemoteBuf,
    m: &Mixed,
    tenant: u32,
    stop: &AtomicBool,
    until: Option<Instant>,
) -> Result<Streamed, BoxErr> {
    let mut free = Vec::new();
    for _ in 0..m.bulk_window {
        free.push(rt.alloc(m.bulk_size)?);
    }
    let mut lat = Histogram::<u64>::new(3)?;
    let mut inflight = FuturesUnordered::new();
    let start = Instant::now();
    let mut bytes = 0usize;
    let done = || stop.load(Ordering::Relaxed) || until.is_some_and(|t| Instant::now() >= t);
    loop {
        while !done() && !free.is_empty() {
            let b = free.pop().expect("non-empty");
            let op = ep.write_remote(b, remote).tenant(tenant);
            inflight.push(async move {
                let t0 = Instant::now();
                let (r, b) = op.await;
                (r, b, t0.elapsed())
            });
        }
        let Some((r, b, took)) = inflight.next().await else { break };
        r?;
        lat.record(took.as_nanos() as u64)?;
        bytes += b.len();
        free.push(b);
    }
    Ok(Streamed { bps: bytes as f64 / start.elapsed().as_secs_f64(), bytes: bytes as u64, lat })
}

pub fn run(m: &Mixed) -> Result<(), BoxErr> {
    let a = &m.common;
    if a.server {
        return serve(m, 1);
    }
    let (child, addr) = match &a.connect {
        Some(addr) => (None, addr.clone()),
        None => {
            let (c, addr) = ServerChild::spawn_with("mixed", a, &server_args(m))?;
            (Some(c), addr)
        }
    };
    let tokio = control_plane()?;
    let rt = build_rt_with(a, sched_config(m), m.lanes.unwrap_or(1), 1)?;
    let ep = tokio.block_on(rt.connect(addr.clone()))?;
    let cpu = CpuMeter::start();
    let layout = m.layout;
    let (remote, alone) = rt.block_on(async {
        let remote = ep.recv_descriptor().await?;
        pingpong(&rt, &ep, PING, a.warmup_rounds(), Duration::ZERO, &mut quiet()).await?;
        let alone = pingpong(&rt, &ep, PING, a.iters, Duration::ZERO, &mut quiet()).await?;
        Ok::<_, BoxErr>((remote, alone))
    })?;
    // Bulk alone and bulk beside the pings take turns, ROUNDS of each, --secs of each in all:
    // the host's memory moves a copying provider's bulk rate by a fifth to a half over seconds
    // (bulk kept read 0.58 to 1.67 with one phase of each), and taking turns spreads that drift
    // over both. Bulk alone runs where it runs beside the pings (its own thread, or the one
    // task).
    let slice = m.secs / ROUNDS as f64;
    let mut bulk_alone = Rounds::default();
    let mut bulk_mixed = Rounds::default();
    let mut mixed: Option<Histogram<u64>> = None;
    for _ in 0..ROUNDS {
        let never = AtomicBool::new(false);
        let until = Instant::now() + Duration::from_secs_f64(slice);
        let bulk = stream(&rt, &ep, &remote, m, 0, &never, Some(until));
        let phase = CpuMeter::start();
        let ((), s) = beside(&rt, layout, async {}, bulk);
        bulk_alone.add(s?, &phase);
        let stop = AtomicBool::new(false);
        let pings = async {
            let h = async {
                // A few unmeasured pings while the stream fills the pipe.
                pingpong(&rt, &ep, PING, 20, Duration::ZERO, &mut quiet()).await?;
                // Pings until the stream has run beside them as long as it ran alone, and at
                // least --iters over the rounds.
                let from = Instant::now();
                let per_round = a.iters.div_ceil(ROUNDS).max(1);
                let mut h = pingpong(&rt, &ep, PING, per_round, Duration::ZERO, &mut quiet()).await?;
                while from.elapsed().as_secs_f64() < slice {
                    h.add(pingpong(&rt, &ep, PING, per_round, Duration::ZERO, &mut quiet()).await?)?;
                }
                Ok::<_, BoxErr>(h)
            }
            .await;
            // Failed or done, the stream ends with the pings.
            stop.store(true, Ordering::Relaxed);
            h
        };
        let bulk = stream(&rt, &ep, &remote, m, 0, &stop, None);
        let phase = CpuMeter::start();
        let (h, s) = beside(&rt, layout, pings, bulk);
        let (h, s) = (h?, s?);
        bulk_mixed.add(s, &phase);
        match &mut mixed {
            Some(all) => all.add(h)?,
            None => mixed = Some(h),
        }
    }
    let mixed = mixed.ok_or("no round ran")?;
    let (bulk_alone, cpu_alone) = bulk_alone.total()?;
    let (bulk_mixed, cpu_mixed) = bulk_mixed.total()?;
    rt.block_on(async {
        let mut s = rt.alloc(1)?;
        s[0] = 0;
        ep.send(s).await.0?;
        Ok::<_, BoxErr>(())
    })?;
    let cpu_pct = cpu.pct();
    let wall = cpu.wall();
    drop(ep);
    let server_cpu = match child {
        Some(c) => c.finish()?,
        None => f64::NAN,
    };
    // The server reports its share over the whole session (pings alone included), so its CPU
    // per GB is over all the bulk bytes it took: an upper bound on what the bulk cost it.
    let bulk_gb = (bulk_alone.bytes + bulk_mixed.bytes) as f64 / 1e9;
    let server_cpu_s_per_gb = server_cpu / 100.0 * wall / bulk_gb.max(1e-9);
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let gbps = |bps: f64| bps * 8.0 / 1e9;
    if let Some(path) = &a.svg {
        let title = format!(
            "{PING} B ping-pong, alone and beside bulk writes ({:?}, {})",
            m.scheduler,
            rt.provider()
        );
        let mixed_name = format!("beside bulk ({:.1} Gb/s)", gbps(bulk_mixed.bps));
        crate::svg::save(
            path,
            &crate::svg::latency_cdf(&title, &[("alone", &alone), (&mixed_name, &mixed)]),
        )?;
    }
    print(
        a.json,
        &format!(
            "mixed: {PING} B ping-pong and {} x {} B writes in flight on one connection over {}, scheduler {:?}",
            m.bulk_window,
            m.bulk_size,
            rt.provider(),
            m.scheduler
        ),
        &[
            ("bench", Val::S("mixed".into())),
            ("provider", Val::S(rt.provider().into())),
            ("scheduler", Val::S(format!("{:?}", m.scheduler).to_lowercase())),
            ("chunk_size", Val::I(sched_config(m).chunk_size as u64)),
            ("small_alone_p50_us", Val::F(us(&alone, 0.5))),
            ("small_alone_p99_us", Val::F(us(&alone, 0.99))),
            ("small_alone_p999_us", Val::F(us(&alone, 0.999))),
            ("small_mixed_p50_us", Val::F(us(&mixed, 0.5))),
            ("small_mixed_p99_us", Val::F(us(&mixed, 0.99))),
            ("small_mixed_p999_us", Val::F(us(&mixed, 0.999))),
            ("bulk_alone_gbps", Val::F(gbps(bulk_alone.bps))),
            ("bulk_mixed_gbps", Val::F(gbps(bulk_mixed.bps))),
            ("bulk_alone_p50_us", Val::F(bulk_alone.us(0.5))),
            ("bulk_alone_p99_us", Val::F(bulk_alone.us(0.99))),
            ("bulk_alone_p999_us", Val::F(bulk_alone.us(0.999))),
            ("bulk_mixed_p50_us", Val::F(bulk_mixed.us(0.5))),
            ("bulk_mixed_p99_us", Val::F(bulk_mixed.us(0.99))),
            ("bulk_mixed_p999_us", Val::F(bulk_mixed.us(0.999))),
            ("driver", Val::S(format!("{:?}", a.driver).to_lowercase())),
            ("layout", Val::S(format!("{layout:?}").to_lowercase())),
            ("cpu_pct", Val::F(cpu_pct)),
            ("server_cpu_pct", Val::F(server_cpu)),
            ("bulk_alone_cores", Val::F(cpu_alone.cores)),
            ("bulk_alone_cpu_s_per_gb", Val::F(cpu_alone.s_per_gb)),
            ("mixed_cores", Val::F(cpu_mixed.cores)),
            ("bulk_mixed_cpu_s_per_gb", Val::F(cpu_mixed.s_per_gb)),
            ("server_cores", Val::F(server_cpu / 100.0)),
            ("server_cpu_s_per_gb", Val::F(server_cpu_s_per_gb)),
        ],
    );
    Ok(())
}
