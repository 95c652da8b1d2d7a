//! The pod's prefix cache: which KV blocks (by chained block hash) the GPU still holds.
//!
//! Modelled on vLLM's block pool. A block used by a running request is *pinned* (reference
//! counted) and cannot be evicted; when its last user finishes it stays cached but becomes
//! evictable, and the least recently used evictable blocks are dropped when the pool needs room.
//! The pool's room is shared with the blocks running requests hold privately (their partial last
//! block and generated tokens), so a busy pod keeps fewer cached prefixes, as a real one does.
//!
//! [`HostCache`] is the second tier, host memory behind vLLM's native CPU offloading connector
//! (`vllm/v1/kv_offload/cpu.py`'s LRU manager): the hashes of blocks written through to host
//! memory, least recently used dropped first when it is full.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy)]
struct Entry {
    pins: u32,
    /// Position in the LRU order while unpinned.
    tick: u64,
}

#[derive(Debug, Default)]
pub struct PrefixCache {
    entries: HashMap<u64, Entry>,
    /// Unpinned blocks only, oldest first: the eviction order.
    lru: BTreeMap<u64, u64>,
    tick: u64,
}

impl PrefixCache {
    /// Number of leading blocks of `hashes` present in the cache.
    pub fn longest_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    pub fn is_pinned(&self, hash: u64) -> bool {
        self.entries.get(&hash).is_some_and(|e| e.pins > 0)
    }

    /// Marks a block as in use, inserting it if it was not cached.
    pub fn pin(&mut self, hash: u64) {
        let entry = self
            .entries
            .entry(hash)
            .or_insert(Entry { pins: 0, tick: 0 });
        if entry.pins == 0 {
            self.lru.remove(&entry.tick);
        }
        entry.pins += 1;
    }

    /// Releases one use; a block nobody uses stays cached as the most recently used evictable one.
    pub fn unpin(&mut self, hash: u64) {
        let Some(entry) = self.entries.get_mut(&hash) else {
            return;
        };
        entry.pins = entry.pins.saturating_sub(1);
        if entry.pins == 0 {
            self.tick += 1;
            entry.tick = self.tick;
            self.lru.insert(self.tick, hash);
        }
    }

    /// Evicts least recently used unpinned blocks until at most `max_blocks` remain cached
    /// (pinned blocks are never evicted, so the result may stay above the bound).
    pub fn evict_to(&mut self, max_blocks: usize) {
        while self.entries.len() > max_blocks {
            let Some((_, hash)) = self.lru.pop_first() else {
                return;
            };
            self.entries.remove(&hash);
        }
    }

    /// Drops every block not in use (vLLM's `reset_prefix_cache` cannot drop blocks in use either).
    pub fn clear_unpinned(&mut self) {
        for hash in std::mem::take(&mut self.lru).into_values() {
            self.entries.remove(&hash);
        }
    }

    /// Drops every block, in use or not: the process that held them is gone.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.lru.clear();
    }

    pub fn block_count(&self) -> usize {
        self.entries.len()
    }

    pub fn pinned_len(&self) -> usize {
        self.entries.len() - self.lru.len()
    }
}

/// The host-memory tier: which blocks (by chained hash) host memory holds, at most `capacity`,
/// evicted least recently used first. Nothing pins a block here: a load reads a copy, so the block
/// stays stored. Capacity 0 holds nothing.
#[derive(Debug, Default)]
pub struct HostCache {
    capacity: usize,
    /// Block hash → its position in the LRU order.
    entries: HashMap<u64, u64>,
    /// Oldest first: the eviction order.
    lru: BTreeMap<u64, u64>,
    tick: u64,
}

impl HostCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// Number of leading blocks of `hashes` present.
    pub fn longest_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    /// Marks a stored block as the most recently used; false if it is not stored.
    pub fn touch(&mut self, hash: u64) -> bool {
        let Some(tick) = self.entries.get_mut(&hash) else {
            return false;
        };
        self.lru.remove(tick);
        self.tick += 1;
        *tick = self.tick;
        self.lru.insert(self.tick, hash);
        true
    }

    /// Stores a block as the most recently used, evicting the least recently used one when full.
    /// True if it was not stored before (its bytes cross to host memory); a stored one is only
    /// refreshed.
    pub fn store(&mut self, hash: u64) -> bool {
        if self.capacity == 0 || self.touch(hash) {
            return false;
        }
        while self.entries.len() >= self.capacity {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            self.entries.remove(&old);
        }
        self.tick += 1;
        self.entries.insert(hash, self.tick);
        self.lru.insert(self.tick, hash);
        true
    }

    /// Drops every block (a restart empties host memory too).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.lru.clear();
    }

    pub fn block_count(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tier_keeps_the_most_recently_stored_blocks() {
        let mut h = HostCache::new(3);
        assert!(h.store(1));
        assert!(h.store(2));
        assert!(h.store(3));
        assert!(!h.store(1), "already stored: refreshed, no bytes move");
        // Full: 2 is now the least recently used.
        assert!(h.store(4));
        assert_eq!(h.block_count(), 3);
        assert_eq!(h.longest_prefix(&[1, 2, 3]), 1);
        assert_eq!(h.longest_prefix(&[3, 4, 1]), 3);
        // A touch refreshes too: 3 survives the next two stores, 1 and 4 do not.
        assert!(h.touch(3));
        assert!(!h.touch(2), "2 was evicted");
        assert!(h.store(5));
        assert!(h.store(6));
        assert_eq!(h.longest_prefix(&[3]), 1);
        assert_eq!(h.longest_prefix(&[1]), 0);
        assert_eq!(h.longest_prefix(&[4]), 0);
        h.clear();
        assert_eq!(h.block_count(), 0);
        assert!(h.store(4));
    }

    #[test]
    fn a_host_tier_of_no_blocks_stores_nothing() {
        let mut h = HostCache::new(0);
        assert!(!h.store(1));
        assert_eq!(h.block_count(), 0);
        assert_eq!(h.longest_prefix(&[1]), 0);
    }

    #[test]
    fn lru_eviction_skips_pinned_blocks() {
        let mut c = PrefixCache::default();
        for h in 1..=4 {
            c.pin(h);
        }
        c.unpin(1);
        c.unpin(2);
        c.unpin(3);
        // 4 stays pinned; 1 is the oldest evictable.
        c.evict_to(2);
        assert_eq!(c.block_count(), 2);
        assert_eq!(c.longest_prefix(&[1]), 0);
        assert_eq!(c.longest_prefix(&[3, 4]), 2);
        c.evict_to(0);
        assert_eq!(c.block_count(), 1, "pinned block survives");
        assert_eq!(c.pinned_len(), 1);
    }

    #[test]
    fn touching_refreshes_lru_position() {
        let mut c = PrefixCache::default();
        for h in [1, 2] {
            c.pin(h);
            c.unpin(h);
        }
        c.pin(1);
        c.unpin(1);
        c.evict_to(1);
        assert_eq!(c.longest_prefix(&[1]), 1);
        assert_eq!(c.longest_prefix(&[2]), 0);
    }
}
