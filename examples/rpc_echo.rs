//! A request/response service on send/recv: one server, many clients, and a latency table.
//!
//! The server keeps a pool of receives posted per client (`recv_stream`) and echoes each
//! request; every client sends requests one at a time and times the round trip.
//!
//! `cargo run --release --example rpc_echo -- --provider shm --clients 4 --requests 2000`
use std::time::Instant;

use clap::Parser;
use futures::StreamExt;
use rdmalane::Runtime;

#[derive(Parser)]
struct Args {
    /// libfabric provider: tcp, shm, efa, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Requests per client.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Request size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
}

#[tokio::main(flavor = "current_thread")]
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
    let server = open()?;
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    // The server: one task per client, echoing every request from a pool of posted receives.
    let (size, clients) = (args.size, args.clients);
    let srv = server.clone();
    let serving = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let ep = listener.accept().await?;
            let rt = srv.clone();
            tasks.push(tokio::spawn(async move {
                let mut requests = ep.recv_stream(16, size)?;
                while let Some(msg) = requests.next().await {
                    let msg = match msg {
                        Ok(m) => m,
                        Err(e) if e.is_peer_lost() => break,
                        Err(e) => return Err(e),
                    };
                    let mut reply = rt.alloc(msg.len().max(1))?;
                    reply[..msg.len()].copy_from_slice(&msg);
                    drop(msg); // re-posts the receive
                    ep.send(reply).await.0?;
                }
                Ok::<(), rdmalane::Error>(())
            }));
        }
        // A client that fails is that client's problem: the server goes on with the others.
        for t in tasks {
            if let Err(e) = t.await.expect("server task") {
                eprintln!("rpc_echo: a client failed: {e}");
            }
        }
        Ok::<(), rdmalane::Error>(())
    });
    // A stranger (a port scan, a health probe) connects and hangs up: it is refused and
    // counted, and no one waits for it.
    drop(tokio::net::TcpStream::connect(addr).await?);

    // The clients: one runtime (one reactor), a connection and a task per client.
    let client_rt = open()?;
    let mut runs = Vec::new();
    for c in 0..args.clients {
        let rt = client_rt.clone();
        let (requests, size) = (args.requests, args.size);
        runs.push(tokio::spawn(async move {
            let ep = rt.connect(addr).await?;
            let mut lat = Vec::with_capacity(requests);
            let (mut req, mut resp) = (rt.alloc(size)?, rt.alloc(size)?);
            for i in 0..requests {
                req.iter_mut().enumerate().for_each(|(k, b)| *b = (c + i + k) as u8);
                let t0 = Instant::now();
                let pending = ep.recv(resp).start();
                let (r, b) = ep.send(req).await;
                r?;
                req = b;
                let (n, b) = pending.await;
                assert_eq!(n?, size, "reply length");
                assert!(b[..] == req[..], "client {c}: reply {i} differs from its request");
                resp = b;
                lat.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            Ok::<Vec<f64>, rdmalane::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    println!("{:>8} {:>10} {:>10} {:>10} {:>10}", "client", "requests", "p50 µs", "p99 µs", "max µs");
    for (c, r) in runs.into_iter().enumerate() {
        let mut lat = r.await??;
        lat.sort_by(f64::total_cmp);
        let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
        println!("{c:>8} {:>10} {:>10.1} {:>10.1} {:>10.1}", lat.len(), q(0.5), q(0.99), q(1.0));
        all.extend(lat);
    }
    all.sort_by(f64::total_cmp);
    let q = |p: f64| all[((all.len() - 1) as f64 * p) as usize];
    println!("{:>8} {:>10} {:>10.1} {:>10.1} {:>10.1}", "all", all.len(), q(0.5), q(0.99), q(1.0));
    serving.await??;
    let refused = server.stats().refused;
    assert_eq!(refused.closed, 1, "the stranger's refusal: {refused:?}");
    println!(
        "{} round trips of {} B over {}, every reply checked; {} stranger refused",
        all.len(),
        args.size,
        server.provider(),
        refused.total()
    );
    Ok(())
}
