//! The smallest rdmalane program: two endpoints on loopback, one exposes a buffer, the other
//! writes into it, and the bytes are checked.
//!
//! `cargo run --release --example write_remote -- --provider shm`
use clap::Parser;
use rdmalane::{Access, Runtime};

#[derive(Parser)]
struct Args {
    /// libfabric provider: tcp, shm, efa, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Bytes to write.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
}

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

    // Meet over TCP; the handshake exchanges fabric addresses.
    let listener = server.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (to_client, to_server) = tokio::try_join!(listener.accept(), client.connect(addr))?;

    // The server exposes a buffer for remote writes and sends its descriptor.
    let target = server.expose(server.alloc(args.size)?, Access::WRITE)?;
    let desc = target.descriptor();
    let ((), remote) = tokio::try_join!(to_client.send_descriptor(&desc), to_server.recv_descriptor())?;

    // The client writes a pattern; the buffer comes back with the result.
    let mut data = client.alloc(args.size)?;
    data.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 31 + 7) as u8);
    let (res, data) = to_server.write_remote(data, &remote).await;
    res?;

    // A completed write means the bytes are at the target.
    assert_eq!(target.as_slice(), &data[..], "bytes at the target differ");
    println!("wrote {} bytes over {} and verified them", args.size, server.provider());
    Ok(())
}
