//! Prefix affinity: which pod already holds a prompt's prefix in its KV cache.
//!
//! * `mod.rs` — prefix keys (below): block hashing, chained and seeded;
//! * `tokenize.rs` — tiktoken blocks (the `tiktoken` build);
//! * `index.rs` — the prefix index: block hash → which pods hold it, LRU per pod, bounded;
//! * `holdings.rs` — this VM's belief ([`Affinity`]): a request's [`Blocks`], one index slot per
//!   listed pod, the leader's pages and snapshots applied, and the belief checked against the
//!   cached tokens a response reports. Its hooks: a request routed (`expect_cache`, then the
//!   observation `crate::vm` publishes), its `usage` read (`on_cache_report`), pods listed
//!   (`list_pods`), a page (`apply_page`) or a snapshot (`load_snapshot`) read at a tick;
//! * `tiers.rs` — KV tiers beyond the GPU (`kv_tiers`): which tier a matched block has aged into
//!   and what loading it costs;
//! * `pages.rs` — the index across the VMs of one Envoy: the leader's delta pages and snapshots
//!   in shared data (`Publisher`), a follower's `catch_up` on them, and what a routed request
//!   needs to tell the leader at all (`RecentTouches`).
//!
//! Prefix keys: the canonical prompt cut into fixed-size blocks, each block's hash chained to the
//! previous one, so block i's hash identifies the whole prompt up to the end of block i.
//!
//! The chain is seeded by the model name and `cache_salt`: engines keep separate KV caches per model
//! (and per LoRA adapter, which OpenAI servers select through `model`) and vLLM isolates tenants by
//! `cache_salt`, so those must never share a prefix. Only full blocks count, as in vLLM's prefix cache.
//! Hash: xxh3-64 (`xxh3_64_with_seed(block, previous_hash)`).

mod holdings;
pub mod index;
pub mod pages;
pub mod tiers;
#[cfg(feature = "tiktoken")]
pub mod tokenize;

pub use holdings::{
    Affinity, Blocks, CacheExpectation, CacheVerdict, IndexSizes, Restarts, MAX_BLOCKS_PER_REQUEST,
};

/// Tokenizes text into token ids (tiktoken mode); injected so the core does not depend on it.
pub trait Tokenizer {
    fn encode(&self, text: &str) -> Vec<u32>;
}

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Chain seed for a model and an optional tenant salt.
pub fn chain_seed(model: &str, cache_salt: Option<&str>) -> u64 {
    let mut key = Vec::with_capacity(model.len() + 16);
    key.extend_from_slice(b"kvroute/v1\0");
    key.extend_from_slice(model.as_bytes());
    key.push(0);
    if let Some(salt) = cache_salt {
        key.extend_from_slice(salt.as_bytes());
    }
    xxh3_64(&key)
}

/// Chained hashes of the full `block_bytes`-sized blocks of `prompt`, at most `max_blocks` of them.
pub fn char_block_hashes(
    prompt: &[u8],
    block_bytes: usize,
    seed: u64,
    max_blocks: usize,
) -> Vec<u64> {
    if block_bytes == 0 {
        return Vec::new();
    }
    let mut hashes = Vec::with_capacity((prompt.len() / block_bytes).min(max_blocks));
    let mut previous = seed;
    for block in prompt.chunks_exact(block_bytes).take(max_blocks) {
        previous = xxh3_64_with_seed(block, previous);
        hashes.push(previous);
    }
    hashes
}

/// Chained hashes over token ids, `tokens_per_block` ids a block (tiktoken mode).
pub fn token_block_hashes(
    tokens: &[u32],
    tokens_per_block: usize,
    seed: u64,
    max_blocks: usize,
) -> Vec<u64> {
    if tokens_per_block == 0 {
        return Vec::new();
    }
    let mut hashes = Vec::with_capacity((tokens.len() / tokens_per_block).min(max_blocks));
    let mut previous = seed;
    let mut bytes = Vec::with_capacity(tokens_per_block * 4);
    for block in tokens.chunks_exact(tokens_per_block).take(max_blocks) {
        bytes.clear();
        for t in block {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        previous = xxh3_64_with_seed(&bytes, previous);
        hashes.push(previous);
    }
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    // Pinned vectors: a change here changes every replica's routing and invalidates shared state,
    // so it must be deliberate (bump the `kvroute/v1` tag).
    #[test]
    fn pinned_vectors() {
        // The library's own published vector for the empty input, so a swapped hash is caught too.
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        let seed = chain_seed("sim-model", None);
        assert_eq!(seed, 0x103b_1bb4_a504_d850, "seed {seed:#x}");
        let h = char_block_hashes(&[b'a'; 130], 64, seed, 100);
        assert_eq!(h.len(), 2, "only full blocks");
        assert_eq!(
            h,
            vec![0xa363_a256_861c_d82a, 0xf98c_b0a1_821d_39cd],
            "{h:x?}"
        );
        let t = token_block_hashes(&[1, 2, 3, 4, 5], 2, seed, 100);
        assert_eq!(
            t,
            vec![0xc8ec_6f55_aced_d226, 0x7d43_8e25_1c6c_f8f3],
            "{t:x?}"
        );
    }

    #[test]
    fn chain_covers_whole_prefix() {
        let seed = chain_seed("m", None);
        let a = char_block_hashes(b"AAAABBBBCCCC", 4, seed, 100);
        let b = char_block_hashes(b"AAAAXBBBCCCC", 4, seed, 100);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2], "a change in block 1 changes every later block");
    }

    #[test]
    fn model_and_salt_separate_caches() {
        let p = [b'x'; 64];
        let base = char_block_hashes(&p, 64, chain_seed("m", None), 1);
        assert_ne!(base, char_block_hashes(&p, 64, chain_seed("m2", None), 1));
        assert_ne!(
            base,
            char_block_hashes(&p, 64, chain_seed("m", Some("tenant")), 1)
        );
    }

    #[test]
    fn max_blocks_bounds_work() {
        assert_eq!(char_block_hashes(&[0u8; 6400], 64, 1, 10).len(), 10);
        assert!(char_block_hashes(b"short", 64, 1, 10).is_empty());
    }
}
