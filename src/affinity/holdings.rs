//! What the pods hold: a request's block hashes, this VM's copy of the prefix index (fed by the
//! leader's pages and snapshots and by this VM's own observations), and the check of that belief
//! against the cached tokens a response reports (an eviction detected is forgotten here at once).

use super::index::{PrefixIndex, MAX_SLOTS};
#[cfg(feature = "tiktoken")]
use super::token_block_hashes;
use super::{chain_seed, char_block_hashes, Tokenizer};
#[cfg(feature = "tiktoken")]
use crate::common::BlockScheme;
use crate::common::Blocking;
use crate::pod::load::LoadTable;
use crate::protocol::parse::RequestView;
use crate::state::messages::{Observation, Page};
use hashbrown::HashMap;

/// How big the index may be: a pod's share, from what it reports caching (`tokens_per_block`
/// tokens a block; `default_pod_blocks` where it reports nothing, at most `max_pod_blocks`), and
/// at most an even share of `max_index_blocks` for all.
pub struct IndexSizes {
    pub tokens_per_block: u32,
    pub default_pod_blocks: u32,
    pub max_pod_blocks: u32,
    pub max_index_blocks: u32,
    /// Blocks each pod keeps beyond the GPU (`kv_tiers`, `super::tiers`).
    pub warm_pod_blocks: usize,
}

/// This VM's belief of what each pod holds: the prefix index (one slot per listed pod) and its
/// place in the leader's page sequence.
#[derive(Default)]
pub struct Affinity {
    index: PrefixIndex,
    slot_of: HashMap<String, usize>,
    /// Each listed pod's restart count as last listed (`PodLoad::restarts`).
    restarts: HashMap<String, u32>,
    /// Sequence number of the last delta page applied.
    pub applied_page: u64,
    /// The VM's clock (Unix ms) as last set ([`Self::set_clock`]): when what it routes now was
    /// routed. 0 = never set.
    clock_ms: u64,
    /// This VM's recent routings, told to the index or not ([`Self::note_routing`]), oldest
    /// first.
    recent_routings: std::collections::VecDeque<RecentRouting>,
    /// Hashes in `recent_routings`.
    recent_routings_hashes: usize,
}

/// What a new load table showed restarted ([`Affinity::list_pods`]).
#[derive(Debug, Default)]
pub struct Restarts {
    /// The pods seen restarted.
    pub pods: Vec<String>,
    /// Prompts this VM routed to them after their new process started: to be told to every VM
    /// again, since every other VM has just made them former (it could not tell them from what
    /// was routed before the start: see [`Affinity::observe_routed`]).
    pub held_again: Vec<Observation>,
}

/// A prompt this VM routed (`super::pages::RecentTouches`): if the pod turns out to have
/// restarted before it, the new process is computing it.
#[derive(Debug, Clone)]
struct RecentRouting {
    addr: String,
    at_ms: u64,
    hashes: Vec<u64>,
}

/// How long a routing in `recent_routings` is kept: a restart is seen at the pod's next poll (200 ms
/// by default) and in each VM's next table, well within this.
const RECENT_ROUTINGS_MS: u64 = 2000;
/// Hashes kept in `recent_routings` (8 bytes each), and routings (about 100 bytes each with their
/// address), the oldest going first: past either, a restart seen later keeps fewer prompts held.
/// The window to cover is a poll and a table's way to every VM, a few hundred ms of routings.
const RECENT_ROUTINGS_MAX_HASHES: usize = 2048;
const RECENT_ROUTINGS_MAX: usize = 128;

/// The blocks of one request, ready for the scheduler and the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocks {
    pub hashes: Vec<u64>,
    pub affinity_key: u64,
    /// Estimated prompt tokens (for the prediction and the work board).
    pub prompt_tokens: u64,
}

/// What the index expects a pod's response to report as cached, taken when the request is routed
/// (before the routing is observed), to be checked against the response's `usage`.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheExpectation {
    pub addr: String,
    pub matched_blocks: usize,
    pub total_blocks: usize,
    /// Index stamps of the matched blocks, in prompt order (at most `MAX_STAMPS`).
    stamps: Vec<u64>,
}

/// What a response's `usage` said about the index's belief.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheVerdict {
    /// The pod had what the index expected (or more).
    Confirmed,
    /// The pod had lost blocks the index believed it held: these (`lost`, now forgotten here);
    /// it keeps about `kept` of ours (for the log: the index capacity is not capped by it).
    Evicted { kept: u32, lost: Vec<u64> },
}

impl Blocks {
    /// A request's blocks, its chain seeded by the model it names.
    pub fn of(block: &Blocking, view: &RequestView, tokenizer: Option<&dyn Tokenizer>) -> Blocks {
        Self::in_cache(block, view, &view.model, tokenizer)
    }

    /// [`Self::of`] with the hash chain seeded by `cache_model` (the KV cache the request lands
    /// in: `crate::router::Router::cache_model`).
    pub fn in_cache(
        block: &Blocking,
        view: &RequestView,
        cache_model: &str,
        tokenizer: Option<&dyn Tokenizer>,
    ) -> Blocks {
        let seed = chain_seed(cache_model, view.cache_salt.as_deref());
        let (hashes, prompt_tokens) = match (block.scheme, tokenizer) {
            #[cfg(feature = "tiktoken")]
            (BlockScheme::Tiktoken(_), Some(t)) => {
                let text = String::from_utf8_lossy(&view.prompt);
                let tokens = t.encode(&text);
                let hashes = token_block_hashes(
                    &tokens,
                    block.tokens_per_block as usize,
                    seed,
                    MAX_BLOCKS_PER_REQUEST,
                );
                (hashes, tokens.len() as u64)
            }
            _ => (
                char_block_hashes(&view.prompt, block.bytes(), seed, MAX_BLOCKS_PER_REQUEST),
                (view.prompt.len() / block.chars_per_token.max(1) as usize) as u64,
            ),
        };
        let affinity_key = hashes.first().copied().unwrap_or(seed);
        Blocks {
            hashes,
            affinity_key,
            prompt_tokens,
        }
    }
}

/// Matched blocks whose stamps a request keeps for the check (bounded memory per request).
const MAX_STAMPS: usize = 2048;
/// A report counts as an eviction when it is short of the expectation by at least this share of
/// the prompt and at least `EVICTION_MIN_BLOCKS` blocks (the engine's tokens and ours differ a
/// little, and its last partial block is never cached).
const EVICTION_MIN_SHARE: f64 = 0.1;
const EVICTION_MIN_BLOCKS: f64 = 2.0;

/// Longest prompt, in blocks, that is hashed: bounds per-request work on huge prompts.
pub const MAX_BLOCKS_PER_REQUEST: usize = 8192;

impl Affinity {
    /// Gives each listed pod a slot (new pods the lowest free ones) sized by what it reports
    /// caching, at most an even share of `max_index_blocks`; forgets the pods no longer listed.
    /// Returns the pods seen restarted since the last table, and what this VM routed to them
    /// after their new process started that the other VMs must hear of again ([`Restarts`]).
    pub fn list_pods(&mut self, table: &LoadTable, sizes: &IndexSizes) -> Restarts {
        let mut restarts = Restarts::default();
        let listed: hashbrown::HashSet<&str> = table.pods.iter().map(|p| p.addr.as_str()).collect();
        let removed: Vec<String> = self
            .slot_of
            .keys()
            .filter(|addr| !listed.contains(addr.as_str()))
            .cloned()
            .collect();
        for addr in removed {
            if let Some(slot) = self.slot_of.remove(&addr) {
                self.index.clear_slot(slot);
            }
            self.restarts.remove(&addr);
        }
        // A restarted pod's cache is empty: what the index held there is dropped at once, not
        // one response report at a time (each a whole recompute later), and routing relearns it;
        // where each prompt lived stays as the pod's former blocks (`super::index`).
        // Every VM sees the table and drops it alike; a VM's first table only sets the count.
        for pod in &table.pods {
            let before = self.restarts.insert(pod.addr.clone(), pod.restarts);
            if before.is_some_and(|n| n != pod.restarts) {
                restarts.pods.push(pod.addr.clone());
                if let Some(&slot) = self.slot_of.get(&pod.addr) {
                    // The pod's clock against ours: a skew of a few ms between hosts places a
                    // request or two routed as the process started on the wrong side of it, and
                    // a response report corrects a wrong hit.
                    let started_ms = pod
                        .metrics
                        .started_at
                        .and_then(|s| (s.is_finite() && s > 0.0).then_some((s * 1e3) as u64));
                    self.index.empty_slot(slot, started_ms);
                    let held = self.observe_recent_routings(slot, &pod.addr, started_ms);
                    restarts.held_again.extend(held);
                }
            }
        }
        // Linear in the pool: a search of the used slots per new pod was quadratic (512 pods
        // joining at once cost 130,000 comparisons each).
        let mut used = vec![false; MAX_SLOTS];
        for &s in self.slot_of.values() {
            if let Some(u) = used.get_mut(s) {
                *u = true;
            }
        }
        let mut next_free = 0;
        let index_share = (sizes.max_index_blocks as usize / table.pods.len().max(1)).max(1);
        for pod in &table.pods {
            let slot = match self.slot_of.get(&pod.addr) {
                Some(&s) => s,
                None => {
                    while used.get(next_free).copied().unwrap_or(false) {
                        next_free += 1;
                    }
                    if next_free >= MAX_SLOTS {
                        continue;
                    }
                    let free = next_free;
                    if let Some(u) = used.get_mut(free) {
                        *u = true;
                    }
                    self.slot_of.insert(pod.addr.clone(), free);
                    free
                }
            };
            let gpu = pod
                .capacity_blocks(
                    sizes.tokens_per_block,
                    sizes.default_pod_blocks,
                    sizes.max_pod_blocks,
                )
                .min(index_share);
            let capacity = gpu.saturating_add(sizes.warm_pod_blocks).min(index_share);
            self.index.set_tiered_capacity(slot, capacity, gpu);
        }
        restarts
    }

    /// How many leading blocks of `hashes` each slot holds (see [`Self::matched_of`]).
    pub fn match_lengths(&self, hashes: &[u64]) -> Vec<usize> {
        self.index.match_lengths(hashes, MAX_SLOTS)
    }

    /// How many leading blocks of `hashes` each slot held before it restarted (or holds since),
    /// where it has former blocks; read with [`Self::matched_of`]. Empty (0 for every pod)
    /// where no pod has any, as on almost every request: no per-request vector then.
    pub fn former_lengths(&self, hashes: &[u64]) -> Vec<usize> {
        if !self.index.has_former() {
            return Vec::new();
        }
        self.index.former_lengths(hashes, MAX_SLOTS)
    }

    /// `addr`'s entry of [`Self::match_lengths`] (0 for a pod without a slot).
    pub fn matched_of(&self, lengths: &[usize], addr: &str) -> usize {
        self.slot_of
            .get(addr)
            .and_then(|&s| lengths.get(s).copied())
            .unwrap_or(0)
    }

    pub fn index_entries(&self) -> usize {
        self.index.entries()
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// How the `matched` leading blocks of `hashes` that `addr` holds lie in its KV tiers.
    pub fn tier_split(
        &self,
        tiers: &[super::tiers::KvTier],
        addr: &str,
        hashes: &[u64],
        matched: usize,
        tokens_per_block: u32,
    ) -> super::tiers::TierSplit {
        if tiers.is_empty() {
            // Every request, every pod: no index lookups where tiers are off (the default).
            return super::tiers::TierSplit {
                gpu_blocks: matched,
                ..Default::default()
            };
        }
        let slot = self.slot_of(addr);
        let gpu = slot
            .and_then(|s| self.index.turnover(s))
            .map_or(0, |(gpu, _)| gpu);
        super::tiers::split(tiers, matched, tokens_per_block, gpu, |i| {
            self.index.touches_since(slot?, *hashes.get(i)?)
        })
    }

    /// When the index last saw `hash` on `addr` (its pod's touch count), if it holds it there.
    pub fn stamp_of(&self, addr: &str, hash: u64) -> Option<u64> {
        self.index.stamp_of(self.slot_of(addr)?, hash)
    }

    /// The restarts seen of `addr` as last listed (`PodLoad::restarts`; 0 for a pod not listed).
    pub fn restarts_of(&self, addr: &str) -> u32 {
        self.restarts.get(addr).copied().unwrap_or(0)
    }

    pub fn slot_of(&self, addr: &str) -> Option<usize> {
        self.slot_of.get(addr).copied()
    }

    /// When what this VM routes from now on was routed: a restart keeps what was routed to the
    /// pod after its new process started (`super::index`).
    pub fn set_clock(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
    }

    /// A prompt routed to `addr` (its leading `hashes`, told to the index or not): kept a while in
    /// case `addr` turns out to have restarted before it.
    pub fn note_routing(&mut self, addr: &str, hashes: &[u64]) {
        if hashes.is_empty() || hashes.len() > RECENT_ROUTINGS_MAX_HASHES || self.clock_ms == 0 {
            return;
        }
        let now = self.clock_ms;
        while self.recent_routings.front().is_some_and(|r| {
            now.saturating_sub(r.at_ms) > RECENT_ROUTINGS_MS
                || self.recent_routings_hashes + hashes.len() > RECENT_ROUTINGS_MAX_HASHES
                || self.recent_routings.len() >= RECENT_ROUTINGS_MAX
        }) {
            if let Some(old) = self.recent_routings.pop_front() {
                self.recent_routings_hashes -= old.hashes.len();
            }
        }
        self.recent_routings_hashes += hashes.len();
        self.recent_routings.push_back(RecentRouting {
            addr: addr.to_string(),
            at_ms: now,
            hashes: hashes.to_vec(),
        });
    }

    /// After `addr` restarted: the prompts this VM routed to it since its new process started
    /// are held there (the new process computes them). Returned for the other VMs, which made
    /// them former: a prompt routed by one worker and asked for again in another was a move and
    /// a second recompute there.
    fn observe_recent_routings(
        &mut self,
        slot: usize,
        addr: &str,
        started_ms: Option<u64>,
    ) -> Vec<Observation> {
        let Some(start) = started_ms else {
            return Vec::new();
        };
        let mut held = Vec::new();
        for routed in &self.recent_routings {
            if routed.addr == addr && routed.at_ms >= start {
                self.index.mark_time(slot, routed.at_ms);
                self.index.observe(slot, &routed.hashes);
                held.push(Observation {
                    addr: addr.to_string(),
                    hashes: routed.hashes.clone(),
                });
            }
        }
        held
    }

    /// What this VM routed now: stamped with the time (the index's marks, which a restart reads)
    /// and kept among the recent routings.
    ///
    /// Only this VM's own routings are marked. Another VM's, applied from the leader's queue or
    /// pages ([`Self::observe`]), arrive a tick or more after they were routed; marked at their
    /// arrival, one routed before a pod's restart and arriving after it was taken for the new
    /// process's (a real-Envoy test failed 1 run in 3 on it). Each VM tells the others what it
    /// routed after the start instead ([`Restarts::held_again`]). One still arriving after this
    /// VM's own first routing past the start is taken for the new process's (the index cannot
    /// tell); the first response from there reports the miss.
    pub fn observe_routed(&mut self, observation: &Observation) {
        if let Some(&slot) = self.slot_of.get(&observation.addr) {
            if self.clock_ms > 0 {
                self.index.mark_time(slot, self.clock_ms);
            }
            self.index.observe(slot, &observation.hashes);
        }
        self.note_routing(&observation.addr, &observation.hashes);
    }

    /// What another VM routed (the leader's queue, a page).
    pub fn observe(&mut self, observation: &Observation) {
        if let Some(&slot) = self.slot_of.get(&observation.addr) {
            self.index.observe(slot, &observation.hashes);
        }
    }

    pub fn apply_page(&mut self, page: &Page) {
        self.apply_changes(page);
        self.applied_page = page.seq;
    }

    /// A page's observations, then its evictions, without moving this VM's place in the page
    /// sequence (another gateway replica's page: its numbers are that replica's).
    pub fn apply_changes(&mut self, page: &Page) {
        for o in &page.observations {
            self.observe(o);
        }
        for e in &page.evictions {
            self.forget(e);
        }
    }

    /// A pod no longer holds these blocks.
    pub fn forget(&mut self, eviction: &Observation) {
        if let Some(&slot) = self.slot_of.get(&eviction.addr) {
            self.index.forget(slot, &eviction.hashes);
        }
    }

    /// Replaces the index with a snapshot (a page whose observations are each pod's blocks, oldest
    /// first).
    pub fn load_snapshot(&mut self, snapshot: &Page) {
        for &slot in self.slot_of.values() {
            self.index.clear_slot(slot);
        }
        self.apply_page(snapshot);
    }

    /// The snapshot of this VM's index, for the leader to publish.
    pub fn snapshot(&self, seq: u64) -> Page {
        let mut observations: Vec<Observation> = self
            .slot_of
            .iter()
            .map(|(addr, &slot)| Observation {
                addr: addr.clone(),
                hashes: self.index.slot_blocks_oldest_first(slot),
            })
            .collect();
        observations.sort_by(|a, b| a.addr.cmp(&b.addr));
        // `observe` touches in reverse order; hand it newest-first so the oldest ends oldest.
        for o in &mut observations {
            o.hashes.reverse();
        }
        Page {
            seq,
            observations,
            evictions: Vec::new(),
            from_peer: false,
        }
    }

    /// The pod holding the longest leading run of `hashes` and that length (for the debug header).
    pub fn longest_holder(&self, hashes: &[u64]) -> Option<(&str, usize)> {
        let lengths = self.index.match_lengths(hashes, MAX_SLOTS);
        self.slot_of
            .iter()
            .map(|(addr, &slot)| (addr.as_str(), lengths.get(slot).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(addr, n)| (*n, std::cmp::Reverse(*addr)))
    }

    /// What the index expects `addr`, routed `blocks` of which it holds `matched` leading ones, to
    /// report as cached; `None` when it expects nothing (a report can only confirm what routing
    /// observes anyway).
    pub fn expect_cache(
        &self,
        addr: &str,
        blocks: &Blocks,
        matched: usize,
    ) -> Option<CacheExpectation> {
        let slot = *self.slot_of.get(addr)?;
        if matched == 0 {
            return None;
        }
        let stamps = blocks
            .hashes
            .iter()
            .take(matched.min(MAX_STAMPS))
            .filter_map(|h| self.index.stamp_of(slot, *h))
            .collect();
        Some(CacheExpectation {
            addr: addr.to_string(),
            matched_blocks: matched,
            total_blocks: blocks.hashes.len(),
            stamps,
        })
    }

    /// Checks a response's report (`cached` of `prompt` engine tokens) against the expectation.
    /// Blocks lost from the middle of an LRU mean everything older went too: the pod keeps about
    /// the blocks touched since the first one it lost, and everything older is forgotten here at
    /// once (the caller tells the leader, which publishes it for every VM). A pod whose cache was
    /// emptied (a restart, a reset) reports nothing cached, so everything it held before this
    /// request is dropped and routing relearns it. What the pod keeps is not its capacity: capping
    /// the index to it kept an emptied pod's index one prompt long for 30 s, and three restarts in a
    /// row left the multi-tenant hit ratio at round-robin's level.
    pub fn on_cache_report(
        &mut self,
        expected: &CacheExpectation,
        cached: u64,
        prompt: u64,
    ) -> CacheVerdict {
        if prompt == 0 || expected.total_blocks == 0 {
            return CacheVerdict::Confirmed;
        }
        let total = expected.total_blocks as f64;
        let expected_share = expected.matched_blocks as f64 / total;
        let reported_share = (cached as f64 / prompt as f64).min(1.0);
        let missing = expected_share - reported_share;
        if missing < EVICTION_MIN_SHARE || missing * total < EVICTION_MIN_BLOCKS {
            return CacheVerdict::Confirmed;
        }
        let kept = (reported_share * total) as usize;
        let first_lost = expected
            .stamps
            .get(kept)
            .or(expected.stamps.last())
            .copied();
        let Some((slot, stamp)) = self.slot_of.get(&expected.addr).copied().zip(first_lost) else {
            return CacheVerdict::Confirmed;
        };
        let blocks = self.index.blocks_newer_than(slot, stamp).max(1);
        let lost = self.index.blocks_not_newer_than(slot, stamp);
        self.index.forget(slot, &lost);
        CacheVerdict::Evicted {
            kept: u32::try_from(blocks).unwrap_or(u32::MAX),
            lost,
        }
    }
}
