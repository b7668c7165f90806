//! The peer process of the two-process tests: exposes a region, sends its descriptor, then
//! serves commands (hash, fill, echo, exit) until told to stop or killed.
use rdmalane::Access;
use rdmalane_conformance::{cmd, decode_cmd, hash, pattern, runtime};

// Two workers: hashing or filling the 64 MiB region blocks the task that does it (seconds in a
// debug build under the VM's emulated CPU), and the control connection's heartbeats must go on
// meanwhile on the other, or the test side loses this peer (it did once in CI).
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let provider = std::env::args().nth(1).expect("provider");
    let rt = runtime(&provider);
    let l = rt.listen("127.0.0.1:0").await.expect("listen");
    println!("LISTENING {}", l.local_addr().expect("addr"));
    let ep = l.accept().await.expect("accept");
    let region = rt.expose(rt.alloc(cmd::REGION).expect("alloc"), Access::READ_WRITE).expect("expose");
    ep.send_descriptor(&region.descriptor()).await.expect("send descriptor");
    let mut inbox = rt.alloc(24).expect("alloc");
    let mut reply = rt.alloc(8).expect("alloc");
    let mut region = Some(region);
    loop {
        let (n, b) = ep.recv(inbox).await;
        inbox = b;
        if n.is_err() {
            return;
        }
        let (c, a, b) = decode_cmd(&inbox);
        match c {
            cmd::HASH => {
                let r = region.as_ref().expect("exposed");
                reply.copy_from_slice(&hash(&r.as_slice()[..a as usize]).to_le_bytes());
            }
            cmd::FILL => {
                // Filling needs the buffer itself: revoke, write, expose again at the same
                // place would change the key, so fill through a local write instead.
                let r = region.take().expect("exposed");
                let mut buf = r.revoke().expect("revoke");
                buf[..a as usize].copy_from_slice(&pattern(a as usize, b));
                let again = rt.expose(buf, Access::READ_WRITE).expect("expose");
                ep.send_descriptor(&again.descriptor()).await.expect("send descriptor");
                region = Some(again);
                continue;
            }
            cmd::ECHO => {
                let (n, got) = ep.recv(rt.alloc(a as usize).expect("alloc")).await;
                let n = n.expect("echo recv");
                let mut out = rt.alloc(n.max(1)).expect("alloc");
                out[..n].copy_from_slice(&got[..n]);
                match ep.send(out.slice(..n).expect("slice")).await.0 {
                    Ok(_) => continue,
                    // The echo arrived and the test moved on: its runtime may be gone before
                    // our send's completion comes back (rxm completes a large send on the
                    // receiver's ack), which is its loss, not a failure of the echo.
                    Err(e) if e.is_peer_lost() => return,
                    Err(e) => panic!("echo send: {e:?}"),
                }
            }
            _ => return,
        }
        let (r, b) = ep.send(reply).await;
        r.expect("reply");
        reply = b;
    }
}
