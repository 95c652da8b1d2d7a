//! The pod's prefix cache: which KV blocks (by chained block hash) the GPU still holds.
//!
//! Modelled on vLLM's block pool. A block used by a running request is *pinned* (reference
//! counted) and cannot be evicted; when its last user finishes it stays cached but becomes
//! evictable, and the least recently used evictable blocks are dropped when the pool needs room.
//! The pool's room is shared with the blocks running requests hold privately (their partial last
//! block and generated tokens), so a busy pod keeps fewer cached prefixes, as a real one does.

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

    pub fn block_count(&self) -> usize {
        self.entries.len()
    }

    pub fn pinned_len(&self) -> usize {
        self.entries.len() - self.lru.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
