//! On shm's checked path the target's progress serves peers' one-sided ops, which raise no
//! completion there: the transport counts them, so an idle reactor knows to keep polling.
use std::time::{Duration, Instant};

use rdmalane::backend::{Access, Completion, PostError, WrKind};
use rdmalane_efa::raw::RawEngine;

#[test]
fn a_passive_shm_target_notices_the_one_sided_ops_it_serves() {
    let (mut target, mut init) =
        (RawEngine::open(Some("shm"), None).unwrap(), RawEngine::open(Some("shm"), None).unwrap());
    assert!(target.caps().silent_refusals, "shm takes its checked path unless local peers are trusted");
    let to_target = init.insert_peer(&target.name()).unwrap();
    target.insert_peer(&init.name()).unwrap();
    let mem = target.alloc(4096, Access::WRITE).unwrap();
    let (remote_addr, key) = target.remote(mem);
    let src = init.alloc(64, Access::LOCAL).unwrap();
    init.bytes(src).fill(0x5a);
    let mut comps = Vec::new();
    target.poll(&mut comps, 16);
    assert!(!target.remote_served(), "nothing was served yet");

    for round in 0..3u64 {
        let write = WrKind::Write { remote_addr, key, imm: None };
        let deadline = Instant::now() + Duration::from_secs(10);
        // shm maps a new peer on first use: posts come back "again" until progress has.
        while let Err(e) = init.post(round, to_target, write, src, 0, 64) {
            assert!(matches!(e, PostError::Again) && Instant::now() < deadline, "{e:?}");
            init.poll(&mut comps, 16);
            target.poll(&mut comps, 16);
            assert!(comps.is_empty(), "{comps:?}");
        }
        let (mut served, mut done) = (false, false);
        while !(served && done) {
            assert!(Instant::now() < deadline, "round {round}: served {served}, completed {done}");
            target.poll(&mut comps, 16);
            served |= target.remote_served();
            comps.clear();
            init.poll(&mut comps, 16);
            for c in comps.drain(..) {
                match c {
                    Completion::Op { id, status, .. } if id.to_raw() == round => {
                        status.unwrap();
                        done = true;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert!(target.bytes(mem)[..64].iter().all(|&b| b == 0x5a));
        target.poll(&mut comps, 16);
        assert!(!target.remote_served(), "round {round}: no op since the last look");
    }
}
