//! The rail groups' own registrations of each region a multi-group runtime registered, found
//! by the runtime's handle. Every op posted there names its group's descriptor, looked up on
//! the op's own thread as it is posted: the lookup takes no lock and writes nothing shared, so
//! a latency-class op's post neither waits for nor takes a cache line from a bulk thread that
//! posts or registers at the same time (the read side of a lock is two locked
//! read-modify-writes on a line that every posting thread shares).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use slab::Slab;

/// One group's registration of a region.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupReg {
    /// Its id in the group's transport.
    pub id: u64,
    /// Its local descriptor there.
    pub desc: usize,
}

/// A registration made on every group's transport: its handle in each.
pub(super) type GroupRegs = Vec<GroupReg>;

/// Handles per chunk of the lock-free lookup.
const CHUNK: usize = 1024;

/// Chunks of the lock-free lookup: handles past `CHUNK * CHUNKS` (a million registrations
/// held at once) are looked up under the lock instead.
const CHUNKS: usize = 1024;

/// The registrations of a runtime with `groups` rail groups, by handle.
pub(super) struct GroupRegTable {
    groups: usize,
    /// Which handles are taken, and each one's registrations (given back to deregister).
    owned: Mutex<Slab<GroupRegs>>,
    /// Each handle's descriptors, `groups` in a row, in chunks made as the first handle in
    /// each is handed out; written under `owned`'s lock, read without it.
    descs: Box<[OnceLock<Box<[AtomicUsize]>>]>,
}

impl GroupRegTable {
    /// An empty table for `groups` groups (one group needs none: it names its own).
    pub(super) fn new(groups: usize) -> GroupRegTable {
        let chunks = if groups > 1 { CHUNKS } else { 0 };
        GroupRegTable {
            groups,
            owned: Mutex::new(Slab::new()),
            descs: (0..chunks).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Keep `regs` (one per group, in group order) under a new handle.
    pub(super) fn insert(&self, regs: GroupRegs) -> usize {
        debug_assert_eq!(regs.len(), self.groups, "a registration per group");
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        let handle = owned.vacant_key();
        // Published before the handle is: whoever learns it, learns it from this thread.
        self.publish(handle, regs.iter().map(|r| r.desc));
        let taken = owned.insert(regs);
        debug_assert_eq!(taken, handle, "a slab fills its vacant key first");
        handle
    }

    /// Forget `handle`, giving back its registrations to deregister (`None`: not ours).
    pub(super) fn remove(&self, handle: usize) -> Option<GroupRegs> {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        let regs = owned.try_remove(handle)?;
        // A stale descriptor names nothing now, as a handle never handed out does.
        self.publish(handle, std::iter::repeat_n(0, self.groups));
        Some(regs)
    }

    /// Group `g`'s descriptor of `handle`'s region; 0 for a handle not (or no longer) held.
    #[inline]
    pub(super) fn desc(&self, handle: usize, g: usize) -> usize {
        // Past the last group the lookup would read the next handle's first.
        debug_assert!(g < self.groups, "group {g} of {}", self.groups);
        match self.descs.get(handle / CHUNK) {
            Some(chunk) => chunk
                .get()
                .and_then(|c| c.get((handle % CHUNK) * self.groups + g))
                .map_or(0, |d| d.load(Ordering::Acquire)),
            None => self.desc_locked(handle, g),
        }
    }

    /// [`desc`](Self::desc) of a handle past the lock-free lookup's reach.
    #[cold]
    fn desc_locked(&self, handle: usize, g: usize) -> usize {
        let owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        owned.get(handle).and_then(|r| r.get(g)).map_or(0, |r| r.desc)
    }

    /// Write `handle`'s descriptors where the lock-free lookup finds them (with the lock held).
    fn publish(&self, handle: usize, descs: impl Iterator<Item = usize>) {
        let Some(slot) = self.descs.get(handle / CHUNK) else { return };
        let groups = self.groups;
        let chunk = slot.get_or_init(|| (0..CHUNK * groups).map(|_| AtomicUsize::new(0)).collect());
        let at = (handle % CHUNK) * groups;
        for (cell, d) in chunk[at..at + groups].iter().zip(descs) {
            cell.store(d, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(descs: &[usize]) -> GroupRegs {
        descs.iter().enumerate().map(|(i, &desc)| GroupReg { id: i as u64 + 100, desc }).collect()
    }

    #[test]
    fn descriptors_are_found_by_handle_and_forgotten_with_it() {
        let t = GroupRegTable::new(2);
        let a = t.insert(regs(&[11, 12]));
        let b = t.insert(regs(&[21, 22]));
        assert_ne!(a, b);
        assert_eq!((t.desc(a, 0), t.desc(a, 1), t.desc(b, 0), t.desc(b, 1)), (11, 12, 21, 22));
        assert_eq!(t.desc(b + 5, 0), 0, "a handle never handed out names nothing");
        let back = t.remove(a).expect("held");
        assert_eq!(back.iter().map(|r| (r.id, r.desc)).collect::<Vec<_>>(), vec![(100, 11), (101, 12)]);
        assert_eq!((t.desc(a, 0), t.desc(a, 1)), (0, 0));
        assert!(t.remove(a).is_none(), "removed once");
        let c = t.insert(regs(&[31, 32]));
        assert_eq!(c, a, "handles are reused");
        assert_eq!(t.desc(c, 1), 32);
    }

    #[test]
    fn handles_past_the_lock_free_reach_are_still_found() {
        let t = GroupRegTable::new(3);
        let far = CHUNK * CHUNKS + 7;
        {
            let mut owned = t.owned.lock().unwrap();
            for _ in 0..far {
                owned.insert(Vec::new());
            }
        }
        let h = t.insert(regs(&[1, 2, 3]));
        assert_eq!(h, far);
        assert_eq!((t.desc(h, 0), t.desc(h, 2)), (1, 3));
        assert_eq!(t.remove(h).map(|r| r.len()), Some(3));
        assert_eq!(t.desc(h, 1), 0);
    }

    #[test]
    fn lookups_on_other_threads_see_what_was_published_before_the_handle() {
        let t = std::sync::Arc::new(GroupRegTable::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let t = t.clone();
            std::thread::spawn(move || rx.iter().map(|h: usize| t.desc(h, 1)).collect::<Vec<_>>())
        };
        for i in 0..3000 {
            tx.send(t.insert(regs(&[i, i + 1]))).expect("the reader runs");
        }
        drop(tx);
        let seen = reader.join().expect("the reader finishes");
        assert_eq!(seen, (0..3000).map(|i| i + 1).collect::<Vec<_>>());
    }
}
