//! KV tiers beyond the GPU: host memory (vLLM's CPU offloading connector, LMCache's CPU backend,
//! llama.cpp's prompt cache), local disk, a remote store. A prefix in a warm tier loads much faster
//! than it recomputes and slower than a GPU hit.
//!
//! **Algorithm.** Engines that offload write every computed block through to the next tier and
//! evict each tier least recently used first, so a pod's blocks age from the GPU into host memory
//! and on into the slower tiers. The index holds them all (each pod's capacity is the GPU's plus
//! every configured tier's) and knows a block's age on its pod in one lookup: the blocks touched
//! there since it was (`PrefixIndex::touches_since`). A block younger than the GPU's capacity is
//! in the GPU, one younger than the GPU's and the host's is in host memory, and so on. A prompt's
//! matched blocks are leading blocks, the most recently touched first (the index touches a
//! prompt's later blocks first, as an engine frees a sequence's tail first), so the tiers split
//! them into runs found by binary search: [`TierSplit`].
//!
//! The prediction counts every tier's blocks as cached (the pod does not recompute them) and adds
//! each warm tier's load, `tokens × load_us_per_token`, to that pod's first token. Loads from a
//! warm tier run beside the engine's steps (vLLM's connector loads asynchronously; the request
//! waits, the batch does not), so they delay this request only, not the queue behind it.
//!
//! Off (no tiers configured), the index's capacity is the GPU's and every match is a GPU hit, as
//! before.

use crate::common::ConfigError;

/// One tier beyond the GPU, the fastest first in `kv_tiers`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KvTier {
    /// `host`, `disk`, `remote`: how the debug line and the docs call it.
    pub name: String,
    /// Tokens of KV each pod keeps in this tier (vLLM's `--kv-offloading-size` GiB × 2^30 ÷
    /// the model's KV bytes per token).
    pub capacity_tokens: u64,
    /// Microseconds to load one token's KV from this tier into the GPU.
    pub load_us_per_token: f64,
}

/// Host memory to GPU for Llama-3.1-8B (128 KiB of KV per token) at the ~50 GB/s one way that
/// vLLM's offloading connector reaches on an H100 (blog.vllm.ai, 2026-01-08, "KV offloading
/// connector"): 131,072 B ÷ 50 GB/s ≈ 2.6 µs a token, against ~40 µs to recompute it (the
/// prediction's prior). A tier's own figure belongs in its `load_us_per_token`.
pub const HOST_LOAD_US_PER_TOKEN: f64 = 2.6;

/// Checks `kv_tiers`.
pub fn validate(tiers: &[KvTier]) -> Result<(), ConfigError> {
    if tiers.len() > MAX_TIERS {
        return Err(ConfigError::at(
            "kv_tiers",
            format!("at most {MAX_TIERS} tiers beyond the GPU"),
        ));
    }
    for (i, t) in tiers.iter().enumerate() {
        let at = |field: &str| format!("kv_tiers[{i}].{field}");
        if t.name.trim().is_empty() {
            return Err(ConfigError::at(at("name"), "must name the tier"));
        }
        if t.capacity_tokens == 0 {
            return Err(ConfigError::at(at("capacity_tokens"), "must be positive"));
        }
        if !(t.load_us_per_token.is_finite() && t.load_us_per_token >= 0.0) {
            return Err(ConfigError::at(
                at("load_us_per_token"),
                "must be a non-negative number",
            ));
        }
    }
    Ok(())
}

/// Tiers beyond the GPU a configuration may name (host, disk, remote).
pub const MAX_TIERS: usize = 3;

/// How a pod's matched blocks of one prompt lie in its tiers.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierSplit {
    /// Leading matched blocks in the GPU.
    pub gpu_blocks: usize,
    /// Matched blocks in the warm tiers (after the GPU's).
    pub warm_blocks: usize,
    /// Milliseconds to load the warm blocks into the GPU.
    pub load_ms: f64,
}

/// Splits `matched` leading blocks by tier: `touches_since(i)` is the touches on the pod since the
/// prompt's block `i` was touched (`None`: not held), `gpu_blocks` the GPU's capacity in blocks.
pub fn split(
    tiers: &[KvTier],
    matched: usize,
    tokens_per_block: u32,
    gpu_blocks: usize,
    touches_since: impl Fn(usize) -> Option<u64>,
) -> TierSplit {
    if tiers.is_empty() || matched == 0 {
        return TierSplit {
            gpu_blocks: matched,
            ..TierSplit::default()
        };
    }
    // The first block at least `age` touches old: the matched blocks before it are younger.
    let younger_than = |age: u64| {
        let (mut lo, mut hi) = (0, matched);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if touches_since(mid).is_some_and(|t| t < age) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let block_tokens = f64::from(tokens_per_block);
    let mut bound = gpu_blocks as u64;
    let gpu = younger_than(bound);
    let (mut start, mut load_us) = (gpu, 0.0);
    for (i, tier) in tiers.iter().enumerate() {
        let blocks = tier.capacity_tokens / u64::from(tokens_per_block.max(1));
        bound = bound.saturating_add(blocks);
        // Whatever is older than the last tier's bound has left the index already.
        let end = if i + 1 == tiers.len() {
            matched
        } else {
            younger_than(bound).max(start)
        };
        load_us += (end - start) as f64 * block_tokens * tier.load_us_per_token;
        start = end;
    }
    TierSplit {
        gpu_blocks: gpu,
        warm_blocks: matched - gpu,
        load_ms: load_us / 1e3,
    }
}

/// Blocks of our size the tiers beyond the GPU hold per pod.
pub fn warm_capacity_blocks(tiers: &[KvTier], tokens_per_block: u32) -> usize {
    let per_block = u64::from(tokens_per_block.max(1));
    tiers
        .iter()
        .map(|t| t.capacity_tokens / per_block)
        .fold(0u64, u64::saturating_add) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(tokens: u64) -> KvTier {
        KvTier {
            name: "host".into(),
            capacity_tokens: tokens,
            load_us_per_token: 2.0,
        }
    }

    #[test]
    fn matched_blocks_split_by_age_into_tiers() {
        // Ten matched blocks, block i touched 10 × i touches ago; 16 tokens a block.
        let age = |i: usize| Some(10 * i as u64);
        // The GPU holds 35 blocks: blocks 0–3 (ages 0–30) are there, 4–9 in host memory.
        let s = split(&[host(16 * 1000)], 10, 16, 35, age);
        assert_eq!((s.gpu_blocks, s.warm_blocks), (4, 6));
        assert!((s.load_ms - 6.0 * 16.0 * 2.0 / 1e3).abs() < 1e-12);
        // Off: all GPU, nothing to load.
        let off = split(&[], 10, 16, 35, age);
        assert_eq!((off.gpu_blocks, off.warm_blocks, off.load_ms), (10, 0, 0.0));
        // Two tiers: host holds 20 blocks (to age 55), disk the rest at 100 µs a token.
        let disk = KvTier {
            name: "disk".into(),
            capacity_tokens: 16 * 1000,
            load_us_per_token: 100.0,
        };
        let s = split(&[host(16 * 20), disk], 10, 16, 35, age);
        assert_eq!((s.gpu_blocks, s.warm_blocks), (4, 6));
        // Blocks 4–5 (ages 40, 50) from host, 6–9 from disk.
        let want = (2.0 * 16.0 * 2.0 + 4.0 * 16.0 * 100.0) / 1e3;
        assert!((s.load_ms - want).abs() < 1e-9, "{}", s.load_ms);
    }

    #[test]
    fn tiers_are_checked() {
        assert!(validate(&[host(1000)]).is_ok());
        let bad = |t: KvTier| validate(&[t]).unwrap_err().field;
        assert_eq!(bad(host(0)), "kv_tiers[0].capacity_tokens");
        let mut t = host(10);
        t.load_us_per_token = -1.0;
        assert_eq!(bad(t), "kv_tiers[0].load_us_per_token");
        let mut t = host(10);
        t.name = " ".into();
        assert_eq!(bad(t), "kv_tiers[0].name");
        assert_eq!(
            validate(&[host(1), host(1), host(1), host(1)])
                .unwrap_err()
                .field,
            "kv_tiers"
        );
        assert_eq!(warm_capacity_blocks(&[host(160), host(33)], 16), 12);
    }
}
