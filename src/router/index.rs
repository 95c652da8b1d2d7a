//! What the pods hold: a request's block hashes, this VM's copy of the prefix index (fed by the
//! leader's pages and snapshots and by this VM's own observations), and the check of that belief
//! against the cached tokens a response reports (an eviction detected is forgotten here at once).

use super::Router;
#[cfg(feature = "tiktoken")]
use crate::common::BlockScheme;
use crate::config::Config;
use crate::prefix::index::{PrefixIndex, MAX_SLOTS};
#[cfg(feature = "tiktoken")]
use crate::prefix::token_block_hashes;
use crate::prefix::{chain_seed, char_block_hashes, Tokenizer};
use crate::protocol::parse::RequestView;
use crate::state::messages::{Observation, Page};

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

/// Matched blocks whose stamps a request keeps for the check (bounded memory per request).
const MAX_STAMPS: usize = 2048;
/// A report counts as an eviction when it is short of the expectation by at least this share of
/// the prompt and at least `EVICTION_MIN_BLOCKS` blocks (the engine's tokens and ours differ a
/// little, and its last partial block is never cached).
const EVICTION_MIN_SHARE: f64 = 0.1;
const EVICTION_MIN_BLOCKS: f64 = 2.0;

/// Longest prompt, in blocks, that is hashed: bounds per-request work on huge prompts.
pub const MAX_BLOCKS_PER_REQUEST: usize = 8192;

impl Router {
    pub fn index_entries(&self) -> usize {
        self.index.entries()
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    pub fn slot_of(&self, addr: &str) -> Option<usize> {
        self.slot_of.get(addr).copied()
    }

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

    pub fn blocks(
        config: &Config,
        view: &RequestView,
        tokenizer: Option<&dyn Tokenizer>,
    ) -> Blocks {
        Self::blocks_in_cache(config, view, &view.model, tokenizer)
    }

    /// The KV cache a request for `model` lands in: an alias's is its base model's (they share
    /// it), a LoRA adapter's its own, as the first pod listing `model` reports (see
    /// `crate::pod::models`); the name itself where no pod lists it.
    pub fn cache_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.load
            .pods
            .iter()
            .find_map(|p| crate::pod::models::cache_key(&p.served, model))
            .unwrap_or(model)
    }

    /// [`Self::blocks`] with the hash chain seeded by `cache_model` (see [`Self::cache_model`]).
    pub fn blocks_in_cache(
        config: &Config,
        view: &RequestView,
        cache_model: &str,
        tokenizer: Option<&dyn Tokenizer>,
    ) -> Blocks {
        let seed = chain_seed(cache_model, view.cache_salt.as_deref());
        let (hashes, prompt_tokens) = match (config.block.scheme, tokenizer) {
            #[cfg(feature = "tiktoken")]
            (BlockScheme::Tiktoken(_), Some(t)) => {
                let text = String::from_utf8_lossy(&view.prompt);
                let tokens = t.encode(&text);
                let hashes = token_block_hashes(
                    &tokens,
                    config.block.tokens_per_block as usize,
                    seed,
                    MAX_BLOCKS_PER_REQUEST,
                );
                (hashes, tokens.len() as u64)
            }
            _ => (
                char_block_hashes(
                    &view.prompt,
                    config.block_bytes(),
                    seed,
                    MAX_BLOCKS_PER_REQUEST,
                ),
                (view.prompt.len() / config.block.chars_per_token.max(1) as usize) as u64,
            ),
        };
        let affinity_key = hashes.first().copied().unwrap_or(seed);
        Blocks {
            hashes,
            affinity_key,
            prompt_tokens,
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
