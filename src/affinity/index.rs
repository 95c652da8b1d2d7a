//! The prefix index: which pods are believed to hold which blocks in their KV cache.
//!
//! One map from (block hash, group of 64 pod slots) to a 64-bit mask of the group's slots answers
//! "how many leading blocks of this prompt does each pod hold" in one pass over the prompt's blocks
//! per group, and a group none of whose pods holds the first block costs one lookup. Up to 64 pods
//! that is one pass whatever the pool size; with 512 pods, eight passes of which all but the
//! holders' groups stop at once. A block held by pods of one group is one entry, so memory follows
//! what is held, not the pool size (a mask as wide as the pool would cost 64 bytes per block at
//! 512 pods, held or not). Each pod
//! also keeps an LRU of its blocks with a capacity that mirrors its real KV cache (`num_gpu_blocks ×
//! block_size` tokens, converted to our block size), so what the index believes falls out roughly
//! when the engine would evict it. The LRU is a queue of (hash, stamp) with lazy deletion: a touch
//! pushes a new stamp, eviction pops entries whose stamp is stale; the queue is compacted when it
//! grows past twice the capacity, so memory stays O(capacity). A stamp is the pod's own touch
//! count, so `touches now − stamp` bounds how many blocks are newer than a block on that pod: with
//! KV tiers beyond the GPU (`super::tiers`) the index holds every tier and this bound tells which
//! tier a block has aged into, in one lookup.
//!
//! A restarted pod keeps what it held as its *former* blocks until it has touched a cache's worth
//! of new ones: not a hit (they are gone), but where those prompts lived, which the picker uses as
//! the affinity floor's benefit of the doubt (`crate::scheduler::picker`). Without it a restart of
//! the whole pool re-placed every prompt as new under the restart's queues, and the pool's
//! partition of prompts was lost with the caches (docs/results.md, "Where each prompt lived"). A
//! VM that loads a snapshot starts without them (a snapshot carries what pods hold, not held).
//! What was routed to the pod after its new process started is not former but held (the restart
//! is seen a poll later, and those prompts are being computed there): each pod's touches are
//! stamped with the time now and then ([`PrefixIndex::mark_time`]), and a restart keeps the blocks
//! touched since the process's start ([`PrefixIndex::empty_slot`]). Made former as well, in one run
//! three of twelve tenants recomputed in a second place within seconds of a whole-pool restart:
//! their requests after the restart, the new process already computing their prompt, saw no holder.

use hashbrown::HashMap;
use std::collections::VecDeque;

pub type PodMask = u64;
/// Slots per mask.
const GROUP: usize = 64;
pub const MAX_SLOTS: usize = crate::common::MAX_PODS;

/// A block as held by one group of slots.
type HolderKey = (u64, u16);

fn group_of(slot: usize) -> (u16, PodMask) {
    ((slot / GROUP) as u16, 1 << (slot % GROUP))
}

#[derive(Debug, Default, Clone)]
struct PodLru {
    /// Blocks held in every tier.
    capacity: usize,
    /// Of those, the GPU's: what a block touched more than this many blocks ago has left.
    gpu_capacity: usize,
    /// hash → stamp of its latest touch.
    latest: HashMap<u64, u64>,
    queue: VecDeque<(u64, u64)>,
    /// Touches ever made here: how many blocks at most became newer than one touched earlier.
    touches: u64,
    /// Blocks the pod held before it restarted (at most `capacity`), kept until
    /// `touches` reaches `former_until`: by then the pod has refilled its cache.
    former: hashbrown::HashSet<u64>,
    former_until: u64,
    /// (time in ms, `touches` then), oldest first: the touches after a mark were made at or after
    /// its time. At most one per [`MARK_EVERY_MS`], the last [`MARKS`] kept.
    marks: VecDeque<(u64, u64)>,
}

/// Resolution of the touch clock: a restart's start is placed to within this.
const MARK_EVERY_MS: u64 = 20;
/// Marks kept per pod (16 bytes each): at least `MARKS × MARK_EVERY_MS` = 0.64 s of history,
/// more where the pod is touched less often, against a restart seen at the next poll (200 ms
/// by default). One seen later (a pod down while it loads its weights) keeps what was touched
/// since the oldest mark, all of it after the start; the touches before it are former.
const MARKS: usize = 32;

impl PodLru {
    fn len(&self) -> usize {
        self.latest.len()
    }

    /// Returns the hashes evicted to stay within capacity.
    fn touch(&mut self, hash: u64, evicted: &mut Vec<u64>) {
        self.touches += 1;
        if self.touches >= self.former_until && !self.former.is_empty() {
            self.former = hashbrown::HashSet::new();
        }
        let stamp = self.touches;
        self.latest.insert(hash, stamp);
        self.queue.push_back((hash, stamp));
        self.evict_over_capacity(evicted);
        if self.queue.len() > 2 * self.capacity.max(16) {
            let latest = &self.latest;
            self.queue.retain(|(h, s)| latest.get(h) == Some(s));
        }
    }

    fn evict_over_capacity(&mut self, evicted: &mut Vec<u64>) {
        while self.latest.len() > self.capacity {
            let Some((h, s)) = self.queue.pop_front() else {
                break;
            };
            if self.latest.get(&h) == Some(&s) {
                self.latest.remove(&h);
                evicted.push(h);
            }
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct PrefixIndex {
    holders: HashMap<HolderKey, PodMask>,
    pods: Vec<PodLru>,
}

impl PrefixIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a slot's capacity in blocks (creating the slot), all in the GPU; shrinking evicts at
    /// once.
    pub fn set_capacity(&mut self, slot: usize, capacity: usize) {
        self.set_tiered_capacity(slot, capacity, capacity);
    }

    /// Sets a slot's capacity in blocks of every tier, `gpu` of them in the GPU (creating the
    /// slot); shrinking evicts at once.
    pub fn set_tiered_capacity(&mut self, slot: usize, capacity: usize, gpu: usize) {
        if slot >= MAX_SLOTS {
            return;
        }
        if self.pods.len() <= slot {
            self.pods.resize_with(slot + 1, PodLru::default);
        }
        let mut evicted = Vec::new();
        if let Some(pod) = self.pods.get_mut(slot) {
            pod.capacity = capacity;
            pod.gpu_capacity = gpu.min(capacity);
            pod.evict_over_capacity(&mut evicted);
        }
        self.unmark(slot, &evicted);
    }

    /// Records that the pod in `slot` now holds `hashes` (a prompt's chained blocks, in order).
    pub fn observe(&mut self, slot: usize, hashes: &[u64]) {
        let Some(pod) = self.pods.get_mut(slot) else {
            return;
        };
        let (group, bit) = group_of(slot);
        let mut evicted = Vec::new();
        // Touch later blocks first so that the leading blocks (shared by most requests) are the most
        // recent and are the last to go, as in an engine's LRU that frees a sequence's tail first.
        for &h in hashes.iter().rev() {
            pod.touch(h, &mut evicted);
            *self.holders.entry((h, group)).or_insert(0) |= bit;
        }
        // A block evicted by an earlier one of these touches and touched again after it is held:
        // where the pod was full and this prompt's blocks its oldest, each touch evicts the next
        // block of the prompt, which is then touched in turn.
        evicted.retain(|h| !pod.latest.contains_key(h));
        self.unmark(slot, &evicted);
    }

    fn unmark(&mut self, slot: usize, evicted: &[u64]) {
        let (group, bit) = group_of(slot);
        for &h in evicted {
            if let Some(mask) = self.holders.get_mut(&(h, group)) {
                *mask &= !bit;
                if *mask == 0 {
                    self.holders.remove(&(h, group));
                }
            }
        }
    }

    /// Forgets that the pod in `slot` holds `hashes` (a report showed them lost). Unlike a
    /// restart's, they are not kept as former blocks: that would make every ordinary LRU eviction
    /// sticky too, and on the reset cell, the one place it could help, it moved nothing beyond the
    /// seeds' noise (docs/results.md, "Where each prompt lived").
    pub fn forget(&mut self, slot: usize, hashes: &[u64]) {
        let Some(pod) = self.pods.get_mut(slot) else {
            return;
        };
        // Their queue entries go stale and are skipped (lazy deletion).
        let gone: Vec<u64> = hashes
            .iter()
            .copied()
            .filter(|h| pod.latest.remove(h).is_some())
            .collect();
        self.unmark(slot, &gone);
    }

    /// The slot's blocks touched at or before `stamp`, oldest first: what an LRU that dropped the
    /// block with that stamp has dropped too.
    pub fn blocks_not_newer_than(&self, slot: usize, stamp: u64) -> Vec<u64> {
        let Some(pod) = self.pods.get(slot) else {
            return Vec::new();
        };
        pod.queue
            .iter()
            .filter(|(h, s)| *s <= stamp && pod.latest.get(h) == Some(s))
            .map(|(h, _)| *h)
            .collect()
    }

    /// The touches the pod in `slot` gets from now on are made at `now_ms` or later (the clock the
    /// pods' process start times are read against).
    pub fn mark_time(&mut self, slot: usize, now_ms: u64) {
        let Some(pod) = self.pods.get_mut(slot) else {
            return;
        };
        if pod
            .marks
            .back()
            .is_some_and(|&(at, _)| now_ms < at.saturating_add(MARK_EVERY_MS))
        {
            return;
        }
        if pod.marks.len() >= MARKS {
            pod.marks.pop_front();
        }
        pod.marks.push_back((now_ms, pod.touches));
    }

    /// Forgets everything about a slot (the pod left the pool, or a snapshot replaces it).
    pub fn clear_slot(&mut self, slot: usize) {
        self.empty_slot(slot, None);
        if let Some(pod) = self.pods.get_mut(slot) {
            pod.former = hashbrown::HashSet::new();
            pod.marks = VecDeque::new();
        }
    }

    /// The pod in `slot` lost its whole cache (it restarted): what it held becomes its former
    /// blocks, replacing any older ones, except what was touched at or after `started_ms` (its new
    /// process's start, where known), which the new process holds. A touch is placed by the
    /// first mark at or after it: where no mark shows it came after the start, it is former.
    pub fn empty_slot(&mut self, slot: usize, started_ms: Option<u64>) {
        let Some(pod) = self.pods.get_mut(slot) else {
            return;
        };
        // Touches after this count came after the start.
        let after = started_ms
            .and_then(|start| pod.marks.iter().find(|&&(at, _)| at >= start))
            .map_or(u64::MAX, |&(_, touches)| touches);
        // Drained and refilled, not `retain`ed: erasing in place leaves tombstones that make the
        // table grow as it refills (a VM's heap grew by 15% in the churn test).
        let mut lost: Vec<u64> = Vec::new();
        let kept: Vec<(u64, u64)> = pod
            .latest
            .drain()
            .filter(|&(hash, stamp)| {
                let held = stamp > after;
                if !held {
                    lost.push(hash);
                }
                held
            })
            .collect();
        pod.latest.extend(kept);
        let latest = &pod.latest;
        pod.queue.retain(|(h, s)| latest.get(h) == Some(s));
        pod.former = lost.iter().copied().collect();
        pod.former_until = pod.touches + pod.capacity as u64;
        self.unmark(slot, &lost);
    }

    /// Whether any slot has former blocks (a pod restarted and has not refilled).
    pub fn has_former(&self) -> bool {
        self.pods.iter().any(|pod| !pod.former.is_empty())
    }

    /// Leading blocks of `hashes` each of the first `slots` slots held or holds, where it has
    /// former blocks (0 elsewhere): a block counts if it is held now or was before the cache
    /// emptied, so a prompt whose opening another prompt has brought back still counts whole.
    pub fn former_lengths(&self, hashes: &[u64], slots: usize) -> Vec<usize> {
        let slots = slots.min(MAX_SLOTS).min(self.pods.len());
        self.pods
            .iter()
            .take(slots)
            .map(|pod| {
                if pod.former.is_empty() {
                    return 0;
                }
                hashes
                    .iter()
                    .take_while(|h| pod.former.contains(*h) || pod.latest.contains_key(*h))
                    .count()
            })
            .collect()
    }

    /// Leading blocks of `hashes` held by each of the first `slots` slots that exist: `result[slot]`.
    pub fn match_lengths(&self, hashes: &[u64], slots: usize) -> Vec<usize> {
        let slots = slots.min(MAX_SLOTS).min(self.pods.len());
        let mut lengths = vec![0usize; slots];
        for first in (0..slots).step_by(GROUP) {
            let group = (first / GROUP) as u16;
            let width = (slots - first).min(GROUP);
            let mut alive: PodMask = if width == GROUP {
                PodMask::MAX
            } else {
                (1 << width) - 1
            };
            for (i, h) in hashes.iter().enumerate() {
                alive &= self.holders.get(&(*h, group)).copied().unwrap_or(0);
                if alive == 0 {
                    break;
                }
                let mut bits = alive;
                while bits != 0 {
                    let slot = first + bits.trailing_zeros() as usize;
                    if let Some(l) = lengths.get_mut(slot) {
                        *l = i + 1;
                    }
                    bits &= bits - 1;
                }
            }
        }
        lengths
    }

    /// Blocks touched in `slot` since `hash` was (at least as many as are newer than it there), if
    /// the slot holds it.
    pub fn touches_since(&self, slot: usize, hash: u64) -> Option<u64> {
        let pod = self.pods.get(slot)?;
        Some(pod.touches - pod.latest.get(&hash)?)
    }

    /// When `hash` was last touched in `slot` (the slot's touch count), if the slot holds it.
    pub fn stamp_of(&self, slot: usize, hash: u64) -> Option<u64> {
        self.pods.get(slot)?.latest.get(&hash).copied()
    }

    /// How many of the slot's blocks were touched after `stamp`: what a pod still holds if its LRU
    /// dropped everything up to the block that had that stamp.
    pub fn blocks_newer_than(&self, slot: usize, stamp: u64) -> usize {
        self.pods
            .get(slot)
            .map_or(0, |pod| pod.latest.values().filter(|&&s| s > stamp).count())
    }

    /// A slot's capacity in blocks and the touches ever made in its LRU: a block touched when the
    /// count was `t` has at most `now − t` blocks newer than it, so it cannot have been evicted
    /// while those and the blocks as new as it fit the capacity.
    /// The capacity is the GPU's: a prefix that ages out of it is in a slower tier.
    pub fn turnover(&self, slot: usize) -> Option<(usize, u64)> {
        self.pods.get(slot).map(|p| (p.gpu_capacity, p.touches))
    }

    pub fn blocks_held(&self, slot: usize) -> usize {
        self.pods.get(slot).map_or(0, PodLru::len)
    }

    pub fn entries(&self) -> usize {
        self.holders.len()
    }

    /// A slot's blocks, oldest first: the snapshot form.
    pub fn slot_blocks_oldest_first(&self, slot: usize) -> Vec<u64> {
        let Some(pod) = self.pods.get(slot) else {
            return Vec::new();
        };
        pod.queue
            .iter()
            .filter(|(h, s)| pod.latest.get(h) == Some(s))
            .map(|(h, _)| *h)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(slots: usize, capacity: usize) -> PrefixIndex {
        let mut idx = PrefixIndex::new();
        for s in 0..slots {
            idx.set_capacity(s, capacity);
        }
        idx
    }

    #[test]
    fn stamps_tell_what_an_lru_keeps_after_an_eviction() {
        let mut idx = index(1, 100);
        idx.observe(0, &[1, 2, 3]);
        idx.observe(0, &[7, 8]);
        let old = idx.stamp_of(0, 3).unwrap();
        assert!(
            idx.stamp_of(0, 1).unwrap() > old,
            "leading blocks are the newest"
        );
        assert_eq!(idx.blocks_newer_than(0, old), 4);
        assert_eq!(idx.blocks_newer_than(0, idx.stamp_of(0, 7).unwrap()), 0);
        assert_eq!(idx.stamp_of(0, 99), None);
        assert_eq!(idx.blocks_newer_than(5, 0), 0);
        let lost = idx.blocks_not_newer_than(0, old);
        assert_eq!(lost, vec![3]);
        idx.forget(0, &lost);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 1)[0], 2);
        assert_eq!(idx.blocks_held(0), 4);
        idx.observe(0, &[3]);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 1)[0], 3, "learned again");
    }

    #[test]
    fn longest_leading_match_per_pod() {
        let mut idx = index(3, 100);
        idx.observe(0, &[1, 2, 3, 4]);
        idx.observe(1, &[1, 2, 9]);
        idx.observe(2, &[2, 3, 4]); // holds later blocks but not the first: no leading match
        assert_eq!(idx.match_lengths(&[1, 2, 3, 4, 5], 3), vec![4, 2, 0]);
        assert_eq!(idx.match_lengths(&[7], 3), vec![0, 0, 0]);
        assert_eq!(idx.match_lengths(&[], 3), vec![0, 0, 0]);
    }

    #[test]
    fn a_prompt_whose_blocks_were_the_oldest_stays_held_when_observed_again() {
        let mut idx = index(1, 4);
        idx.observe(0, &[1, 2, 3]);
        idx.observe(0, &[10]);
        // The pod is full and 1, 2, 3 are its oldest: touching the new block 20 evicts 3,
        // touching 3 again evicts 2, and so on down the prompt, and at last 10.
        idx.observe(0, &[1, 2, 3, 20]);
        assert_eq!(idx.match_lengths(&[1, 2, 3, 20], 1), vec![4]);
        assert_eq!(idx.match_lengths(&[10], 1), vec![0]);
        assert_eq!(idx.blocks_held(0), 4);
        assert_eq!(idx.entries(), 4);
    }

    #[test]
    fn eviction_is_least_recently_used_and_bounded() {
        let mut idx = index(1, 4);
        idx.observe(0, &[1, 2, 3, 4]);
        idx.observe(0, &[1, 2]); // refresh 1 and 2
        idx.observe(0, &[10, 11]); // evicts 3 and 4
        assert_eq!(idx.blocks_held(0), 4);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 1), vec![2]);
        assert_eq!(idx.match_lengths(&[10, 11], 1), vec![2]);
        assert_eq!(idx.entries(), 4);
        for i in 0..10_000u64 {
            idx.observe(0, &[100 + i]);
        }
        assert_eq!(idx.blocks_held(0), 4);
        assert_eq!(idx.entries(), 4);
        assert!(idx.pods[0].queue.len() <= 2 * 16 + 1, "queue compacted");
    }

    #[test]
    fn the_leading_blocks_outlive_the_tail() {
        let mut idx = index(1, 3);
        idx.observe(0, &[1, 2, 3]);
        idx.observe(0, &[1, 5]); // needs one slot: the tail (3) goes, not the shared head
        assert_eq!(idx.match_lengths(&[1, 2], 1), vec![2]);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 1), vec![2]);
    }

    #[test]
    fn shrinking_and_clearing_unmark_blocks() {
        let mut idx = index(2, 10);
        idx.observe(0, &[1, 2, 3]);
        idx.observe(1, &[1, 2, 3]);
        idx.set_capacity(0, 1);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 2), vec![1, 3]);
        idx.clear_slot(1);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 2), vec![1, 0]);
        assert_eq!(idx.entries(), 1);
    }

    #[test]
    fn an_emptied_pod_keeps_where_its_prompts_lived_until_it_refills() {
        let mut idx = index(2, 4);
        idx.observe(0, &[1, 2, 3]);
        idx.observe(1, &[1, 9]);
        idx.empty_slot(0, None);
        assert_eq!(idx.match_lengths(&[1, 2, 3], 2), vec![0, 1], "not a hit");
        assert_eq!(idx.former_lengths(&[1, 2, 3], 2), vec![3, 0]);
        // The opening brought back by another prompt still counts with the former rest.
        idx.observe(0, &[1]);
        assert_eq!(idx.former_lengths(&[1, 2, 3, 4], 2), vec![3, 0]);
        // A cache's worth of touches (4) after it emptied, the former blocks are gone.
        idx.observe(0, &[5, 6, 7]);
        assert_eq!(idx.former_lengths(&[1, 2, 3], 2), vec![0, 0]);
        // Blocks a report showed lost are not; a pod leaving keeps none.
        idx.forget(1, &[9]);
        assert_eq!(idx.former_lengths(&[1, 9], 2), vec![0, 0]);
        idx.empty_slot(1, None);
        assert_eq!(idx.former_lengths(&[1, 9], 2), vec![0, 1]);
        idx.clear_slot(1);
        assert_eq!(idx.former_lengths(&[1, 9], 2), vec![0, 0]);
    }

    #[test]
    fn what_was_routed_to_a_restarted_pod_after_its_new_process_started_is_held_there() {
        let mut idx = index(1, 16);
        idx.mark_time(0, 1_000);
        idx.observe(0, &[1, 2]);
        idx.mark_time(0, 1_010); // within one mark: placed at 1,000
        idx.observe(0, &[3]);
        idx.mark_time(0, 2_000);
        idx.observe(0, &[4, 5]);
        idx.mark_time(0, 3_000);
        idx.observe(0, &[1, 6]);
        // The new process started at 1,500: the pod holds what came from 2,000 on.
        idx.empty_slot(0, Some(1_500));
        assert_eq!(idx.match_lengths(&[4, 5], 1), vec![2]);
        assert_eq!(
            idx.match_lengths(&[1, 6], 1),
            vec![2],
            "touched again after the start"
        );
        assert_eq!(idx.match_lengths(&[1, 2], 1), vec![1]);
        assert_eq!(
            idx.former_lengths(&[1, 2], 1),
            vec![2],
            "2 lived here before"
        );
        assert_eq!(idx.match_lengths(&[3], 1), vec![0]);
        // A start after every mark: nothing touched since, everything former.
        idx.empty_slot(0, Some(3_500));
        assert_eq!(idx.match_lengths(&[4, 5], 1), vec![0]);
        assert_eq!(idx.former_lengths(&[4, 5], 1), vec![2]);
        // Where the marks begin after the start (a long restart), what came after the oldest
        // mark is held.
        idx.mark_time(0, 4_000);
        idx.observe(0, &[7]);
        idx.empty_slot(0, Some(10));
        assert_eq!(idx.match_lengths(&[7], 1), vec![1]);
        assert_eq!(idx.match_lengths(&[1], 1), vec![0]);
    }

    #[test]
    fn unknown_slots_are_ignored() {
        let mut idx = index(1, 10);
        idx.observe(5, &[1]);
        idx.set_capacity(MAX_SLOTS + 3, 10);
        assert_eq!(idx.entries(), 0);
        assert_eq!(idx.slot_blocks_oldest_first(9), Vec::<u64>::new());
    }

    #[test]
    fn pods_beyond_the_first_sixty_four_are_matched_in_their_own_groups() {
        let mut idx = index(512, 100);
        idx.observe(3, &[1, 2, 3]);
        idx.observe(64 + 3, &[1, 2]); // same bit, next group
        idx.observe(511, &[1, 2, 3, 4]);
        idx.observe(200, &[9]);
        let lengths = idx.match_lengths(&[1, 2, 3, 4], MAX_SLOTS);
        assert_eq!(lengths.len(), 512);
        assert_eq!((lengths[3], lengths[67], lengths[511]), (3, 2, 4));
        assert_eq!(lengths.iter().filter(|&&l| l > 0).count(), 3);
        assert_eq!(
            idx.entries(),
            3 + 2 + 4 + 1,
            "one entry per block and group"
        );
        idx.forget(67, &[1, 2]);
        idx.clear_slot(511);
        let lengths = idx.match_lengths(&[1, 2, 3, 4], 512);
        assert_eq!((lengths[3], lengths[67], lengths[511]), (3, 0, 0));
        assert_eq!(idx.entries(), 3 + 1);
        assert_eq!(
            idx.match_lengths(&[9], 100).len(),
            100,
            "only the slots asked for"
        );
    }

    #[test]
    fn snapshot_order_is_oldest_first() {
        let mut idx = index(1, 10);
        idx.observe(0, &[1, 2]);
        idx.observe(0, &[3]);
        // observe touches in reverse, so 2 is older than 1.
        assert_eq!(idx.slot_blocks_oldest_first(0), vec![2, 1, 3]);
    }
}
