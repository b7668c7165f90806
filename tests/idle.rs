//! An idle runtime stays quiet: its reactor thread sleeps on the CQ's wait object (tcp) or in
//! short naps (shm), using at most 2% of a core. Its own test binary, so no other test's
//! threads run beside it.
use std::time::{Duration, Instant};

use rdmalane_conformance::{bounded, pair, providers, runtime};

/// CPU seconds used so far by each of this process's reactor threads, by thread id.
fn reactor_cpu() -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if !stat.contains("(rdmalane-reacto") {
            continue;
        }
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let secs = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0;
        out.insert(task.file_name().to_string_lossy().into_owned(), secs);
    }
    out
}

#[test]
fn an_idle_connected_runtime_uses_at_most_two_percent_of_a_core() {
    for p in providers() {
        bounded(30, async {
            let (a, b) = (runtime(p), runtime(p));
            let (ab, ba) = pair(&a, &b).await;
            // A server's usual state: memory exposed to peers, receives posted, nothing
            // arriving. (On shm, where exposed memory is served by the reactor's progress, its
            // naps are shorter while it exposes any.)
            let _exposed = b.expose(b.alloc(1 << 20).unwrap(), rdmalane::Access::READ_WRITE).unwrap();
            let _pending = ba.recv(b.alloc(64).unwrap());
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (c0, t0) = (reactor_cpu(), Instant::now());
            tokio::time::sleep(Duration::from_secs(3)).await;
            let c1 = reactor_cpu();
            let secs = t0.elapsed().as_secs_f64();
            let pct: Vec<f64> =
                c1.iter().map(|(tid, c)| 100.0 * (c - c0.get(tid).copied().unwrap_or(0.0)) / secs).collect();
            eprintln!("{p}: idle reactor CPU {pct:.2?}% of a core");
            assert_eq!(pct.len(), 2, "{p}: two reactor threads");
            assert!(pct.iter().all(|&x| x <= 2.0), "{p}: an idle reactor used {pct:.2?}% of a core");
            drop(ab);
        });
    }
}
