//! A tiny remote block store: the server exposes a region of blocks; clients write and read
//! blocks with one-sided ops, no server CPU in the data path; then everything is checked.
//!
//! Each block carries (block id, version, checksum of the payload) in its first 24 bytes.
//! Clients own disjoint ranges of blocks, write every block several times, read random blocks
//! back and check that each holds the version they last wrote; at the end the server checks
//! every block in its own memory.
//!
//! `cargo run --release --example block_store -- --provider shm`
use clap::Parser;
use rdmalane::{Access, RegisteredBuf, Runtime};

#[derive(Parser)]
struct Args {
    /// libfabric provider: tcp, shm, efa, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Block size in bytes.
    #[arg(long, default_value_t = 4096)]
    block: usize,
    /// Blocks per client.
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Clients.
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Versions written per block.
    #[arg(long, default_value_t = 4)]
    versions: u64,
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x1000_0000_01b3))
}

/// Fill `buf` as block `id`, version `v`.
fn fill(buf: &mut [u8], id: u64, v: u64) {
    for (k, b) in buf[24..].iter_mut().enumerate() {
        *b = (id as usize * 131 + v as usize * 17 + k) as u8;
    }
    let sum = checksum(&buf[24..]);
    buf[0..8].copy_from_slice(&id.to_le_bytes());
    buf[8..16].copy_from_slice(&v.to_le_bytes());
    buf[16..24].copy_from_slice(&sum.to_le_bytes());
}

/// (id, version) if the block is intact.
fn check(buf: &[u8]) -> Option<(u64, u64)> {
    let w = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
    (w(16) == checksum(&buf[24..])).then(|| (w(0), w(8)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let a = Args::parse();
    let open = || {
        Runtime::builder()
            .backend(rdmalane_verbs::Verbs)
            .backend(rdmalane_efa::Libfabric)
            .provider(&a.provider)
            .build()
    };
    let server = open()?;
    let total = a.block * a.blocks * a.clients;
    let store = server.expose(server.alloc(total)?, Access::READ_WRITE)?;
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    // The server hands each client the descriptor of the store, then stays out of the way.
    let desc = store.descriptor();
    let srv = server.clone();
    let clients = a.clients;
    let serving = tokio::spawn(async move {
        let mut eps = Vec::new();
        for _ in 0..clients {
            let ep = listener.accept().await?;
            // Posted now: a client may finish before the server gets round to it.
            let done = ep.recv(srv.alloc(1)?).start();
            ep.send_descriptor(&desc).await?;
            eps.push((ep, done));
        }
        // Keep each endpoint until its client says it is done, then let the client go. A
        // client that fails or vanishes is logged; the others are still served.
        for (ep, done) in eps {
            let bye = async {
                done.await.0?;
                ep.send(srv.alloc(1)?).await.0
            };
            if let Err(e) = bye.await {
                eprintln!("block_store: a client failed: {e}");
            }
        }
        Ok::<(), rdmalane::Error>(())
    });
    // A stranger sends garbage: it is refused and counted while the clients are served.
    let mut stranger = tokio::net::TcpStream::connect(addr).await?;
    tokio::io::AsyncWriteExt::write_all(&mut stranger, b"GET / HTTP/1.1\r\n\r\n").await?;

    let mut runs = Vec::new();
    for c in 0..a.clients {
        let rt = open()?;
        let (block, blocks, versions) = (a.block, a.blocks, a.versions);
        runs.push(tokio::spawn(async move {
            let ep = rt.connect(addr).await?;
            let store = ep.recv_descriptor().await?;
            let first = c * blocks;
            let at = |i: usize| store.slice((i * block) as u64..((i + 1) * block) as u64);
            let mut buf: RegisteredBuf = rt.alloc(block)?;
            let (mut writes, mut reads) = (0, 0);
            for v in 1..=versions {
                for i in first..first + blocks {
                    fill(&mut buf, i as u64, v);
                    let (r, b) = ep.write_remote(buf, &at(i)?).await;
                    r?;
                    buf = b;
                    writes += 1;
                }
                // Read back a pseudo-random sample of this client's blocks.
                for k in 0..blocks / 4 {
                    let i = first + (k * 7919 + v as usize * 31) % blocks;
                    let (r, b) = ep.read_remote(buf, &at(i)?).await;
                    r?;
                    buf = b;
                    reads += 1;
                    assert_eq!(check(&buf), Some((i as u64, v)), "client {c}: block {i} after version {v}");
                }
            }
            // Done; stay connected until the server has seen it.
            let bye = ep.recv(rt.alloc(1)?).start();
            ep.send(rt.alloc(1)?).await.0?;
            bye.await.0?;
            Ok::<(usize, usize), rdmalane::Error>((writes, reads))
        }));
    }
    let (mut writes, mut reads) = (0, 0);
    for r in runs {
        let (w, rd) = r.await??;
        writes += w;
        reads += rd;
    }
    serving.await??;

    // Consistency: every block in the server's memory is intact and at the last version.
    let bytes = store.as_slice();
    for i in 0..a.blocks * a.clients {
        let got = check(&bytes[i * a.block..(i + 1) * a.block]);
        assert_eq!(got, Some((i as u64, a.versions)), "block {i} at the server");
    }
    let refused = server.stats().refused;
    assert_eq!(refused.bad_hello, 1, "the stranger's refusal: {refused:?}");
    println!(
        "{writes} block writes and {reads} block reads by {} clients over {}; all {} blocks consistent; {} stranger refused",
        a.clients,
        server.provider(),
        a.blocks * a.clients,
        refused.total()
    );
    Ok(())
}
