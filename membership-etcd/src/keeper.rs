//! The one task that talks to etcd: it keeps this runtime's entry published on a live lease,
//! follows the cluster's prefix, and tells each subscriber of each change once. When etcd goes
//! away it says so once, keeps taking commands, and retries with backoff; when etcd returns it
//! publishes again where the lease was lost and lists the prefix anew, reporting only what
//! changed meanwhile.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    WatchOptions,
};
use futures::channel::mpsc::UnboundedSender;
use rdmalane::membership::{Member, MemberEvent, MemberId};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use crate::entry;
use crate::EtcdOptions;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What the membership handle asks of the keeper.
pub(crate) enum Cmd {
    Publish(Member, oneshot::Sender<Result<(), String>>),
    Withdraw(oneshot::Sender<Result<(), String>>),
    Watch(UnboundedSender<MemberEvent>),
}

/// How a session with etcd ended, short of an error.
enum Exit {
    /// The handle is gone: the entry was withdrawn.
    Closed,
    /// Start over at once (a new publication, or a lease to replace).
    Again,
    /// Start over after a backoff: our entry was deleted under us, and whoever deletes it may
    /// keep doing so.
    Republish,
}

pub(crate) struct Keeper {
    opts: Arc<EtcdOptions>,
    client: Option<Client>,
    /// What to keep published; `None` before `publish` and after `withdraw`.
    me: Option<Member>,
    lease: Option<i64>,
    /// The create revision of our first publication since we last withdrew: published with
    /// the entry when it is put again under a new lease, so that we stay as old as we are.
    since: Option<u64>,
    /// Every entry in the prefix as last seen, ours included.
    known: BTreeMap<MemberId, Member>,
    subscribers: Vec<UnboundedSender<MemberEvent>>,
    /// Publications not yet in etcd, answered when they are.
    waiting: Vec<oneshot::Sender<Result<(), String>>>,
    /// etcd has been unreachable since we said so.
    offline: bool,
    backoff: Duration,
}

/// Run a request against etcd within the request timeout.
async fn call<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    read(limit, f).await.map_err(|(Read::TooLarge(why) | Read::Failed(why))| why)
}

/// A client that has answered a status request.
pub(crate) async fn connect(opts: &EtcdOptions) -> Result<Client, String> {
    let limit = opts.connect_timeout;
    let options = ConnectOptions::new()
        .with_connect_timeout(limit)
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
    let mut client = call(limit, Client::connect(opts.endpoints.clone(), Some(options))).await?;
    call(limit, client.status()).await?;
    Ok(client)
}

impl Keeper {
    pub(crate) fn new(opts: Arc<EtcdOptions>, client: Client) -> Keeper {
        Keeper {
            opts,
            client: Some(client),
            me: None,
            lease: None,
            since: None,
            known: BTreeMap::new(),
            subscribers: Vec::new(),
            waiting: Vec::new(),
            offline: false,
            backoff: MIN_BACKOFF,
        }
    }

    pub(crate) async fn run(mut self, mut cmds: UnboundedReceiver<Cmd>) {
        loop {
            match self.session(&mut cmds).await {
                Ok(Exit::Closed) => return,
                Ok(Exit::Again) => continue,
                Ok(Exit::Republish) => {}
                Err(why) => {
                    if !self.offline {
                        tracing::warn!(
                            etcd = ?self.opts.endpoints,
                            %why,
                            "etcd unreachable or failing: connected members keep working; retrying"
                        );
                        self.offline = true;
                    }
                    self.client = None;
                }
            }
            // Back off, still taking commands.
            let pause = tokio::time::sleep(self.backoff);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    _ = &mut pause => break,
                    c = cmds.recv() => match c {
                        Some(Cmd::Withdraw(done)) => {
                            self.revoke_between_sessions().await;
                            self.offline_cmd(Cmd::Withdraw(done));
                        }
                        Some(c) => self.offline_cmd(c),
                        None => {
                            self.revoke_between_sessions().await;
                            return;
                        }
                    },
                }
            }
            // Never wait longer than a third of the TTL: etcd, back from a restart, gives each
            // lease one TTL more, and ours must be renewed within it.
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF).min(self.opts.ttl / 3);
        }
    }

    /// A leave (or the handle's drop) between two sessions: revoke the lease where a client is
    /// at hand (a session that ended to publish again, whose etcd just answered), so that the
    /// others see the member leave now rather than once the lease runs out. Without one, or
    /// should etcd not answer, the entry goes with the lease as before.
    async fn revoke_between_sessions(&mut self) {
        if self.lease.is_none() {
            return;
        }
        let Some(mut client) = self.client.take() else { return };
        if let Err(why) = self.revoke(&mut client).await {
            tracing::debug!(%why, "etcd: revoking the lease on leaving failed; it runs out instead");
        }
        self.client = Some(client);
    }

    fn offline_cmd(&mut self, c: Cmd) {
        match c {
            Cmd::Publish(m, done) => {
                self.me = Some(m);
                self.waiting.push(done);
            }
            // Nothing renews the lease from now on: the entry goes when it runs out.
            Cmd::Withdraw(done) => {
                self.me = None;
                self.lease = None;
                self.since = None;
                let _ = done.send(Ok(()));
            }
            Cmd::Watch(tx) => self.subscribe(tx),
        }
    }

    async fn session(&mut self, cmds: &mut UnboundedReceiver<Cmd>) -> Result<Exit, String> {
        let limit = self.opts.connect_timeout;
        let mut client = match &self.client {
            Some(c) => c.clone(),
            None => {
                let c = connect(&self.opts).await?;
                self.client = Some(c.clone());
                c
            }
        };
        if self.me.is_some() {
            self.publish(&mut client).await?;
        }
        for w in self.waiting.drain(..) {
            let _ = w.send(Ok(()));
        }
        // The lease is renewed from here on (opening the stream renews it once), while the
        // directory is listed and watched: a listing that fails or takes long must not let
        // our entry lapse, which would cut every peer's endpoints to us.
        let mut keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)> = match self.lease {
            Some(id) => {
                Some(call(limit, client.lease_keep_alive(id)).await.map_err(|e| format!("keep-alive: {e}"))?)
            }
            None => None,
        };
        let mut tick = tokio::time::interval(self.opts.ttl / 3);
        tick.tick().await;
        let mut lister = client.clone();
        let (revision, ours_listed) = renewing(self.list(&mut lister), &mut keeper, &mut tick).await?;
        if self.me.is_some() && !ours_listed {
            // Deleted between our put and the listing (its lease may live): put it back.
            tracing::warn!("our entry was deleted while we are a member; publishing again");
            return Ok(Exit::Republish);
        }
        let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1).with_prev_key();
        let watching = call(limit, client.watch(entry::folder(&self.opts.prefix), Some(options)));
        let mut watch = renewing(watching, &mut keeper, &mut tick)
            .await
            .map_err(|e| format!("opening the watch: {e}"))?;
        if self.offline {
            tracing::info!(etcd = ?self.opts.endpoints, "etcd reachable again: entry and watch resumed");
            self.offline = false;
        }
        self.backoff = MIN_BACKOFF;
        loop {
            tokio::select! {
                m = watch.message() => match m.map_err(|e| format!("watch: {e}"))? {
                    None => return Err("the watch ended".into()),
                    Some(resp) if resp.canceled() => {
                        return Err(format!("the watch was cancelled (compacted at {})", resp.compact_revision()))
                    }
                    Some(resp) => {
                        let mut ours_gone = false;
                        for ev in resp.events() {
                            match (ev.event_type(), ev.kv()) {
                                (EventType::Put, Some(kv)) => self.put(kv.key(), kv.value(), kv.create_revision()),
                                (EventType::Delete, Some(kv)) => ours_gone |= self.deleted(kv.key()),
                                _ => {}
                            }
                        }
                        // Deleted while we are published and our lease may live (an operator
                        // cleared the prefix): put it back, or we are gone until an outage.
                        if ours_gone {
                            tracing::warn!("our entry was deleted while we are a member; publishing again");
                            return Ok(Exit::Republish);
                        }
                    }
                },
                _ = tick.tick(), if keeper.is_some() => renew(&mut keeper).await?,
                r = renewed(&mut keeper) => match r? {
                    // etcd forgot the lease (it ran out while we could not renew it): publish
                    // again under a new one.
                    Some(ttl) if ttl <= 0 => {
                        tracing::warn!("our lease ran out; publishing again");
                        self.lease = None;
                        return Ok(Exit::Again);
                    }
                    Some(_) => {}
                    None => return Err("the keep-alive stream ended".into()),
                },
                c = cmds.recv() => match c {
                    Some(Cmd::Watch(tx)) => self.subscribe(tx),
                    Some(Cmd::Publish(m, done)) => {
                        self.me = Some(m);
                        self.waiting.push(done);
                        return Ok(Exit::Again);
                    }
                    Some(Cmd::Withdraw(done)) => {
                        self.me = None;
                        self.since = None;
                        let r = self.revoke(&mut client).await;
                        let _ = done.send(r);
                        return Ok(Exit::Again);
                    }
                    None => {
                        let _ = self.revoke(&mut client).await;
                        return Ok(Exit::Closed);
                    }
                },
            }
        }
    }

    /// Put our entry on a live lease: the one we hold if etcd still has it, else a new one.
    async fn publish(&mut self, client: &mut Client) -> Result<(), String> {
        let limit = self.opts.connect_timeout;
        let Some(me) = self.me.clone() else { return Ok(()) };
        let alive = match self.lease {
            Some(id) => call(limit, client.lease_time_to_live(id, None)).await?.ttl() > 0,
            None => false,
        };
        if !alive {
            let ttl = self.opts.ttl.as_secs().max(1) as i64;
            self.lease = Some(call(limit, client.lease_grant(ttl, None)).await?.id());
        }
        let options = PutOptions::new().with_lease(self.lease.expect("granted above")).with_prev_key();
        let key = entry::key(&self.opts.prefix, me.id.expect("a published member has an id"));
        // `since` goes into the entry only where the key is not the one first published (it
        // was deleted, and this put makes it anew): an entry that never needs it stays
        // readable by a version that refuses fields it does not know.
        let since = match self.since {
            Some(first) => {
                let at =
                    call(limit, client.get(key.clone(), Some(GetOptions::new().with_keys_only()))).await?;
                let created = at.kvs().first().and_then(|kv| u64::try_from(kv.create_revision()).ok());
                (created != Some(first)).then_some(first)
            }
            None => None,
        };
        let resp = call(limit, client.put(key, entry::encode(&me, since), Some(options))).await?;
        if self.since.is_none() {
            // The key's create revision: the put's own where it made the key.
            let created = match resp.prev_key() {
                Some(kv) => kv.create_revision(),
                None => resp.header().map_or(0, |h| h.revision()),
            };
            self.since = u64::try_from(created).ok().filter(|&r| r > 0);
        }
        Ok(())
    }

    async fn revoke(&mut self, client: &mut Client) -> Result<(), String> {
        match self.lease.take() {
            Some(id) => call(self.opts.connect_timeout, client.lease_revoke(id)).await.map(drop),
            None => Ok(()),
        }
    }

    /// List the prefix; report what changed since we last knew it; return its revision, and
    /// whether our own key was there (however its value reads).
    async fn list(&mut self, client: &mut Client) -> Result<(i64, bool), String> {
        let folder = entry::folder(&self.opts.prefix);
        let (revision, kvs) = listing(client, &folder, self.opts.connect_timeout)
            .await
            .map_err(|e| format!("listing {folder}: {e}"))?;
        let ours = self.me.as_ref().and_then(|m| m.id).map(|id| entry::key(&self.opts.prefix, id));
        let ours_listed = kvs.iter().any(|(k, _, _)| ours.as_deref().map(str::as_bytes) == Some(&k[..]));
        let mut now = BTreeMap::new();
        for (key, value, created) in kvs {
            if let Some(m) = self.trusted(&key, &value, created) {
                now.insert(m.id.expect("decoded entries have ids"), m);
            }
        }
        let gone: Vec<MemberId> = self.known.keys().filter(|id| !now.contains_key(id)).copied().collect();
        for id in gone {
            let member = self.known.remove(&id).expect("listed above");
            self.tell(MemberEvent::Left {
                member,
                reason: "its entry was gone when we listed the directory again".into(),
            });
        }
        for m in now.into_values() {
            self.learned(m);
        }
        Ok((revision, ours_listed))
    }

    fn put(&mut self, key: &[u8], value: &[u8], revision: i64) {
        if let Some(m) = self.trusted(key, value, revision) {
            self.learned(m);
        }
    }

    /// `m` as an entry reads now: told as joined where it is new, and where its entry changed
    /// (its runtime published again under the same id with another address or label, which
    /// overwrites the key and deletes nothing), which the others take as an update.
    fn learned(&mut self, m: Member) {
        let id = m.id.expect("decoded entries have ids");
        if self.known.get(&id) != Some(&m) {
            self.known.insert(id, m.clone());
            self.tell(MemberEvent::Joined(m));
        }
    }

    /// An entry was deleted; returns whether it was ours while we are published.
    fn deleted(&mut self, key: &[u8]) -> bool {
        let Some(id) = entry::id_of(&self.opts.prefix, key) else { return false };
        if let Some(member) = self.known.remove(&id) {
            let reason = "its entry was deleted (it left, or its lease ran out)".into();
            self.tell(MemberEvent::Left { member, reason });
        }
        self.me.as_ref().and_then(|m| m.id) == Some(id)
    }

    /// The member an entry describes, or `None` (and a warning) when it does not add up.
    fn trusted(&self, key: &[u8], value: &[u8], revision: i64) -> Option<Member> {
        match entry::decode(&self.opts.prefix, key, value, revision) {
            Ok(m) => Some(m),
            Err(why) => {
                tracing::warn!(key = %String::from_utf8_lossy(key), %why, "ignoring an entry in the cluster's prefix");
                None
            }
        }
    }

    fn subscribe(&mut self, tx: UnboundedSender<MemberEvent>) {
        for m in self.known.values() {
            let _ = tx.unbounded_send(MemberEvent::Joined(m.clone()));
        }
        self.subscribers.push(tx);
    }

    fn tell(&mut self, ev: MemberEvent) {
        self.subscribers.retain(|s| s.unbounded_send(ev.clone()).is_ok());
    }
}

/// Entries read per request while listing: a reply holds at most this many values, so valid
/// entries (64 KiB at most each) stay far below the client's 4 MiB reply limit.
const PAGE: i64 = 32;

/// Every key under `folder` with its value and create revision, and the revision it was read
/// at, a page at a time. A page that cannot be read whole (values too large for one reply,
/// which no entry of ours is) is read a key at a time, and a key whose value alone is too large
/// is left out with a warning.
async fn listing(client: &mut Client, folder: &str, limit: Duration) -> Result<(i64, Vec<Kv>), String> {
    let end = prefix_end(folder.as_bytes());
    let mut from = folder.as_bytes().to_vec();
    let mut revision = 0;
    let mut out = Vec::new();
    let whole = |kv: &etcd_client::KeyValue| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision());
    loop {
        // Every page at the first one's revision: one consistent listing.
        let at = |o: GetOptions| if revision > 0 { o.with_revision(revision) } else { o };
        let page = at(GetOptions::new().with_range(end.clone()).with_limit(PAGE));
        let (kvs, more, last, rev) = match read(limit, client.get(from.clone(), Some(page))).await {
            Ok(r) => {
                let last = r.kvs().last().map(|kv| kv.key().to_vec());
                (
                    r.kvs().iter().map(whole).collect::<Vec<Kv>>(),
                    r.more(),
                    last,
                    r.header().map_or(0, |h| h.revision()),
                )
            }
            // Only a reply too large for the client is read again a key at a time; any other
            // failure ends the listing (a listing that skipped a live member would report it
            // gone).
            Err(Read::TooLarge(why)) => {
                let keys = at(GetOptions::new().with_range(end.clone()).with_limit(PAGE).with_keys_only());
                let r = call(limit, client.get(from.clone(), Some(keys))).await?;
                let rev = if revision > 0 { revision } else { r.header().map_or(0, |h| h.revision()) };
                let mut kvs = Vec::new();
                for k in r.kvs() {
                    match read(limit, client.get(k.key(), Some(GetOptions::new().with_revision(rev)))).await {
                        Ok(v) => kvs.extend(v.kvs().iter().map(whole)),
                        Err(Read::TooLarge(alone)) => tracing::warn!(
                            key = %String::from_utf8_lossy(k.key()), why = %alone, page = %why,
                            "ignoring an entry in the cluster's prefix too large to read"
                        ),
                        Err(Read::Failed(e)) => return Err(e),
                    }
                }
                (kvs, r.more(), r.kvs().last().map(|kv| kv.key().to_vec()), rev)
            }
            Err(Read::Failed(e)) => return Err(e),
        };
        if revision == 0 {
            revision = rev;
        }
        out.extend(kvs);
        match (more, last) {
            // The next page starts just past the last key of this one.
            (true, Some(mut next)) => {
                next.push(0);
                from = next;
            }
            _ => return Ok((revision, out)),
        }
    }
}

/// How a read failed: with a reply larger than the client takes (gRPC's "out of range" or
/// "resource exhausted"), or otherwise.
enum Read {
    TooLarge(String),
    Failed(String),
}

/// A request to etcd within `limit`, its failures told apart (see [`Read`]).
async fn read<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Read> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if too_large(s.code() as i32, s.message()) => {
            Err(Read::TooLarge(s.to_string()))
        }
        Ok(Err(e)) => Err(Read::Failed(e.to_string())),
        Err(_) => Err(Read::Failed(format!("no answer within {} ms", limit.as_millis()))),
    }
}

/// Does a gRPC status with `code` and `message` say the reply was larger than the client takes?
/// RESOURCE_EXHAUSTED (8) does; OUT_OF_RANGE (11) does from the client's decoder, but etcd
/// answers a read at a compacted (or future) revision with the same code: a listing that took
/// that for a reply too large would skip live members' keys and report them gone.
fn too_large(code: i32, message: &str) -> bool {
    code == 8 || (code == 11 && !message.contains("revision"))
}

/// A key, its value and its create revision.
type Kv = (Vec<u8>, Vec<u8>, i64);

/// The end of the range of keys that start with `prefix` (etcd's prefix convention).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("not empty") += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// Await `f` while renewing the lease at each tick.
async fn renewing<T>(
    f: impl std::future::Future<Output = Result<T, String>>,
    keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    tick: &mut tokio::time::Interval,
) -> Result<T, String> {
    tokio::pin!(f);
    loop {
        tokio::select! {
            r = &mut f => return r,
            _ = tick.tick(), if keeper.is_some() => renew(keeper).await?,
        }
    }
}

/// Ask etcd to renew the lease we keep (its answer comes on the keep-alive stream).
async fn renew(keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>) -> Result<(), String> {
    match keeper {
        Some((k, _)) => k.keep_alive().await.map_err(|e| format!("keep-alive: {e}")),
        None => Ok(()),
    }
}

/// The next keep-alive answer's TTL; pending when there is no lease to keep.
async fn renewed(keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>) -> Result<Option<i64>, String> {
    match keeper {
        Some((_, stream)) => {
            stream.message().await.map(|r| r.map(|r| r.ttl())).map_err(|e| format!("keep-alive: {e}"))
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::too_large;

    #[test]
    fn a_compacted_revision_is_no_reply_too_large() {
        assert!(too_large(8, "grpc: received message larger than max"));
        assert!(too_large(
            11,
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes"
        ));
        assert!(!too_large(11, "etcdserver: mvcc: required revision has been compacted"));
        assert!(!too_large(11, "etcdserver: mvcc: required revision is a future revision"));
        assert!(!too_large(14, "transport error"));
    }
}
