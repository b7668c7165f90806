//! Bringing the two sides together: the child server process, and the connection for each
//! engine (the runtime's own handshake, or a bare TCP exchange of addresses for raw).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmalane::backend::PeerAddr;
use rdmalane::{Driver, Endpoint, Listener, Runtime};
use rdmalane_efa::raw::RawEngine;

use crate::cli::{Common, DriverArg, Engine, LatOp, MemoryArg};

pub type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// The server side running as a child of this process.
pub struct ServerChild {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl ServerChild {
    /// Start `rdmalane-perf MODE --server` with the same settings; returns it and its address.
    pub fn spawn(mode: &str, a: &Common) -> Result<(ServerChild, String), BoxErr> {
        Self::spawn_with(mode, a, &[])
    }

    /// As `spawn`, with extra arguments for the mode.
    pub fn spawn_with(mode: &str, a: &Common, extra: &[String]) -> Result<(ServerChild, String), BoxErr> {
        let engine = match a.engine {
            Engine::Runtime => "runtime",
            Engine::Raw => "raw",
        };
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                mode,
                "--server",
                "--once",
                "--listen",
                "127.0.0.1:0",
                "--provider",
                &a.provider,
                "--engine",
                engine,
            ])
            .args(["--size", &a.size.to_string(), "--iters", &a.iters.to_string()])
            .args(a.warmup.iter().flat_map(|w| ["--warmup".to_string(), w.to_string()]))
            .args(["--window", &a.window.to_string()])
            .args(["--driver", if a.driver == DriverArg::Thread { "thread" } else { "inline" }])
            .args(["--memory", if a.memory == MemoryArg::Cuda { "cuda" } else { "host" }])
            .args(extra)
            .args(a.op.iter().flat_map(|op| {
                let name = match op {
                    LatOp::Send => "send",
                    LatOp::Write => "write",
                    LatOp::WriteAwait => "write-await",
                };
                ["--op", name]
            }))
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line)? == 0 {
                let _ = child.kill();
                return Err("server exited before listening".into());
            }
            if let Some(addr) = line.trim().strip_prefix("LISTENING ") {
                let addr = addr.to_string();
                return Ok((ServerChild { child, out }, addr));
            }
        }
    }

    /// Wait for the server to end; returns the CPU share it reported.
    pub fn finish(mut self) -> Result<f64, BoxErr> {
        let mut rest = String::new();
        self.out.read_to_string(&mut rest)?;
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("server failed: {status}").into());
        }
        rest.lines()
            .filter_map(|l| l.strip_prefix("SERVER_CPU "))
            .next_back()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| "server reported no CPU figure".into())
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each of this process's threads as `name@cpu`, the CPU it ran on last (from /proc).
pub fn thread_cpus() -> String {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let name = head.split_once('(').map_or("?", |(_, n)| n);
        // `processor` is field 39 of stat(5); here index 36 (fields after the name, from 3).
        let cpu = rest.split_whitespace().nth(36).unwrap_or("?");
        out.push(format!("{name}@{cpu}"));
    }
    out.join(",")
}

/// CPU seconds (user + system) this process has used, from /proc.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat(5); here indices 11 and 12. 100 ticks/s.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU share in percent of one core over a measured span.
pub struct CpuMeter(f64, Instant);

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter(cpu_seconds(), Instant::now())
    }
    pub fn pct(&self) -> f64 {
        let wall = self.1.elapsed().as_secs_f64().max(1e-9);
        100.0 * (cpu_seconds() - self.0) / wall
    }
    /// CPU seconds this process used since the start (every thread of it).
    pub fn secs(&self) -> f64 {
        cpu_seconds() - self.0
    }
    /// Wall seconds since the start.
    pub fn wall(&self) -> f64 {
        self.1.elapsed().as_secs_f64()
    }
}

/// A tokio runtime for the control plane (handshakes, peer liveness).
pub fn control_plane() -> Result<tokio::runtime::Runtime, BoxErr> {
    tokio_rt()
}

/// The runtime engine's connection.
pub struct RtConn {
    /// Runs the control-plane tasks (peer liveness) for the connection's life.
    pub _tokio: Arc<tokio::runtime::Runtime>,
    pub rt: Runtime,
    pub ep: Endpoint,
}

/// Serve client after client: `accept` waits for the next one (its error, the listener's, ends
/// the server), `run` serves it (its error is logged and the next client served; with `--once`
/// the first client is the only one, and its error is the server's).
pub fn serve_each<T>(
    a: &Common,
    mut accept: impl FnMut() -> Result<T, BoxErr>,
    mut run: impl FnMut(T) -> Result<(), BoxErr>,
) -> Result<(), BoxErr> {
    loop {
        let client = accept()?;
        match run(client) {
            Err(e) if !a.once => eprintln!("rdmalane-perf: a client failed: {e}; serving the next"),
            r => r?,
        }
        if a.once {
            return Ok(());
        }
    }
}

/// The runtime engine's server: one listener that outlives its clients.
pub struct RtServer {
    tokio: Arc<tokio::runtime::Runtime>,
    pub rt: Runtime,
    listener: Listener,
}

impl RtServer {
    /// Listen on `a.listen` and say where (`LISTENING ADDR` on stdout).
    pub fn bind(rt: Runtime, a: &Common) -> Result<RtServer, BoxErr> {
        let tokio = Arc::new(tokio_rt()?);
        let listener = tokio.block_on(async {
            let l = rt.listen(&a.listen).await?;
            println!("LISTENING {}", l.local_addr()?);
            std::io::stdout().flush()?;
            Ok::<_, BoxErr>(l)
        })?;
        Ok(RtServer { tokio, rt, listener })
    }

    /// The next client's connection.
    pub fn accept(&self) -> Result<RtConn, BoxErr> {
        let ep = self.tokio.block_on(self.listener.accept())?;
        Ok(RtConn { _tokio: self.tokio.clone(), rt: self.rt.clone(), ep })
    }

    /// The next `n` connections (one client's, for modes that open several).
    pub fn accept_n(&self, n: usize) -> Result<Vec<Endpoint>, BoxErr> {
        self.tokio.block_on(async {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(self.listener.accept().await?);
            }
            Ok(v)
        })
    }
}

fn tokio_rt() -> Result<tokio::runtime::Runtime, BoxErr> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?)
}

pub fn build_rt(a: &Common) -> Result<Runtime, BoxErr> {
    build_rt_with(a, sched_from_env(), 1, 1)
}

/// The scheduler's settings from the environment (`RDMALANE_CHUNK_SIZE`, ...) over the
/// defaults; the benchmark's own flags go over these. A variable that does not parse ends the
/// benchmark, naming it.
pub fn sched_from_env() -> rdmalane::sched::SchedConfig {
    rdmalane::sched::SchedConfig::from_env().unwrap_or_else(|e| {
        eprintln!("rdmalane-perf: {e}");
        std::process::exit(2)
    })
}

/// A runtime for the benchmarks: by default the inline driver (the benchmark thread drives the
/// reactor).
pub fn build_rt_with(
    a: &Common,
    sched: rdmalane::sched::SchedConfig,
    lanes: usize,
    rails: usize,
) -> Result<Runtime, BoxErr> {
    let mut b = Runtime::builder()
        .backend(rdmalane_verbs::Verbs)
        .backend(rdmalane_efa::Libfabric)
        .provider(&a.provider)
        .driver(match a.driver {
            DriverArg::Inline => Driver::Inline,
            DriverArg::Thread => Driver::Thread,
        })
        .scheduler(sched)
        .lanes(lanes)
        .rails(rails);
    if let Some(n) = &a.node {
        b = b.node(n);
    }
    Ok(b.build()?)
}

impl RtConn {
    /// The server on the runtime `a` describes.
    pub fn server(a: &Common) -> Result<RtServer, BoxErr> {
        RtServer::bind(build_rt(a)?, a)
    }

    pub fn client(a: &Common, addr: &str) -> Result<RtConn, BoxErr> {
        Self::client_on(build_rt(a)?, addr)
    }

    /// The client side on a runtime built by the caller.
    pub fn client_on(rt: Runtime, addr: &str) -> Result<RtConn, BoxErr> {
        let tokio = tokio_rt()?;
        let ep = tokio.block_on(rt.connect(addr.to_string()))?;
        Ok(RtConn { _tokio: Arc::new(tokio), rt, ep })
    }
}

/// The raw engine's connection: the endpoint, the peer, and the TCP socket used for setup and
/// the final handshake.
pub struct RawConn {
    pub eng: RawEngine,
    pub peer: PeerAddr,
    pub ctl: TcpStream,
    /// Ids whose completion arrived while waiting for others (a reply's receive may complete
    /// in the same poll as the send before it).
    pub early: Vec<u64>,
}

/// How long the raw engine's setup exchange may take.
const SETUP_LIMIT: Duration = Duration::from_secs(5);

fn exchange(ctl: &mut TcpStream, mine: &[u8]) -> Result<Vec<u8>, BoxErr> {
    ctl.write_all(&(mine.len() as u32).to_le_bytes())?;
    ctl.write_all(mine)?;
    let mut len = [0u8; 4];
    ctl.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 4096 {
        return Err("peer sent an oversized address".into());
    }
    let mut v = vec![0u8; len];
    ctl.read_exact(&mut v)?;
    Ok(v)
}

/// The raw engine on the provider `a` names: a libfabric endpoint, or a verbs lane.
fn raw_engine(a: &Common) -> Result<RawEngine, BoxErr> {
    if rdmalane_verbs::is_verbs(&a.provider) {
        let spec = rdmalane_verbs::DeviceSpec::parse(Some(&a.provider))?;
        return Ok(RawEngine::on(Box::new(rdmalane_verbs::VerbsTransport::open(&spec, false)?))?);
    }
    Ok(RawEngine::open_with(Some(&a.provider), a.node.as_deref(), a.memory == MemoryArg::Cuda)?)
}

impl RawConn {
    fn finish(mut eng: RawEngine, mut ctl: TcpStream) -> Result<RawConn, BoxErr> {
        let theirs = exchange(&mut ctl, &eng.name())?;
        let peer = eng.insert_peer(&theirs)?;
        exchange(&mut ctl, b"ready")?;
        Ok(RawConn { eng, peer, ctl, early: Vec::new() })
    }

    /// Listen on `a.listen` and say where (`LISTENING ADDR` on stdout).
    pub fn listen(a: &Common) -> Result<TcpListener, BoxErr> {
        let l = TcpListener::bind(&a.listen)?;
        println!("LISTENING {}", l.local_addr()?);
        std::io::stdout().flush()?;
        Ok(l)
    }

    /// The next client that completes the setup exchange, on an engine of its own: a client
    /// that sends nothing, or garbage, is dropped after the setup limit and the next one taken.
    pub fn accept(l: &TcpListener, a: &Common) -> Result<RawConn, BoxErr> {
        loop {
            let (ctl, from) = l.accept()?;
            let setup = move || {
                ctl.set_read_timeout(Some(SETUP_LIMIT))?;
                let c = Self::finish(raw_engine(a)?, ctl)?;
                c.ctl.set_read_timeout(None)?;
                Ok::<_, BoxErr>(c)
            };
            match setup() {
                Ok(c) => return Ok(c),
                Err(e) if a.once => return Err(e),
                Err(e) => {
                    eprintln!("rdmalane-perf: setup with {from} failed: {e}; waiting for the next client")
                }
            }
        }
    }

    pub fn client(a: &Common, addr: &str) -> Result<RawConn, BoxErr> {
        let eng = raw_engine(a)?;
        Self::finish(eng, TcpStream::connect(addr)?)
    }

    /// Send eight bytes over the setup socket.
    pub fn put(&mut self, v: u64) -> Result<(), BoxErr> {
        Ok(self.ctl.write_all(&v.to_le_bytes())?)
    }

    /// Receive eight bytes over the setup socket.
    pub fn get(&mut self) -> Result<u64, BoxErr> {
        let mut b = [0u8; 8];
        self.ctl.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Run `client` against the server: the given address, or a child process on loopback.
pub fn with_server<T>(
    mode: &str,
    a: &Common,
    client: impl FnOnce(&str) -> Result<T, BoxErr>,
) -> Result<(T, Option<f64>), BoxErr> {
    match &a.connect {
        Some(addr) => Ok((client(addr)?, None)),
        None => {
            let (child, addr) = ServerChild::spawn(mode, a)?;
            let v = client(&addr)?;
            let cpu = child.finish()?;
            Ok((v, Some(cpu)))
        }
    }
}
