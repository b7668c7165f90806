//! A fixed list of addresses: membership that needs nothing.
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

use super::{Member, MemberEvent, Membership};
use crate::base::error::Result;

/// Members given as a list of addresses, each labelled by its address. Publishing tells no
/// one (the others have us on their lists) and nobody ever leaves the list: a peer that goes
/// away is noticed by its control connection, as with [`Runtime::connect`](crate::Runtime::connect).
#[derive(Debug, Clone, Default)]
pub struct StaticMembership {
    members: Vec<Member>,
}

impl StaticMembership {
    /// The members at `addrs` (`host:port`, where each listens).
    pub fn new<S: Into<String>>(addrs: impl IntoIterator<Item = S>) -> StaticMembership {
        let members = addrs
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let addr: String = a.into();
                Member {
                    id: None,
                    label: addr.clone(),
                    addr,
                    provider: None,
                    rails: None,
                    meta: Default::default(),
                    revision: i as u64,
                }
            })
            .collect();
        StaticMembership { members }
    }
}

impl Membership for StaticMembership {
    fn name(&self) -> &'static str {
        "static"
    }

    fn publish(&self, _me: Member) -> BoxFuture<'_, Result<()>> {
        async { Ok(()) }.boxed()
    }

    fn withdraw(&self) -> BoxFuture<'_, Result<()>> {
        async { Ok(()) }.boxed()
    }

    fn watch(&self) -> BoxStream<'static, MemberEvent> {
        let joined: Vec<MemberEvent> = self.members.iter().cloned().map(MemberEvent::Joined).collect();
        futures::stream::iter(joined).chain(futures::stream::pending()).boxed()
    }
}
