//! Processes that find each other through etcd and keep a page-transfer workload going while
//! members join, leave and crash.
//!
//! `cargo run --release --example cluster -- --etcd 127.0.0.1:2379`
//!
//! Run against an etcd you started: this process (the coordinator, member `w0`) starts member
//! processes of its own binary, one after another; later it tells one to leave cleanly and
//! SIGKILLs another, starts a newcomer, and at the end tells the rest to leave. Every member
//! exposes pages whose bytes are a function of its id and page number, and reads batches of
//! random pages from every other member it learns of, checking every byte. An op either
//! succeeds with the right bytes or fails because its peer left (only after that peer's leave
//! or crash); anything else is a failure. It exits 0 only when all of that held, and prints
//! join-to-first-byte (publication to the first verified page read from the newcomer) and
//! leave-detection times (leave or kill to the `Left` event).
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdmalane::membership::{Cluster, JoinOptions, MemberEvent, MemberId};
use rdmalane::{Access, Pieces, RemoteBuf, Runtime};
use rdmalane_etcd::{EtcdMembership, EtcdOptions};

#[derive(Parser, Clone)]
struct Args {
    /// etcd's client endpoint (`host:port`).
    #[arg(long)]
    etcd: String,
    /// The cluster's prefix in etcd (a fresh one per run by default).
    #[arg(long)]
    prefix: Option<String>,
    /// libfabric provider: tcp, shm, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Lease TTL in seconds: a crashed member leaves within it.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// Member processes started at the beginning (then one leaves, one is killed, one new
    /// one joins).
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Seconds between scenario steps.
    #[arg(long, default_value_t = 3)]
    step: u64,
    /// Internal: run as a member process with this label.
    #[arg(long, hide = true)]
    member: Option<String>,
}

const PAGE: usize = 16 << 10;
const PAGES: usize = 64;
const BATCH: usize = 8;

/// What page `p` of member `id` holds.
fn content(id: u64, p: usize) -> Vec<u8> {
    let mut x = id ^ (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// What one member did: ops that moved verified bytes, ops that failed because their peer
/// left, and the first verified byte from each peer (unix µs).
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    bytes: AtomicU64,
    lost: AtomicU64,
    failed: AtomicBool,
    first_byte: Mutex<BTreeMap<u64, u64>>,
    /// Peers whose `Left` we saw, with when (unix µs).
    left: Mutex<BTreeMap<u64, u64>>,
    /// When each peer began to join, as its entry says (unix µs).
    joined: Mutex<BTreeMap<u64, u64>>,
}

impl Tally {
    fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::SeqCst);
        format!(
            "ok={} bytes={} lost={} failed={}",
            n(&self.ok),
            n(&self.bytes),
            n(&self.lost),
            self.failed.load(Ordering::SeqCst)
        )
    }
}

/// Join, serve our pages, and read from every member we learn of until `stop`.
async fn member(
    a: &Args,
    label: &str,
    stop: Arc<AtomicBool>,
) -> Result<(Arc<Tally>, Arc<Cluster>), Box<dyn std::error::Error>> {
    let rt = Runtime::builder().backend(rdmalane_efa::Libfabric).provider(&a.provider).build()?;
    let opts = EtcdOptions::new([a.etcd.as_str()], a.prefix.clone().expect("set by main"))
        .ttl(Duration::from_secs(a.ttl));
    let directory = EtcdMembership::connect(opts).await?;
    let joined_at = now_us();
    let cluster =
        Cluster::join(&rt, directory, JoinOptions::new(label).meta("joined_at_us", joined_at.to_string()))
            .await?;
    let me = rt.id();
    let mut mem = rt.alloc(PAGE * PAGES)?;
    for p in 0..PAGES {
        mem[p * PAGE..(p + 1) * PAGE].copy_from_slice(&content(me, p));
    }
    let region = Arc::new(rt.expose(mem, Access::READ)?);
    let tally = Arc::new(Tally::default());
    let cluster = Arc::new(cluster);
    // Whoever connects gets our pages' descriptor.
    {
        let (cluster, region) = (cluster.clone(), region.clone());
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok(ep) = cluster.accept().await {
                let _ = ep.send_descriptor(&region.descriptor()).await;
                kept.push(ep);
            }
        });
    }
    // Everyone we learn of gets read from.
    {
        let (cluster2, tally, stop) = (cluster.clone(), tally.clone(), stop.clone());
        let (rt, ttl) = (rt.clone(), a.ttl);
        tokio::spawn(async move {
            let mut events = cluster2.events();
            let mut gone: BTreeMap<u64, Arc<AtomicBool>> = BTreeMap::new();
            while let Some(ev) = events.next().await {
                match ev {
                    MemberEvent::Joined(m) => {
                        let Some(id) = m.id else { continue };
                        if let Some(t) = m.meta.get("joined_at_us").and_then(|t| t.parse().ok()) {
                            tally.joined.lock().unwrap().insert(id.0, t);
                        }
                        let left = Arc::new(AtomicBool::new(false));
                        gone.insert(id.0, left.clone());
                        let grace = Duration::from_secs(ttl + 2);
                        let job = reader(
                            rt.clone(),
                            cluster2.clone(),
                            id,
                            tally.clone(),
                            stop.clone(),
                            left,
                            grace,
                        );
                        tokio::spawn(job);
                    }
                    MemberEvent::Left { member, .. } => {
                        let id = member.id.map(|i| i.0).unwrap_or(0);
                        tally.left.lock().unwrap().insert(id, now_us());
                        if let Some(l) = gone.get(&id) {
                            l.store(true, Ordering::SeqCst);
                        }
                    }
                }
            }
        });
    }
    Ok((tally, cluster))
}

/// Read batches of random pages from member `id` and check them, until `stop` or its loss.
async fn reader(
    rt: Runtime,
    cluster: Arc<Cluster>,
    id: MemberId,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    left: Arc<AtomicBool>,
    grace: Duration,
) {
    let fail = |what: String| {
        eprintln!("member {:016x}: {what}", rt.id());
        tally.failed.store(true, Ordering::SeqCst);
    };
    // A member may be on its way out when we reach it: its listener closes before the
    // directory says it left. A connect that fails is a failure only if it does not leave
    // within the lease's time.
    let ep = match cluster.connect(id).await {
        Ok(ep) => ep,
        Err(e) if e.is_peer_lost() || leaves_within(&left, grace).await => return,
        Err(e) => return fail(format!("connect to {id}: {e}")),
    };
    let remote: RemoteBuf = match ep.recv_descriptor().await {
        Ok(r) => r,
        Err(e) if e.is_peer_lost() || leaves_within(&left, grace).await => return,
        Err(e) => return fail(format!("descriptor from {id}: {e}")),
    };
    let mut buf = match rt.alloc(PAGE * BATCH) {
        Ok(b) => b,
        Err(e) => return fail(format!("alloc: {e}")),
    };
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let remote_pages: Vec<usize> =
            (0..BATCH).map(|i| (round * 7 + i * 13 + id.0 as usize) % PAGES).collect();
        let local: Vec<usize> = (0..BATCH).collect();
        let pieces = Pieces::pages(&local, &remote_pages, PAGE).expect("valid pages");
        let (res, b) = ep.read_batch(buf, &remote, &pieces).await;
        buf = b;
        match res {
            Ok(n) => {
                for (i, &p) in remote_pages.iter().enumerate() {
                    if buf[i * PAGE..(i + 1) * PAGE] != content(id.0, p)[..] {
                        return fail(format!("page {p} from {id} has the wrong bytes"));
                    }
                }
                tally.first_byte.lock().unwrap().entry(id.0).or_insert_with(now_us);
                tally.ok.fetch_add(1, Ordering::Relaxed);
                tally.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.is_peer_lost() || leaves_within(&left, grace).await => {
                tally.lost.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(e) => return fail(format!("read from {id}: {e}")),
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Whether the member whose `left` flag this is leaves (or has left) within `grace`.
async fn leaves_within(left: &AtomicBool, grace: Duration) -> bool {
    let until = tokio::time::Instant::now() + grace;
    while !left.load(Ordering::SeqCst) {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// A member process: join, work until told `leave` on stdin, leave, report.
async fn run_member(a: Args, label: String) -> Result<(), Box<dyn std::error::Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, cluster) = member(&a, &label, stop.clone()).await?;
    println!("JOINED {}", cluster.me().id.expect("an id"));
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await??;
    stop.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leaving_at = now_us();
    cluster.leave().await?;
    println!("REPORT {label} leaving_at_us={leaving_at} {}", tally.summary());
    match tally.failed.load(Ordering::SeqCst) {
        true => Err(format!("{label}: a check failed").into()),
        false => Ok(()),
    }
}

struct Proc {
    label: String,
    child: Child,
    id: u64,
    out: BufReader<std::process::ChildStdout>,
}

fn spawn(a: &Args, label: &str) -> Result<Proc, Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["--etcd", &a.etcd, "--prefix", a.prefix.as_deref().expect("set"), "--provider", &a.provider])
        .args(["--ttl", &a.ttl.to_string(), "--member", label])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    let id = line.trim().strip_prefix("JOINED ").ok_or_else(|| format!("{label} said {line:?}"))?;
    Ok(Proc { label: label.to_string(), child, id: u64::from_str_radix(id, 16)?, out })
}

/// Tell a member to leave and collect its report line.
fn finish(mut p: Proc) -> Result<String, Box<dyn std::error::Error>> {
    writeln!(p.child.stdin.as_mut().expect("piped"), "leave")?;
    let mut report = String::new();
    p.out.read_line(&mut report)?;
    let status = p.child.wait()?;
    if !status.success() {
        return Err(format!("{} exited with {status}: {report}", p.label).into());
    }
    Ok(report.trim().to_string())
}

async fn coordinate(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    if a.members < 2 {
        return Err("--members: at least 2 (one leaves, one is killed)".into());
    }
    let step = Duration::from_secs(a.step);
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, cluster) = member(&a, "w0", stop.clone()).await?;
    let mut procs = Vec::new();
    for i in 1..=a.members {
        procs.push(spawn(&a, &format!("w{i}"))?);
    }
    tokio::time::sleep(step).await;
    // One leaves cleanly, one is killed.
    let leaving = procs.remove(0);
    let leaver = leaving.id;
    let mut reports = vec![finish(leaving)?];
    let left_at: u64 = reports[0]
        .split_whitespace()
        .find_map(|f| f.strip_prefix("leaving_at_us="))
        .and_then(|t| t.parse().ok())
        .ok_or("the leaver's report has no leave time")?;
    tokio::time::sleep(step).await;
    let mut killed = procs.remove(0);
    let (victim, killed_at) = (killed.id, now_us());
    killed.child.kill()?;
    killed.child.wait()?;
    tokio::time::sleep(step).await;
    // A newcomer joins a running cluster.
    let newcomer = spawn(&a, &format!("w{}", a.members + 1))?;
    let new_id = newcomer.id;
    procs.push(newcomer);
    tokio::time::sleep(step).await;
    for p in procs {
        reports.push(finish(p)?);
    }
    stop.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.leave().await?;

    for r in &reports {
        println!("{r}");
    }
    let left = tally.left.lock().unwrap().clone();
    let first = tally.first_byte.lock().unwrap().clone();
    let ms = |from: u64, to: Option<&u64>| to.map(|t| t.saturating_sub(from) as f64 / 1000.0);
    let clean = ms(left_at, left.get(&leaver)).ok_or("w0 never saw the clean leave")?;
    let crash = ms(killed_at, left.get(&victim)).ok_or("w0 never saw the killed member leave")?;
    let began = *tally.joined.lock().unwrap().get(&new_id).ok_or("the newcomer's entry had no join time")?;
    let first_byte = ms(began, first.get(&new_id)).ok_or("w0 never read from the newcomer")?;
    println!("w0: {}", tally.summary());
    println!("leave detected: clean {clean:.1} ms, SIGKILL {crash:.1} ms (TTL {} s)", a.ttl);
    println!("join to first byte: {first_byte:.1} ms (the newcomer's join() call to w0's first verified page from it)");
    if tally.failed.load(Ordering::SeqCst) {
        return Err("w0: a check failed".into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs go to stderr: a member's stdout is read by the coordinator.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut a = Args::parse();
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match a.member.clone() {
        Some(label) => tokio.block_on(run_member(a, label)),
        None => {
            a.prefix.get_or_insert_with(|| format!("/rdmalane-example/{}", std::process::id()));
            tokio.block_on(coordinate(a))
        }
    }
}
