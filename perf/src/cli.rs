//! Command-line arguments.
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "rdmalane-perf", about = "Latency and bandwidth of rdmalane against the raw transport")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Ping-pong latency with send/recv (one-way: half the round trip). With
    /// `RDMALANE_PERF_PLACEMENT` set, each side also prints on stderr the CPU its threads ran
    /// on last and its runtime's lend counts.
    Lat(Common),
    /// One-sided write bandwidth with a window of writes in flight.
    Bw(Common),
    /// 16 B ping-pong alone, 1 MiB write stream alone, then both on one connection.
    Mixed(Mixed),
    /// Tenant A's bulk on many lanes against tenant B's on one: per-tenant fairness.
    Tenants(Mixed),
    /// Scattered pages written as batches (KV-cache transfer), next to memcpy's rate.
    Pages(PagesArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PagesArgs {
    #[command(flatten)]
    pub common: Common,
    /// Page size in bytes.
    #[arg(long, default_value_t = 65536)]
    pub page_size: usize,
    /// Bytes to move in all.
    #[arg(long, default_value_t = 1 << 30)]
    pub total: u64,
    /// Pages per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Rails (NICs / domains) the runtime spans.
    #[arg(long, default_value_t = 1)]
    pub rails: usize,
    /// Each side's page pool in bytes (pages are picked from it at random). The default keeps
    /// about the memory footprint of `bw` (a window of 16 buffers, 1 MiB at 64 KiB), so the two
    /// compare the transfer path; larger pools measure memory bandwidth (see memcpy_gbps).
    #[arg(long, default_value_t = 512 << 10)]
    pub pool_bytes: usize,
    /// Every page carries an immediate value; the receiver counts them.
    #[arg(long)]
    pub imm: bool,
}

/// The scheduler mode to run with.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sched {
    /// Split, prioritise, share, rotate.
    Fair,
    /// Whole ops in arrival order, as raw libfabric.
    Fifo,
}

#[derive(Args, Debug, Clone)]
pub struct Mixed {
    #[command(flatten)]
    pub common: Common,
    /// fair or fifo.
    #[arg(long, value_enum, default_value_t = Sched::Fair)]
    pub scheduler: Sched,
    /// Chunk size for split writes (default: the runtime's).
    #[arg(long)]
    pub chunk_size: Option<usize>,
    /// Bulk bytes in flight per lane and per tenant (default: the runtime's).
    #[arg(long)]
    pub lane_bytes: Option<usize>,
    /// Lanes per connection (tenants: tenant A's; B has one).
    #[arg(long)]
    pub lanes: Option<usize>,
    /// Bulk write size.
    #[arg(long, default_value_t = 1 << 20)]
    pub bulk_size: usize,
    /// Bulk writes in flight.
    #[arg(long, default_value_t = 8)]
    pub bulk_window: usize,
    /// Seconds of bulk alone, and at least as long beside the pings (and per tenant run).
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// How the ping-pong and the stream share threads beside each other.
    #[arg(long, value_enum, default_value_t = Layout::Tasks)]
    pub layout: Layout,
}

/// How `mixed` runs its two streams beside each other.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Each on a thread of its own, as an application's tasks: the pings on the thread that
    /// drives the runtime, the stream on a worker thread.
    Tasks,
    /// Both joined in one task (`futures::join!`): each waits while the other is polled.
    Joined,
}

/// Which code drives the transport.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The rdmalane runtime (reactor, op cells).
    Runtime,
    /// The transport alone, busy-polled: the baseline.
    Raw,
}

/// Who drives the reactor (`rdmalane::Driver`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverArg {
    /// The benchmark thread, busy-polling.
    Inline,
    /// A reactor thread, spinning briefly and then sleeping when idle.
    Thread,
}

/// What `lat` ping-pongs with.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatOp {
    /// send/recv, as fi_pingpong and ib_send_lat.
    Send,
    /// One-sided writes, each side polling its memory for the peer's, as ib_write_lat.
    Write,
    /// One awaited write at a time: submit, then wait for its completion (as perftest's
    /// `ib_write_bw -t 1` posts); the figure is the whole submit-to-completion time, not half
    /// a round trip. What an application that awaits each `write_remote` gets.
    WriteAwait,
}

/// What runs the benchmark's future on the runtime side (the thread driver's hand-off is the
/// executor's wake-up; the inline driver polls in `Runtime::block_on` whatever this says).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executor {
    /// `Runtime::block_on` (with the thread driver: a plain parking `block_on`).
    BlockOn,
    /// A current-thread tokio runtime's `block_on`.
    TokioCurrent,
    /// A multi-thread tokio runtime's `block_on`, as `#[tokio::main]` runs `main`.
    TokioMulti,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// tcp, shm, efa, verbs, or a full libfabric provider string.
    #[arg(long, default_value = "tcp")]
    pub provider: String,
    /// Message size in bytes.
    #[arg(long, default_value_t = 16)]
    pub size: usize,
    /// Measured iterations (mixed: ping-pongs per phase).
    #[arg(long, default_value_t = 10000)]
    pub iters: usize,
    /// Unmeasured iterations first [default: 2000 round trips (lat, mixed's pings), 200
    /// writes (bw)]
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Writes in flight (bw).
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// runtime or raw.
    #[arg(long, value_enum, default_value_t = Engine::Runtime)]
    pub engine: Engine,
    /// End with one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Also write the result as an SVG plot here (lat, mixed: latency CDF; bw with --sizes:
    /// bandwidth against size).
    #[arg(long)]
    pub svg: Option<String>,
    /// bw: run these sizes (comma-separated) instead of --size, one line each.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Be the server side only: serve client after client until stopped (a client that fails
    /// is logged and the next one served).
    #[arg(long)]
    pub server: bool,
    /// With --server: serve one client, then exit (its failure is the exit status).
    #[arg(long)]
    pub once: bool,
    /// Address the server listens on (with --server).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Connect to a server at this address instead of starting one.
    #[arg(long)]
    pub connect: Option<String>,
    /// Local fabric address to bind (tcp across hosts).
    #[arg(long)]
    pub node: Option<String>,
    /// Who drives the runtime's reactor: `inline` (the benchmark thread busy-polls it, as
    /// fi_pingpong and perftest poll) or `thread` (a reactor thread of its own that sleeps when
    /// idle: what an application gets by default). The raw engine is always busy-polled.
    #[arg(long, value_enum, default_value_t = DriverArg::Inline)]
    pub driver: DriverArg,
    /// lat: pause this many microseconds before each measured round trip, send or write
    /// (sporadic traffic: an idle reactor thread may be asleep when the next ping comes).
    #[arg(long, default_value_t = 0)]
    pub gap_us: u64,
    /// lat: send (default on libfabric, like fi_pingpong) or write (default on verbs, like
    /// perftest's ib_write_lat, its baseline there), or write-await. The raw engine uses send
    /// unless told.
    #[arg(long, value_enum)]
    pub op: Option<LatOp>,
    /// lat, runtime engine: what runs the client's future (block-on, tokio-current,
    /// tokio-multi) for send/recv and write-await; the write ping-pong and the server side
    /// run under `Runtime::block_on`.
    #[arg(long, value_enum, default_value_t = Executor::BlockOn)]
    pub executor: Executor,
    /// bw, pages: where the buffers live on both sides: `host`, or `cuda` (device 0, in a
    /// build with the `cuda` feature), on the path the runtime picks (`RDMALANE_DEVICE_MEMORY`).
    #[arg(long, value_enum, default_value_t = MemoryArg::Host)]
    pub memory: MemoryArg,
}

/// Where `bw` and `pages` keep their buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryArg {
    /// Host memory.
    Host,
    /// CUDA device 0's memory.
    Cuda,
}

/// Round trips a ping-pong runs unmeasured by default. A shm ping-pong's first thousand or so
/// round trips walk the provider's rings for the first time, and each page they touch first is
/// a page fault (a few µs in a VM): with 200 round trips first, the measured run's first 2-3 ms
/// held a hundred round trips 4-6 µs slower, 0.5% of 20,000, which set its p99 (the raw
/// engine's as much as the runtime's). 2,000 leave none.
pub const PINGPONG_WARMUP: usize = 2000;

/// Writes a bandwidth run posts unmeasured by default.
pub const BW_WARMUP: usize = 200;

impl Common {
    /// Unmeasured round trips before a ping-pong's measured ones (`lat`, `mixed`'s pings).
    pub fn warmup_rounds(&self) -> usize {
        self.warmup.unwrap_or(PINGPONG_WARMUP)
    }

    /// Unmeasured writes before a bandwidth run's measured ones (`bw`).
    pub fn warmup_writes(&self) -> usize {
        self.warmup.unwrap_or(BW_WARMUP)
    }

    /// The op `lat` uses on this provider.
    pub fn lat_op(&self) -> LatOp {
        match (self.op, self.engine) {
            (Some(op), _) => op,
            (None, Engine::Raw) => LatOp::Send,
            (None, _) if rdmalane_verbs::is_verbs(&self.provider) => LatOp::Write,
            (None, _) => LatOp::Send,
        }
    }
}
