//! The control connection after the handshake: it carries what the reactor has to tell the peer
//! and heartbeats, and brings the peer's messages to the reactor; when it ends, the peer is lost.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::base::control::Ctl;
use crate::base::control_inbox::Inbox;
use crate::base::control_outbox::OutboxRx;
use crate::base::transport::RailSet;
use crate::runtime::{Runtime, Slots};

/// A way for someone other than the socket (the cluster's membership, when the peer's entry
/// leaves the directory) to declare the peer lost. The watch task carries it out, so it acts
/// only while the endpoint lives, exactly as a closed socket would.
#[derive(Debug, Default)]
pub(crate) struct LossSwitch {
    reason: Mutex<Option<String>>,
    tripped: Notify,
}

impl LossSwitch {
    /// Declare the peer lost for `reason`; the first reason given is the one reported.
    pub(crate) fn trip(&self, reason: String) {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(reason);
        self.tripped.notify_one();
    }

    async fn tripped(&self) -> String {
        loop {
            if let Some(r) = self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return r;
            }
            self.tripped.notified().await;
        }
    }
}

/// The control socket stays open for the endpoint's life: it carries what the reactor has to
/// tell the peer (`outbox`) and heartbeats, and brings the peer's messages to the reactor. EOF,
/// an error, silence or a malformed message means the peer is gone.
pub(super) fn watch_peer(
    rt: Runtime,
    slots: Slots,
    s: TcpStream,
    mut outbox: OutboxRx,
    switch: Arc<LossSwitch>,
) -> tokio::task::JoinHandle<()> {
    let weak = rt.downgrade();
    let timeout = rt.peer_timeout();
    drop(rt);
    let (rd, mut wr) = s.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    tokio::spawn(async move {
        // Both sides send a heartbeat a few times per timeout, so a peer whose host or network
        // went away (no FIN, no RST) is noticed too.
        let beat = timeout / 3;
        // Each wake-up costs a reactor a command and a wake: only those an honest peer sends
        // are handed on. Per rail, it announces its sleep once per kick of ours, and kicks us
        // once per announcement of ours; repeats are dropped.
        let peer_asleep = AtomicU32::new(0);
        let we_announced = AtomicU32::new(0);
        let writer = async {
            let mut open = true;
            loop {
                let next = async {
                    match open {
                        true => outbox.recv().await,
                        false => std::future::pending().await,
                    }
                };
                let msg = tokio::select! {
                    _ = tokio::time::sleep(beat) => Some(Ctl::Heartbeat),
                    m = next => m,
                };
                // The reactor dropped its sender (the peer was removed): heartbeats only.
                let Some(msg) = msg else {
                    open = false;
                    continue;
                };
                // A peer that stops reading would otherwise stall this writer for good while
                // its own heartbeats keep the reader content, and our messages pile up.
                match tokio::time::timeout(timeout, wr.write_all(&msg.encode())).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return format!("control connection: {e}"),
                    Err(_) => return format!("the peer read nothing for {} ms", timeout.as_millis()),
                }
                match msg {
                    Ctl::Goodbye { reason } => return reason,
                    Ctl::Kick { rails } => {
                        peer_asleep.fetch_and(!rails.0, Ordering::Relaxed);
                    }
                    Ctl::Asleep { rails } => {
                        we_announced.fetch_or(rails.0, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        };
        // The peer's message to the reactor it concerns, holding its place in the inbox until
        // handled; false once the runtime is gone.
        let inbox = Inbox::new();
        let hand_on = |msg: Ctl, credit| match weak.upgrade() {
            Some(rt) => {
                rt.control(&slots, msg, credit);
                true
            }
            None => false,
        };
        let reader = async {
            loop {
                let msg = match tokio::time::timeout(timeout, Ctl::read(&mut rd)).await {
                    Err(_) => return format!("no heartbeat for {} ms", timeout.as_millis()),
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return "control connection closed".to_string()
                    }
                    Ok(Err(e)) => return format!("control connection: {e}"),
                    Ok(Ok(Err(why))) => return format!("control protocol violated: {why}"),
                    Ok(Ok(Ok(Ctl::Heartbeat))) => continue,
                    // The peer's own words, quoted: a newline in them must not pass for a line
                    // of ours where the reason is logged or shown.
                    Ok(Ok(Ok(Ctl::Goodbye { reason }))) => {
                        return format!("the peer gave up on us: {reason:?}")
                    }
                    Ok(Ok(Ok(Ctl::Asleep { rails }))) => {
                        // Only the rails not already said to sleep.
                        let new = rails.without(RailSet(peer_asleep.fetch_or(rails.0, Ordering::Relaxed)));
                        if new.is_empty() {
                            continue;
                        }
                        Ctl::Asleep { rails: new }
                    }
                    Ok(Ok(Ok(Ctl::Kick { rails }))) => {
                        // Only the rails we said sleep.
                        let due = rails.and(RailSet(we_announced.fetch_and(!rails.0, Ordering::Relaxed)));
                        if due.is_empty() {
                            continue;
                        }
                        Ctl::Kick { rails: due }
                    }
                    Ok(Ok(Ok(msg))) => msg,
                };
                // With the peer's inbox full, read nothing more until the reactors catch up.
                let credit = inbox.credit().await;
                if !hand_on(msg, credit) {
                    return "runtime gone".to_string();
                }
            }
        };
        let reason = tokio::select! {
            r = writer => r,
            r = reader => r,
            r = switch.tripped() => r,
        };
        if let Some(rt) = weak.upgrade() {
            rt.peer_lost(&slots, reason);
        }
    })
}
