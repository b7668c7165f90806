//! The registration cache: registering memory that is already registered reuses the
//! registration. Keyed by the memory's identity (address and length of a shared, immutable
//! `Bytes`, which the cache keeps alive while registered, so a hit can never name memory that
//! was freed and reused). Idle entries are evicted least recently used first once the cache
//! holds more than its byte cap; an entry still used by a buffer handle, and so by any op in
//! flight, is never evicted: deregistration waits for the last of them.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;

use super::{Runtime, WeakRuntime};
use crate::base::error::{Error, OpKind, Result};
use crate::base::transport::{Access, MemoryRegion};

/// One registration of one `Bytes`: what a shared buffer holds.
pub(crate) struct Entry {
    pub bytes: Bytes,
    pub mr: MemoryRegion,
    pub rt_id: u64,
    rt: WeakRuntime,
}

impl Drop for Entry {
    fn drop(&mut self) {
        // The memory goes to the reactor with the deregistration and is released after it.
        if let Some(rt) = self.rt.upgrade() {
            rt.release_region(self.mr.id, Some(Box::new(self.bytes.clone())));
        }
    }
}

struct Slot {
    entry: Arc<Entry>,
    last_used: u64,
}

#[derive(Default)]
struct State {
    slots: HashMap<(usize, usize), Slot>,
    bytes: usize,
    tick: u64,
}

/// What the cache has done, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Registrations served from the cache.
    pub hits: u64,
    /// Registrations made because the memory was not cached.
    pub misses: u64,
    /// Idle registrations dropped to stay under the cap.
    pub evictions: u64,
    /// Bytes the cache holds registered now.
    pub bytes: u64,
    /// Entries it holds now.
    pub entries: u64,
}

/// The runtime's registration cache (see the module's doc).
pub(crate) struct MrCache {
    cap: usize,
    state: Mutex<State>,
    stats: Mutex<CacheStats>,
}

impl MrCache {
    pub(crate) fn new(cap: usize) -> MrCache {
        MrCache { cap, state: Mutex::new(State::default()), stats: Mutex::new(CacheStats::default()) }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.bytes = st.bytes as u64;
        s.entries = st.slots.len() as u64;
        s
    }

    fn count(&self, f: impl FnOnce(&mut CacheStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The registration of `bytes`, cached or made now.
    pub(crate) fn register(&self, rt: &Runtime, bytes: Bytes) -> Result<Arc<Entry>> {
        if bytes.is_empty() {
            return Err(Error::invalid(OpKind::Register, "cannot register empty memory"));
        }
        let key = (bytes.as_ptr() as usize, bytes.len());
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.tick += 1;
            let tick = st.tick;
            if let Some(slot) = st.slots.get_mut(&key) {
                slot.last_used = tick;
                let entry = slot.entry.clone();
                drop(st);
                self.count(|s| s.hits += 1);
                return Ok(entry);
            }
        }
        // Registered outside the lock: it is a round trip to the reactor. Two racing misses on
        // the same memory both register; the second to insert keeps the first's entry.
        let mr = rt.register_region(bytes.as_ptr() as *mut u8, bytes.len(), Access::LOCAL)?;
        let entry = Arc::new(Entry { bytes, mr, rt_id: rt.id(), rt: rt.downgrade() });
        self.count(|s| s.misses += 1);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.tick += 1;
        let tick = st.tick;
        if let Some(slot) = st.slots.get_mut(&key) {
            slot.last_used = tick;
            return Ok(slot.entry.clone());
        }
        st.bytes += key.1;
        st.slots.insert(key, Slot { entry: entry.clone(), last_used: tick });
        let evicted = self.evict(&mut st);
        drop(st);
        if evicted > 0 {
            self.count(|s| s.evictions += evicted);
        }
        Ok(entry)
    }

    /// Drop idle entries, oldest first, until under the cap (entries in use stay).
    fn evict(&self, st: &mut State) -> u64 {
        let mut n = 0;
        while st.bytes > self.cap {
            let victim = st
                .slots
                .iter()
                .filter(|(_, s)| Arc::strong_count(&s.entry) == 1)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| *k);
            let Some(k) = victim else { break };
            st.slots.remove(&k);
            st.bytes -= k.1;
            n += 1;
        }
        n
    }

    /// Evict what is idle beyond the cap now (entries whose last handle went since).
    pub(crate) fn trim(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.evict(&mut st);
        drop(st);
        self.count(|s| s.evictions += n);
        n
    }
}

/// Measure a registration's duration.
pub(crate) fn timed<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed().as_nanos() as u64)
}
