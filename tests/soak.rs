//! Soak: mixed traffic against a peer process that is killed and restarted every few seconds.
//! Every op is accounted for (completed or failed, none vanished) and resident memory stays
//! flat. `RDMALANE_SOAK_SECS` sets the length (default: 120 s under CI, 15 s otherwise).
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use rdmalane::RemoteBuf;
use rdmalane_conformance::{bounded, cmd, encode_cmd, runtime, PeerProcess};

const PEER: &str = env!("CARGO_BIN_EXE_peer");

fn rss_mib() -> u64 {
    rdmalane_conformance::resident_bytes("self") >> 20
}

#[test]
fn mixed_traffic_through_peer_restarts_loses_no_op_and_no_memory() {
    let secs: u64 = std::env::var("RDMALANE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() { 120 } else { 15 });
    let rt = runtime(rdmalane_conformance::main_provider());
    bounded(secs + 60, async {
        let end = Instant::now() + Duration::from_secs(secs);
        let (mut rounds, mut made, mut ok, mut failed) = (0u64, 0u64, 0u64, 0u64);
        let mut rss = Vec::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        while Instant::now() < end {
            rounds += 1;
            let peer = PeerProcess::spawn(PEER, rdmalane_conformance::main_provider());
            let ep = rt.connect(peer.addr.clone()).await.unwrap();
            let (n, d) = ep.recv(rt.alloc(RemoteBuf::MAX_ENCODED_LEN).unwrap()).await;
            let remote = RemoteBuf::from_bytes(&d[..n.unwrap()]).unwrap();
            let round_end = Instant::now() + Duration::from_millis(1500 + rand() % 2000);
            let mut ops = FuturesUnordered::new();
            let mut killer = Some(peer);
            loop {
                // Keep about 32 ops in flight: writes of any size, reads, and small commands.
                while ops.len() < 32 {
                    let len = 1 + (rand() % (1 << 20)) as usize;
                    let off = rand() % (cmd::REGION as u64 - len as u64);
                    let piece = remote.slice(off..off + len as u64).unwrap();
                    let op: Pin<Box<dyn Future<Output = Result<(), rdmalane::Error>> + Send>> =
                        match rand() % 4 {
                            0 => Box::pin(
                                ep.read_remote(rt.alloc(len).unwrap(), &piece)
                                    .start()
                                    .map(|(r, _)| r.map(|_| ())),
                            ),
                            1 => {
                                // A command and its reply: the receive is posted before the command
                                // goes out (verbs delivers a message only into a posted receive).
                                let mut m = rt.alloc(24).unwrap();
                                m.copy_from_slice(&encode_cmd(cmd::HASH, 16, 0));
                                let reply = ep.recv(rt.alloc(8).unwrap()).start();
                                let sent = ep.send(m).start();
                                Box::pin(async move {
                                    let (r, _) = sent.await;
                                    let (n, _) = reply.await;
                                    r.and(n.map(|_| ()))
                                })
                            }
                            _ => Box::pin(
                                ep.write_remote(rt.alloc(len).unwrap(), &piece)
                                    .start()
                                    .map(|(r, _)| r.map(|_| ())),
                            ),
                        };
                    ops.push(op);
                    made += 1;
                }
                let r = ops.next().await.unwrap();
                match r {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
                // Kill the peer mid-traffic, then drain what is left: each op must resolve.
                if Instant::now() >= round_end {
                    drop(killer.take());
                    break;
                }
            }
            while let Some(r) = ops.next().await {
                match r {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
            }
            drop(ep);
            eprintln!("soak: round {rounds} done: {ok} ok, {failed} failed of {made}");
            // After a few rounds of warm-up (allocator arenas, provider buffers).
            if rounds > 3 {
                rss.push(rss_mib());
            }
        }
        // Every op we made resolved; the runtime agrees.
        let s = rt.stats();
        let deadline = Instant::now() + Duration::from_secs(10);
        while {
            let s = rt.stats();
            s.completed + s.failed + s.withdrawn != s.submitted
        } {
            assert!(Instant::now() < deadline, "ops unaccounted for: {:?}", rt.stats());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (lo, hi) = (rss.iter().min().copied().unwrap_or(0), rss.iter().max().copied().unwrap_or(0));
        eprintln!(
            "soak: {rounds} peer restarts, {ok} ops completed, {failed} failed; RSS {lo}..{hi} MiB; {s:?}"
        );
        assert_eq!(ok + failed, made, "ops vanished");
        assert!(ok > 0 && rounds >= 2, "too little happened");
        assert!(hi - lo < 128, "resident memory grew from {lo} to {hi} MiB");
    });
}
