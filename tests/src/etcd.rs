//! A real etcd (Debian's `etcd-server`) for the membership tests: on loopback ports it picks,
//! in a temporary data folder, stopped (and the folder removed) when dropped.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary: `RDMALANE_ETCD_BIN`, else Debian's.
fn binary() -> String {
    std::env::var("RDMALANE_ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".into())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// One etcd member on loopback.
pub struct EtcdServer {
    dir: PathBuf,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

impl EtcdServer {
    /// Start etcd and wait until it reports itself healthy (at most 20 s).
    pub fn start() -> EtcdServer {
        let dir = std::env::temp_dir().join(format!("rdmalane-etcd-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("etcd data folder");
        let mut s = EtcdServer { dir, client: free_port(), peer: free_port(), child: None };
        s.restart();
        s
    }

    /// Its client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client)
    }

    /// Start it again on the same ports and data (after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)); waits until it is healthy.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let (c, p) = (self.client, self.peer);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("etcd log");
        let child = Command::new(binary())
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{c}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{c}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{p}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{p}"))
            .arg(format!("--initial-cluster=t=http://127.0.0.1:{p}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {} (Debian package etcd-server): {e}", binary()));
        self.child = Some(child);
        let t0 = Instant::now();
        while !self.healthy() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "etcd not healthy within 20 s; see {:?}",
                self.dir
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    /// SIGKILL it (no clean shutdown), and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop it cleanly (SIGTERM), and wait for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
