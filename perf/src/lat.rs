//! `lat`: send/recv or write ping-pong, or awaited writes one at a time (`--op write-await`,
//! timed whole from submit to completion); one-way latency is half of each round trip, as perftest
//! and fabtests report it, timed as perftest times it (the CPU's time-stamp counter).
use std::time::Duration;

use hdrhistogram::Histogram;
use rdmalane::backend::{Access, Completion, PostError, Posted, WrKind};
use rdmalane::{Endpoint, Runtime};
use rdmalane_wake::Cycles;

use crate::cli::{Common, Engine, Executor, LatOp};
use crate::conn::{serve_each, with_server, BoxErr, CpuMeter, RawConn, RtConn};
use crate::report::{print, Progress, Val};

pub fn run(a: &Common) -> Result<(), BoxErr> {
    // The runtime's stage marks (`probe`) read the counter the round trips are timed with.
    rdmalane::probe::set_clock(rdmalane_wake::ticks);
    if a.server {
        let done = |cpu: CpuMeter| {
            println!("SERVER_CPU {:.2}", cpu.pct());
            report_probe("server", a);
        };
        return match a.engine {
            Engine::Runtime => {
                let srv = RtConn::server(a)?;
                serve_each(
                    a,
                    || srv.accept(),
                    |mut c| {
                        let cpu = CpuMeter::start();
                        rt_side(&mut c, a, false, None)?;
                        done(cpu);
                        report_placement("server", Some(&c.rt));
                        Ok(())
                    },
                )
            }
            Engine::Raw => {
                let l = RawConn::listen(a)?;
                serve_each(
                    a,
                    || RawConn::accept(&l, a),
                    |mut c| {
                        let cpu = CpuMeter::start();
                        raw_side(&mut c, a, false, None)?;
                        done(cpu);
                        report_placement("server", None);
                        Ok(())
                    },
                )
            }
        };
    }
    let mut hist = Histogram::<u64>::new(3)?;
    // The client's lent-reactor counts (see `Stats::task_holds`), where it has one.
    let mut lend = [0u64; 3];
    // Wake-ups the client sent its peer's sleeping reactors (see `Stats::kicks`).
    let mut kicks = 0;
    // The client's cores busy over its measured side (every thread: reactors, spinning tasks).
    let mut cpu_pct = f64::NAN;
    let (provider, server_cpu) = with_server("lat", a, |addr| match a.engine {
        Engine::Runtime => {
            let mut c = RtConn::client(a, addr)?;
            let cpu = CpuMeter::start();
            rt_side(&mut c, a, true, Some(&mut hist))?;
            cpu_pct = cpu.pct();
            let st = c.rt.stats();
            lend = [st.task_holds, st.task_asks, st.thread_retakes];
            kicks = st.kicks;
            report_placement("client", Some(&c.rt));
            Ok(c.rt.provider().to_string())
        }
        Engine::Raw => {
            let mut c = RawConn::client(a, addr)?;
            let cpu = CpuMeter::start();
            raw_side(&mut c, a, true, Some(&mut hist))?;
            cpu_pct = cpu.pct();
            report_placement("client", None);
            Ok(c.eng.caps().provider.clone())
        }
    })?;
    report_probe("client", a);
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    if let Some(path) = &a.svg {
        let title = format!("{} B ping-pong over {provider} ({:?})", a.size, a.engine);
        let what = if a.lat_op() == LatOp::WriteAwait { "submit to completion" } else { "one-way latency" };
        crate::svg::save(path, &crate::svg::latency_cdf(&title, &[(what, &hist)]))?;
    }
    print(
        a.json,
        &format!("lat: {} B {:?} ping-pong over {provider}, engine {:?}", a.size, a.lat_op(), a.engine),
        &[
            ("bench", Val::S("lat".into())),
            ("provider", Val::S(provider)),
            ("engine", Val::S(format!("{:?}", a.engine).to_lowercase())),
            ("op", Val::S(format!("{:?}", a.lat_op()).to_lowercase())),
            ("size", Val::I(a.size as u64)),
            ("iters", Val::I(a.iters as u64)),
            ("p50_us", Val::F(us(0.5))),
            ("p99_us", Val::F(us(0.99))),
            ("p999_us", Val::F(us(0.999))),
            ("mean_us", Val::F(hist.mean() / 1000.0)),
            ("cpu_pct", Val::F(cpu_pct)),
            ("server_cpu_pct", Val::F(server_cpu.unwrap_or(f64::NAN))),
            ("task_holds", Val::I(lend[0])),
            ("task_asks", Val::I(lend[1])),
            ("thread_retakes", Val::I(lend[2])),
            ("kicks", Val::I(kicks)),
        ],
    );
    Ok(())
}

fn rt_side(
    c: &mut RtConn,
    a: &Common,
    client: bool,
    mut hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    let total = a.warmup_rounds() + a.iters;
    let (rt, ep) = (&c.rt, &c.ep);
    match a.lat_op() {
        LatOp::Write => return rt.block_on(write_side(rt, ep, a, client, hist)),
        LatOp::WriteAwait => return run_on(a.executor, rt, write_await_side(rt, ep, a, client, hist)),
        LatOp::Send => {}
    }
    if client {
        // The client's future runs on the executor asked for, as an application's would.
        return run_on(a.executor, rt, async {
            pingpong(rt, ep, a.size, a.warmup_rounds(), Duration::ZERO, &mut Progress::new(false, 0)).await?;
            let mut progress = Progress::new(!a.json, a.iters);
            let gap = Duration::from_micros(a.gap_us);
            let h = pingpong(rt, ep, a.size, a.iters, gap, &mut progress).await?;
            progress.done();
            if let Some(out) = hist.as_deref_mut() {
                *out = h;
            }
            Ok::<(), BoxErr>(())
        });
    }
    rt.block_on(async {
        // Two receives stay posted: the one for this ping and the one for the next. The
        // buffer of each ping goes back out after the answer, off the round trip's path,
        // yet long before the ping it is for can come (a round trip later).
        let mut sbuf = rt.alloc(a.size)?;
        let mut posted = std::collections::VecDeque::new();
        for _ in 0..total.min(2) {
            posted.push_back(ep.recv(rt.alloc(a.size)?).start());
        }
        for i in 0..total {
            let (r, b) = posted.pop_front().expect("a receive is posted").await;
            r?;
            let (r, s) = ep.send(sbuf).await;
            r?;
            sbuf = s;
            if i + 2 < total {
                posted.push_back(ep.recv(b).start());
            }
        }
        Ok::<(), BoxErr>(())
    })
}

/// The write ping-pong on the raw engine: the same rounds as `write_side`, no runtime.
fn raw_write_side(
    c: &mut RawConn,
    a: &Common,
    client: bool,
    hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    let size = a.size.max(1);
    let (mine, src, raddr, rkey) = raw_targets(c, size)?;
    let last = size - 1;
    let spins = spins_per_turn(a);
    let mut comps = Vec::with_capacity(16);
    let clock = clock();
    let mut samples = Samples::new(if client { a.iters } else { 0 });
    for i in 0..a.warmup_rounds() + a.iters {
        let seq = (i % 255) as u8 + 1;
        if client {
            pause_before(a, i);
        }
        let t0 = clock.now();
        if !client {
            raw_wait_byte(c, mine, last, seq, spins, &mut comps)?;
        }
        c.eng.bytes(src)[last] = seq;
        let kind = WrKind::Write { remote_addr: raddr, key: rkey, imm: None };
        let id = post(c, 3, kind, src, size)?;
        if client {
            raw_wait_byte(c, mine, last, seq, spins, &mut comps)?;
            if i >= a.warmup_rounds() {
                samples.add(t0, clock.now());
            }
        }
        // Our own completion is reaped after the answer: it never holds up the round trip.
        wait_for(c, id, &mut comps)?;
    }
    if let Some(h) = hist {
        *h = samples.histogram(&clock)?;
    }
    Ok(())
}

/// Each side's `size`-byte buffer the other writes, exposed, and the peer's descriptor of its
/// own. The client sends first, the server receives first: a send needs a posted receive on
/// verbs.
async fn swap_targets(
    rt: &Runtime,
    ep: &Endpoint,
    size: usize,
    client: bool,
) -> Result<(rdmalane::ExposedBuf<rdmalane::RegisteredBuf>, rdmalane::RemoteBuf), BoxErr> {
    let mine = rt.expose(rt.alloc(size)?, Access::WRITE)?;
    let theirs = if client {
        ep.send_descriptor(&mine.descriptor()).await?;
        ep.recv_descriptor().await?
    } else {
        let d = ep.recv_descriptor().await?;
        ep.send_descriptor(&mine.descriptor()).await?;
        d
    };
    Ok((mine, theirs))
}

/// On the raw engine: the buffer the peer writes, a source buffer, and the peer's target's
/// address and key, swapped over the setup connection.
fn raw_targets(c: &mut RawConn, size: usize) -> Result<(usize, usize, u64, u64), BoxErr> {
    let mine = c.eng.alloc(size, Access::WRITE)?;
    let src = c.eng.alloc(size, Access::LOCAL)?;
    let (addr, key) = c.eng.remote(mine);
    c.put(addr)?;
    c.put(key)?;
    Ok((mine, src, c.get()?, c.get()?))
}

/// Until byte `i` of buffer `mem` is `v`, driving the engine now and then: providers that move
/// one-sided data in software (shm) need the target's progress; completions that come in the
/// meantime are kept for `wait_for`.
fn raw_wait_byte(
    c: &mut RawConn,
    mem: usize,
    i: usize,
    v: u8,
    spins: usize,
    comps: &mut Vec<Completion>,
) -> Result<(), BoxErr> {
    loop {
        for _ in 0..spins {
            if c.eng.peek(mem, i) == Some(v) {
                return Ok(());
            }
        }
        comps.clear();
        c.eng.poll(comps, 16);
        for comp in comps.iter() {
            if let Completion::Op { id, status, .. } = comp {
                status.clone()?;
                c.early.push(id.to_raw());
            }
        }
    }
}

/// Write ping-pong, as perftest's ib_write_lat: each side exposes a buffer to the other and
/// polls its last byte for the peer's sequence number; the client writes, the server answers
/// with a write as soon as it sees it. One-way latency is half the client's round trip.
async fn write_side(
    rt: &Runtime,
    ep: &Endpoint,
    a: &Common,
    client: bool,
    hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    let size = a.size.max(1);
    let (mine, theirs) = swap_targets(rt, ep, size, client).await?;
    let mut src = rt.alloc(size)?;
    let clock = clock();
    let mut samples = Samples::new(if client { a.iters } else { 0 });
    let total = a.warmup_rounds() + a.iters;
    let mut progress = Progress::new(client && !a.json, total);
    let last = size - 1;
    let spins = spins_per_turn(a);
    for i in 0..total {
        let seq = (i % 255) as u8 + 1;
        if client {
            pause_before(a, i);
        }
        let t0 = clock.now();
        if !client {
            wait_byte(&mine, last, seq, spins).await;
        }
        src[last] = seq;
        // Our own completion is reaped after the answer: it never holds up the round trip.
        let write = ep.write_remote(src, &theirs).start();
        if client {
            wait_byte(&mine, last, seq, spins).await;
            if i >= a.warmup_rounds() {
                samples.add(t0, clock.now());
            }
        }
        let (r, b) = write.await;
        r?;
        src = b;
        progress.tick(i);
    }
    progress.done();
    if let Some(out) = hist {
        *out = samples.histogram(&clock)?;
    }
    Ok(())
}

/// Run `fut` on `exec` (see `Executor`). The inline driver turns its reactor only inside
/// `Runtime::block_on`, so there it runs there whatever `exec` says.
fn run_on<T>(exec: Executor, rt: &Runtime, fut: impl std::future::Future<Output = T>) -> T {
    let tokio = |b: &mut tokio::runtime::Builder| b.enable_all().build().expect("a tokio runtime");
    match exec {
        _ if rt.driver() == rdmalane::Driver::Inline => rt.block_on(fut),
        Executor::BlockOn => rt.block_on(fut),
        Executor::TokioCurrent => tokio(&mut tokio::runtime::Builder::new_current_thread()).block_on(fut),
        Executor::TokioMulti => tokio(&mut tokio::runtime::Builder::new_multi_thread()).block_on(fut),
    }
}

/// The sequence number a write-await round carries in its last byte (1 to 254); 255 stops the
/// server.
fn await_seq(i: usize) -> u8 {
    (i % 254) as u8 + 1
}

/// The byte that stops a write-await server.
const AWAIT_STOP: u8 = 255;

/// Write-await, as an application awaits each write: the client writes `size` bytes to the
/// server's exposed buffer and waits for the write's completion, one at a time, timing submit
/// to completion; the server only serves (its progress is what lands the writes on software
/// providers) until the client's stop byte arrives.
async fn write_await_side(
    rt: &Runtime,
    ep: &Endpoint,
    a: &Common,
    client: bool,
    hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    let size = a.size.max(1);
    let (mine, theirs) = swap_targets(rt, ep, size, client).await?;
    let last = size - 1;
    if !client {
        wait_byte(&mine, last, AWAIT_STOP, spins_per_turn(a)).await;
        return Ok(());
    }
    let mut src = rt.alloc(size)?;
    let clock = clock();
    let mut samples = Samples::new(a.iters);
    let total = a.warmup_rounds() + a.iters;
    let mut progress = Progress::new(!a.json, total);
    for i in 0..total {
        pause_before(a, i);
        src[last] = await_seq(i);
        let t0 = clock.now();
        let (r, b) = ep.write_remote(src, &theirs).await;
        let t1 = clock.now();
        r?;
        src = b;
        if i >= a.warmup_rounds() {
            samples.add(t0, t1);
        }
        progress.tick(i);
    }
    progress.done();
    if let Some(out) = hist {
        *out = samples.whole(&clock)?;
    }
    // The server leaves once the stop byte lands, perhaps before our completion of it comes
    // (tcp's needs the target's progress): its outcome does not matter.
    src[last] = AWAIT_STOP;
    let _ = ep.write_remote(src, &theirs).await;
    Ok(())
}

/// Write-await on the raw engine: the same rounds, each a post and a poll for its completion.
fn raw_write_await_side(
    c: &mut RawConn,
    a: &Common,
    client: bool,
    hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    let size = a.size.max(1);
    let (mine, src, raddr, rkey) = raw_targets(c, size)?;
    let last = size - 1;
    let mut comps = Vec::with_capacity(16);
    if !client {
        return raw_wait_byte(c, mine, last, AWAIT_STOP, spins_per_turn(a), &mut comps);
    }
    let clock = clock();
    let mut samples = Samples::new(a.iters);
    let kind = WrKind::Write { remote_addr: raddr, key: rkey, imm: None };
    for i in 0..a.warmup_rounds() + a.iters {
        pause_before(a, i);
        c.eng.bytes(src)[last] = await_seq(i);
        let t0 = clock.now();
        let id = post(c, 3, kind, src, size)?;
        wait_for(c, id, &mut comps)?;
        let t1 = clock.now();
        if i >= a.warmup_rounds() {
            samples.add(t0, t1);
        }
    }
    if let Some(h) = hist {
        *h = samples.whole(&clock)?;
    }
    // As on the runtime: the stop write's own completion does not matter.
    c.eng.bytes(src)[last] = AWAIT_STOP;
    if let Ok(id) = post(c, 3, kind, src, size) {
        let _ = wait_for(c, id, &mut comps);
    }
    Ok(())
}

/// Until byte `i` of `buf` is `v`. The peer's write lands without our reactor, so this spins
/// on memory and yields to the driver (which turns the reactor, reaping our own completions)
/// only every so many looks, as ib_write_lat polls its completion queue only now and then.
async fn wait_byte(buf: &rdmalane::ExposedBuf<rdmalane::RegisteredBuf>, i: usize, v: u8, spins: usize) {
    std::future::poll_fn(|cx| {
        for _ in 0..spins {
            if buf.peek(i) == Some(v) {
                return std::task::Poll::Ready(());
            }
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

/// `--gap-us`: sleep before measured round `i` (not during warm-up), so that idle reactor
/// threads may fall asleep in between.
fn pause_before(a: &Common, i: usize) {
    if a.gap_us > 0 && i >= a.warmup_rounds() {
        std::thread::sleep(Duration::from_micros(a.gap_us));
    }
}

/// Looks at the polled byte between two turns of the reactor (or polls of the raw engine) in
/// the write ping-pong. The looks are plain volatile reads, as perftest's: no `pause` between
/// them, which costs about 40 ns on recent x86 and, under qemu's TCG, leaves the emulator's
/// execution loop each time (the Soft-RoCE VM's latency then read 1.6x perftest's on the raw
/// engine). On verbs the NIC places the data with no help from us, so the looks go on much
/// longer between turns (each turn a poll of the completion queue, on the answer's path if it
/// lands meanwhile); providers that move one-sided data in software (shm, tcp) need our
/// progress, so those turn often.
fn spins_per_turn(a: &Common) -> usize {
    if rdmalane_verbs::is_verbs(&a.provider) {
        1 << 14
    } else {
        256
    }
}

/// With `RDMALANE_PERF_PLACEMENT` set, one line on stderr per side after its run: the CPU each
/// of its threads ran on last and the runtime's lend counts. Single process pairs of `lat` land
/// on either side of a median as the OS places them; this says where each one landed.
fn report_placement(side: &str, rt: Option<&Runtime>) {
    if std::env::var_os("RDMALANE_PERF_PLACEMENT").is_none() {
        return;
    }
    let lend = rt.map(|r| r.stats()).map_or(String::new(), |st| {
        format!(
            " holds={} asks={} retakes={} kicks={}",
            st.task_holds, st.task_asks, st.thread_retakes, st.kicks
        )
    });
    eprintln!("PLACEMENT {side}{lend} threads={}", crate::conn::thread_cpus());
}

/// `n` ping-pongs of `size` bytes; one-way latencies (half round trips) in ns. The receive for
/// each reply is posted a round ahead, right after the send before it, as a server keeps
/// receives posted: off the round trip's path, and still long before its reply can come.
pub async fn pingpong(
    rt: &Runtime,
    ep: &Endpoint,
    size: usize,
    n: usize,
    gap: Duration,
    progress: &mut Progress,
) -> Result<Histogram<u64>, BoxErr> {
    let clock = clock();
    let mut samples = Samples::new(n);
    let mut s = rt.alloc(size)?;
    let mut spare = Some(rt.alloc(size)?);
    let mut recv = if n > 0 { Some(ep.recv(rt.alloc(size)?).start()) } else { None };
    for i in 0..n {
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        let t0 = clock.now();
        let (res, b) = ep.send(s).await;
        res?;
        s = b;
        // The last round posts none: a receive left posted would take the next run's reply.
        let ahead = if i + 1 < n { spare.take().map(|buf| ep.recv(buf).start()) } else { None };
        let (res, b) = recv.take().expect("a receive is posted").await;
        res?;
        samples.add(t0, clock.now());
        spare = Some(b);
        recv = ahead;
        progress.tick(i);
    }
    samples.histogram(&clock)
}

/// Round trips in counter ticks, kept as perftest keeps them: in an array, turned into one-way
/// latencies (half of each) after the run. Taking a sample is a store, so the next round
/// starts without a histogram update on its path (`fi_pingpong`, timing its whole loop at
/// once, has none either).
struct Samples(Vec<u64>);

impl Samples {
    fn new(n: usize) -> Samples {
        Samples(Vec::with_capacity(n))
    }

    /// The round that began at counter value `t0` ended at `now` (a counter that went back,
    /// as it may across cores, gives no sample).
    #[inline]
    fn add(&mut self, t0: u64, now: u64) {
        if let Some(d) = now.checked_sub(t0) {
            self.0.push(d);
        }
    }

    /// One-way latencies in ns (half of each round trip).
    fn histogram(&self, clock: &Cycles) -> Result<Histogram<u64>, BoxErr> {
        self.scaled(clock, 0.5)
    }

    /// The samples whole, in ns (each one op's own time, not a round trip).
    fn whole(&self, clock: &Cycles) -> Result<Histogram<u64>, BoxErr> {
        self.scaled(clock, 1.0)
    }

    fn scaled(&self, clock: &Cycles, by: f64) -> Result<Histogram<u64>, BoxErr> {
        self.dump(clock);
        let mut h = Histogram::<u64>::new(3)?;
        for &d in &self.0 {
            h.record((clock.ns(d as f64) * by) as u64)?;
        }
        Ok(h)
    }

    /// With `RDMALANE_PERF_SAMPLES=DIR`: every sample in ns, in the order taken, one per line,
    /// in a file of its own under DIR. Says when a tail's slow rounds came (periodic work of
    /// ours, or the host's), which a histogram cannot.
    fn dump(&self, clock: &Cycles) {
        let Some(dir) = std::env::var_os("RDMALANE_PERF_SAMPLES") else { return };
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::path::Path::new(&dir).join(format!("samples-{}-{seq}.txt", std::process::id()));
        let text: String = self.0.iter().map(|&d| format!("{}\n", clock.ns(d as f64) as u64)).collect();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("could not write {}: {e}", path.display());
        }
    }
}

/// Without the `probe` feature there is nothing to report.
#[cfg(not(feature = "probe"))]
fn report_probe(_side: &str, _a: &Common) {}

/// With the `probe` feature: where this side's time went, on stderr (this thread's count: the
/// inline driver's, or the raw engine's).
#[cfg(feature = "probe")]
fn report_probe(side: &str, a: &Common) {
    let Some(p) = rdmalane_efa::probe_snapshot() else { return };
    let c = clock();
    let ns = |t: &rdmalane_efa::Tally| t.mean().map_or("-".into(), |m| format!("{:.0} ns", c.ns(m)));
    eprintln!(
        "probe {side} ({:?} engine): turnaround {} over {} replies; lookout {}; fi_cq_read {} with \
         completions, {} without; posting a send or write {}",
        a.engine,
        ns(&p.turnaround),
        p.turnaround.count,
        ns(&p.lookout),
        ns(&p.cq_hit),
        ns(&p.cq_empty),
        ns(&p.post)
    );
    let stages = rdmalane::probe::stages().unwrap_or_default();
    if stages.iter().any(|s| s.count > 0) {
        // Each step holds one mark's own cost: taken off.
        let own = rdmalane::probe::mark_ticks().unwrap_or(0.0);
        let step = |s: &rdmalane::probe::StageTally| {
            let mean = if s.count > 0 { c.ns(s.ticks as f64 / s.count as f64 - own) } else { f64::NAN };
            format!("{:?} {:.0} ns ({})", s.stage, mean.max(0.0), s.count)
        };
        let steps: Vec<String> = stages.iter().map(step).collect();
        eprintln!(
            "probe {side} stages from a reap with completions (less a mark's own {:.0} ns each): {}",
            c.ns(own),
            steps.join(", ")
        );
    }
}

/// The clock samples are taken with: perftest's, the time-stamp counter (a VM's OS clock can
/// cost microseconds a read). Calibrated once per process: `mixed` runs four ping-pongs.
fn clock() -> Cycles {
    static CLOCK: std::sync::OnceLock<Cycles> = std::sync::OnceLock::new();
    *CLOCK.get_or_init(|| Cycles::calibrate(std::time::Duration::from_millis(50)))
}

/// Poll until the completions for `ids` (at most two; those not in already) have arrived. The
/// ids wait on the stack, so the raw engine's loop allocates nothing per round trip, as a
/// hand-written libfabric loop (`fi_pingpong`'s) allocates nothing: a baseline that paid a
/// `malloc` and a `free` a round trip would flatter the runtime beside it.
fn wait_for(
    c: &mut RawConn,
    ids: impl IntoIterator<Item = u64>,
    comps: &mut Vec<Completion>,
) -> Result<(), BoxErr> {
    let mut pending = [0u64; 2];
    let mut n = 0;
    for id in ids {
        if let Some(i) = c.early.iter().position(|e| *e == id) {
            c.early.swap_remove(i);
            continue;
        }
        let Some(slot) = pending.get_mut(n) else {
            return Err("a raw-engine wait is for two requests at most".into());
        };
        *slot = id;
        n += 1;
    }
    while n > 0 {
        comps.clear();
        c.eng.poll(comps, 16);
        for comp in comps.iter() {
            if let Completion::Op { id, status, .. } = comp {
                status.clone()?;
                match pending[..n].iter().position(|p| *p == id.to_raw()) {
                    Some(i) => {
                        pending[i] = pending[n - 1];
                        n -= 1;
                    }
                    None => c.early.push(id.to_raw()),
                }
            }
        }
    }
    Ok(())
}

fn post(c: &mut RawConn, id: u64, kind: WrKind, mem: usize, len: usize) -> Result<Option<u64>, BoxErr> {
    loop {
        match c.eng.post(id, c.peer, kind, mem, 0, len) {
            Ok(Posted::Queued) => return Ok(Some(id)),
            Ok(Posted::Completed) => return Ok(None),
            Err(PostError::Again) => {
                let mut v = Vec::new();
                c.eng.poll(&mut v, 0);
            }
            Err(PostError::Failed(e)) => return Err(e.into()),
        }
    }
}

fn raw_side(
    c: &mut RawConn,
    a: &Common,
    client: bool,
    hist: Option<&mut Histogram<u64>>,
) -> Result<(), BoxErr> {
    match a.op {
        Some(LatOp::Write) => return raw_write_side(c, a, client, hist),
        Some(LatOp::WriteAwait) => return raw_write_await_side(c, a, client, hist),
        _ => {}
    }
    let total = a.warmup_rounds() + a.iters;
    let s = c.eng.alloc(a.size, Access::LOCAL)?;
    // Two receive buffers, posted a round ahead as `pingpong` does (ids 10 and 11).
    let r = [c.eng.alloc(a.size, Access::LOCAL)?, c.eng.alloc(a.size, Access::LOCAL)?];
    let recv_into = |c: &mut RawConn, i: usize| post(c, 10 + (i % 2) as u64, WrKind::Recv, r[i % 2], a.size);
    let mut comps = Vec::with_capacity(16);
    let mut progress = Progress::new(client && !a.json, total);
    let clock = clock();
    let mut samples = Samples::new(if client { a.iters } else { 0 });
    if client {
        let mut recv = if total > 0 { recv_into(c, 0)? } else { None };
        for i in 0..total {
            pause_before(a, i);
            let t0 = clock.now();
            let send = post(c, 2, WrKind::Send { imm: None }, s, a.size)?;
            let ahead = if i + 1 < total { recv_into(c, i + 1)? } else { None };
            wait_for(c, recv.into_iter().chain(send), &mut comps)?;
            if i >= a.warmup_rounds() {
                samples.add(t0, clock.now());
            }
            recv = ahead;
            progress.tick(i);
        }
        if let Some(h) = hist {
            *h = samples.histogram(&clock)?;
        }
    } else {
        let mut posted = std::collections::VecDeque::new();
        for i in 0..total.min(2) {
            posted.push_back(recv_into(c, i)?);
        }
        for i in 0..total {
            let recv = posted.pop_front().flatten();
            wait_for(c, recv, &mut comps)?;
            let send = post(c, 2, WrKind::Send { imm: None }, s, a.size)?;
            if i + 2 < total {
                posted.push_back(recv_into(c, i + 2)?);
            }
            wait_for(c, send, &mut comps)?;
        }
    }
    progress.done();
    Ok(())
}
