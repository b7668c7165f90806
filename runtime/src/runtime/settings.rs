//! The builder's settings and the one rule that resolves them: what the application set
//! explicitly beats the environment, which beats the default. [`resolve`] is a pure function
//! of the settings and an environment lookup, run once by `Builder::build`.
use std::time::Duration;

use crate::base::error::Result;
use crate::base::memory::DevicePolicy;
use crate::base::sched::SchedConfig;
use crate::base::vars::{self, invalid, parse};
use crate::base::MAX_RAILS;

/// What the application set on the builder, each `None` where it set nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub provider: Option<String>,
    pub node: Option<String>,
    pub core: Option<usize>,
    pub lanes: Option<usize>,
    pub rails: Option<usize>,
    pub rail_nodes: Vec<String>,
    pub rail_groups: Option<Vec<Vec<usize>>>,
    pub trust_local_peers: Option<bool>,
    pub poll_spacing: Option<Duration>,
    pub await_spin: Option<Duration>,
    pub await_drive: Option<bool>,
    pub lend_nap: Option<bool>,
    pub cq_wait: Option<bool>,
    pub express: Option<bool>,
    pub device_memory: Option<DevicePolicy>,
    pub mr_cache_bytes: Option<usize>,
    pub max_message: Option<usize>,
    pub peer_timeout: Option<Duration>,
    pub secret: Option<Vec<u8>>,
    pub sched: Option<SchedConfig>,
}

/// Where the rail groups come from; checked against the transport's rails once it is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RailGroups {
    /// Set on the builder: must fit.
    Explicit(Vec<Vec<usize>>),
    /// `RDMALANE_RAIL_GROUPS`: another runtime of the process may have other rails, so one
    /// that does not fit is ignored, saying so.
    Env(String),
    /// One group per NUMA node of the rails' NICs.
    Auto,
}

/// The settings resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub provider: Option<String>,
    pub node: Option<String>,
    pub core: Option<usize>,
    pub lanes: usize,
    pub rails: usize,
    pub rail_groups: RailGroups,
    pub trust_local_peers: bool,
    pub poll_spacing: Option<Duration>,
    /// How long a latency-class op's poll watches for its completion before parking; `None`:
    /// by the host's cores (`driver::handoff::default_budget`).
    pub await_spin: Option<Duration>,
    /// A spinning op's task turns the first reactor itself (see `driver::lend`); `None`: where
    /// ops spin.
    pub await_drive: Option<bool>,
    /// The lending thread parks between its looks while a task has its reactor (see
    /// `driver::lend`).
    pub lend_nap: bool,
    /// Reactor threads sleep on their completion queues' wait object where the transport has
    /// one (else they nap, and peers kick them awake for their ops).
    pub cq_wait: bool,
    /// An express rail (see `LaneMap`); `None`: by the host's cores and the provider.
    pub express: Option<bool>,
    /// Which path device memory may take.
    pub device_memory: DevicePolicy,
    pub mr_cache_bytes: usize,
    pub max_message: Option<usize>,
    pub peer_timeout: Duration,
    pub secret: Option<Vec<u8>>,
    pub sched: SchedConfig,
}

/// The default peer timeout.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// The shortest peer timeout taken.
pub(crate) const PEER_TIMEOUT_MIN: Duration = Duration::from_millis(30);
/// The registration cache's default cap.
const MR_CACHE_BYTES: usize = 1 << 30;

/// Cores a reactor can be pinned to: those an affinity mask (glibc's `cpu_set_t`) holds.
const MAX_CORE: usize = 1024;
/// Lanes a peer may have.
pub(crate) const MAX_LANES: usize = 64;

/// Resolve `s` against the environment `env` (a lookup of a variable's value): explicit beats
/// environment beats default. A variable that is set but does not parse is an error naming it;
/// an empty one counts as unset.
pub(crate) fn resolve(s: &Settings, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let num = |name: &str| parse::<usize>(name, var(name), "a count");
    let rails_env = num("RDMALANE_RAILS")?;
    let nodes = s.rail_nodes.len();
    let rails = match s.rails {
        Some(r) => r.max(nodes),
        None if nodes > 0 => nodes,
        None => rails_env.unwrap_or(1),
    };
    if !(1..=MAX_RAILS).contains(&rails) {
        return Err(invalid(format!("{rails} rails (1 to {MAX_RAILS})")));
    }
    let lanes = pick(s.lanes, num("RDMALANE_LANES")?, 1);
    if !(1..=MAX_LANES).contains(&lanes) {
        return Err(invalid(format!("{lanes} lanes per peer (1 to {MAX_LANES})")));
    }
    let max_message = s.max_message.or(num("RDMALANE_MAX_MESSAGE")?);
    if max_message == Some(0) {
        return Err(invalid("a largest message of 0 bytes"));
    }
    let rail_groups = match (&s.rail_groups, var("RDMALANE_RAIL_GROUPS")) {
        (Some(g), _) => RailGroups::Explicit(g.clone()),
        (None, Some(v)) => RailGroups::Env(v),
        (None, None) => RailGroups::Auto,
    };
    let peer_timeout_env =
        parse::<u64>("RDMALANE_PEER_TIMEOUT_MS", var("RDMALANE_PEER_TIMEOUT_MS"), "milliseconds")?
            .map(Duration::from_millis);
    let poll_spacing_env = vars::poll_spacing(var("RDMALANE_POLL_SPACING_NS"))?;
    let trust_env = vars::trust_local_peers(var("RDMALANE_TRUST_LOCAL_PEERS"))?;
    let await_spin_env =
        parse::<u64>("RDMALANE_AWAIT_SPIN_US", var("RDMALANE_AWAIT_SPIN_US"), "microseconds")?
            .map(Duration::from_micros);
    let sched = match &s.sched {
        Some(c) => c.clone(),
        None => SchedConfig::from_vars(&var)?,
    };
    sched.check()?;
    let core = s.core.or(num("RDMALANE_CORE")?);
    if let Some(c) = core.filter(|&c| c >= MAX_CORE) {
        // Past what an affinity mask holds: pinning to it would panic the reactor's thread.
        return Err(invalid(format!("core {c}: a reactor is pinned to a core from 0 to {}", MAX_CORE - 1)));
    }
    Ok(Resolved {
        provider: s.provider.clone().or_else(|| var("RDMALANE_PROVIDER")),
        node: s.node.clone().or_else(|| var("RDMALANE_NODE")),
        core,
        lanes,
        rails,
        rail_groups,
        trust_local_peers: pick(s.trust_local_peers, trust_env, false),
        poll_spacing: s.poll_spacing.or(poll_spacing_env),
        await_spin: s.await_spin.or(await_spin_env),
        await_drive: s.await_drive.or(vars::flag("RDMALANE_AWAIT_DRIVE", var("RDMALANE_AWAIT_DRIVE"))?),
        lend_nap: pick(s.lend_nap, vars::flag("RDMALANE_LEND_NAP", var("RDMALANE_LEND_NAP"))?, true),
        cq_wait: pick(s.cq_wait, vars::flag("RDMALANE_CQ_WAIT", var("RDMALANE_CQ_WAIT"))?, true),
        express: s.express.or(vars::flag("RDMALANE_EXPRESS", var("RDMALANE_EXPRESS"))?),
        device_memory: pick(
            s.device_memory,
            vars::device_policy(var("RDMALANE_DEVICE_MEMORY"))?,
            default_device_policy(),
        ),
        mr_cache_bytes: pick(s.mr_cache_bytes, num("RDMALANE_MR_CACHE_BYTES")?, MR_CACHE_BYTES),
        max_message,
        peer_timeout: pick(s.peer_timeout, peer_timeout_env, PEER_TIMEOUT).max(PEER_TIMEOUT_MIN),
        secret: s
            .secret
            .clone()
            .or_else(|| var("RDMALANE_SECRET").map(String::into_bytes))
            .filter(|k| !k.is_empty()),
        sched,
    })
}

/// Device memory's default: where this build has a device buffer (the `cuda` feature), native
/// where the transport can, staged elsewhere; without one, the transport is not asked.
fn default_device_policy() -> DevicePolicy {
    if cfg!(feature = "cuda") {
        DevicePolicy::Auto
    } else {
        DevicePolicy::Off
    }
}

/// The one rule.
fn pick<T>(explicit: Option<T>, env: Option<T>, default: T) -> T {
    explicit.or(env).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::base::error::{Error, OpKind};
    use crate::base::sched::{Mode, Stripe};

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn none(_: &str) -> Option<String> {
        None
    }

    /// For one setting: the default with nothing set, the variable's value over the default,
    /// and the explicit value over the variable (also when the explicit value is the default).
    fn rule<T: PartialEq + std::fmt::Debug>(
        var: (&str, &str),
        explicit: impl Fn(&mut Settings),
        get: impl Fn(&Resolved) -> T,
        (default, from_env, set): (T, T, T),
    ) {
        let plain = resolve(&Settings::default(), &none).expect("defaults resolve");
        assert_eq!(get(&plain), default, "{}: the default", var.0);
        let env = with(&[var]);
        let from = resolve(&Settings::default(), &env).expect("the variable parses");
        assert_eq!(get(&from), from_env, "{}: the environment over the default", var.0);
        let mut s = Settings::default();
        explicit(&mut s);
        let both = resolve(&s, &env).expect("resolves");
        assert_eq!(get(&both), set, "{}: explicit over the environment", var.0);
        let bad = with(&[(var.0, "not-a-value")]);
        if let Err(e) = resolve(&Settings::default(), &bad) {
            assert!(e.to_string().contains(var.0), "the error names {}: {e}", var.0);
        }
    }

    #[test]
    fn provider_and_node() {
        let some = |v: &str| Some(v.to_string());
        rule(
            ("RDMALANE_PROVIDER", "shm"),
            |s| s.provider = some("tcp"),
            |r| r.provider.clone(),
            (None, some("shm"), some("tcp")),
        );
        rule(
            ("RDMALANE_NODE", "10.0.0.1"),
            |s| s.node = some("127.0.0.1"),
            |r| r.node.clone(),
            (None, some("10.0.0.1"), some("127.0.0.1")),
        );
    }

    #[test]
    fn core() {
        rule(("RDMALANE_CORE", "3"), |s| s.core = Some(1), |r| r.core, (None, Some(3), Some(1)));
        // Past an affinity mask: refused, named, rather than a panic on the reactor's thread.
        let far = Settings { core: Some(1024), ..Settings::default() };
        let e = resolve(&far, &|_: &str| None).unwrap_err().to_string();
        assert!(e.contains("core 1024"), "{e}");
        let e = resolve(&Settings::default(), &|n: &str| (n == "RDMALANE_CORE").then(|| "5000".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("core 5000"), "{e}");
    }

    #[test]
    fn lanes_set_to_one_explicitly_beat_the_environment() {
        rule(("RDMALANE_LANES", "4"), |s| s.lanes = Some(1), |r| r.lanes, (1, 4, 1));
    }

    #[test]
    fn rails() {
        rule(("RDMALANE_RAILS", "2"), |s| s.rails = Some(1), |r| r.rails, (1, 2, 1));
        let nodes = Settings { rail_nodes: vec!["a".into(), "b".into(), "c".into()], ..Settings::default() };
        assert_eq!(resolve(&nodes, &with(&[("RDMALANE_RAILS", "2")])).unwrap().rails, 3, "one rail per node");
    }

    #[test]
    fn rail_groups() {
        let groups = vec![vec![0], vec![1]];
        rule(
            ("RDMALANE_RAIL_GROUPS", "0;1"),
            |s| s.rail_groups = Some(vec![vec![0, 1]]),
            |r| r.rail_groups.clone(),
            (RailGroups::Auto, RailGroups::Env("0;1".into()), RailGroups::Explicit(vec![vec![0, 1]])),
        );
        let _ = groups;
    }

    #[test]
    fn trust_local_peers_set_false_explicitly_beats_the_environment() {
        rule(
            ("RDMALANE_TRUST_LOCAL_PEERS", "1"),
            |s| s.trust_local_peers = Some(false),
            |r| r.trust_local_peers,
            (false, true, false),
        );
    }

    #[test]
    fn poll_spacing() {
        let ns = |n| Some(Duration::from_nanos(n));
        rule(
            ("RDMALANE_POLL_SPACING_NS", "500"),
            |s| s.poll_spacing = ns(0),
            |r| r.poll_spacing,
            (None, ns(500), ns(0)),
        );
    }

    #[test]
    fn await_spin() {
        let us = |n| Some(Duration::from_micros(n));
        rule(
            ("RDMALANE_AWAIT_SPIN_US", "20"),
            |s| s.await_spin = us(0),
            |r| r.await_spin,
            (None, us(20), us(0)),
        );
    }

    #[test]
    fn express() {
        rule(
            ("RDMALANE_EXPRESS", "1"),
            |s| s.express = Some(false),
            |r| r.express,
            (None, Some(true), Some(false)),
        );
        let bad = resolve(&Settings::default(), &with(&[("RDMALANE_EXPRESS", "maybe")])).unwrap_err();
        assert!(bad.to_string().contains("RDMALANE_EXPRESS=maybe"), "{bad}");
    }

    #[test]
    fn device_memory() {
        rule(
            ("RDMALANE_DEVICE_MEMORY", "staged"),
            |s| s.device_memory = Some(DevicePolicy::Native),
            |r| r.device_memory,
            (default_device_policy(), DevicePolicy::Staged, DevicePolicy::Native),
        );
        let bad = resolve(&Settings::default(), &with(&[("RDMALANE_DEVICE_MEMORY", "gpu")])).unwrap_err();
        assert!(bad.to_string().contains("RDMALANE_DEVICE_MEMORY=gpu"), "{bad}");
    }

    #[test]
    fn mr_cache_bytes() {
        rule(
            ("RDMALANE_MR_CACHE_BYTES", "4096"),
            |s| s.mr_cache_bytes = Some(1 << 30),
            |r| r.mr_cache_bytes,
            (1 << 30, 4096, 1 << 30),
        );
    }

    #[test]
    fn max_message() {
        rule(
            ("RDMALANE_MAX_MESSAGE", "8192"),
            |s| s.max_message = Some(4096),
            |r| r.max_message,
            (None, Some(8192), Some(4096)),
        );
    }

    #[test]
    fn peer_timeout_set_explicitly_beats_the_environment() {
        let ms = Duration::from_millis;
        rule(
            ("RDMALANE_PEER_TIMEOUT_MS", "120000"),
            |s| s.peer_timeout = Some(ms(900)),
            |r| r.peer_timeout,
            (PEER_TIMEOUT, ms(120_000), ms(900)),
        );
    }

    #[test]
    fn secret() {
        let b = |v: &str| Some(v.as_bytes().to_vec());
        rule(
            ("RDMALANE_SECRET", "env"),
            |s| s.secret = b("mine"),
            |r| r.secret.clone(),
            (None, b("env"), b("mine")),
        );
    }

    #[test]
    fn scheduler_set_explicitly_is_taken_whole() {
        let fifo = SchedConfig { mode: Mode::Fifo, ..SchedConfig::default() };
        rule(
            ("RDMALANE_CHUNK_SIZE", "8192"),
            |s| s.sched = Some(SchedConfig::default()),
            |r| r.sched.chunk_size,
            (64 << 10, 8192, 64 << 10),
        );
        rule(
            ("RDMALANE_SCHEDULER", "fifo"),
            |s| s.sched = Some(SchedConfig::default()),
            |r| r.sched.mode,
            (Mode::Fair, Mode::Fifo, Mode::Fair),
        );
        let env = with(&[("RDMALANE_SCHEDULER", "fair")]);
        assert_eq!(
            resolve(&Settings { sched: Some(fifo), ..Settings::default() }, &env).unwrap().sched.mode,
            Mode::Fifo
        );
        for (name, value, get) in [
            (
                "RDMALANE_LATENCY_THRESHOLD",
                "100",
                (|c: &SchedConfig| c.latency_threshold) as fn(&SchedConfig) -> usize,
            ),
            ("RDMALANE_LANE_BYTES", "100", |c| c.lane_bytes),
            ("RDMALANE_TENANT_BYTES", "100", |c| c.tenant_bytes),
            ("RDMALANE_NIC_BYTES", "100", |c| c.nic_bytes),
            ("RDMALANE_POST_BATCH", "100", |c| c.post_batch),
        ] {
            let d = get(&SchedConfig::default());
            rule((name, value), |s| s.sched = Some(SchedConfig::default()), |r| get(&r.sched), (d, 100, d));
        }
        rule(
            ("RDMALANE_STRIPE", "bytes"),
            |s| s.sched = Some(SchedConfig::default()),
            |r| r.sched.stripe,
            (Stripe::RoundRobin, Stripe::Bytes, Stripe::RoundRobin),
        );
        rule(
            ("RDMALANE_MIN_BULK_SHARE", "0.5"),
            |s| s.sched = Some(SchedConfig::default()),
            |r| r.sched.min_bulk_share,
            (0.1, 0.5, 0.1),
        );
    }

    #[test]
    fn values_out_of_range_or_unparsable_are_errors_that_name_them() {
        for (name, value) in [
            ("RDMALANE_LANES", "0"),
            ("RDMALANE_LANES", "65"),
            ("RDMALANE_RAILS", "33"),
            ("RDMALANE_MAX_MESSAGE", "0"),
            ("RDMALANE_LANES", "four"),
            ("RDMALANE_PEER_TIMEOUT_MS", "3s"),
            ("RDMALANE_TRUST_LOCAL_PEERS", "maybe"),
            ("RDMALANE_LEND_NAP", "yes please"),
            ("RDMALANE_CQ_WAIT", "fd"),
            ("RDMALANE_SCHEDULER", "lifo"),
        ] {
            let e = resolve(&Settings::default(), &with(&[(name, value)])).expect_err(name);
            assert!(matches!(e, Error::InvalidArgument { op: OpKind::Open, .. }), "{name}={value}: {e:?}");
        }
        let blank = with(&[("RDMALANE_LANES", " ")]);
        assert_eq!(resolve(&Settings::default(), &blank).unwrap().lanes, 1, "an empty variable is unset");
        let nap = |env: &[(&str, &str)], set: Option<bool>| {
            resolve(&Settings { lend_nap: set, ..Settings::default() }, &with(env)).unwrap().lend_nap
        };
        assert!(nap(&[], None), "the lending thread naps unless asked to spin");
        assert!(!nap(&[("RDMALANE_LEND_NAP", "0")], None));
        assert!(!nap(&[("RDMALANE_LEND_NAP", "1")], Some(false)), "the builder's word wins");
        assert!(nap(&[("RDMALANE_LEND_NAP", "0")], Some(true)), "the builder's word wins");
        let cq_wait = |env: &[(&str, &str)], set: Option<bool>| {
            resolve(&Settings { cq_wait: set, ..Settings::default() }, &with(env)).unwrap().cq_wait
        };
        assert!(cq_wait(&[], None), "reactor threads sleep on the wait object unless told");
        assert!(!cq_wait(&[("RDMALANE_CQ_WAIT", "0")], None));
        assert!(!cq_wait(&[("RDMALANE_CQ_WAIT", "1")], Some(false)), "the builder's word wins");
    }
}
