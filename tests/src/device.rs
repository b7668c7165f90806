//! Device buffers for the device-memory tests: one trait over the emulated device (a host
//! stand-in on the staging path, everywhere), CUDA memory (the `cuda` feature, on a GPU) and
//! plain registered memory, so the same checks run on each.
use rdmalane::{IoBufMut, RegisteredBuf, Runtime};

/// A buffer the tests fill and read back whatever memory it is.
pub trait TestBuf: IoBufMut + Sized {
    /// What it is, for messages.
    const KIND: &'static str;
    /// `len` zeroed bytes registered with `rt`.
    fn make(rt: &Runtime, len: usize) -> Self;
    /// Write `src` at `at`.
    fn put(&mut self, at: usize, src: &[u8]);
    /// Its bytes.
    fn get(&self) -> Vec<u8>;
}

impl TestBuf for RegisteredBuf {
    const KIND: &'static str = "host";
    fn make(rt: &Runtime, len: usize) -> Self {
        rt.alloc(len).expect("alloc")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self[at..at + src.len()].copy_from_slice(src);
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec()
    }
}

impl TestBuf for rdmalane::buf::EmulatedDeviceBuf {
    const KIND: &'static str = "emulated device";
    fn make(rt: &Runtime, len: usize) -> Self {
        rdmalane::buf::EmulatedDeviceBuf::alloc(rt, len).expect("emulated device buffer")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self.copy_from_host(at, src).expect("fill");
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec()
    }
}

#[cfg(feature = "cuda")]
impl TestBuf for rdmalane::CudaBuf {
    const KIND: &'static str = "CUDA";
    fn make(rt: &Runtime, len: usize) -> Self {
        rt.alloc_cuda(0, len).expect("CUDA buffer")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self.copy_from_host(at, src).expect("fill");
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec().expect("copy back")
    }
}

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdmalane::{Access, Endpoint, Pieces, RemoteBuf};

use crate::pattern;

/// Sizes across the staging chunk (2 MiB): one small op, one of a few pages, one of 3 chunks.
pub const SIZES: [usize; 3] = [16, 3 * 4096 + 5, (5 << 20) + 123];
/// The target's region: the largest size.
pub const REGION: usize = (5 << 20) + 123;
/// Batch pages: 40 of 32 KiB from a 64-page source, shuffled on both sides.
const PAGE: usize = 32 << 10;
const SOURCE_PAGES: usize = 64;
const BATCH_TAG: u64 = 0x900;

/// The batch both sides compute alike.
fn batch_pieces() -> Pieces {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut l: Vec<usize> = (0..SOURCE_PAGES).collect();
    let mut r: Vec<usize> = (0..REGION / PAGE).collect();
    l.shuffle(&mut rng);
    r.shuffle(&mut rng);
    Pieces::pages(&l[..40], &r[..40], PAGE).expect("pages")
}

/// A short message to the other side (`ok`, or what went wrong).
async fn say(ep: &Endpoint, what: &str) {
    let rt = ep.runtime();
    let mut m = rt.alloc(what.len().max(1)).expect("alloc");
    m[..what.len()].copy_from_slice(what.as_bytes());
    ep.send(m).await.0.expect("send a word");
}

/// The other side's next word; panics with it where it is not `ok`.
async fn hear(ep: &Endpoint, what: &str) {
    let rt = ep.runtime();
    heard(tokio::time::timeout(Duration::from_secs(60), ep.recv(rt.alloc(4096).expect("alloc"))).await, what);
}

/// Check a received word (from `hear`, or a receive posted ahead).
fn heard(got: Result<rdmalane::BufResult<usize, RegisteredBuf>, tokio::time::error::Elapsed>, what: &str) {
    let (n, b) = got.unwrap_or_else(|_| panic!("{what}: no word from the other side in 60 s"));
    let n = n.unwrap_or_else(|e| panic!("{what}: the other side is gone: {e}"));
    let word = String::from_utf8_lossy(&b[..n]).into_owned();
    assert_eq!(word, "ok", "{what}: the other side says");
}

/// The target's side of the device-memory suite, with its memory of kind `T`: exposes a region,
/// and after each of the initiator's writes checks it only through the documented sync (the
/// write's immediate event, then `settle`), publishes it for the initiator's read, and says so.
pub async fn target<T: TestBuf>(ep: &Endpoint) {
    let rt = ep.runtime().clone();
    let exposed = rt.expose(T::make(&rt, REGION), Access::READ_WRITE).expect("expose");
    ep.send_descriptor(&exposed.descriptor()).await.expect("send descriptor");
    let check = |ok: bool, what: String| if ok { "ok".to_string() } else { what };
    for (k, &n) in SIZES.iter().enumerate() {
        let tag = 0x100 + k as u64;
        let ev = tokio::time::timeout(Duration::from_secs(60), rt.next_imm()).await.expect("imm event");
        let mut word =
            if ev.imm == tag { "ok".to_string() } else { format!("event {:#x}, not {tag:#x}", ev.imm) };
        if word == "ok" {
            exposed.settle(..n).expect("settle");
            word = check(
                exposed.get_ref().get()[..n] == pattern(n, k as u64 + 1)[..],
                format!("{n} bytes differ at the {} target", T::KIND),
            );
            exposed.publish(..n).expect("publish");
        }
        say(ep, &word).await;
    }
    let pieces = batch_pieces();
    tokio::time::timeout(Duration::from_secs(60), rt.wait_imm(BATCH_TAG, pieces.len()))
        .await
        .expect("every piece's event");
    exposed.settle(..).expect("settle");
    let got = exposed.get_ref().get();
    let want = pattern(SOURCE_PAGES * PAGE, 77);
    let bad = pieces.iter().position(|pc| {
        got[pc.remote as usize..pc.remote as usize + pc.len] != want[pc.local..pc.local + pc.len]
    });
    exposed.publish(..).expect("publish");
    say(ep, &check(bad.is_none(), format!("page {bad:?} differs at the {} target", T::KIND))).await;
    let (n, msg) = ep.recv(T::make(&rt, 4096)).await;
    let ok = n.as_ref().is_ok_and(|&n| n == 1000) && msg.get()[..1000] == pattern(1000, 5)[..];
    // Held until the initiator has heard it: a connection closed at once could fail the
    // initiator's receive of that last word. Its answer is received into a receive posted
    // before it can arrive: a message that finds none waits in the provider, and the initiator
    // closes right after sending it, which fails a receive posted after the close is seen.
    let last = ep.recv(rt.alloc(4096).expect("alloc")).start();
    say(ep, &check(ok, format!("message into {} memory: {n:?}", T::KIND))).await;
    heard(tokio::time::timeout(Duration::from_secs(60), last).await, "the initiator's last word");
}

/// The initiator's side, with its memory of kind `S` (see [`target`]): writes each size with
/// an immediate value, reads it back, a page batch both ways, then a message.
pub async fn initiator<S: TestBuf>(ep: &Endpoint, what: &str) {
    let remote: RemoteBuf = ep.recv_descriptor().await.expect("descriptor");
    initiator_to::<S>(ep, &remote, what).await
}

/// [`initiator`] with the target's descriptor in hand.
pub async fn initiator_to<S: TestBuf>(ep: &Endpoint, remote: &RemoteBuf, what: &str) {
    let rt = ep.runtime().clone();
    for (k, &n) in SIZES.iter().enumerate() {
        let want = pattern(n, k as u64 + 1);
        let mut src = S::make(&rt, n);
        src.put(0, &want);
        let at = remote.slice(0..n as u64).expect("in the region");
        ep.write_with_imm(src, &at, 0x100 + k as u64)
            .await
            .0
            .unwrap_or_else(|e| panic!("{what}: write of {n}: {e}"));
        hear(ep, &format!("{what}: write of {n}")).await;
        let (got, back) = ep.read_remote(S::make(&rt, n), &at).await;
        assert_eq!(got.unwrap_or_else(|e| panic!("{what}: read of {n}: {e}")), n);
        assert!(back.get() == want, "{what}: {n} bytes read back");
    }
    let pieces = batch_pieces();
    let want = pattern(SOURCE_PAGES * PAGE, 77);
    let mut src = S::make(&rt, SOURCE_PAGES * PAGE);
    src.put(0, &want);
    let (moved, _) = ep.write_batch_with_imm(src, remote, &pieces, BATCH_TAG).await;
    assert_eq!(moved.unwrap_or_else(|e| panic!("{what}: batch: {e}")) as u64, pieces.bytes());
    hear(ep, &format!("{what}: page batch")).await;
    let (moved, back) = ep.read_batch(S::make(&rt, SOURCE_PAGES * PAGE), remote, &pieces).await;
    assert_eq!(moved.unwrap_or_else(|e| panic!("{what}: read batch: {e}")) as u64, pieces.bytes());
    let back = back.get();
    let bad =
        pieces.iter().position(|pc| back[pc.local..pc.local + pc.len] != want[pc.local..pc.local + pc.len]);
    assert_eq!(bad, None, "{what}: a page read back differs");
    let want = pattern(1000, 5);
    let mut msg = S::make(&rt, 1000);
    msg.put(0, &want);
    ep.send(msg).await.0.unwrap_or_else(|e| panic!("{what}: send: {e}"));
    hear(ep, &format!("{what}: message")).await;
    say(ep, "ok").await;
}

/// Ops of random sizes on `S` to and from `remote`, each dropped at a random point (before its
/// first poll, after a few, mid-transfer); returns once the runtime has accounted for all.
pub async fn drop_storm<S: TestBuf>(ep: &Endpoint, remote: &RemoteBuf, what: &str) {
    let rt = ep.runtime().clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let max = remote.len() as usize;
    for i in 0..120 {
        let n = rng.gen_range(1..=max);
        let mut src = S::make(&rt, n);
        src.put(0, &pattern(n.min(64), i));
        let at = remote.slice(0..n as u64).expect("in the region");
        let mut op = if i % 3 == 0 { ep.read_remote(src, &at) } else { ep.write_remote(src, &at) };
        for _ in 0..rng.gen_range(0..4) {
            if futures::poll!(&mut op).is_ready() {
                break;
            }
            if rng.gen_bool(0.5) {
                tokio::time::sleep(Duration::from_micros(rng.gen_range(0..300))).await;
            }
        }
        drop(op);
    }
    let t = std::time::Instant::now();
    loop {
        let s = rt.stats();
        if s.submitted == s.completed + s.failed + s.withdrawn {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{what}: ops never accounted for: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
