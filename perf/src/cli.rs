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
    /// Ping-pong latency with send/recv (one-way: half the round trip).
    Lat(Common),
    /// One-sided write bandwidth with a window of writes in flight.
    Bw(Common),
}

/// Which code drives the transport.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The rdmalane runtime (reactor, op cells).
    Runtime,
    /// The transport alone, busy-polled: the baseline.
    Raw,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// tcp, shm, efa, verbs, or a full libfabric provider string.
    #[arg(long, default_value = "tcp")]
    pub provider: String,
    /// Message size in bytes.
    #[arg(long, default_value_t = 16)]
    pub size: usize,
    /// Measured iterations.
    #[arg(long, default_value_t = 10000)]
    pub iters: usize,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Writes in flight (bw).
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// runtime or raw.
    #[arg(long, value_enum, default_value_t = Engine::Runtime)]
    pub engine: Engine,
    /// End with one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Be the server side only.
    #[arg(long)]
    pub server: bool,
    /// Address the server listens on (with --server).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Connect to a server at this address instead of starting one.
    #[arg(long)]
    pub connect: Option<String>,
    /// Local fabric address to bind (tcp across hosts).
    #[arg(long)]
    pub node: Option<String>,
}
