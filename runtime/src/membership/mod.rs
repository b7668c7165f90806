//! Membership: which runtimes make up a cluster, as they come and go.
//!
//! A [`Membership`] is a directory of members. Two ship with rdmalane: [`StaticMembership`], a
//! list of addresses that needs nothing (the embedded default, and what `Runtime::connect`
//! always did), and, in the `rdmalane-etcd` crate, an etcd directory where each runtime
//! publishes itself on a lease it keeps alive and watches the others.
//!
//! A [`Cluster`] puts a runtime in one: it listens, publishes this runtime's entry, follows the
//! directory, and connects by member id or label. When a member's entry leaves the directory
//! (a clean leave, or a lease that expired because its process died), a
//! [`MemberEvent::Left`] fires and every endpoint to it is declared lost: its ops fail with
//! [`Error::PeerLost`](crate::Error::PeerLost), as when its control connection closes.
//!
//! Entries are claims, not facts. Before any traffic, a connect checks the entry's provider
//! against ours and the id of the runtime that answers at its address against the entry's;
//! of two entries with one label, only the newer gets traffic (a restarted runtime's old entry
//! lingers until its lease runs out).
mod cluster;
mod static_list;
mod table;

use std::collections::BTreeMap;
use std::fmt;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::base::error::Result;

pub use cluster::{Cluster, Events, JoinOptions};
pub use static_list::StaticMembership;

/// A member by the id of its runtime ([`Runtime::id`](crate::Runtime::id)); it changes when
/// the process restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(pub u64);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One member's entry, as its runtime published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its runtime's id; `None` in a static list, which knows addresses only.
    pub id: Option<MemberId>,
    /// The application's name for it (`"prefill-3"`); a restarted runtime keeps its label
    /// and gets a new id.
    pub label: String,
    /// Where it listens for handshakes (`host:port`).
    pub addr: String,
    /// Its provider (`tcp;ofi_rxm`, `shm`, `efa`, `verbs`); `None` where the directory does
    /// not say.
    pub provider: Option<String>,
    /// How many rails it has; `None` where the directory does not say.
    pub rails: Option<usize>,
    /// Whatever the application published with it.
    pub meta: BTreeMap<String, String>,
    /// The directory's order of publication (etcd: the create revision of the member's first
    /// publication, which a member published again under a new lease keeps; static: the
    /// position in the list): of two entries with one label, the higher is the newer.
    pub revision: u64,
}

impl Member {
    /// How errors and logs name it: the label, and the id where there is one.
    pub fn name(&self) -> String {
        match self.id {
            Some(id) => format!("{}#{id}", self.label),
            None => self.label.clone(),
        }
    }
}

/// A change in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// A member published its entry (or was there when the stream began).
    Joined(Member),
    /// A member's entry left the directory: it left, or its lease expired.
    Left {
        /// The entry that left.
        member: Member,
        /// How it was noticed.
        reason: String,
    },
}

impl MemberEvent {
    /// The member the event is about.
    pub fn member(&self) -> &Member {
        match self {
            MemberEvent::Joined(m) | MemberEvent::Left { member: m, .. } => m,
        }
    }
}

/// A directory of members: where a runtime publishes itself and learns of the others.
///
/// Implementations keep their publication alive on their own (renewing leases, publishing
/// again after the directory comes back) and never report a member twice: a stream's
/// `Joined` and `Left` alternate for any one id. While the directory is unreachable they
/// report nothing: members connected already keep working.
pub trait Membership: Send + Sync + 'static {
    /// The backend's name, for logs and errors (`"static"`, `"etcd"`).
    fn name(&self) -> &'static str;

    /// Publish `me` and keep it published until [`withdraw`](Self::withdraw) or drop.
    fn publish(&self, me: Member) -> BoxFuture<'_, Result<()>>;

    /// Take back what [`publish`](Self::publish) published: the others see a `Left` at once
    /// rather than when a lease runs out.
    fn withdraw(&self) -> BoxFuture<'_, Result<()>>;

    /// The members there now, each as a `Joined`, then every change, for as long as the
    /// stream is held. Each call gives a stream of its own; it includes this runtime's own
    /// entry.
    fn watch(&self) -> BoxStream<'static, MemberEvent>;
}

impl Membership for Box<dyn Membership> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn publish(&self, me: Member) -> BoxFuture<'_, Result<()>> {
        (**self).publish(me)
    }

    fn withdraw(&self) -> BoxFuture<'_, Result<()>> {
        (**self).withdraw()
    }

    fn watch(&self) -> BoxStream<'static, MemberEvent> {
        (**self).watch()
    }
}
