//! The listener's handshake slots, by arrival: who may be evicted at the cap, and whose slot a
//! finished, evicted or panicked handshake task leaves.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::AbortHandle;

use super::drive::{Evict, Progress};

/// A handshake in progress, as the listener keeps it.
pub(super) struct Slot {
    pub addr: SocketAddr,
    /// What the handshake says of itself, for eviction.
    pub progress: Arc<Progress>,
    /// Its task, to abort on eviction; its id names it when the task panics.
    pub abort: AbortHandle,
}

/// A slot's id, in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct SlotId(u64);

/// The slots in use.
#[derive(Default)]
pub(super) struct Slots {
    /// By arrival: the first entry is the oldest.
    by_arrival: BTreeMap<SlotId, Slot>,
    last: u64,
}

impl Slots {
    /// Slots in use.
    pub(super) fn len(&self) -> usize {
        self.by_arrival.len()
    }

    /// The id the next handshake's slot takes (its task reports it when it ends).
    pub(super) fn next_id(&mut self) -> SlotId {
        self.last += 1;
        SlotId(self.last)
    }

    /// Take slot `id` for a handshake.
    pub(super) fn insert(&mut self, id: SlotId, slot: Slot) {
        self.by_arrival.insert(id, slot);
    }

    /// The handshake in `id` ended: whether it still held its slot (else it was evicted, and
    /// its refusal counted then).
    pub(super) fn ended(&mut self, id: SlotId) -> bool {
        self.by_arrival.remove(&id).is_some()
    }

    /// A handshake task panicked (it could not report its slot): free the slot of `task`, and
    /// say whose it was.
    pub(super) fn panicked(&mut self, task: tokio::task::Id) -> Option<SocketAddr> {
        let id = *self.by_arrival.iter().find(|(_, s)| s.abort.id() == task)?.0;
        self.by_arrival.remove(&id).map(|s| s.addr)
    }

    /// At the cap: free the slot of the oldest idle stranger, else of the oldest idle peer whose
    /// hello is in but whose proof of the shared secret is not. The caller aborts its task.
    pub(super) fn evict(&mut self) -> Option<(Slot, Evict)> {
        // By arrival, so the first of the lowest turn is the oldest of it.
        let (id, turn) = self
            .by_arrival
            .iter()
            .filter_map(|(&id, s)| s.progress.evictable().map(|turn| (id, turn)))
            .min_by_key(|&(id, turn)| (turn, id))?;
        self.by_arrival.remove(&id).map(|s| (s, turn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::JoinSet;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_panicked_handshake_frees_its_slot_and_an_evicted_one_is_not_counted_twice() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("tokio");
        rt.block_on(async {
            let mut tasks: JoinSet<SlotId> = JoinSet::new();
            let mut slots = Slots::default();
            let calm = slots.next_id();
            let abort = tasks.spawn(async move { std::future::pending::<SlotId>().await });
            slots.insert(calm, Slot { addr: addr(1), progress: Arc::default(), abort });
            let wild = slots.next_id();
            let abort = tasks.spawn(async move {
                if wild.0 > 0 {
                    panic!("a handshake with a bug");
                }
                wild
            });
            slots.insert(wild, Slot { addr: addr(2), progress: Arc::default(), abort });
            assert_eq!(slots.len(), 2);

            let e = tasks.join_next().await.expect("a task").expect_err("it panicked");
            assert!(e.is_panic());
            assert_eq!(slots.panicked(e.id()), Some(addr(2)));
            assert_eq!(slots.len(), 1, "the panicked task's slot is free");
            assert_eq!(slots.panicked(e.id()), None);

            // Ending after an eviction leaves nothing to free.
            slots.by_arrival[&calm].progress.idle();
            let (s, turn) = slots.evict().expect("an idle stranger");
            assert!(matches!(turn, Evict::Stranger) && s.addr == addr(1));
            s.abort.abort();
            assert!(!slots.ended(calm));
            assert_eq!(slots.len(), 0);
        });
    }

    #[test]
    fn eviction_takes_strangers_first_and_the_oldest_of_each_turn() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("tokio");
        rt.block_on(async {
            let mut tasks: JoinSet<()> = JoinSet::new();
            let mut slots = Slots::default();
            let mut add = |port, idle: bool, hello: bool| {
                let id = slots.next_id();
                let progress = Arc::new(Progress::default());
                if idle {
                    progress.idle();
                }
                if hello {
                    progress.hello_in();
                }
                let abort = tasks.spawn(std::future::pending());
                slots.insert(id, Slot { addr: addr(port), progress, abort });
            };
            add(1, true, true); // unproven, oldest
            add(2, false, false); // busy: never
            add(3, true, false); // stranger
            add(4, true, true); // unproven
            add(5, true, false); // stranger, younger
            let order: Vec<u16> = std::iter::from_fn(|| slots.evict()).map(|(s, _)| s.addr.port()).collect();
            assert_eq!(order, [3, 5, 1, 4]);
            assert_eq!(slots.len(), 1);
            tasks.abort_all();
        });
    }
}
