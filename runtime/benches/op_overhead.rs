//! The runtime's own cost per op, with the transport taken out: a null transport completes
//! every request at once (sends inline, receives and writes on the next poll). What remains is
//! the op cell, the reactor, the scheduler and the counters. A second null transport holds each
//! completion back for a few polls, as a peer's answer keeps an awaited op waiting: there the
//! thread driver's task spins on the lent reactor until it comes, the path a ping-pong takes.
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rdmalane::backend::{
    Access, Backend, Caps, Completion, LaneId, MemoryRegion, Notify, PeerAddr, PostError, Posted, Transport,
    TransportConfig, WorkRequest, WrKind,
};
use rdmalane::{Driver, Op, RegisteredBuf, RemoteBuf, Runtime, TransportError};

struct Null {
    caps: Caps,
    lanes: usize,
    done: Vec<Completion>,
    /// Polls that find nothing before the completions posted so far show.
    late: u32,
    /// Polls left before they do.
    wait: u32,
}

struct Quiet;
impl Notify for Quiet {
    fn notify(&self) {}
}

impl Transport for Null {
    fn caps(&self) -> &Caps {
        &self.caps
    }
    fn open_lane(&mut self, _rail: usize) -> Result<(LaneId, Vec<u8>), TransportError> {
        self.lanes += 1;
        Ok((rdmalane::backend::LaneId(self.lanes), vec![self.lanes as u8]))
    }
    fn connect_lane(&mut self, _: LaneId, _: &[u8]) -> Result<PeerAddr, TransportError> {
        Ok(0)
    }
    fn close_lane(&mut self, _: LaneId) {}
    unsafe fn register(&mut self, ptr: *mut u8, _: usize, _: Access) -> Result<MemoryRegion, TransportError> {
        Ok(MemoryRegion { id: 0, desc: 0, key: 1, remote_base: ptr as u64, rail_keys: Vec::new() })
    }
    fn deregister(&mut self, _: u64) -> Result<(), TransportError> {
        Ok(())
    }
    unsafe fn post(&mut self, wr: &WorkRequest<'_>) -> Result<Posted, PostError> {
        let len = wr.local.iter().map(|s| s.len).sum();
        match wr.kind {
            WrKind::Send { .. } => Ok(Posted::Completed),
            _ => {
                self.done.push(Completion::Op { id: wr.id, len, imm: None, status: Ok(()) });
                self.wait = self.late;
                Ok(Posted::Queued)
            }
        }
    }
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.wait > 0 {
            self.wait -= 1;
            return 0;
        }
        let n = self.done.len().min(max);
        out.extend(self.done.drain(..n));
        n
    }
    fn wait(&mut self, t: Duration) {
        std::thread::sleep(t);
    }
    fn notifier(&self) -> Arc<dyn Notify> {
        Arc::new(Quiet)
    }
}

/// Null transports whose completions show after `.0` empty polls.
struct NullBackend(u32);
impl Backend for NullBackend {
    fn open(&self, _: &TransportConfig) -> rdmalane::Result<Box<dyn Transport>> {
        let caps = Caps {
            provider: "null".into(),
            max_msg_size: 1 << 30,
            inject_size: 64,
            iov_limit: 4,
            cq_data_size: 8,
            tx_depth: 1 << 16,
            rx_depth: 1 << 16,
            wait_fd: false,
            silent_refusals: false,
            rails: 1,
            rail_numa: vec![None],
            device: rdmalane::backend::DeviceRegistration::None,
        };
        Ok(Box::new(Null { caps, lanes: 0, done: Vec::new(), late: self.0, wait: 0 }))
    }
}

/// Two runtimes over the null transport, connected, with 4 KiB of the second's memory exposed
/// to the first and a 16 B buffer of the first's.
struct Pair {
    a: Runtime,
    ab: rdmalane::Endpoint,
    remote: RemoteBuf,
    buf: Option<RegisteredBuf>,
    // Kept alive for the endpoint and the exposed memory; dropped with the pair.
    _rest: (Runtime, rdmalane::Endpoint, rdmalane::ExposedBuf<RegisteredBuf>),
}

impl Pair {
    fn open(open: impl Fn() -> Runtime) -> Pair {
        let (a, b) = (open(), open());
        let tokio = tokio::runtime::Runtime::new().unwrap();
        let (ab, ba) = tokio.block_on(async {
            let l = b.listen("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (x, y) = tokio::join!(a.connect(addr), l.accept());
            (x.unwrap(), y.unwrap())
        });
        let exposed = b.expose(b.alloc(4096).unwrap(), Access::READ_WRITE).unwrap();
        let remote = exposed.descriptor();
        let buf = Some(a.alloc(16).unwrap());
        Pair { a, ab, remote, buf, _rest: (b, ba, exposed) }
    }

    /// Send, receive and write loops awaited one after another inside one `block_on`, as a
    /// run-to-completion loop awaits them: the op alone, without the cost of entering and
    /// leaving `block_on`. `how` ends each benchmark's name.
    fn loops(&mut self, c: &mut Criterion, how: &str) {
        type MakeOp = fn(&rdmalane::Endpoint, RegisteredBuf, &RemoteBuf) -> Op<RegisteredBuf>;
        let ops: [(&str, MakeOp); 3] = [
            ("send", |ep, b, _| ep.send(b)),
            ("recv", |ep, b, _| ep.recv(b)),
            ("write", |ep, b, d| ep.write_remote(b, d)),
        ];
        let dst = &self.remote.slice(0..16).unwrap();
        let Pair { a, ab, buf, .. } = self;
        for (what, op) in ops {
            c.bench_function(&format!("{what} 16 B, {how}"), |bn| {
                bn.iter_custom(|n| {
                    let b = buf.take().unwrap();
                    let t = std::time::Instant::now();
                    let b = a.block_on(async {
                        let mut b = b;
                        for _ in 0..n {
                            let (r, back) = op(ab, b, dst).await;
                            r.unwrap();
                            b = back;
                        }
                        b
                    });
                    let d = t.elapsed();
                    *buf = Some(b);
                    d
                })
            });
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut p =
        Pair::open(|| Runtime::builder().backend(NullBackend(0)).driver(Driver::Inline).build().unwrap());
    let (a, ab, remote) = (&p.a, &p.ab, &p.remote);
    let buf = &mut p.buf;
    c.bench_function("send 16 B (inline completion)", |bn| {
        bn.iter(|| {
            let (r, back) = a.block_on(ab.send(buf.take().unwrap()));
            r.unwrap();
            *buf = Some(back);
        })
    });
    c.bench_function("recv 16 B (completion on the next poll)", |bn| {
        bn.iter(|| {
            let (r, back) = a.block_on(ab.recv(buf.take().unwrap()));
            r.unwrap();
            *buf = Some(back);
        })
    });
    c.bench_function("write 16 B (through the reactor, no bulk queued)", |bn| {
        bn.iter(|| {
            let (r, back) = a.block_on(ab.write_remote(buf.take().unwrap(), &remote.slice(0..16).unwrap()));
            r.unwrap();
            *buf = Some(back);
        })
    });
    p.loops(c, "inside block_on");
    drop(p);
    // The same loops under the thread driver, as an application's task runs them: its ops
    // spin (the await spin is set, as a host with cores to spare has it by default), so the
    // task takes the reactor its thread lends and turns it itself. What this adds to the
    // inline figures is the lend's hold and release around each op.
    let thread = || {
        Runtime::builder()
            .backend(NullBackend(0))
            .driver(Driver::Thread)
            .await_spin(Duration::from_micros(50))
            .build()
            .unwrap()
    };
    Pair::open(thread).loops(c, "thread driver");
    // Completions that come LATE polls after the post: the inline driver parks the op and
    // turns between polls of its future; the thread driver's op spins on the lent reactor.
    let late = |driver| {
        move || {
            Runtime::builder()
                .backend(NullBackend(LATE))
                .driver(driver)
                .await_spin(Duration::from_micros(50))
                .build()
                .unwrap()
        }
    };
    Pair::open(late(Driver::Inline)).loops(c, &format!("{LATE} polls late, inline"));
    Pair::open(late(Driver::Thread)).loops(c, &format!("{LATE} polls late, thread driver"));
}

/// Empty polls before a late completion shows.
const LATE: u32 = 8;

// criterion's macros generate undocumented public functions.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, bench);
}
use group::benches;
criterion_main!(benches);
