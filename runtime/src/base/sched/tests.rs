//! The scheduler alone, driven deterministically: pushes, `next`, completions in the order a
//! test picks.
use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::scheduler::LaneId;
use super::*;

fn cfg() -> SchedConfig {
    SchedConfig {
        chunk_size: 1000,
        lane_bytes: 4000,
        tenant_bytes: 4000,
        nic_bytes: 16_000,
        bulk_per_round: usize::MAX,
        idle_after_chunks: 0,
        ..Default::default()
    }
}

fn bulk(tenant: TenantId, len: usize, lanes: Vec<usize>) -> OpSpec {
    OpSpec { tenant, class: Class::Bulk, len, lanes: ids(&lanes), splittable: true, cuts: None, tail: 0 }
}

/// Lanes by index.
fn ids(lanes: &[usize]) -> std::sync::Arc<[LaneId]> {
    lanes.iter().map(|&l| LaneId(l)).collect()
}

/// Run until `stop` or nothing moves; completes the oldest chunk each step unless `order`
/// picks another. Returns every chunk posted, in posting order.
struct Sim {
    s: Scheduler,
    inflight: VecDeque<Chunk>,
    posted: Vec<Chunk>,
    done: Vec<OpDone>,
}

impl Sim {
    fn new(c: SchedConfig) -> Sim {
        Sim { s: Scheduler::new(c), inflight: VecDeque::new(), posted: Vec::new(), done: Vec::new() }
    }
    fn fill(&mut self) {
        let mut out = Vec::new();
        self.s.next(&mut out, 64);
        self.posted.extend(&out);
        self.inflight.extend(out);
    }
    fn complete_at(&mut self, i: usize, ok: bool) {
        if let Some(c) = self.inflight.remove(i % self.inflight.len().max(1)) {
            if let Some(d) = self.s.complete(c, ok) {
                self.done.push(d);
            }
        }
    }
    fn drain(&mut self) {
        loop {
            self.fill();
            if self.inflight.is_empty() {
                break;
            }
            self.complete_at(0, true);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_byte_of_every_op_is_posted_exactly_once(
        ops in proptest::collection::vec((0u32..3, 0usize..20_000, any::<bool>(), 1usize..4), 1..30),
        order in proptest::collection::vec(any::<usize>(), 0..400),
        fifo: bool,
    ) {
        let mut c = cfg();
        if fifo { c.mode = Mode::Fifo; }
        let mut sim = Sim::new(c);
        let mut lens = HashMap::new();
        for (t, len, small, lanes) in ops {
            let class = if small { Class::Latency } else { Class::Bulk };
            let id = sim.s.push(OpSpec { tenant: t, class, len, lanes: (0..lanes).map(LaneId).collect(), splittable: true, cuts: None, tail: 0 });
            lens.insert(id, len);
        }
        for i in order {
            sim.fill();
            sim.complete_at(i, true);
        }
        sim.drain();
        let mut covered: HashMap<OpId, Vec<(usize, usize)>> = HashMap::new();
        for c in &sim.posted {
            covered.entry(c.op).or_default().push((c.offset, c.len));
        }
        for (id, len) in &lens {
            let mut r = covered.remove(id).unwrap_or_default();
            r.sort();
            let mut at = 0;
            for (off, l) in r.iter().filter(|(_, l)| *l > 0) {
                prop_assert_eq!(*off, at, "gap or overlap in op {:?}", id);
                at += l;
            }
            prop_assert_eq!(at, *len);
        }
        prop_assert_eq!(sim.done.len(), lens.len());
        prop_assert!(sim.done.iter().all(|d| d.ok));
        prop_assert!(sim.s.is_empty());
    }

    /// A batch's cuts: no chunk spans one, each stretch is covered once, and an unsplittable
    /// batch (pieces carrying an immediate) gets exactly one chunk per stretch.
    #[test]
    fn chunks_never_cross_a_cut(
        stretches in proptest::collection::vec(1usize..3000, 1..20),
        splittable: bool,
        order in proptest::collection::vec(any::<usize>(), 0..100),
        stripe_bytes: bool,
    ) {
        let mut c = cfg();
        if stripe_bytes { c.stripe = Stripe::Bytes; }
        let mut sim = Sim::new(c);
        let mut cuts = Vec::new();
        let mut at = 0;
        for l in &stretches {
            at += l;
            cuts.push(at);
        }
        let len = cuts.pop().expect("one stretch at least");
        let spec = OpSpec { cuts: Some(cuts.clone().into()), splittable, ..bulk(0, len, vec![0, 1, 2]) };
        sim.s.push(spec);
        for i in order {
            sim.fill();
            sim.complete_at(i, true);
        }
        sim.drain();
        let mut r: Vec<(usize, usize)> = sim.posted.iter().map(|c| (c.offset, c.len)).collect();
        r.sort();
        let mut at = 0;
        for (off, l) in &r {
            prop_assert_eq!(*off, at);
            prop_assert!(!cuts.iter().any(|&c| c > *off && c < off + l), "chunk {}+{} crosses a cut", off, l);
            at += l;
        }
        prop_assert_eq!(at, len);
        if !splittable {
            prop_assert_eq!(r.len(), stretches.len());
        }
    }

    #[test]
    fn an_op_completes_only_after_its_last_chunk(len in 1usize..50_000, order in proptest::collection::vec(any::<usize>(), 0..200)) {
        let mut sim = Sim::new(cfg());
        let id = sim.s.push(bulk(0, len, vec![0, 1]));
        for i in order {
            sim.fill();
            let posted: usize = sim.posted.iter().map(|c| c.len).sum();
            sim.complete_at(i, true);
            if !sim.done.is_empty() {
                prop_assert!(posted == len && sim.inflight.is_empty(), "done early");
            }
        }
        sim.drain();
        prop_assert_eq!(sim.done, vec![OpDone { op: id, ok: true }]);
    }

    #[test]
    fn a_fenced_tail_goes_out_whole_and_only_after_the_rest_has_completed(
        len in 1usize..40_000,
        tail in 1usize..3_000,
        others in 0usize..3,
        order in proptest::collection::vec(any::<usize>(), 0..400),
        refuse in proptest::collection::vec(proptest::bool::weighted(0.3), 0..400),
    ) {
        // The tail may exceed the chunk size (1000): it still goes out as one chunk.
        let c = SchedConfig { max_message: 3_000, ..cfg() };
        let mut sim = Sim::new(c);
        let id = sim.s.push(OpSpec { tail, ..bulk(0, len, vec![0, 1]) });
        for t in 0..others {
            sim.s.push(bulk(1 + t as u32, 20_000, vec![0, 1]));
        }
        let tail = tail.min(len);
        let mut completed = 0usize;
        let mut steps = order.into_iter().chain(std::iter::repeat(0)).take(2_000);
        // Some posts are refused (a full queue): those chunks go back and come out again.
        let mut refuse = refuse.into_iter();
        loop {
            let before = sim.posted.len();
            sim.fill();
            let fresh: Vec<Chunk> = sim.posted.drain(before..).collect();
            let mut refused = false;
            for c in fresh.into_iter().rev() {
                if refuse.next() == Some(true) {
                    refused = true;
                    assert!(sim.s.unissue(c).is_none(), "a live op's chunk goes back");
                    let at = sim.inflight.iter().position(|x| *x == c).expect("posted");
                    sim.inflight.remove(at);
                } else {
                    sim.posted.push(c);
                }
            }
            for c in &sim.posted[before..] {
                if c.op != id {
                    continue;
                }
                let is_tail = c.offset + c.len > len - tail;
                if is_tail {
                    prop_assert_eq!((c.offset, c.len), (len - tail, tail), "tail cut");
                    prop_assert_eq!(completed, len - tail, "tail before the body landed");
                    prop_assert!(!sim.inflight.iter().any(|x| x.op == id && x != c), "body in flight");
                }
            }
            if sim.inflight.is_empty() {
                if refused {
                    continue;
                }
                break;
            }
            let i = steps.next().unwrap_or(0) % sim.inflight.len();
            if sim.inflight[i].op == id {
                completed += sim.inflight[i].len;
            }
            sim.complete_at(i, true);
        }
        prop_assert_eq!(completed, len);
        let ok = OpDone { op: id, ok: true };
        prop_assert!(sim.done.contains(&ok), "not resolved ok: {:?}", sim.done);
    }

    #[test]
    fn a_failed_chunk_withdraws_the_rest_and_fails_the_op_once_drained(len in 5_000usize..50_000, fail_at in 0usize..8) {
        let mut sim = Sim::new(cfg());
        let id = sim.s.push(bulk(0, len, vec![0]));
        sim.fill();
        let n = sim.inflight.len();
        prop_assume!(n > 1);
        sim.complete_at(fail_at % n, false);
        prop_assert!(sim.done.is_empty(), "resolved with chunks in flight");
        let before = sim.posted.len();
        sim.drain();
        prop_assert_eq!(sim.posted.len(), before, "posted after the failure");
        prop_assert_eq!(sim.done, vec![OpDone { op: id, ok: false }]);
    }

    #[test]
    fn a_cancelled_op_posts_nothing_more(len in 5_000usize..50_000) {
        let mut sim = Sim::new(cfg());
        let id = sim.s.push(bulk(0, len, vec![0]));
        sim.fill();
        let before = sim.posted.len();
        prop_assert_eq!(sim.s.cancel(id), None, "chunks are in flight");
        sim.drain();
        prop_assert_eq!(sim.posted.len(), before);
        prop_assert_eq!(sim.done, vec![OpDone { op: id, ok: false }]);
    }

    #[test]
    fn weighted_bulk_shares_hold_within_five_percent(w in proptest::collection::vec(1u32..5, 2..4)) {
        let mut sim = Sim::new(cfg());
        let mut owner = HashMap::new();
        for (t, &weight) in w.iter().enumerate() {
            sim.s.set_weight(t as u32, weight);
            for _ in 0..4 {
                let id = sim.s.push(bulk(t as u32, 10_000_000, vec![0, 1]));
                owner.insert(id, t);
            }
        }
        let mut bytes = vec![0usize; w.len()];
        for _ in 0..20_000 {
            sim.fill();
            let c = sim.inflight.pop_front().unwrap();
            bytes[owner[&c.op]] += c.len;
            sim.s.complete(c, true);
        }
        let total: usize = bytes.iter().sum();
        let wsum: u32 = w.iter().sum();
        for (t, &weight) in w.iter().enumerate() {
            let want = weight as f64 / wsum as f64;
            let got = bytes[t] as f64 / total as f64;
            prop_assert!((got - want).abs() <= 0.05 * want, "tenant {t}: share {got:.3}, weight share {want:.3}");
        }
    }

    #[test]
    fn lanes_do_not_buy_a_larger_share(lanes_a in 1usize..17) {
        let mut sim = Sim::new(cfg());
        sim.s.push(bulk(0, 100_000_000, (0..lanes_a).collect()));
        sim.s.push(bulk(1, 100_000_000, vec![100]));
        let mut bytes = [0usize; 2];
        for _ in 0..20_000 {
            sim.fill();
            let c = sim.inflight.pop_front().unwrap();
            bytes[(c.lane == LaneId(100)) as usize] += c.len;
            sim.s.complete(c, true);
        }
        let ratio = bytes[1] as f64 / bytes[0] as f64;
        prop_assert!((0.95..=1.05).contains(&ratio), "B/A = {ratio:.3} with A on {lanes_a} lanes");
    }
}

#[test]
fn a_latency_op_goes_before_any_further_bulk_and_waits_for_at_most_the_budget() {
    let mut sim = Sim::new(cfg());
    for t in 0..3 {
        sim.s.push(bulk(t, 1_000_000, vec![0, 1]));
    }
    for _ in 0..50 {
        sim.fill();
        sim.complete_at(0, true);
    }
    sim.fill();
    // What is ahead of it: the bulk in flight, bounded by the tenant budgets.
    let ahead: usize = sim.inflight.iter().map(|c| c.len).sum();
    assert!(ahead <= 3 * (cfg().tenant_bytes + cfg().chunk_size), "{ahead} bytes ahead");
    let id = sim.s.push(OpSpec {
        tenant: 9,
        class: Class::Latency,
        len: 16,
        lanes: ids(&[0, 1]),
        splittable: false,
        cuts: None,
        tail: 0,
    });
    sim.complete_at(0, true);
    let mut out = Vec::new();
    sim.s.next(&mut out, 64);
    assert_eq!(out.first().map(|c| c.op), Some(id), "latency op not first: {out:?}");
}

#[test]
fn bulk_is_not_starved_by_a_latency_flood() {
    let c = SchedConfig { min_bulk_share: 0.2, ..cfg() };
    let mut sim = Sim::new(c);
    sim.s.push(bulk(0, 100_000_000, vec![0]));
    let (mut bulk_bytes, mut lat_bytes) = (0usize, 0usize);
    for _ in 0..20_000 {
        // Keep a latency backlog at all times.
        while sim.s.len() < 20 {
            sim.s.push(OpSpec {
                tenant: 1,
                class: Class::Latency,
                len: 1000,
                lanes: ids(&[0]),
                splittable: false,
                cuts: None,
                tail: 0,
            });
        }
        sim.fill();
        let c = sim.inflight.pop_front().unwrap();
        sim.s.complete(c, true);
        if c.op.0 == 0 {
            bulk_bytes += c.len;
        } else {
            lat_bytes += c.len;
        }
    }
    let share = bulk_bytes as f64 / (bulk_bytes + lat_bytes) as f64;
    // About the configured minimum (posting in batches makes it oscillate around it).
    assert!(share >= 0.8 * 0.2, "bulk share {share:.3} under a latency flood");
}

#[test]
fn small_ops_are_never_split_and_messages_never_are() {
    let mut sim = Sim::new(cfg());
    let a = sim.s.push(OpSpec {
        tenant: 0,
        class: Class::Latency,
        len: 999,
        lanes: ids(&[0]),
        splittable: true,
        cuts: None,
        tail: 0,
    });
    let b = sim.s.push(OpSpec {
        tenant: 0,
        class: Class::Bulk,
        len: 5000,
        lanes: ids(&[0]),
        splittable: false,
        cuts: None,
        tail: 0,
    });
    sim.drain();
    let pieces = |id| sim.posted.iter().filter(|c| c.op == id).count();
    assert_eq!((pieces(a), pieces(b)), (1, 1));
    let ids: HashSet<_> = sim.done.iter().map(|d| d.op).collect();
    assert_eq!(ids, [a, b].into_iter().collect());
}

#[test]
fn fifo_posts_whole_ops_in_arrival_order() {
    let mut sim = Sim::new(SchedConfig { mode: Mode::Fifo, ..cfg() });
    let a = sim.s.push(bulk(0, 50_000, vec![0]));
    let b = sim.s.push(OpSpec {
        tenant: 1,
        class: Class::Latency,
        len: 16,
        lanes: ids(&[0]),
        splittable: true,
        cuts: None,
        tail: 0,
    });
    sim.fill();
    assert_eq!(sim.posted.iter().map(|c| (c.op, c.len)).collect::<Vec<_>>(), vec![(a, 50_000), (b, 16)]);
}

#[test]
fn bulk_per_round_bounds_the_chunks_of_one_call_but_not_latency() {
    let mut s = Scheduler::new(SchedConfig { bulk_per_round: 1, ..cfg() });
    s.push(bulk(0, 100_000, vec![0]));
    for _ in 0..3 {
        s.push(OpSpec {
            tenant: 1,
            class: Class::Latency,
            len: 8,
            lanes: ids(&[0]),
            splittable: false,
            cuts: None,
            tail: 0,
        });
    }
    let mut out = Vec::new();
    s.next(&mut out, 64);
    assert_eq!(out.len(), 4, "three latency ops and one bulk chunk: {out:?}");
}

#[test]
fn bulk_runs_unthrottled_until_latency_work_shows_up() {
    let c = SchedConfig { idle_after_chunks: 4, idle_chunk_size: 10_000, idle_budget_factor: 4, ..cfg() };
    let mut sim = Sim::new(c);
    sim.s.push(bulk(0, 1_000_000, vec![0]));
    sim.fill();
    assert!(sim.posted.iter().all(|c| c.len == 10_000), "idle bulk is not split finely: {:?}", sim.posted);
    while let Some(c) = sim.inflight.pop_front() {
        sim.s.complete(c, true);
    }
    sim.s.push(OpSpec {
        tenant: 1,
        class: Class::Latency,
        len: 8,
        lanes: ids(&[0]),
        splittable: false,
        cuts: None,
        tail: 0,
    });
    let before = sim.posted.len();
    sim.fill();
    let after: Vec<_> = sim.posted[before..].iter().filter(|c| c.len != 8).map(|c| c.len).collect();
    // Split while latency work was seen within the last 4 bulk chunks; unthrottled after.
    assert_eq!(after[..4], [1000; 4], "bulk not split once latency shows: {after:?}");
    assert!(after[4..].iter().all(|&l| l == 10_000), "{after:?}");
}

#[test]
fn a_chunk_refused_after_its_op_was_cancelled_ends_the_op() {
    // The reactor looked at the first chunk (its future still there), then the future was
    // dropped: the other chunks went back and the op was cancelled with the first still out.
    // The provider then refused that one (rxm's first write on a lane still connecting): its
    // return must end the op, or it sits in the scheduler forever, neither posted nor
    // withdrawn, holding the buffer (rail_groups' dropped split op, 1 run in ~100 here).
    let mut s = Scheduler::new(cfg());
    let id = s.push(bulk(0, 4000, vec![0]));
    let mut out = Vec::new();
    s.next(&mut out, 64);
    assert_eq!(out.len(), 4, "{out:?}");
    for &c in &out[1..] {
        assert_eq!(s.unissue(c), None);
    }
    assert_eq!(s.cancel(id), None, "the first chunk is still out");
    assert_eq!(s.unissue(out[0]), Some(OpDone { op: id, ok: false }), "its return ends the op");
    assert!(s.is_empty(), "nothing is left behind");
    // A failed op's last chunk going back ends it the same way.
    let id = s.push(bulk(0, 2000, vec![0]));
    out.clear();
    s.next(&mut out, 64);
    assert_eq!(s.fail(id), None);
    assert_eq!(s.unissue(out[0]), None, "one more is out");
    assert_eq!(s.unissue(out[1]), Some(OpDone { op: id, ok: false }));
    assert!(s.is_empty());
}

#[test]
fn the_first_unposted_offset_counts_ranges_handed_back() {
    // A failure withdraws what is not posted; the batch it ends names the first piece that
    // did not land, which may be a range a full queue handed back, before the failing chunk.
    let mut s = Scheduler::new(cfg());
    let id = s.push(bulk(0, 4000, vec![0]));
    assert_eq!(s.first_unposted(id), Some(0), "nothing posted yet");
    let mut out = Vec::new();
    s.next(&mut out, 64);
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(s.first_unposted(id), None, "all of it is out");
    assert_eq!(s.unissue(out[1]), None);
    assert_eq!(s.first_unposted(id), Some(out[1].offset), "the returned range");
    assert_eq!(s.first_unposted(OpId(999)), None, "an unknown op has none");
}

#[test]
fn budgets_too_large_to_multiply_saturate_instead_of_wrapping_to_none() {
    // A weight of 2^31 times 2^29 bytes a tenant, times the idle factor of 16, is 2^64: a
    // product that wrapped read as a budget of nothing, and the tenant was never served.
    let c = SchedConfig {
        tenant_bytes: 1 << 29,
        lane_bytes: 1 << 60,
        idle_after_chunks: 1_000,
        idle_budget_factor: 16,
        ..cfg()
    };
    let mut sim = Sim::new(c);
    sim.s.set_weight(0, 1 << 31);
    sim.s.push(bulk(0, 10_000, vec![0]));
    sim.drain();
    assert_eq!(sim.done.len(), 1, "the op was served");
    assert!(sim.done[0].ok);
}

#[test]
fn settings_a_scheduler_cannot_run_with_are_named() {
    assert!(SchedConfig::default().check().is_ok());
    for (name, set) in [
        ("bulk_per_round", (|c: &mut SchedConfig| c.bulk_per_round = 0) as fn(&mut SchedConfig)),
        ("lane_wrs", |c| c.lane_wrs = 0),
        ("nic_wrs", |c| c.nic_wrs = 0),
        ("tenant_bytes", |c| c.tenant_bytes = 0),
        ("nic_bytes", |c| c.nic_bytes = 0),
    ] {
        let mut c = SchedConfig::default();
        set(&mut c);
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains(name), "{name}: {e}");
    }
    let nan = SchedConfig { min_bulk_share: f64::NAN, ..SchedConfig::default() };
    assert!(nan.check().unwrap_err().to_string().contains("min_bulk_share"));
    let var = |name: &str| (name == "RDMALANE_MIN_BULK_SHARE").then(|| "NaN".to_string());
    let e = SchedConfig::from_vars(&var).unwrap_err().to_string();
    assert!(e.contains("RDMALANE_MIN_BULK_SHARE"), "{e}");
}
