//! A latency tenant and a bulk tenant sharing one connection: the latency tenant's 16-byte
//! one-sided writes are served first; the bulk tenant's 1 MiB writes are split and fill the
//! rest. Prints both.
//!
//! `cargo run --release --example mixed_tenants -- --provider tcp`
use std::cell::Cell;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::sched::Class;
use rdmalane::{Access, Runtime};

#[derive(Parser)]
struct Args {
    /// libfabric provider: tcp, shm, efa, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Seconds to run.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
}

const LATENCY: u32 = 1;
const BULK: u32 = 2;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args = Args::parse();
    let open = || {
        Runtime::builder()
            .backend(rdmalane_verbs::Verbs)
            .backend(rdmalane_efa::Libfabric)
            .provider(&args.provider)
            .build()
    };
    let (server, client) = (open()?, open()?);
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (to_client, ep) = tokio::try_join!(listener.accept(), client.connect(addr))?;

    // The server exposes one region: a small mailbox and a bulk area.
    let region = server.expose(server.alloc(4096 + (1 << 20))?, Access::WRITE)?;
    let desc = region.descriptor();
    let ((), remote) = tokio::try_join!(to_client.send_descriptor(&desc), ep.recv_descriptor())?;
    let (mailbox, bulk_area) = (remote.slice(0..16)?, remote.slice(4096..)?);

    let until = Instant::now() + Duration::from_secs_f64(args.secs);
    let done = Cell::new(false);
    // Latency tenant: one 16-byte write at a time, timed.
    let latency = async {
        let mut lat = Vec::new();
        let mut buf = client.alloc(16)?;
        while Instant::now() < until {
            let t0 = Instant::now();
            let (r, b) = ep.write_remote(buf, &mailbox).class(Class::Latency).tenant(LATENCY).await;
            r?;
            buf = b;
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        done.set(true);
        Ok::<_, rdmalane::Error>(lat)
    };
    // Bulk tenant: eight 1 MiB writes in flight.
    let bulk = async {
        let mut free: Vec<_> = (0..8).map(|_| client.alloc(1 << 20)).collect::<Result<_, _>>()?;
        let mut inflight = FuturesUnordered::new();
        let mut bytes = 0usize;
        let t0 = Instant::now();
        loop {
            while !done.get() && !free.is_empty() {
                let b = free.pop().expect("non-empty");
                inflight.push(ep.write_remote(b, &bulk_area).class(Class::Bulk).tenant(BULK));
            }
            let Some((r, b)) = inflight.next().await else { break };
            r?;
            bytes += b.len();
            free.push(b);
        }
        Ok::<_, rdmalane::Error>(bytes as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9)
    };
    let (lat, gbps) = tokio::join!(latency, bulk);
    let (mut lat, gbps) = (lat?, gbps?);
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!("over {}, one connection, {:.1} s:", client.provider(), args.secs);
    println!("  latency tenant: {} writes of 16 B, p50 {:.1} µs, p99 {:.1} µs", lat.len(), q(0.5), q(0.99));
    println!("  bulk tenant:    {gbps:.1} Gb/s of 1 MiB writes");
    assert!(!lat.is_empty() && gbps > 0.0, "both tenants made progress");
    Ok(())
}
