//! Helpers for the conformance tests: runtimes on each provider, connected pairs, a child peer
//! process, a real etcd, and a time bound on every test.
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdmalane::{Endpoint, RemoteBuf, Runtime};

pub mod device;
pub mod etcd;

/// The providers every conformance test runs on: `tcp` and `shm`, or the comma-separated list in
/// `RDMALANE_TEST_PROVIDERS` (`verbs` inside the Soft-RoCE VM: scripts/softroce-vm.sh).
pub fn providers() -> Vec<&'static str> {
    match std::env::var("RDMALANE_TEST_PROVIDERS") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|p| &*Box::leak(p.trim().to_string().into_boxed_str())).collect()
        }
        _ => vec!["tcp", "shm"],
    }
}

/// The providers that span several rails in one runtime (libfabric's; verbs opens one device).
pub fn rail_providers() -> Vec<&'static str> {
    providers().into_iter().filter(|p| !rdmalane_verbs::is_verbs(p)).collect()
}

/// The providers that check keys, ranges and access at the target: all of them (shm does once
/// the backend asks it for ordered one-sided ops, which keeps it off its unchecked fast path).
pub fn enforcing_providers() -> Vec<&'static str> {
    providers()
}

/// The provider for tests of one stack's behaviour (faults, handshake, soak): the first of
/// [`providers`].
pub fn main_provider() -> &'static str {
    providers()[0]
}

/// A builder for `provider` with both backends, as the tests' runtimes are made.
pub fn builder(provider: &str) -> rdmalane::Builder {
    Runtime::builder()
        .backend(rdmalane_verbs::Verbs)
        .backend(rdmalane_efa::Libfabric)
        .provider(provider)
        .idle_spin(Duration::from_micros(50))
}

/// A runtime on `provider` with its own reactor thread.
pub fn runtime(provider: &str) -> Runtime {
    builder(provider).build().unwrap_or_else(|e| panic!("runtime on {provider}: {e}"))
}

/// A runtime on `provider` spanning `rails` rails (tcp: 127.0.0.1, 127.0.0.2, ...).
pub fn runtime_with_rails(provider: &str, rails: usize, stripe: rdmalane::sched::Stripe) -> Runtime {
    let sched = rdmalane::sched::SchedConfig { stripe, ..Default::default() };
    builder(provider)
        .rails(rails)
        .scheduler(sched)
        .build()
        .unwrap_or_else(|e| panic!("runtime on {provider} with {rails} rails: {e}"))
}

/// `len` bytes of `rt`'s registered memory holding [`pattern`]`(len, seed)`, with the pattern
/// to check them against.
pub fn filled(rt: &Runtime, len: usize, seed: u64) -> (Vec<u8>, rdmalane::RegisteredBuf) {
    let want = pattern(len, seed);
    let mut buf = rt.alloc(len).unwrap_or_else(|e| panic!("alloc {len}: {e}"));
    buf.copy_from_slice(&want);
    (want, buf)
}

/// Pages `0..n` in two independent shuffles from `seed`: where each page comes from and goes to.
pub fn shuffled_pages(n: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut l: Vec<usize> = (0..n).collect();
    let mut r = l.clone();
    l.shuffle(&mut rng);
    r.shuffle(&mut rng);
    (l, r)
}

/// Write `src` (holding `want`) over all of `remote` (`target` is the memory it names), check
/// the target, read it back into fresh memory of `rt` and check that too; `what` names the case
/// in failures. Returns the source buffer.
pub async fn write_and_read_back(
    rt: &Runtime,
    ep: &Endpoint,
    src: rdmalane::RegisteredBuf,
    remote: &RemoteBuf,
    target: &[u8],
    want: &[u8],
    what: &str,
) -> rdmalane::RegisteredBuf {
    let (res, src) = ep.write_remote(src, remote).await;
    res.unwrap_or_else(|e| panic!("{what}: write: {e}"));
    assert!(target == want, "{what}: whole-region write");
    let (n, back) = ep.read_remote(rt.alloc(want.len()).unwrap(), remote).await;
    assert_eq!(n.unwrap_or_else(|e| panic!("{what}: read: {e}")), want.len());
    assert!(back[..] == want[..], "{what}: read back");
    src
}

/// Run `f` on a fresh tokio runtime; a test that passes `secs` fails (a hang is a failure).
pub fn bounded<F: Future>(secs: u64, f: F) -> F::Output {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    rt.block_on(async {
        match tokio::time::timeout(Duration::from_secs(secs), f).await {
            Ok(v) => v,
            Err(_) => panic!("test did not finish within {secs} s"),
        }
    })
}

/// Abort the whole test process if the returned guard is not dropped within `secs`: for tests
/// that cannot run inside [`bounded`].
pub fn watchdog(secs: u64) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs)) {
            eprintln!("test did not finish within {secs} s: aborting");
            std::process::abort();
        }
    });
    Watchdog(tx)
}

/// Dropping it stops the watchdog.
pub struct Watchdog(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

/// Connect `a` to `b`: (a's endpoint to b, b's endpoint to a).
pub async fn pair(a: &Runtime, b: &Runtime) -> (Endpoint, Endpoint) {
    let l = b.listen("127.0.0.1:0").await.expect("listen");
    let addr = l.local_addr().expect("addr");
    let (x, y) = tokio::join!(a.connect(addr), l.accept());
    (x.expect("connect"), y.expect("accept"))
}

/// Hand a descriptor from `from` to `to` over the data plane.
pub async fn share(from: &Endpoint, to: &Endpoint, desc: RemoteBuf) -> RemoteBuf {
    let (sent, got) = tokio::join!(from.send_descriptor(&desc), to.recv_descriptor());
    sent.expect("send descriptor");
    got.expect("recv descriptor")
}

/// `from` exposes `len` fresh bytes with `access` and hands the descriptor to `to`: the exposed
/// buffer (kept by the caller) and the descriptor as `to` received it.
pub async fn expose_to(
    from: &Endpoint,
    to: &Endpoint,
    len: usize,
    access: rdmalane::Access,
) -> (rdmalane::ExposedBuf<rdmalane::RegisteredBuf>, RemoteBuf) {
    let rt = from.runtime();
    let exposed = rt.expose(rt.alloc(len).expect("alloc"), access).expect("expose");
    let remote = share(from, to, exposed.descriptor()).await;
    (exposed, remote)
}

/// Runtimes of two shapes (rail groups, an express rail, one reactor) meet both ways, each
/// connecting in turn: a write and a read of each of `lens` bytes (at most the largest) and a
/// 16 B message move byte-exact.
pub async fn meet_both_ways(a: &Runtime, b: &Runtime, lens: &[usize], p: &str) {
    let region = lens.iter().copied().max().unwrap_or(16);
    for (x, y) in [(a, b), (b, a)] {
        let (xy, yx) = pair(x, y).await;
        let (target, remote) = expose_to(&yx, &xy, region, rdmalane::Access::READ_WRITE).await;
        for &len in lens {
            let (want, src) = filled(x, len, len as u64);
            let at = remote.slice(0..len as u64).expect("within the region");
            xy.write_remote(src, &at).await.0.unwrap_or_else(|e| panic!("{p}: write {len}: {e}"));
            assert!(target.as_slice()[..len] == want[..], "{p}: {len} bytes across shapes");
            let (n, back) = xy.read_remote(x.alloc(len).expect("alloc"), &at).await;
            assert_eq!(n.unwrap_or_else(|e| panic!("{p}: read {len}: {e}")), len);
            assert!(back[..] == want[..], "{p}: read of {len} across shapes");
        }
        let recv = yx.recv(y.alloc(16).expect("alloc")).start();
        xy.send(x.alloc(16).expect("alloc")).await.0.unwrap();
        assert_eq!(recv.await.0.unwrap(), 16, "{p}: message across shapes");
    }
}

/// Write `len` bytes from `rt` to `remote` over `ep`, poll the op once (it goes to the
/// reactor, split or not), let `after` pass, and drop it mid-flight; then wait, 10 s at most,
/// for the runtime to let go of the buffer (kept while anything of the op is in flight, never
/// leaked). True if it still held the buffer when the op was dropped.
pub async fn drop_write_mid_flight(
    rt: &Runtime,
    ep: &Endpoint,
    remote: &RemoteBuf,
    len: usize,
    after: Duration,
    what: &str,
) -> bool {
    // Shared, so we see when the runtime lets go of it.
    let src = std::sync::Arc::new(filled(rt, len, len as u64).1);
    let weak = std::sync::Arc::downgrade(&src);
    let mut op = ep.write_remote(src, remote);
    let _ = futures::poll!(&mut op);
    tokio::time::sleep(after).await;
    drop(op);
    let held_on = weak.upgrade().is_some();
    let t = std::time::Instant::now();
    while weak.upgrade().is_some() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}: buffer never let go; {:?}", rt.stats());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    held_on
}

/// Resident memory of a process (`"self"` or a pid), in bytes, from `/proc/PID/statm`.
pub fn resident_bytes(pid: &str) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4096
}

/// A byte pattern that differs per size and seed, so misplaced bytes show.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// FNV-1a, for comparing large buffers across processes.
pub fn hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x1000_0000_01b3))
}

/// The peer process (`src/bin/peer.rs`), killed when dropped.
pub struct PeerProcess {
    /// The child.
    pub child: Child,
    /// Its control-plane address.
    pub addr: String,
}

impl PeerProcess {
    /// Start the peer on `provider` and wait until it listens.
    pub fn spawn(bin: &str, provider: &str) -> PeerProcess {
        let mut cmd = Command::new(bin);
        cmd.arg(provider);
        let (child, _, addr) = spawn_listening(cmd);
        PeerProcess { child, addr }
    }
}

/// Start `cmd` with its stdout piped and wait for its first line, `LISTENING ADDR`: the child,
/// the rest of its stdout, and the address.
pub fn spawn_listening(mut cmd: Command) -> (Child, BufReader<std::process::ChildStdout>, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("child output");
    let addr =
        line.trim().strip_prefix("LISTENING ").unwrap_or_else(|| panic!("{cmd:?} said {line:?}")).to_string();
    (child, out, addr)
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Commands the peer process understands (first 8 bytes of a 24-byte message).
pub mod cmd {
    /// Reply with the hash of the first `a` bytes of the exposed region.
    pub const HASH: u64 = 1;
    /// Fill the first `a` bytes with `pattern(a, b)`, then reply.
    pub const FILL: u64 = 2;
    /// Receive a message of up to `a` bytes and send it back.
    pub const ECHO: u64 = 3;
    /// Exit cleanly.
    pub const EXIT: u64 = 4;
    /// The size of the exposed region.
    pub const REGION: usize = 64 << 20;
}

/// Encode a peer command.
pub fn encode_cmd(c: u64, a: u64, b: u64) -> [u8; 24] {
    let mut m = [0u8; 24];
    m[0..8].copy_from_slice(&c.to_le_bytes());
    m[8..16].copy_from_slice(&a.to_le_bytes());
    m[16..24].copy_from_slice(&b.to_le_bytes());
    m
}

/// Decode a peer command.
pub fn decode_cmd(m: &[u8]) -> (u64, u64, u64) {
    let w = |i: usize| u64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    (w(0), w(1), w(2))
}
