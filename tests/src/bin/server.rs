//! The server process of the hostile-client tests: a listener that keeps serving. Each peer it
//! accepts gets a region to write into and the hash of what landed on request; every refused
//! handshake is reported on stdout as `REFUSED <reason> <the runtime's count for it>`, from
//! `Listener::refusals` and `Stats::refused`.
//!   server PROVIDER SECRET CONNECT_TIMEOUT_MS
use std::io::Write;
use std::time::Duration;

use rdmalane::{Access, Endpoint, Runtime};
use rdmalane_conformance::{builder, cmd, decode_cmd, hash};

/// The region each peer writes into.
pub const REGION: usize = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let provider = args.next().expect("provider");
    let secret = args.next().expect("secret");
    let timeout_ms: u64 = args.next().expect("connect timeout").parse().expect("ms");
    let rt = builder(&provider)
        .secret(secret)
        .connect_timeout(Duration::from_millis(timeout_ms))
        .build()
        .expect("runtime");
    let l = rt.listen("127.0.0.1:0").await.expect("listen");
    let mut refusals = l.refusals();
    println!("LISTENING {}", l.local_addr().expect("addr"));
    let counts = rt.clone();
    tokio::spawn(async move {
        while let Some(r) = refusals.next().await {
            let n = counts.stats().refused.of(r.reason);
            println!("REFUSED {} {n}", r.reason);
            let _ = std::io::stdout().flush();
        }
    });
    loop {
        match l.accept().await {
            Ok(ep) => {
                let rt = rt.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(&rt, &ep).await {
                        eprintln!("server: peer {}: {e}", ep.peer_id());
                    }
                });
            }
            Err(e) => {
                eprintln!("server: the listener failed: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// Expose a region, send its descriptor, answer HASH requests until the peer says EXIT or goes.
async fn serve(rt: &Runtime, ep: &Endpoint) -> rdmalane::Result<()> {
    let region = rt.expose(rt.alloc(REGION)?, Access::WRITE)?;
    ep.send_descriptor(&region.descriptor()).await?;
    let mut inbox = rt.alloc(24)?;
    let mut reply = rt.alloc(8)?;
    loop {
        let (n, b) = ep.recv(inbox).await;
        inbox = b;
        n?;
        let (c, a, _) = decode_cmd(&inbox);
        if c != cmd::HASH {
            return Ok(());
        }
        let len = (a as usize).min(REGION);
        reply.copy_from_slice(&hash(&region.as_slice()[..len]).to_le_bytes());
        let (r, b) = ep.send(reply).await;
        r?;
        reply = b;
    }
}
