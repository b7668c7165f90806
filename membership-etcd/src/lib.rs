//! # rdmalane-etcd
//!
//! Cluster membership for rdmalane on etcd (v3 API). Each runtime publishes its entry (id,
//! label, listen address, provider, rails, metadata) under `<prefix>/members/<id>` on a lease
//! it keeps alive, and watches the prefix for the others:
//!
//! ```no_run
//! # async fn f(rt: rdmalane::Runtime) -> rdmalane::Result<()> {
//! use rdmalane::membership::{Cluster, JoinOptions};
//! use rdmalane_etcd::{EtcdMembership, EtcdOptions};
//!
//! let etcd = EtcdMembership::connect(EtcdOptions::new(["127.0.0.1:2379"], "/rdmalane/prod")).await?;
//! let cluster = Cluster::join(&rt, etcd, JoinOptions::new("decode-0")).await?;
//! let ep = cluster.connect_label("prefill-3").await?;
//! # Ok(()) }
//! ```
//!
//! etcd down is not rdmalane down: connected members keep working while etcd is away, and
//! nobody is reported as leaving for it. When etcd returns, the entry is published again
//! (under a new lease if the old one ran out) and the prefix listed anew; only what changed
//! meanwhile is reported, so no member joins twice. A member whose process dies leaves when
//! its lease runs out (the TTL, 5 s by default).
mod entry;
mod keeper;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use rdmalane::membership::{Member, MemberEvent, Membership};
use rdmalane::{Error, MembershipFailure, OpKind, Result};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::oneshot;

use keeper::{Cmd, Keeper};

/// Where the etcd directory is and how it is kept.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    connect_timeout: Duration,
}

impl EtcdOptions {
    /// The etcd at `endpoints` (`host:port`, or `http://host:port`), the cluster under
    /// `prefix` (clusters under different prefixes never see each other). Lease TTL 5 s,
    /// connect timeout 3 s.
    pub fn new<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
        prefix: impl Into<String>,
    ) -> EtcdOptions {
        EtcdOptions {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: prefix.into(),
            ttl: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
        }
    }

    /// From the environment, as a Kubernetes pod gets it: `RDMALANE_ETCD` (comma-separated
    /// endpoints) and `RDMALANE_CLUSTER` (the prefix, `/rdmalane` if unset); `None` when
    /// `RDMALANE_ETCD` is unset or empty.
    pub fn from_env() -> Option<EtcdOptions> {
        let endpoints = std::env::var("RDMALANE_ETCD").ok()?;
        let endpoints: Vec<String> =
            endpoints.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if endpoints.is_empty() {
            return None;
        }
        let prefix = std::env::var("RDMALANE_CLUSTER").unwrap_or_else(|_| "/rdmalane".into());
        Some(EtcdOptions::new(endpoints, prefix))
    }

    /// How long an entry outlives its runtime's last renewal: a member that dies is seen to
    /// leave within this (whole seconds, at least 1; etcd may round a short TTL up).
    pub fn ttl(mut self, ttl: Duration) -> EtcdOptions {
        self.ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// How long to wait for etcd to answer a connect or a request (3 s by default).
    pub fn connect_timeout(mut self, t: Duration) -> EtcdOptions {
        self.connect_timeout = t;
        self
    }
}

/// Membership in an etcd directory. Dropping it withdraws this runtime's entry (best
/// effort); [`Cluster::leave`](rdmalane::membership::Cluster::leave) does so and waits.
#[derive(Debug)]
pub struct EtcdMembership {
    opts: Arc<EtcdOptions>,
    cmds: UnboundedSender<Cmd>,
}

impl EtcdMembership {
    /// Connect to etcd. Fails within the connect timeout, with
    /// [`MembershipFailure::DirectoryUnreachable`], when etcd does not answer. Must be called
    /// within a tokio runtime (a task keeps the entry and the watch).
    pub async fn connect(opts: EtcdOptions) -> Result<EtcdMembership> {
        let opts = Arc::new(opts);
        let client = keeper::connect(&opts).await.map_err(|detail| unreachable(&opts, detail))?;
        let (cmds, rx) = unbounded_channel();
        tokio::spawn(Keeper::new(opts.clone(), client).run(rx));
        tracing::info!(etcd = ?opts.endpoints, prefix = %opts.prefix, "membership on etcd");
        Ok(EtcdMembership { opts, cmds })
    }

    /// Connect to etcd, or, if it does not answer, use `fallback` and log that it did.
    pub async fn connect_or(opts: EtcdOptions, fallback: impl Membership) -> Box<dyn Membership> {
        match EtcdMembership::connect(opts).await {
            Ok(m) => Box::new(m),
            Err(e) => {
                tracing::warn!(error = %e, fallback = fallback.name(), "etcd unreachable at start: using the fallback membership");
                Box::new(fallback)
            }
        }
    }

    fn ask(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), String>>) -> Cmd,
    ) -> BoxFuture<'_, Result<()>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.cmds.send(make(tx)).is_ok();
        let limit = self.opts.connect_timeout;
        async move {
            if !sent {
                return Err(failed(
                    &self.opts,
                    MembershipFailure::Directory,
                    "the membership task ended".into(),
                ));
            }
            match tokio::time::timeout(limit, rx).await {
                Ok(Ok(Ok(()))) => Ok(()),
                Ok(Ok(Err(detail))) => Err(failed(&self.opts, MembershipFailure::Directory, detail)),
                Ok(Err(_)) => {
                    Err(failed(&self.opts, MembershipFailure::Directory, "the membership task ended".into()))
                }
                Err(_) => Err(unreachable(&self.opts, format!("no answer within {} ms", limit.as_millis()))),
            }
        }
        .boxed()
    }
}

impl Membership for EtcdMembership {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn publish(&self, me: Member) -> BoxFuture<'_, Result<()>> {
        if me.id.is_none() {
            let e = Error::invalid(OpKind::Join, "a member published to etcd needs its runtime id");
            return async move { Err(e) }.boxed();
        }
        // The others drop an entry they cannot read: published, it would leave this member
        // invisible, with nothing to say so.
        if let Err(why) = entry::check(&self.opts.prefix, &me) {
            let e =
                Error::invalid(OpKind::Join, format!("the others would refuse this member's entry: {why}"));
            return async move { Err(e) }.boxed();
        }
        self.ask(|done| Cmd::Publish(me, done))
    }

    fn withdraw(&self) -> BoxFuture<'_, Result<()>> {
        self.ask(Cmd::Withdraw)
    }

    fn watch(&self) -> BoxStream<'static, MemberEvent> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let _ = self.cmds.send(Cmd::Watch(tx));
        rx.boxed()
    }
}

fn failed(opts: &EtcdOptions, why: MembershipFailure, detail: String) -> Error {
    Error::Membership {
        op: OpKind::Join,
        member: format!("etcd {:?}", opts.endpoints).into(),
        why,
        detail: detail.into(),
    }
}

fn unreachable(opts: &EtcdOptions, detail: String) -> Error {
    failed(opts, MembershipFailure::DirectoryUnreachable, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The only test that touches these variables.
    #[test]
    fn options_come_from_the_environment() {
        std::env::remove_var("RDMALANE_ETCD");
        assert!(EtcdOptions::from_env().is_none(), "unset: no etcd");
        std::env::set_var("RDMALANE_ETCD", " etcd-0:2379, ,etcd-1:2379 ");
        std::env::remove_var("RDMALANE_CLUSTER");
        let o = EtcdOptions::from_env().expect("set");
        assert_eq!(o.endpoints, ["etcd-0:2379", "etcd-1:2379"]);
        assert_eq!(o.prefix, "/rdmalane");
        std::env::set_var("RDMALANE_CLUSTER", "/prod");
        assert_eq!(EtcdOptions::from_env().expect("set").prefix, "/prod");
        std::env::set_var("RDMALANE_ETCD", " , ");
        assert!(EtcdOptions::from_env().is_none(), "empty: no etcd");
        assert_eq!(EtcdOptions::new(["x"], "/p").ttl(Duration::from_millis(10)).ttl, Duration::from_secs(1));
    }
}
