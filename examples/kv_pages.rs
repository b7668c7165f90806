//! Move scattered pages of a fake KV cache to a peer, the way an inference server hands a
//! request's cache from prefill to decode: the pages a sequence owns are scattered over the
//! sender's cache, and land in whatever free pages the receiver allotted. One batch per layer,
//! every page carrying the layer's tag as immediate data; the receiver counts the tags (pages
//! land in any order) and then checks every byte.
//!
//! `cargo run --release --example kv_pages -- --provider shm --rails 2`
use clap::Parser;
use rdmalane::{Access, Pieces, Runtime};

#[derive(Parser)]
struct Args {
    /// libfabric provider: tcp, shm, efa, or a full provider string.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// Rails (NICs or domains) each side spans.
    #[arg(long, default_value_t = 1)]
    rails: usize,
    /// Bytes per page (one layer's keys and values for a block of tokens).
    #[arg(long, default_value_t = 16384)]
    page: usize,
    /// Pages in each side's cache, per layer.
    #[arg(long, default_value_t = 256)]
    cache_pages: usize,
    /// Layers.
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Pages the sequence being moved owns, per layer.
    #[arg(long, default_value_t = 48)]
    seq_pages: usize,
}

/// The cache is laid out page-major: page p of layer l sits at (p * layers + l) * page.
fn offset(a: &Args, page: usize, layer: usize) -> usize {
    (page * a.layers + layer) * a.page
}

/// What page p of layer l holds at the sender: a pattern naming both.
fn content(a: &Args, page: usize, layer: usize) -> Vec<u8> {
    (0..a.page).map(|k| (page * 7 + layer * 131 + k * 3) as u8).collect()
}

/// A deterministic shuffle-free pick of `n` distinct pages out of `of`, different per seed.
fn pick(n: usize, of: usize, seed: usize) -> Vec<usize> {
    let step = (of / 2..of).find(|s| gcd(*s, of) == 1).unwrap_or(1);
    (0..n).map(|i| (seed * 13 + i * step) % of).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let a = Args::parse();
    if a.seq_pages > a.cache_pages {
        return Err("--seq-pages cannot exceed --cache-pages".into());
    }
    let open = || {
        Runtime::builder()
            .backend(rdmalane_verbs::Verbs)
            .backend(rdmalane_efa::Libfabric)
            .provider(&a.provider)
            .rails(a.rails)
            .build()
    };
    let (prefill, decode) = (open()?, open()?);
    let listener = decode.listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (to_decode, to_prefill) = tokio::try_join!(prefill.connect(addr), listener.accept())?;

    // Each side's cache: layers * cache_pages pages, registered once.
    let cache_len = a.cache_pages * a.layers * a.page;
    let mut src = prefill.alloc(cache_len)?;
    // The sequence's pages at the sender, and the free pages the receiver allotted for it.
    let sent_pages = pick(a.seq_pages, a.cache_pages, 1);
    let recv_pages = pick(a.seq_pages, a.cache_pages, 5);
    for layer in 0..a.layers {
        for &p in &sent_pages {
            let o = offset(&a, p, layer);
            src[o..o + a.page].copy_from_slice(&content(&a, p, layer));
        }
    }
    let cache = decode.expose(decode.alloc(cache_len)?, Access::WRITE)?;
    // Both at once: on verbs (RC) a message is delivered only into a receive already posted.
    let desc = cache.descriptor();
    let ((), remote) = tokio::try_join!(to_prefill.send_descriptor(&desc), to_decode.recv_descriptor())?;

    // One batch per layer: the layer's pages sit `layers` pages apart on both sides.
    let stride = a.layers * a.page;
    let src = std::sync::Arc::new(src);
    let mut batches = Vec::new();
    for layer in 0..a.layers {
        let pieces = Pieces::pages_strided(&sent_pages, stride, &recv_pages, stride, a.page)?;
        // Shift the layer in: the pages of layer l start l pages into each slot.
        let pieces: Pieces = pieces
            .iter()
            .map(|p| (p.local + layer * a.page, p.remote + (layer * a.page) as u64, p.len))
            .collect();
        batches.push(to_decode.write_batch_with_imm(src.clone(), &remote, &pieces, layer as u64).start());
    }

    // The receiver waits for every layer's pages by count: no ordering is assumed.
    for layer in 0..a.layers {
        decode.wait_imm(layer as u64, a.seq_pages).await;
    }
    let mut moved = 0;
    for b in batches {
        let (n, _) = b.await;
        moved += n?;
    }

    // Every page of every layer is where the receiver allotted it, byte for byte.
    let got = cache.as_slice();
    for layer in 0..a.layers {
        for (&s, &r) in sent_pages.iter().zip(&recv_pages) {
            let o = offset(&a, r, layer);
            if got[o..o + a.page] != content(&a, s, layer)[..] {
                return Err(format!("layer {layer}: page {s} did not land in page {r}").into());
            }
        }
    }
    println!(
        "moved {} pages ({} bytes) of {} layers over {} with {} rail(s); all verified",
        a.seq_pages * a.layers,
        moved,
        a.layers,
        prefill.provider(),
        prefill.caps().rails
    );
    Ok(())
}
