//! Conformance across two processes: the peer (`src/bin/peer.rs`) runs in a child process.
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdmalane::{Endpoint, RemoteBuf, Runtime};
use rdmalane_conformance::{
    bounded, cmd, encode_cmd, filled, hash, pair, pattern, providers, runtime, PeerProcess,
};

const PEER: &str = env!("CARGO_BIN_EXE_peer");

async fn command(rt: &Runtime, ep: &Endpoint, c: u64, a: u64, b: u64) {
    let mut m = rt.alloc(24).unwrap();
    m.copy_from_slice(&encode_cmd(c, a, b));
    ep.send(m).await.0.unwrap();
}

async fn ask(rt: &Runtime, ep: &Endpoint, c: u64, a: u64, b: u64) -> u64 {
    let reply = ep.recv(rt.alloc(8).unwrap()).start();
    command(rt, ep, c, a, b).await;
    let (n, r) = reply.await;
    assert_eq!(n.unwrap(), 8);
    u64::from_le_bytes(r[..8].try_into().unwrap())
}

async fn descriptor(ep: &Endpoint) -> RemoteBuf {
    ep.recv_descriptor().await.unwrap()
}

#[test]
fn writes_reads_and_messages_cross_processes_byte_exact() {
    for p in providers() {
        let peer = PeerProcess::spawn(PEER, p);
        bounded(120, async {
            let rt = runtime(p);
            let ep = rt.connect(peer.addr.clone()).await.unwrap();
            let remote = descriptor(&ep).await;
            for (i, size) in [1usize, 4099, (1 << 20) + 7, 64 << 20].into_iter().enumerate() {
                let (want, src) = filled(&rt, size, i as u64);
                ep.write_remote(src, &remote).await.0.unwrap_or_else(|e| panic!("{p}: write {size}: {e}"));
                assert_eq!(
                    ask(&rt, &ep, cmd::HASH, size as u64, 0).await,
                    hash(&want),
                    "{p}: {size} bytes at the peer"
                );
            }
            // The peer fills its region (and re-exposes it); we read it back.
            let size = (3 << 20) + 5;
            let fill = ep.recv(rt.alloc(RemoteBuf::MAX_ENCODED_LEN).unwrap()).start();
            command(&rt, &ep, cmd::FILL, size as u64, 77).await;
            let (n, d) = fill.await;
            let remote = RemoteBuf::from_bytes(&d[..n.unwrap()]).unwrap();
            let (r, got) =
                ep.read_remote(rt.alloc(size).unwrap(), &remote.slice(0..size as u64).unwrap()).await;
            r.unwrap();
            assert!(got[..] == pattern(size, 77)[..], "{p}: read from the peer differs");
            // Echo.
            let echo = ep.recv(rt.alloc(70_000).unwrap()).start();
            command(&rt, &ep, cmd::ECHO, 70_000, 0).await;
            let mut m = rt.alloc(65_001).unwrap();
            m.copy_from_slice(&pattern(65_001, 5));
            ep.send(m).await.0.unwrap();
            let (n, back) = echo.await;
            assert_eq!(n.unwrap(), 65_001);
            assert!(back[..65_001] == pattern(65_001, 5)[..], "{p}: echo differs");
            command(&rt, &ep, cmd::EXIT, 0, 0).await;
        });
    }
}

#[test]
fn a_killed_peer_turns_pending_ops_into_errors_and_others_go_on() {
    for p in providers() {
        let mut peer = PeerProcess::spawn(PEER, p);
        bounded(60, async {
            let rt = runtime(p);
            let ep = rt.connect(peer.addr.clone()).await.unwrap();
            let remote = descriptor(&ep).await;
            // Another peer, in this process, that must keep working.
            let other = runtime(p);
            let (to_other, from_rt) = pair(&rt, &other).await;

            let mut ops = FuturesUnordered::new();
            for _ in 0..32 {
                ops.push(ep.write_remote(rt.alloc(4 << 20).unwrap(), &remote).start());
            }
            let recv = ep.recv(rt.alloc(64).unwrap()).start();
            // Let some writes start, then kill the peer mid-transfer.
            let _ = ops.next().await;
            peer.child.kill().unwrap();
            let killed = Instant::now();
            let mut errors = 0;
            while let Some((r, _)) = ops.next().await {
                errors += r.is_err() as usize;
            }
            let (r, _) = recv.await;
            let waited = killed.elapsed();
            assert!(r.is_err(), "{p}: a receive from a dead peer succeeded");
            assert!(r.as_ref().unwrap_err().is_peer_lost(), "{p}: {r:?}");
            assert!(waited < Duration::from_secs(10), "{p}: took {waited:?}");
            eprintln!("{p}: {errors} writes failed, all resolved {waited:?} after the kill");
            // New writes to the dead peer fail fast.
            let (r, _) = ep.write_remote(rt.alloc(16).unwrap(), &remote.slice(0..16).unwrap()).await;
            assert!(r.unwrap_err().is_peer_lost(), "{p}");
            // The other peer is unaffected.
            let recv = from_rt.recv(other.alloc(16).unwrap()).start();
            let mut m = rt.alloc(16).unwrap();
            m.fill(3);
            to_other.send(m).await.0.unwrap();
            let (n, got) = recv.await;
            assert_eq!((n.unwrap(), got[0]), (16, 3), "{p}");
        });
    }
}

#[test]
fn a_restarted_peer_can_be_reached_again() {
    for p in providers() {
        bounded(60, async {
            let rt = runtime(p);
            for round in 0..2 {
                let peer = PeerProcess::spawn(PEER, p);
                let ep = rt.connect(peer.addr.clone()).await.unwrap();
                let remote = descriptor(&ep).await;
                let mut src = rt.alloc(4096).unwrap();
                src.copy_from_slice(&pattern(4096, round));
                ep.write_remote(src, &remote).await.0.unwrap();
                assert_eq!(
                    ask(&rt, &ep, cmd::HASH, 4096, 0).await,
                    hash(&pattern(4096, round)),
                    "{p} round {round}"
                );
                drop(peer);
            }
        });
    }
}

#[test]
fn a_frozen_peer_is_lost_after_the_peer_timeout() {
    for p in providers() {
        let peer = PeerProcess::spawn(PEER, p);
        // An explicit builder setting beats RDMALANE_PEER_TIMEOUT_MS, so the test takes the
        // variable itself: under the Soft-RoCE VM's emulated CPUs a healthy peer can be silent
        // for more than 900 ms while it starts, and the VM sets a longer timeout for that.
        let timeout = std::env::var("RDMALANE_PEER_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_millis(900), Duration::from_millis);
        bounded(60, async {
            let rt = rdmalane_conformance::builder(p).peer_timeout(timeout).build().unwrap();
            let ep = rt.connect(peer.addr.clone()).await.unwrap();
            let _remote = descriptor(&ep).await;
            let recv = ep.recv(rt.alloc(64).unwrap()).start();
            // Freeze the peer: its kernel still holds the connection open, but it sends nothing.
            let pid = peer.child.id().to_string();
            assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
            let t0 = Instant::now();
            let (r, _) = recv.await;
            let waited = t0.elapsed();
            let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
            assert!(r.as_ref().is_err_and(|e| e.is_peer_lost()), "{p}: {r:?}");
            assert!(waited < timeout + Duration::from_secs(2), "{p}: noticed after {waited:?}");
            eprintln!("{p}: frozen peer lost after {waited:?}");
        });
    }
}
