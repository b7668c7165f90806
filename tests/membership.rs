//! Membership on a real etcd (Debian's `etcd-server`, started per test on ports it picks):
//! join, clean leave, a killed member, etcd restarted and away for 10 s, two clusters under
//! different prefixes, entries that lie, a restarted runtime's stale entry, etcd unreachable
//! at start, an entry deleted under a live lease, values too large for one listing, a member
//! back from past its lease beside its replacement, a handshake accepted after its member
//! left; and the static list, which needs no etcd.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdmalane::membership::{Cluster, JoinOptions, MemberEvent, MemberId, StaticMembership};
use rdmalane::{Access, Endpoint, Error, MembershipFailure, RegisteredBuf, RemoteBuf, Runtime};
use rdmalane_conformance::etcd::EtcdServer;
use rdmalane_conformance::{bounded, expose_to, filled, main_provider, providers, runtime};
use rdmalane_etcd::{EtcdMembership, EtcdOptions};

/// Short leases, so a killed member leaves quickly.
const TTL: Duration = Duration::from_secs(2);

fn prefix(test: &str) -> String {
    format!("/rdmalane-test/{test}-{}", std::process::id())
}

async fn directory(etcd: &EtcdServer, prefix: &str) -> EtcdMembership {
    let opts = EtcdOptions::new([etcd.endpoint()], prefix).ttl(TTL).connect_timeout(Duration::from_secs(2));
    EtcdMembership::connect(opts).await.expect("etcd")
}

async fn join(rt: &Runtime, etcd: &EtcdServer, prefix: &str, label: &str) -> Cluster {
    Cluster::join(rt, directory(etcd, prefix).await, JoinOptions::new(label)).await.expect("join")
}

/// Members `a` and `b` of the cluster under `pre`, once `a` has seen `b`.
async fn two_members(etcd: &EtcdServer, pre: &str) -> (Runtime, Runtime, Cluster, Cluster) {
    let (ra, rb) = (runtime(main_provider()), runtime(main_provider()));
    let a = join(&ra, etcd, pre, "a").await;
    let b = join(&rb, etcd, pre, "b").await;
    a.wait_for("b", Duration::from_secs(5)).await.expect("a sees b");
    (ra, rb, a, b)
}

/// An address where nobody listens (bound, then let go).
fn dead_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

fn id(rt: &Runtime) -> MemberId {
    MemberId(rt.id())
}

/// The next event within `secs`, or a failure naming what was awaited.
async fn next(events: &mut rdmalane::membership::Events, secs: u64, what: &str) -> MemberEvent {
    match tokio::time::timeout(Duration::from_secs(secs), events.next()).await {
        Ok(Some(ev)) => ev,
        Ok(None) => panic!("{what}: the event stream ended"),
        Err(_) => panic!("{what}: no event within {secs} s"),
    }
}

/// `a` connects to `b` (runtime `rb`) by id, `b` accepts, and a write over the pair lands.
async fn works_again(a: &Cluster, b: &Cluster, rb: &Runtime, seed: u64) {
    let (ea, eb) = tokio::join!(a.connect(id(rb)), b.accept());
    let link = Link::new(ea.expect("connect again"), eb.expect("accept")).await;
    link.write(seed).await.expect("b works again");
}

/// The next event within `secs` is `id` leaving.
async fn left(events: &mut rdmalane::membership::Events, secs: u64, what: &str, id: MemberId) {
    match next(events, secs, what).await {
        MemberEvent::Left { member, .. } => assert_eq!(member.id, Some(id), "{what}"),
        ev => panic!("{what}: expected {id} to leave, saw {ev:?}"),
    }
}

/// The next event within `secs` is `id` joining.
async fn joined(events: &mut rdmalane::membership::Events, secs: u64, what: &str, id: MemberId) {
    match next(events, secs, what).await {
        MemberEvent::Joined(m) => assert_eq!(m.id, Some(id), "{what}"),
        ev => panic!("{what}: expected {id} to join, saw {ev:?}"),
    }
}

/// `b` exposes 64 KiB to `a` over their endpoints; `a` writes a pattern into it and `b`'s
/// memory is checked: the pair works.
struct Link {
    a: Endpoint,
    /// Held: dropping it would lose the peer.
    _b: Endpoint,
    target: rdmalane::ExposedBuf<RegisteredBuf>,
    remote: RemoteBuf,
}

impl Link {
    async fn new(a: Endpoint, b: Endpoint) -> Link {
        let (target, remote) = expose_to(&b, &a, 64 << 10, Access::READ_WRITE).await;
        Link { a, _b: b, target, remote }
    }

    /// `a` connects to `b`'s label `"b"`, `b` accepts.
    async fn between(a: &Cluster, b: &Cluster) -> Link {
        let (ea, eb) = tokio::join!(a.connect_label("b"), b.accept());
        Link::new(ea.expect("connect"), eb.expect("accept")).await
    }

    async fn write(&self, seed: u64) -> Result<(), Error> {
        let (want, src) = filled(self.a.runtime(), 64 << 10, seed);
        self.a.write_remote(src, &self.remote).await.0?;
        assert!(self.target.as_slice() == &want[..], "the bytes arrived (seed {seed})");
        Ok(())
    }
}

#[test]
fn members_find_each_other_and_connect_by_label_and_id() {
    let etcd = EtcdServer::start();
    for p in providers() {
        bounded(60, async {
            let pre = prefix(&format!("join-{}", p.replace(';', "_")));
            let (ra, rb) = (runtime(p), runtime(p));
            let a = join(&ra, &etcd, &pre, "a").await;
            let opts = JoinOptions::new("b").meta("role", "store");
            let b = Cluster::join(&rb, directory(&etcd, &pre).await, opts).await.expect("join b");
            let seen = a.wait_for("b", Duration::from_secs(5)).await.expect("a sees b");
            assert_eq!(seen.id, Some(id(&rb)));
            assert_eq!(seen.addr, b.local_addr().to_string());
            assert_eq!(seen.provider.as_deref(), Some(rb.provider()));
            assert_eq!(seen.meta.get("role").map(String::as_str), Some("store"));
            let mut events = b.events();
            match next(&mut events, 5, "b sees a").await {
                MemberEvent::Joined(m) => {
                    assert_eq!((m.id, &m.label, &m.addr), (Some(id(&ra)), &a.me().label, &a.me().addr), "{p}")
                }
                ev => panic!("{p}: b saw {ev:?} first"),
            }

            let (ea, eb) = tokio::join!(a.connect_label("b"), b.accept());
            let (ea, eb) = (ea.expect("connect by label"), eb.expect("accept"));
            assert_eq!(ea.peer_id(), rb.id());
            let link = Link::new(ea, eb).await;
            link.write(1).await.expect("write by label");
            let (ea2, eb2) = tokio::join!(a.connect(id(&rb)), b.accept());
            let link2 = Link::new(ea2.expect("connect by id"), eb2.expect("accept")).await;
            link2.write(2).await.expect("write by id");
            assert_eq!(a.members().len(), 1, "{p}: one other member");
        });
    }
}

#[test]
fn a_clean_leave_is_seen_at_once_and_loses_its_endpoints() {
    let etcd = EtcdServer::start();
    bounded(60, async {
        let (_ra, rb, a, b) = two_members(&etcd, &prefix("leave")).await;
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        let link = Link::between(&a, &b).await;
        link.write(1).await.expect("before the leave");

        let t0 = Instant::now();
        b.leave().await.expect("leave");
        left(&mut events, 5, "the leave", id(&rb)).await;
        // A revoked lease is seen at once, not after its TTL.
        assert!(t0.elapsed() < TTL, "seen {:?} after the leave", t0.elapsed());
        let t1 = Instant::now();
        loop {
            match link.write(2).await {
                Err(e) => {
                    assert!(e.is_peer_lost(), "a write to a member that left: {e}");
                    assert!(e.to_string().contains("left the cluster"), "the reason says so: {e}");
                    break;
                }
                Ok(()) => {
                    assert!(t1.elapsed() < Duration::from_secs(5), "writes still succeed 5 s after b left")
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(a.members().is_empty());
        let e = a.connect(id(&rb)).await.expect_err("b is gone");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::UnknownMember, .. }), "{e}");
    });
}

#[test]
fn a_killed_member_leaves_within_its_lease() {
    let etcd = EtcdServer::start();
    let p = main_provider();
    let pre = prefix("crash");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_member"));
    cmd.args([etcd.endpoint().as_str(), pre.as_str(), "child", p, &TTL.as_secs().to_string()]);
    let (mut child, _out, said) = spawn_member(cmd);
    bounded(60, async {
        let ra = runtime(p);
        let a = join(&ra, &etcd, &pre, "a").await;
        let child_entry = a.wait_for("child", Duration::from_secs(10)).await.expect("a sees the child");
        assert_eq!(child_entry.id.map(|i| i.to_string()), Some(said.clone()));
        let ep = a.connect_label("child").await.expect("connect");
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));

        let t0 = Instant::now();
        child.kill().expect("SIGKILL the child");
        let _ = child.wait();
        match next(&mut events, 10, "the killed member's leave").await {
            MemberEvent::Left { member, .. } => assert_eq!(member.label, "child"),
            ev => panic!("expected the child to leave, saw {ev:?}"),
        }
        let took = t0.elapsed();
        // etcd checks expiry about every 500 ms and may round a short TTL up a little.
        assert!(took <= TTL + Duration::from_millis(1500), "left {took:?} after the kill (TTL {TTL:?})");
        eprintln!("leave detected {} ms after SIGKILL (TTL {} s)", took.as_millis(), TTL.as_secs());
        let (res, _) = ep.send(ra.alloc(8).expect("alloc")).await;
        assert!(res.expect_err("the child is dead").is_peer_lost());
    });
}

#[test]
fn a_member_whose_lease_runs_out_is_lost_and_then_publishes_again() {
    let etcd = EtcdServer::start();
    bounded(60, async {
        let pre = prefix("expired");
        let (_ra, rb, a, b) = two_members(&etcd, &pre).await;
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        let link = Link::between(&a, &b).await;
        link.write(1).await.expect("before the lease goes");

        // The lease goes while b lives and its connections stay open (an operator revoked it,
        // or b was cut off from etcd for longer than its TTL).
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        let key = format!("{pre}/members/{}", id(&rb));
        let lease = client.get(key, None).await.expect("get").kvs()[0].lease();
        client.lease_revoke(lease).await.expect("revoke");
        left(&mut events, 5, "b's lease gone", id(&rb)).await;
        let e = loop {
            match link.write(2).await {
                Err(e) => break e,
                Ok(()) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        assert!(e.is_peer_lost(), "the same typed error as a lost connection: {e}");

        // b notices at its next renewal and publishes again, under the same id.
        joined(&mut events, 10, "b back", id(&rb)).await;
        works_again(&a, &b, &rb, 3).await;
    });
}

#[test]
fn a_member_whose_entry_is_deleted_under_a_live_lease_publishes_again() {
    let etcd = EtcdServer::start();
    bounded(60, async {
        let pre = prefix("deleted");
        let (_ra, rb, a, b) = two_members(&etcd, &pre).await;
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        // An operator clears the entry; b's lease lives on.
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        client.delete(format!("{pre}/members/{}", id(&rb)), None).await.expect("delete");
        left(&mut events, 5, "b's entry gone", id(&rb)).await;
        joined(&mut events, 5, "b back", id(&rb)).await;
        works_again(&a, &b, &rb, 1).await;
    });
}

#[test]
fn a_member_whose_entry_changes_under_its_id_is_known_as_it_now_reads() {
    // A runtime that publishes again under its id (it left while etcd was away, then joined
    // again within the lease with another label or address) overwrites its key, and no
    // deletion comes between: the others take the new entry as an update of the member.
    let etcd = EtcdServer::start();
    bounded(60, async {
        let pre = prefix("changed");
        let (_ra, rb, a, _b) = two_members(&etcd, &pre).await;
        a.wait_for("b", Duration::from_secs(5)).await.expect("a sees b");
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        let key = format!("{pre}/members/{}", id(&rb));
        let kv = client.get(key.clone(), None).await.expect("get").kvs()[0].clone();
        let value = String::from_utf8(kv.value().to_vec()).expect("utf-8");
        assert!(value.contains("\"label\":\"b\""), "{value}");
        let renamed = value.replace("\"label\":\"b\"", "\"label\":\"b-renamed\"");
        let lease = etcd_client::PutOptions::new().with_lease(kv.lease());
        client.put(key, renamed, Some(lease)).await.expect("put");
        let t = std::time::Instant::now();
        while !a.members().iter().any(|m| m.label == "b-renamed") {
            assert!(t.elapsed() < Duration::from_secs(10), "a still knows b as {:?}", a.members());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(a.members().len(), 1, "one member, updated: {:?}", a.members());
        assert_eq!(a.members()[0].id, Some(id(&rb)));
    });
}

#[test]
fn values_too_large_for_one_reply_neither_hide_members_nor_let_leases_lapse() {
    let etcd = EtcdServer::start();
    bounded(90, async {
        let pre = prefix("large");
        // Four values of 1.4 MB under the prefix: one listing would be a 5.6 MB reply, past
        // the client's 4 MiB limit. They are no entries, and are ignored.
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        for i in 0..4 {
            let junk = vec![b'x'; 1_400_000];
            client.put(format!("{pre}/members/junk-{i}"), junk, None).await.expect("put a large value");
        }
        let (_ra, rb, a, b) = two_members(&etcd, &pre).await;
        b.wait_for("a", Duration::from_secs(5)).await.expect("b sees a");
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        // Three lease times: b's entry is renewed throughout.
        match tokio::time::timeout(3 * TTL, events.next()).await {
            Err(_) => {}
            Ok(ev) => panic!("nothing should change, saw {ev:?}"),
        }
        assert_eq!(a.members().into_iter().map(|m| m.id).collect::<Vec<_>>(), vec![Some(id(&rb))]);
        let link = Link::between(&a, &b).await;
        link.write(1).await.expect("a and b work");
    });
}

#[test]
fn a_member_cut_off_past_its_lease_does_not_take_its_label_back() {
    let etcd = EtcdServer::start();
    let p = main_provider();
    bounded(60, async {
        let pre = prefix("takeback");
        let (ra, rb, rc) = (runtime(p), runtime(p), runtime(p));
        let a = join(&ra, &etcd, &pre, "a").await;
        let _b = join(&rb, &etcd, &pre, "svc").await;
        a.wait_for("svc", Duration::from_secs(5)).await.expect("a sees b");
        // b's replacement c joins under the same label (b lives on, cut off from the others).
        let c = join(&rc, &etcd, &pre, "svc").await;
        let t0 = Instant::now();
        while a.members().len() < 2 {
            assert!(t0.elapsed() < Duration::from_secs(5), "a sees c");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut events = a.events();
        for _ in 0..2 {
            assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        }
        // b's lease goes (cut off from etcd past its TTL); b publishes again, its key made anew.
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
        let key = format!("{pre}/members/{}", id(&rb));
        let first = client.get(key.clone(), None).await.expect("get");
        let value = String::from_utf8_lossy(first.kvs()[0].value()).to_string();
        assert!(!value.contains("since"), "an entry first published carries no since: {value}");
        let lease = first.kvs()[0].lease();
        client.lease_revoke(lease).await.expect("revoke");
        left(&mut events, 5, "b's lease gone", id(&rb)).await;
        joined(&mut events, 10, "b back", id(&rb)).await;
        let again = client.get(key, None).await.expect("get");
        let value = String::from_utf8_lossy(again.kvs()[0].value()).to_string();
        let want = format!("\"since\":{}", first.kvs()[0].create_revision());
        assert!(value.contains(&want), "the entry made anew carries its first revision: {value}");
        // (Led to b instead, c would wait to accept for good.)
        let (ea, ec) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(a.connect_label("svc"), c.accept())
        })
        .await
        .expect("the label leads to c, which accepts");
        assert_eq!(ea.expect("connect by label").peer_id(), rc.id(), "the label stays with the replacement");
        drop(ec);
        let e = a.connect(id(&rb)).await.expect_err("the old process gets no traffic");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::Superseded, .. }), "{e}");
    });
}

#[test]
fn a_handshake_accepted_after_its_member_left_is_lost_at_once() {
    let etcd = EtcdServer::start();
    bounded(60, async {
        let (ra, rb, a, b) = two_members(&etcd, &prefix("late-accept")).await;
        b.wait_for("a", Duration::from_secs(5)).await.expect("b sees a");
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        // b connects; a has not accepted yet when b leaves.
        let eb = b.connect_label("a").await.expect("b connects");
        b.leave().await.expect("leave");
        left(&mut events, 5, "the leave", id(&rb)).await;
        let ea = a.accept().await.expect("the handshake was made");
        assert_eq!(ea.peer_id(), rb.id());
        let (res, _) = tokio::time::timeout(Duration::from_secs(5), ea.recv(ra.alloc(64).expect("alloc")))
            .await
            .expect("the receive ends");
        let e = res.expect_err("b left before a took its endpoint");
        assert!(e.is_peer_lost() && e.to_string().contains("left the cluster"), "{e}");
        drop(eb);
    });
}

/// Start the member process and read its `JOINED <id>` line.
fn spawn_member(
    mut cmd: Command,
) -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn member");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("member output");
    let id =
        line.trim().strip_prefix("JOINED ").unwrap_or_else(|| panic!("member said {line:?}")).to_string();
    (child, out, id)
}

/// etcd goes away (`kill`: SIGKILL; else a clean stop) for `away`, then comes back: the
/// connected pair keeps writing throughout, nobody leaves or joins twice, both entries are
/// back for a newcomer, and the newcomer is seen.
fn outage(name: &str, kill: bool, away: Duration) {
    let mut etcd = EtcdServer::start();
    let p = main_provider();
    bounded(90, async {
        let pre = prefix(name);
        let (_ra, _rb, a, b) = two_members(&etcd, &pre).await;
        let rc = runtime(p);
        let mut events = a.events();
        assert!(matches!(next(&mut events, 5, "snapshot").await, MemberEvent::Joined(_)));
        let link = Link::between(&a, &b).await;

        match kill {
            true => etcd.kill(),
            false => etcd.stop(),
        }
        let t0 = Instant::now();
        let mut writes = 0u64;
        while t0.elapsed() < away {
            link.write(writes).await.unwrap_or_else(|e| panic!("write {writes} with etcd away: {e}"));
            writes += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        etcd.restart();
        let c = join(&rc, &etcd, &pre, "c").await;
        match next(&mut events, 15, "the newcomer").await {
            MemberEvent::Joined(m) => assert_eq!(m.label, "c", "the only news is c"),
            ev => panic!("after the outage a saw {ev:?} before c joined"),
        }
        c.wait_for("a", Duration::from_secs(10)).await.expect("a's entry is back");
        c.wait_for("b", Duration::from_secs(10)).await.expect("b's entry is back");
        // Give late news a chance to show: there must be none (no leave, no second join).
        tokio::time::sleep(TTL * 2).await;
        let late = tokio::time::timeout(Duration::from_millis(10), events.next()).await;
        assert!(late.is_err(), "a saw {late:?} after the outage");
        link.write(writes).await.expect("write after etcd returned");
        eprintln!("{name}: {writes} writes verified while etcd was away for {} ms", away.as_millis());
    });
}

#[test]
fn members_keep_working_across_an_etcd_restart() {
    outage("restart", false, Duration::from_millis(500));
}

#[test]
fn members_keep_working_while_etcd_is_killed_for_ten_seconds() {
    outage("killed", true, Duration::from_secs(10));
}

#[test]
fn clusters_under_different_prefixes_do_not_see_each_other() {
    let etcd = EtcdServer::start();
    let p = main_provider();
    bounded(60, async {
        let (x, y) = (prefix("x"), prefix("x-y"));
        let (ra, rb, rc) = (runtime(p), runtime(p), runtime(p));
        let a = join(&ra, &etcd, &x, "a").await;
        let _b = join(&rb, &etcd, &x, "b").await;
        let c = join(&rc, &etcd, &y, "c").await;
        a.wait_for("b", Duration::from_secs(5)).await.expect("a sees b");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let labels: Vec<String> = a.members().into_iter().map(|m| m.label).collect();
        assert_eq!(labels, ["b"], "a sees b only");
        assert!(c.members().is_empty(), "c sees nobody: {:?}", c.members());
        let e = c.connect_label("a").await.expect_err("a is in another cluster");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::UnknownMember, .. }), "{e}");
    });
}

/// Put an entry straight into etcd, as a lying (or broken) runtime would.
async fn put_raw(etcd: &EtcdServer, key: String, value: String) {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.expect("etcd client");
    client.put(key, value, None).await.expect("put");
}

fn entry(id: u64, label: &str, addr: &str, provider: &str) -> String {
    format!(r#"{{"id":"{id:016x}","label":"{label}","addr":"{addr}","provider":"{provider}","rails":1}}"#)
}

#[test]
fn entries_that_lie_are_refused_and_others_unaffected() {
    let etcd = EtcdServer::start();
    bounded(60, async {
        let pre = prefix("liars");
        let (ra, _rb, a, b) = two_members(&etcd, &pre).await;
        let dead = dead_addr();
        let b_addr = b.local_addr().to_string();
        let key = |id: u64| format!("{pre}/members/{id:016x}");
        put_raw(&etcd, key(0x1111), entry(0x1111, "dead", &dead, ra.provider())).await;
        put_raw(&etcd, key(0x2222), entry(0x2222, "alien", &b_addr, "verbs-on-mars")).await;
        put_raw(&etcd, key(0x3333), entry(0x3333, "impostor", &b_addr, ra.provider())).await;
        put_raw(&etcd, key(0x4444), "{not an entry".into()).await;
        put_raw(&etcd, key(0x5555), entry(0x6666, "wrong-key", &b_addr, ra.provider())).await;
        for l in ["dead", "alien", "impostor"] {
            a.wait_for(l, Duration::from_secs(5)).await.unwrap_or_else(|e| panic!("{l}: {e}"));
        }
        let labels: Vec<String> = a.members().into_iter().map(|m| m.label).collect();
        assert!(
            !labels.iter().any(|l| l == "wrong-key"),
            "an entry under another id's key is ignored: {labels:?}"
        );
        assert_eq!(labels.len(), 4, "b, dead, alien, impostor; garbage ignored: {labels:?}");

        let t0 = Instant::now();
        let e = a.connect(MemberId(0x1111)).await.expect_err("nobody answers there");
        assert!(
            matches!(e, Error::Io { .. } | Error::Timeout { .. }),
            "an address that does not answer: {e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(12), "within the connect timeout");
        let e = a.connect(MemberId(0x2222)).await.expect_err("another provider");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::ProviderMismatch, .. }), "{e}");
        assert!(e.to_string().contains("verbs-on-mars"), "names the provider: {e}");
        let (e, eb) = tokio::join!(a.connect(MemberId(0x3333)), b.accept());
        let e = e.expect_err("b answers at the impostor's address");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::IdMismatch, .. }), "{e}");
        drop(eb);

        // The honest pair is unaffected.
        let link = Link::between(&a, &b).await;
        link.write(7).await.expect("a and b still work");
    });
}

#[test]
fn a_restarted_runtime_supersedes_its_old_entry() {
    let etcd = EtcdServer::start();
    let p = main_provider();
    bounded(60, async {
        let pre = prefix("restart-label");
        let (ra, rb) = (runtime(p), runtime(p));
        let a = join(&ra, &etcd, &pre, "a").await;
        // The old process's entry, still there (its lease not yet run out), at an address
        // where nothing answers now.
        let dead = dead_addr();
        put_raw(&etcd, format!("{pre}/members/{:016x}", 0x7777), entry(0x7777, "svc", &dead, ra.provider()))
            .await;
        a.wait_for("svc", Duration::from_secs(5)).await.expect("the old entry");
        let b = join(&rb, &etcd, &pre, "svc").await;
        let t0 = Instant::now();
        while a.members().len() < 2 {
            assert!(t0.elapsed() < Duration::from_secs(5), "a sees the restarted svc");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (ea, eb) = tokio::join!(a.connect_label("svc"), b.accept());
        assert_eq!(ea.expect("connect by label").peer_id(), rb.id(), "the label leads to the new runtime");
        drop(eb);
        let e = a.connect(MemberId(0x7777)).await.expect_err("the old entry gets no traffic");
        assert!(matches!(e, Error::Membership { why: MembershipFailure::Superseded, .. }), "{e}");
    });
}

#[test]
fn etcd_unreachable_at_start_fails_in_time_or_falls_back() {
    let p = main_provider();
    bounded(30, async {
        let nobody = dead_addr();
        let opts = EtcdOptions::new([nobody.as_str()], "/x").connect_timeout(Duration::from_secs(1));
        let t0 = Instant::now();
        let e = EtcdMembership::connect(opts.clone()).await.expect_err("nobody there");
        assert!(t0.elapsed() < Duration::from_millis(1500), "failed after {:?}", t0.elapsed());
        assert!(matches!(e, Error::Membership { why: MembershipFailure::DirectoryUnreachable, .. }), "{e}");
        assert!(e.to_string().contains(&nobody), "names etcd's address: {e}");

        // Configured to, it starts on a static list instead.
        let rb = runtime(p);
        let lb = rb.listen("127.0.0.1:0").await.expect("listen");
        let b_addr = lb.local_addr().unwrap().to_string();
        let ra = runtime(p);
        let directory = EtcdMembership::connect_or(opts, StaticMembership::new([b_addr.clone()])).await;
        assert_eq!(directory.name(), "static");
        let a = Cluster::join(&ra, directory, JoinOptions::new("a")).await.expect("join statically");
        a.wait_for(&b_addr, Duration::from_secs(1)).await.expect("the static entry");
        let (ea, eb) = tokio::join!(a.connect_label(&b_addr), lb.accept());
        let link = Link::new(ea.expect("connect"), eb.expect("accept")).await;
        link.write(3).await.expect("static membership works");
    });
}

#[test]
fn static_membership_connects_by_address() {
    for p in providers() {
        bounded(30, async {
            let (ra, rb) = (runtime(p), runtime(p));
            let b = Cluster::join(&rb, StaticMembership::new(Vec::<String>::new()), JoinOptions::new("b"))
                .await
                .expect("join b");
            let b_addr = b.local_addr().to_string();
            let a = Cluster::join(&ra, StaticMembership::new([b_addr.clone()]), JoinOptions::new("a"))
                .await
                .expect("join a");
            let m = a.wait_for(&b_addr, Duration::from_secs(1)).await.expect("listed");
            assert_eq!((m.id, m.provider), (None, None), "a static list knows addresses only");
            let (ea, eb) = tokio::join!(a.connect_label(&b_addr), b.accept());
            let link = Link::new(ea.expect("connect"), eb.expect("accept")).await;
            link.write(4).await.expect("{p}");
            let e = a.connect_label("nobody:1").await.expect_err("not listed");
            assert!(matches!(e, Error::Membership { why: MembershipFailure::UnknownMember, .. }), "{e}");
            let e =
                Cluster::join(&ra, StaticMembership::default(), JoinOptions::new("c").listen("0.0.0.0:0"))
                    .await
                    .expect_err("nothing to publish");
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        });
    }
}
