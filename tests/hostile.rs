//! A server keeps serving whatever arrives on its port. A server process (`src/bin/server.rs`)
//! listens with a shared secret while a real client connects again and again and checks the
//! bytes it writes; meanwhile hostile connections arrive: empty, zeros, random bytes, a valid
//! prefix then garbage, an oversized length, the wrong version, the wrong secret, no secret, a
//! silent socket held open, a hello sent one byte per second, and 1,000 connections opened at
//! once; and, in a test of its own, more whole hellos than the server has handshake slots,
//! each followed by silence (a hello asks for nothing secret). Every real connect completes
//! within the bound (1 s; `RDMALANE_TEST_CONNECT_BOUND_MS` under emulation), every refusal is
//! counted by its reason, and the server's threads and memory return to their level after the
//! flood.
use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdmalane::{Error, RefusalReason, Runtime};
use rdmalane_conformance::{
    bounded, builder, cmd, encode_cmd, hash, pattern, providers, resident_bytes, spawn_listening,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SECRET: &str = "hostile-test secret";
/// The server's handshake limit: silent sockets are refused after it.
const HANDSHAKE_MS: u64 = 2000;
/// How far above its level the server's resident memory may be after the flood: three of the
/// real client's tcp connections (some 17 MiB each, which glibc keeps for the next once one
/// is gone; on a loaded host the server held 36 MiB over its level this way). A flood that
/// left 48 KiB behind per stranger would still show.
const SLACK_KIB: u64 = 48 << 10;
/// Connections of the flood.
const FLOOD: usize = 1000;

fn connect_bound() -> Duration {
    let ms =
        std::env::var("RDMALANE_TEST_CONNECT_BOUND_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    Duration::from_millis(ms)
}

/// The server process, killed when dropped; its refusals arrive on `refused`.
struct Server {
    child: Child,
    addr: String,
    refused: mpsc::Receiver<(String, u64)>,
    /// Refusals seen so far, by reason name.
    seen: HashMap<String, u64>,
}

impl Server {
    fn spawn(provider: &str) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_server"));
        cmd.args([provider, SECRET, &HANDSHAKE_MS.to_string()]);
        let (child, out, addr) = spawn_listening(cmd);
        let (tx, refused) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { return };
                let mut f = line.split_whitespace();
                if let (Some("REFUSED"), Some(reason), Some(n)) = (f.next(), f.next(), f.next()) {
                    let _ = tx.send((reason.to_string(), n.parse().expect("a count")));
                }
            }
        });
        Server { child, addr, refused, seen: HashMap::new() }
    }

    /// Wait until `n` more refusals have come, checking that the server's own count for each
    /// reason is the number of refusals of it reported; returns them by reason.
    fn refusals(&mut self, n: usize, within: Duration) -> HashMap<String, u64> {
        let deadline = Instant::now() + within;
        let mut got = HashMap::new();
        for i in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            let (reason, count) = self
                .refused
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("{i} of {n} refusals within {within:?}: {got:?}"));
            let seen = self.seen.entry(reason.clone()).or_default();
            *seen += 1;
            // The count printed is read after the refusal was counted, so it may already
            // include later ones, never fewer.
            assert!(count >= *seen, "{reason}: the server counts {count}, it reported {seen}");
            *got.entry(reason).or_default() += 1;
        }
        got
    }

    /// (threads, resident KiB, open descriptors) of the server process.
    fn usage(&self) -> (u64, u64, u64) {
        let pid = self.child.id().to_string();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("Threads: in /proc status");
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds").count() as u64;
        (threads, resident_bytes(&pid) >> 10, fds)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the real client saw.
#[derive(Default)]
struct Real {
    connects: AtomicU64,
    rounds: AtomicU64,
    /// The slowest connect, in microseconds.
    slowest_us: AtomicU64,
}

/// Connect, write and check bytes a few times, hang up; again until `stop`. Panics (failing
/// the test) if a connect takes longer than the bound or a byte is wrong.
async fn real_client(rt: Runtime, addr: String, stop: Arc<AtomicBool>, real: Arc<Real>) {
    let bound = connect_bound();
    let mut seed = 1u64;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let ep = match tokio::time::timeout(bound, rt.connect(addr.clone())).await {
            Ok(r) => r.unwrap_or_else(|e| panic!("the real client's connect failed: {e}")),
            Err(_) => panic!("the real client's connect took over {bound:?}"),
        };
        let took = start.elapsed();
        real.slowest_us.fetch_max(took.as_micros() as u64, Ordering::Relaxed);
        real.connects.fetch_add(1, Ordering::Relaxed);
        let remote = ep.recv_descriptor().await.expect("descriptor");
        for _ in 0..3 {
            seed += 1;
            let len = 4096 + (seed as usize * 7919) % (60 << 10);
            let want = pattern(len, seed);
            let mut buf = rt.alloc(len).expect("alloc");
            buf.copy_from_slice(&want);
            let (r, _) = ep.write_remote(buf, &remote.slice(..len as u64).expect("slice")).await;
            r.expect("write");
            let mut m = rt.alloc(24).expect("alloc");
            m.copy_from_slice(&encode_cmd(cmd::HASH, len as u64, 0));
            let reply = ep.recv(rt.alloc(8).expect("alloc")).start();
            ep.send(m).await.0.expect("send");
            let (n, got) = reply.await;
            assert_eq!(n.expect("reply"), 8);
            assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), hash(&want), "bytes at the server");
            real.rounds.fetch_add(1, Ordering::Relaxed);
        }
        let mut m = rt.alloc(24).expect("alloc");
        m.copy_from_slice(&encode_cmd(cmd::EXIT, 0, 0));
        ep.send(m).await.0.expect("send exit");
    }
}

/// A server on provider `p`, the provider's full name, and the real client connecting to it
/// again and again until `stop` (on the tokio runtime this is called on).
struct Scene {
    srv: Server,
    provider: String,
    addr: String,
    stop: Arc<AtomicBool>,
    real: Arc<Real>,
    client: tokio::task::JoinHandle<()>,
}

impl Scene {
    fn start(p: &str) -> Scene {
        let srv = Server::spawn(p);
        let provider = builder(p).build().expect("runtime").provider().to_string();
        let real_rt = builder(p).secret(SECRET).build().expect("runtime");
        let stop = Arc::new(AtomicBool::new(false));
        let real = Arc::new(Real::default());
        let client = tokio::spawn(real_client(real_rt, srv.addr.clone(), stop.clone(), real.clone()));
        let addr = srv.addr.clone();
        Scene { srv, provider, addr, stop, real, client }
    }
}

/// A hello for `provider` up to (and without) its lane addresses.
fn hello_head(provider: &str, version: u16) -> Vec<u8> {
    let mut v = b"RDLN".to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&0xbad_c0ffeeu64.to_le_bytes());
    v.extend_from_slice(&[9u8; 32]);
    v.push(1); // requires a secret
    v.push(1); // one rail
    v.extend_from_slice(&(provider.len() as u16).to_le_bytes());
    v.extend_from_slice(provider.as_bytes());
    v
}

async fn send_and_close(addr: &str, bytes: Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(&bytes).await;
}

#[test]
fn no_client_can_stall_a_server_and_every_refusal_is_counted() {
    // The flood holds 1,000 sockets in this process.
    let _ = rlimit::increase_nofile_limit(8192);
    for p in providers() {
        bounded(240, async {
            let Scene { mut srv, provider, addr, stop, real, client } = Scene::start(p);
            let wait_rounds = |n: u64| {
                let real = real.clone();
                async move {
                    let target = real.rounds.load(Ordering::Relaxed) + n;
                    while real.rounds.load(Ordering::Relaxed) < target {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            };
            wait_rounds(3).await;
            eprintln!(
                "{p}: start: {:?} after {} connects",
                srv.usage(),
                real.connects.load(Ordering::Relaxed)
            );

            // 1. Strangers that give themselves away at once, and peers that are refused.
            let mut random = pattern(256, 77);
            random[0] = b'X';
            let mut prefix_garbage = hello_head(&provider, rdmalane::PROTOCOL_VERSION)[..46].to_vec();
            prefix_garbage.extend_from_slice(&[0xee; 64]); // flags 0xee
            let mut oversized = hello_head(&provider, rdmalane::PROTOCOL_VERSION)[..48].to_vec();
            oversized.extend_from_slice(&u16::MAX.to_le_bytes()); // a provider of 64 KiB
            oversized.extend_from_slice(&[b'x'; 512]);
            let wrong = builder(p).secret("not the secret").build().expect("runtime");
            let none = builder(p).build().expect("runtime");
            let (.., w, n) = tokio::join!(
                send_and_close(&addr, Vec::new()),
                send_and_close(&addr, vec![0; 64]),
                send_and_close(&addr, random),
                send_and_close(&addr, prefix_garbage),
                send_and_close(&addr, oversized),
                send_and_close(&addr, hello_head(&provider, rdmalane::PROTOCOL_VERSION - 1)),
                wrong.connect(addr.clone()),
                none.connect(addr.clone()),
            );
            assert!(matches!(w, Err(Error::Handshake { why: RefusalReason::WrongSecret, .. })), "{w:?}");
            assert!(matches!(n, Err(Error::Handshake { .. })), "{n:?}");
            let got = srv.refusals(8, Duration::from_secs(30));
            let expect = [
                ("closed", 1),
                ("bad_hello", 4),
                ("wrong_version", 1),
                ("wrong_secret", 1),
                ("missing_secret", 1),
            ];
            assert_eq!(got, expect.iter().map(|&(r, n)| (r.to_string(), n)).collect(), "phase 1");
            wait_rounds(3).await;
            let phase1 = srv.usage();
            eprintln!("{p}: phase 1: {phase1:?} after {} connects", real.connects.load(Ordering::Relaxed));

            // 2. A silent socket and a hello one byte per second: the handshake limit ends both.
            let silent = TcpStream::connect(&addr).await.expect("connect");
            let slow = tokio::spawn({
                let addr = addr.clone();
                let hello = hello_head(&provider, rdmalane::PROTOCOL_VERSION);
                async move {
                    let mut s = TcpStream::connect(&addr).await.expect("connect");
                    for b in hello {
                        if s.write_all(&[b]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            });
            wait_rounds(3).await;
            let got = srv.refusals(2, Duration::from_secs(30));
            assert_eq!(got, [("timeout".to_string(), 2)].into_iter().collect(), "phase 2");
            slow.abort();
            drop(silent);
            wait_rounds(3).await;

            // 3. A thousand connections at once, held open: at the cap the oldest stranger makes
            // room for the newcomer, so the real client still gets in.
            let before = srv.usage();
            eprintln!("{p}: phase 2: {before:?} after {} connects", real.connects.load(Ordering::Relaxed));
            // The memory level to come back to: the highest seen before the flood. A tcp peer's
            // connection holds some 17 MiB of the server's while it lasts, and glibc keeps what
            // a gone one freed for the next: over 300 of the real client's reconnects alone the
            // server's resident memory moved between 89 and 123 MiB with no upward drift, so a
            // level read between two reconnects can sit a connection or two below the one after
            // the flood (88.7 MiB before, 123.1 after, in a run on a loaded host).
            let level = phase1.1.max(before.1);
            let connects = real.connects.load(Ordering::Relaxed);
            let flood: Vec<TcpStream> =
                futures::future::join_all((0..FLOOD).map(|_| TcpStream::connect(&addr)))
                    .await
                    .into_iter()
                    .map(|s| s.expect("flood connect"))
                    .collect();
            let start = Instant::now();
            while real.connects.load(Ordering::Relaxed) < connects + 3 {
                assert!(start.elapsed() < 4 * connect_bound(), "the real client stalled behind the flood");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let during = srv.usage();
            let got = srv.refusals(FLOOD, Duration::from_secs(60));
            drop(flood);
            let over_cap = got.get("over_cap").copied().unwrap_or(0);
            let timeout = got.get("timeout").copied().unwrap_or(0);
            assert_eq!(over_cap + timeout, FLOOD as u64, "phase 3: {got:?}");
            // Natively the flood is taken in well under the handshake timeout, so all but the
            // last 256 strangers are displaced at the cap. Where the host is slow enough that the
            // connect bound is raised (the Soft-RoCE VM's emulated CPUs take seconds to accept a
            // thousand connections), the first strangers' timeouts run out before the cap
            // fills (284 of them once, 516 another time): the cap must still have displaced a
            // good share.
            let least = if connect_bound() > Duration::from_secs(1) { FLOOD / 4 } else { FLOOD - 256 };
            assert!(over_cap >= least as u64, "phase 3: {got:?}");
            wait_rounds(3).await;
            stop.store(true, Ordering::Relaxed);
            client.await.expect("the real client");
            // Back to its level: no more of the server's threads and descriptors than before
            // (less the real client's last connection), its memory within SLACK_KIB of its
            // level. Descriptors are the precise check (a handshake left behind holds its
            // socket); resident memory moves with the real client's reconnects meanwhile
            // (tcp;ofi_rxm's per-endpoint pools, see `level`), while the flood's handshakes are
            // a few KiB each. Settling may take past the 10 s that tokio keeps an idle blocking
            // thread (handshakes open lanes on them).
            let back =
                |now: (u64, u64, u64)| now.0 <= before.0 && now.1 <= level + SLACK_KIB && now.2 <= before.2;
            let settle = Instant::now();
            let after = loop {
                let now = srv.usage();
                if back(now) || settle.elapsed() > Duration::from_secs(15) {
                    break now;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            eprintln!(
                "{p}: {} connects, slowest {} us; {} rounds checked; server threads/RSS KiB/fds before {before:?}, during {during:?}, after {after:?}",
                real.connects.load(Ordering::Relaxed),
                real.slowest_us.load(Ordering::Relaxed),
                real.rounds.load(Ordering::Relaxed)
            );
            // Fewer is fine: handshakes open lanes on tokio's blocking threads, which linger for
            // 10 s after their last use (the real client's reconnects kept one or two alive
            // before; a run on a loaded host read 6 threads before and 4 after).
            assert!(after.0 <= before.0, "server threads {} after the flood, {} before", after.0, before.0);
            assert!(
                after.2 <= before.2,
                "server descriptors {} after the flood, {} before",
                after.2,
                before.2
            );
            assert!(
                after.1 <= level + SLACK_KIB,
                "server RSS {} KiB after the flood, its level {} before",
                after.1,
                level
            );
            assert!(real.slowest_us.load(Ordering::Relaxed) < connect_bound().as_micros() as u64);
        });
    }
}

/// A whole hello for `provider` that asks for the shared secret, with one lane address.
fn whole_hello(provider: &str) -> Vec<u8> {
    let mut v = hello_head(provider, rdmalane::PROTOCOL_VERSION);
    v.push(1);
    v.extend_from_slice(&16u16.to_le_bytes());
    v.extend_from_slice(&[7u8; 16]);
    v
}

/// Hellos need nothing secret. Connections that each send a whole one and then fall silent,
/// more of them than the server has handshake slots, must not lock a real client out: at the
/// cap a newcomer takes the place of the oldest of them once no stranger is left to evict.
#[test]
fn hellos_without_their_proofs_do_not_hold_the_slots() {
    const HELLOS: usize = 320;
    let _ = rlimit::increase_nofile_limit(8192);
    for p in providers() {
        bounded(240, async {
            let Scene { mut srv, provider, addr, stop, real, client } = Scene::start(p);
            while real.rounds.load(Ordering::Relaxed) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let connects = real.connects.load(Ordering::Relaxed);
            let hello = whole_hello(&provider);
            let held: Vec<TcpStream> = futures::future::join_all((0..HELLOS).map(|_| {
                let (addr, hello) = (addr.clone(), hello.clone());
                async move {
                    let mut s = TcpStream::connect(&addr).await.expect("connect");
                    s.write_all(&hello).await.expect("a hello");
                    s
                }
            }))
            .await;
            let start = Instant::now();
            while real.connects.load(Ordering::Relaxed) < connects + 3 {
                assert!(!client.is_finished(), "{p}: the real client failed behind the hellos");
                assert!(
                    start.elapsed() < 4 * connect_bound(),
                    "{p}: the real client stalled behind the hellos"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Every silent hello ends refused: evicted at the cap, or at the handshake limit.
            let got = srv.refusals(HELLOS, Duration::from_secs(60));
            drop(held);
            let over_cap = got.get("over_cap").copied().unwrap_or(0);
            let timeout = got.get("timeout").copied().unwrap_or(0);
            assert_eq!(over_cap + timeout, HELLOS as u64, "{p}: {got:?}");
            stop.store(true, Ordering::Relaxed);
            client.await.expect("the real client");
            eprintln!(
                "{p}: {} connects, slowest {} us; the hellos: {got:?}",
                real.connects.load(Ordering::Relaxed),
                real.slowest_us.load(Ordering::Relaxed)
            );
            assert!(real.slowest_us.load(Ordering::Relaxed) < connect_bound().as_micros() as u64);
        });
    }
}

/// A stranger's hello, with no secret asked for, whose one lane address is `name`.
fn hello_naming(provider: &str, name: &[u8]) -> Vec<u8> {
    let mut v = hello_head(provider, rdmalane::PROTOCOL_VERSION);
    v[46] = 0; // no secret
    v.push(1);
    v.extend_from_slice(&(name.len() as u16).to_le_bytes());
    v.extend_from_slice(name);
    v
}

/// Where a runtime asks no secret, a stranger's lanes are opened on its hello alone, and its
/// lane addresses go to the provider: an empty one, a short one, or one of another form must
/// be refused, not read past. The server lives on and serves a real client.
#[test]
fn lane_addresses_that_are_not_whole_addresses_are_refused() {
    for p in providers() {
        bounded(60, async {
            let srv = builder(p).build().expect("runtime");
            let listener = srv.listen("127.0.0.1:0").await.expect("listen");
            let addr = listener.local_addr().expect("addr").to_string();
            let provider = srv.provider().to_string();
            let shorts: [&[u8]; 4] = [b"", b"\x02", b"\x02\x00\x1f\x90", b"no terminating NUL at all"];
            for name in shorts {
                let mut s = TcpStream::connect(&addr).await.expect("connect");
                s.write_all(&hello_naming(&provider, name)).await.expect("hello");
                // Refused: the server closes the socket (after its own hello, if it got that far).
                let mut sink = Vec::new();
                let read = tokio::io::AsyncReadExt::read_to_end(&mut s, &mut sink);
                let r = tokio::time::timeout(Duration::from_secs(10), read).await;
                assert!(r.is_ok(), "{p}: a lane address of {name:?} was not refused within 10 s");
            }
            let client = builder(p).build().expect("runtime");
            let (c, a) = tokio::join!(client.connect(addr.clone()), listener.accept());
            let (c, a) = (c.expect("a real client connects"), a.expect("accept"));
            let reply = a.recv(srv.alloc(8).expect("alloc")).start();
            let mut m = client.alloc(8).expect("alloc");
            m.copy_from_slice(b"still up");
            c.send(m).await.0.expect("send");
            let (n, got) = reply.await;
            assert_eq!(n.expect("recv"), 8);
            assert_eq!(&got[..8], b"still up");
        });
    }
}
