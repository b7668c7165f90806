//! A runtime in a cluster: listening, published, following the directory, connecting by id
//! or label, and losing the endpoints of members that leave.
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::table::Table;
use super::{Member, MemberEvent, MemberId, Membership};
use crate::base::error::{Error, MembershipFailure, OpKind, Result};
use crate::bootstrap::{Listener, LossSwitch};
use crate::endpoint::Endpoint;
use crate::runtime::Runtime;

/// How a runtime joins: its label, where it listens, what it tells the others.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    label: String,
    listen: String,
    advertise: Option<String>,
    meta: BTreeMap<String, String>,
}

impl JoinOptions {
    /// Join as `label`, listening on `127.0.0.1:0` (a port the system picks).
    pub fn new(label: impl Into<String>) -> JoinOptions {
        JoinOptions {
            label: label.into(),
            listen: "127.0.0.1:0".into(),
            advertise: None,
            meta: BTreeMap::new(),
        }
    }

    /// Listen for handshakes on `addr` instead.
    pub fn listen(mut self, addr: impl Into<String>) -> JoinOptions {
        self.listen = addr.into();
        self
    }

    /// Publish `addr` as where to reach us (needed when listening on `0.0.0.0`, or behind a
    /// translated address); by default the listener's own address.
    pub fn advertise(mut self, addr: impl Into<String>) -> JoinOptions {
        self.advertise = Some(addr.into());
        self
    }

    /// Publish `key = value` with the entry.
    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> JoinOptions {
        self.meta.insert(key.into(), value.into());
        self
    }
}

/// This runtime as a member of a cluster.
///
/// Call order: [`join`](Cluster::join) (listen, follow the directory, publish); then any of
/// [`events`](Cluster::events), [`members`](Cluster::members), [`connect`](Cluster::connect),
/// [`connect_label`](Cluster::connect_label), [`accept`](Cluster::accept); last
/// [`leave`](Cluster::leave), which the others see at once. Dropping the cluster drops its
/// directory, which withdraws the entry too (etcd: the lease is revoked, best effort); a
/// process that dies is seen to leave when its lease runs out.
///
/// A member leaving makes every endpoint to it (connected or accepted through this cluster)
/// lost, so its ops fail with [`Error::PeerLost`].
pub struct Cluster {
    shared: Arc<Shared>,
    follow: tokio::task::JoinHandle<()>,
}

struct Shared {
    rt: Runtime,
    listener: Listener,
    directory: Arc<dyn Membership>,
    me: Member,
    state: Mutex<State>,
}

struct State {
    table: Table,
    subscribers: Vec<UnboundedSender<MemberEvent>>,
    /// The endpoints each member has, held weakly: their loss switches.
    links: HashMap<MemberId, Vec<Weak<LossSwitch>>>,
    /// How many members `links` may name before it is swept of endpoints that are gone.
    sweep_at: usize,
    /// The members that left most recently (at most [`LEFT_KEPT`]), and why: a handshake
    /// they made before leaving may be accepted after, and its endpoint is lost at once.
    left: VecDeque<(MemberId, String)>,
}

/// Members that left remembered for endpoints accepted late.
const LEFT_KEPT: usize = 1024;

/// The fewest members `links` names before it is first swept.
const SWEEP_MIN: usize = 64;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("me", &self.shared.me.name())
            .field("directory", &self.shared.directory.name())
            .finish()
    }
}

impl Cluster {
    /// Listen, follow `directory`, and publish this runtime in it. Must be called within a
    /// tokio runtime. Fails as the listener or the directory's publication fails (an etcd
    /// that does not answer: [`MembershipFailure::DirectoryUnreachable`]).
    pub async fn join(rt: &Runtime, directory: impl Membership, opts: JoinOptions) -> Result<Cluster> {
        let listener = rt.listen(opts.listen.as_str()).await?;
        let bound = listener.local_addr()?;
        let addr = match opts.advertise {
            Some(a) => a,
            None if bound.ip().is_unspecified() => {
                return Err(Error::invalid(
                    OpKind::Join,
                    format!("listening on {bound}: say which address to publish (JoinOptions::advertise)"),
                ))
            }
            None => bound.to_string(),
        };
        let me = Member {
            id: Some(MemberId(rt.id())),
            label: opts.label,
            addr,
            provider: Some(rt.provider().to_string()),
            rails: Some(rt.rail_bytes().len()),
            meta: opts.meta,
            revision: 0,
        };
        let directory: Arc<dyn Membership> = Arc::new(directory);
        let state = State {
            table: Table::new(MemberId(rt.id()), me.addr.clone()),
            subscribers: Vec::new(),
            links: HashMap::new(),
            sweep_at: SWEEP_MIN,
            left: VecDeque::new(),
        };
        let shared = Arc::new(Shared { rt: rt.clone(), listener, directory, me, state: Mutex::new(state) });
        // Follow before publishing, so no member that joins in between is missed.
        let mut changes = shared.directory.watch();
        let weak = Arc::downgrade(&shared);
        let follow = tokio::spawn(async move {
            while let Some(ev) = changes.next().await {
                match weak.upgrade() {
                    Some(s) => s.on_event(ev),
                    None => return,
                }
            }
        });
        let cluster = Cluster { shared, follow };
        cluster.shared.directory.publish(cluster.shared.me.clone()).await?;
        tracing::info!(
            me = %cluster.shared.me.name(),
            addr = %cluster.shared.me.addr,
            directory = cluster.shared.directory.name(),
            "joined the cluster"
        );
        Ok(cluster)
    }

    /// This runtime's entry, as published.
    pub fn me(&self) -> &Member {
        &self.shared.me
    }

    /// The listener's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listener.local_addr().expect("a bound listener has an address")
    }

    /// The other members now, oldest publication first.
    pub fn members(&self) -> Vec<Member> {
        self.shared.lock().table.members()
    }

    /// The members there now, each as a `Joined`, then each change as it happens (never a
    /// member twice, never this runtime). Each call gives a stream of its own.
    pub fn events(&self) -> Events {
        let (tx, rx) = unbounded_channel();
        let mut st = self.shared.lock();
        for m in st.table.members() {
            let _ = tx.send(MemberEvent::Joined(m));
        }
        st.subscribers.push(tx);
        Events { rx }
    }

    /// Wait up to `within` for a member labelled `label` and return its newest entry.
    pub async fn wait_for(&self, label: &str, within: Duration) -> Result<Member> {
        let mut events = self.events();
        let found = tokio::time::timeout(within, async {
            while let Some(ev) = events.next().await {
                if let MemberEvent::Joined(m) = ev {
                    // It may have left again already: then wait on for another.
                    let newest = (m.label == label).then(|| self.shared.lock().table.newest(label).cloned());
                    if let Some(Some(m)) = newest {
                        return Some(m);
                    }
                }
            }
            None
        });
        match found.await {
            Ok(Some(m)) => Ok(m),
            _ => Err(unknown(label, format!("none joined within {} ms", within.as_millis()))),
        }
    }

    /// Connect to the member `id`. Refused before any traffic when the entry is unknown,
    /// superseded by a newer one under its label, or names another provider; refused after
    /// the handshake when the runtime answering at its address is not `id`.
    pub async fn connect(&self, id: MemberId) -> Result<Endpoint> {
        let member = {
            let st = self.shared.lock();
            st.table.by_id(id).cloned().map_err(|(why, detail)| Error::Membership {
                op: OpKind::Connect,
                member: id.to_string().into(),
                why,
                detail: detail.into(),
            })?
        };
        self.connect_member(member).await
    }

    /// Connect to the newest member labelled `label` (with a static list, its address).
    pub async fn connect_label(&self, label: &str) -> Result<Endpoint> {
        let member = self.shared.lock().table.newest(label).cloned();
        match member {
            Some(m) => self.connect_member(m).await,
            None => Err(unknown(label, "not in the directory".into())),
        }
    }

    /// The next member that connected to us (see [`Listener::accept`]). If it is or becomes
    /// a member that leaves, the endpoint is lost with it (also where it left between its
    /// handshake and this call: its ops then fail with [`Error::PeerLost`] at once).
    pub async fn accept(&self) -> Result<Endpoint> {
        let ep = self.shared.listener.accept().await?;
        let id = MemberId(ep.peer_id());
        self.shared.link(id, &ep);
        let gone = self.shared.lock().left.iter().find(|(l, _)| *l == id).map(|(_, why)| why.clone());
        if let (Some(why), Some(switch)) = (gone, ep.loss_switch().and_then(|w| w.upgrade())) {
            switch.trip(why);
        }
        Ok(ep)
    }

    /// Withdraw this runtime's entry: the others see it leave at once, and lose their
    /// endpoints to us. Ours stay usable; dropping the cluster stops listening.
    pub async fn leave(&self) -> Result<()> {
        self.shared.directory.withdraw().await
    }

    async fn connect_member(&self, m: Member) -> Result<Endpoint> {
        let ours = self.shared.rt.provider();
        if let Some(theirs) = m.provider.as_deref().filter(|p| *p != ours) {
            return Err(mismatch(
                &m,
                MembershipFailure::ProviderMismatch,
                format!("it runs {theirs}, we run {ours}"),
            ));
        }
        let ep = self.shared.rt.connect(m.addr.as_str()).await?;
        let Some(id) = m.id else { return Ok(ep) };
        if ep.peer_id() != id.0 {
            let detail = format!("runtime {:016x} answered at {}", ep.peer_id(), m.addr);
            return Err(mismatch(&m, MembershipFailure::IdMismatch, detail));
        }
        self.shared.link(id, &ep);
        // It may have left while we connected; then this endpoint would never hear of it.
        if !self.shared.lock().table.has(id) {
            return Err(unknown(&m.name(), "it left while we connected".into()));
        }
        Ok(ep)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.follow.abort();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_event(&self, ev: MemberEvent) {
        let mut st = self.lock();
        let Some(news) = st.table.apply(ev) else { return };
        if let MemberEvent::Left { member, reason } = &news {
            tracing::info!(member = %member.name(), %reason, "member left");
            let why = format!("{} left the cluster: {reason}", member.name());
            let switches = member.id.and_then(|id| st.links.remove(&id)).unwrap_or_default();
            for s in switches.iter().filter_map(Weak::upgrade) {
                s.trip(why.clone());
            }
            if let Some(id) = member.id {
                if st.left.len() == LEFT_KEPT {
                    st.left.pop_front();
                }
                st.left.push_back((id, why));
            }
        } else {
            tracing::info!(member = %news.member().name(), addr = %news.member().addr, "member joined");
            if let Some(id) = news.member().id {
                st.left.retain(|(l, _)| *l != id);
            }
        }
        st.subscribers.retain(|s| s.send(news.clone()).is_ok());
    }

    fn link(&self, id: MemberId, ep: &Endpoint) {
        if let Some(s) = ep.loss_switch() {
            let mut st = self.lock();
            let list = st.links.entry(id).or_default();
            list.retain(|w| w.strong_count() > 0);
            list.push(s);
            // Peers that never leave through the directory (a static list reports no leaves)
            // would stay named here for good: sweep those whose endpoints are all gone, as
            // seldom as the map doubles.
            if st.links.len() >= st.sweep_at {
                st.links.retain(|_, l| {
                    l.retain(|w| w.strong_count() > 0);
                    !l.is_empty()
                });
                st.sweep_at = (2 * st.links.len()).max(SWEEP_MIN);
            }
        }
    }
}

fn unknown(member: &str, detail: String) -> Error {
    Error::Membership {
        op: OpKind::Connect,
        member: member.into(),
        why: MembershipFailure::UnknownMember,
        detail: detail.into(),
    }
}

fn mismatch(m: &Member, why: MembershipFailure, detail: String) -> Error {
    Error::Membership { op: OpKind::Connect, member: m.name().into(), why, detail: detail.into() }
}

/// The cluster's changes, as [`Cluster::events`] gives them: a [`Stream`], or
/// [`next`](Events::next) for one at a time.
#[derive(Debug)]
pub struct Events {
    rx: UnboundedReceiver<MemberEvent>,
}

impl Events {
    /// The next change; `None` once the cluster is gone.
    pub async fn next(&mut self) -> Option<MemberEvent> {
        self.rx.recv().await
    }
}

impl Stream for Events {
    type Item = MemberEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<MemberEvent>> {
        self.rx.poll_recv(cx)
    }
}
