//! A cluster member in a process of its own, for the membership tests that kill one: joins
//! the cluster on etcd, says `JOINED <id>`, and accepts endpoints until killed.
use std::time::Duration;

use rdmalane::membership::{Cluster, JoinOptions};
use rdmalane_conformance::runtime;
use rdmalane_etcd::{EtcdMembership, EtcdOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [etcd, prefix, label, provider, ttl] = &args[..] else {
        panic!("usage: member ETCD PREFIX LABEL PROVIDER TTL_SECS");
    };
    let rt = runtime(provider);
    let ttl = Duration::from_secs(ttl.parse().expect("ttl"));
    let directory = EtcdMembership::connect(EtcdOptions::new([etcd.as_str()], prefix.as_str()).ttl(ttl))
        .await
        .expect("etcd");
    let cluster = Cluster::join(&rt, directory, JoinOptions::new(label.as_str())).await.expect("join");
    println!("JOINED {}", cluster.me().id.expect("an id"));
    let mut kept = Vec::new();
    while let Ok(ep) = cluster.accept().await {
        kept.push(ep);
    }
}
