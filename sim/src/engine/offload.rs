//! The host-memory KV tier, as vLLM's native CPU offloading connector (`OffloadingConnector` with
//! the CPU spec, `vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`) runs it.
//!
//! Write-through: a request's full prompt blocks are stored in host memory once their KV is on the
//! GPU (computed, pulled or revived from the GPU cache); a block already there is only refreshed,
//! and the whole chain is refreshed head last, so a prefix's head outlives its tail as vLLM's
//! `touch` orders it. The copy is asynchronous: no step waits for it.
//!
//! Lookup: at admission, after the GPU prefix hit, the further consecutive blocks of the request's
//! chain that host memory holds are loaded instead of computed, asynchronously (vLLM's
//! `WAITING_FOR_REMOTE_KVS`): the request waits out the load on the host link (`transfer.rs`) and
//! then joins the batch with those tokens computed; other requests' steps do not wait. A request
//! that brings KV from a prefill pod pulls it instead (kvsim asks one connector per request).

use crate::cache::HostCache;
use crate::config::SimConfig;
use crate::metrics::Counters;

use super::scheduler::State;

/// Writes `chain` (a request's blocks on the GPU, in chain order) through to the host tier: blocks
/// host memory lacks are stored (their bytes cross GPU → CPU), the rest refreshed, tail first so
/// the head is the most recently used.
pub(super) fn write_through(
    cfg: &SimConfig,
    host: &mut HostCache,
    counters: &mut Counters,
    chain: &[u64],
) {
    if !cfg.host_tier() {
        return;
    }
    let stored = chain.iter().rev().filter(|h| host.store(**h)).count() as u64;
    counters.offload_stored_bytes += stored * cfg.kv_bytes_per_block();
}

impl State {
    /// Blocks of `candidates` after the first `hit` (the GPU prefix hit) that the host tier holds,
    /// in a row: what a request admitted now loads instead of computing. 0 without a tier.
    pub(super) fn host_lookup(&self, cfg: &SimConfig, candidates: &[u64], hit: usize) -> usize {
        if !cfg.host_tier() {
            return 0;
        }
        self.host
            .longest_prefix(candidates.get(hit..).unwrap_or_default())
    }

    /// At admission: the blocks a request loads are refreshed (tail first), then its GPU hits are
    /// written through (vLLM stores a request's blocks from its first, the ones host memory lost
    /// since included).
    pub(super) fn host_admit(&mut self, cfg: &SimConfig, hashes: &[u64], hit: usize, loads: usize) {
        if !cfg.host_tier() {
            return;
        }
        let loaded = hashes.get(hit..hit + loads).unwrap_or_default();
        for h in loaded.iter().rev() {
            self.host.touch(*h);
        }
        let gpu = hashes.get(..hit).unwrap_or_default();
        write_through(cfg, &mut self.host, &mut self.counters, gpu);
    }
}
