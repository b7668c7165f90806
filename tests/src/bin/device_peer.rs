//! The target process of the two-process device-memory tests: `device_peer PROVIDER KIND`
//! (KIND: host, emulated or cuda) listens, says `LISTENING <addr>`, and runs the target side of
//! the suite (`rdmalane_conformance::device::target`) for each client, twice over: the suite
//! alone, then after the client's drop storm.
use rdmalane::RegisteredBuf;
use rdmalane_conformance::device::target;
use rdmalane_conformance::runtime;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [provider, kind] = &args[..] else { panic!("usage: device_peer PROVIDER host|emulated|cuda") };
    let rt = runtime(provider);
    let l = rt.listen("127.0.0.1:0").await.expect("listen");
    println!("LISTENING {}", l.local_addr().expect("addr"));
    while let Ok(ep) = l.accept().await {
        match kind.as_str() {
            "host" => target::<RegisteredBuf>(&ep).await,
            "emulated" => target::<rdmalane::buf::EmulatedDeviceBuf>(&ep).await,
            #[cfg(feature = "cuda")]
            "cuda" => target::<rdmalane::CudaBuf>(&ep).await,
            other => panic!("no memory kind {other} in this build"),
        }
    }
}
