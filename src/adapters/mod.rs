//! LoRA adapters: which pods hold which adapter, and what loading one a pod lacks costs the
//! request that waits for it.
//!
//! **Algorithm.** A request whose `model` is an adapter (a pod lists it with a `parent` in
//! `/v1/models`, or names it in `vllm:lora_requests_info`) costs a pod that does not hold it one
//! adapter load before its prefill can start, and the load runs inside the engine's step, so the
//! requests queued behind it wait for it too (vLLM loads adapters in the model runner, as part of
//! the step that first needs them). The predictor adds the load ([`Adapters::load_ms_on`]) to that
//! pod's first token and to the work the request puts on it (`crate::scheduler::predict`); where
//! every slot holds another adapter, the reload of the one evicted goes to the pool's cost, not to
//! the request's first token; a pod holding the adapter pays nothing. So an adapter's requests stay where it is loaded, and a hot adapter is
//! loaded on a second pod only when the holder's queue makes loading elsewhere sooner. The work a
//! load adds is the pod's own queue's wait, not the pool's (`predict::with_added_wait`): a load is
//! paid once, and the next arrivals there find the adapter loaded.
//!
//! **Which pods hold it.** A pod holds the adapters it reports running (its latest
//! `vllm:lora_requests_info` sample, up to a poll old), and, as many as it has slots left (the
//! sample's `max_lora`, vLLM's `--max-loras`; else `adapters.default_slots`, vLLM's default 1), the
//! adapters most recently routed to it: vLLM keeps the adapters it loaded in its GPU slots, least
//! recently used evicted first, and its metrics name only those with requests running or waiting,
//! so an idle pod's loaded adapter is known only from having sent it there. Routing an adapter's
//! request observes its [`adapter_block`] on the pod in the prefix index, so what every worker VM
//! and gateway replica routed counts, in the order the index saw it (with one worker's own memory
//! instead, a request landing on another of Envoy's workers found the holder cold and went
//! anywhere).
//!
//! **What a load costs** starts at `adapters.load_ms` and is learned from first bytes: a request
//! predicted to load its adapter took `observed − predicted without the load` longer than the
//! prediction of its tokens, and the running mean of that (worth `prior_samples` requests at first,
//! then tracking the last [`TRACKED_SAMPLES`]) is what the next load is priced at. The pod's cost
//! fit learns from the same first byte less the load (`crate::vm::Vm::learn`), so adapter requests
//! do not make a pod look slow per token.
//!
//! With `adapters.price_loads: false` the load is not priced (every pod holds every adapter, as
//! far as the ranking knows): what kvroute did before, kept for comparison (`make bench`'s
//! many-adapter workload runs both).

use crate::common::ConfigError;
use crate::pod::load::{LoadTable, PodLoad};
use hashbrown::HashMap;

/// After this many first bytes the learned load time is a moving average of the most recent
/// ones: an adapter store that slows down (a cold disk, a busier network) is followed.
pub const TRACKED_SAMPLES: f64 = 50.0;

/// A learned load time is at most this (a first byte 10 minutes late is a stall, not a load).
const MAX_LOAD_MS: f64 = 600_000.0;

/// The `adapters` section.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct AdapterConfig {
    /// Price loading an adapter a pod lacks into its predicted first token.
    pub price_loads: bool,
    /// Milliseconds to load an adapter a pod does not hold, before any is observed.
    pub load_ms: f64,
    /// How many first bytes `load_ms` is worth against observed loads.
    pub prior_samples: f64,
    /// Adapter slots of a pod that does not report `max_lora`.
    pub default_slots: u32,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig {
            price_loads: true,
            load_ms: DEFAULT_LOAD_MS,
            prior_samples: 5.0,
            // vLLM's `--max-loras` default.
            default_slots: 1,
        }
    }
}

/// Loading an adapter onto a pod's GPU, before any load is observed. vLLM keeps as many adapters
/// in host memory as in GPU slots unless told otherwise (`max_cpu_loras` defaults to
/// `max_loras`), so an adapter a pod lacks is read from disk: a rank-16 adapter on every linear
/// layer of a 7–8B model is about 80 MB (≈5 MB per rank), 30–40 ms from NVMe at 2–3 GB/s, plus
/// reading the safetensors and copying layer by layer to the GPU before the prefill starts
/// (vllm-project/vllm#31941 overlaps the two for "~28% lower" TTFT). Reports run from ~10 ms
/// (host memory, pinned) to 0.5–1 s (predibase/lorax#433, unpinned per-layer copies); the
/// learned figure replaces this within a few dozen loads.
pub const DEFAULT_LOAD_MS: f64 = 100.0;

impl AdapterConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.load_ms.is_finite() && (0.0..=MAX_LOAD_MS).contains(&self.load_ms)) {
            return Err(ConfigError::at(
                "adapters.load_ms",
                "must be in [0, 600000] milliseconds",
            ));
        }
        if !(self.prior_samples.is_finite() && self.prior_samples >= 0.0) {
            return Err(ConfigError::at(
                "adapters.prior_samples",
                "must be a non-negative number",
            ));
        }
        if self.default_slots == 0 {
            return Err(ConfigError::at(
                "adapters.default_slots",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// What sending a request for an adapter to a pod costs in loads, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdapterLoad {
    /// Loading the request's adapter before its prefill: this request's first token waits for it.
    pub load_ms: f64,
    /// Loading again the adapter this load evicts, which its next request pays: a cost to the
    /// pool, not to this request's first token (priced in `crate::scheduler::predict`'s added
    /// wait, as before). Served inside the request's own prediction, it put the predicted first
    /// token of a request loading its adapter a whole load late wherever the slots were full: on
    /// `make bench`'s many-adapters those requests (30%) were predicted a median +129% too late,
    /// +39–50% with the reload left out (three seeds each).
    pub reload_ms: f64,
}

/// What a load costs, as learned, and the adapters the pods name.
#[derive(Debug, Default)]
pub struct Adapters {
    /// The learned load time and how many first bytes it stands for; `None` until the first.
    learned: Option<(f64, f64)>,
    /// Every adapter some pod of the load table names, with its [`adapter_block`] (read per
    /// request: kept with the table).
    names: HashMap<String, u64>,
}

/// The entry standing for "this pod has `adapter` loaded" in the prefix index: a block of no
/// prompt (its own namespace), observed on a pod whenever a request for the adapter is routed
/// there. So every worker VM and gateway replica learns it as they learn prefixes, through the
/// leader's pages and the replica exchange, and a pod whose cache is found emptied (a restart)
/// loses it with its prefixes.
pub fn adapter_block(adapter: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(adapter.as_bytes(), ADAPTER_BLOCK_SEED)
}

/// Seeds [`adapter_block`]'s hash apart from prompt chains (`crate::affinity::chain_seed`).
const ADAPTER_BLOCK_SEED: u64 = 0x6c6f_7261_2d6b_7672;

impl Adapters {
    /// Whether `model` names an adapter: some pod of the load table lists it with a `parent` in
    /// `/v1/models` or names it in `vllm:lora_requests_info`.
    pub fn is_adapter(&self, model: &str) -> bool {
        self.names.contains_key(model)
    }

    /// What loading `adapter` on `pod` costs, in milliseconds (see [`AdapterLoad`]): nothing
    /// where it holds it (see the module header), where there is no adapter, or with pricing
    /// off; one load where a slot is free; one load and another adapter's reload where every slot
    /// holds another adapter, since the one evicted is loaded again by its next request (so two
    /// adapters do not take turns in one slot while a pod with a free slot is near). `stamp_of`
    /// gives when the index last saw a block on the pod.
    pub fn load_ms_on(
        &self,
        config: &AdapterConfig,
        pod: &PodLoad,
        adapter: Option<&str>,
        stamp_of: impl Fn(u64) -> Option<u64>,
    ) -> AdapterLoad {
        let Some(adapter) = adapter.filter(|_| config.price_loads) else {
            return AdapterLoad::default();
        };
        let held = self.held_by(config, pod, stamp_of);
        if held.contains(&adapter) {
            return AdapterLoad::default();
        }
        let load_ms = self.load_ms(config);
        AdapterLoad {
            load_ms,
            reload_ms: if held.len() >= slots_of(config, pod) {
                load_ms
            } else {
                0.0
            },
        }
    }

    /// The adapters `pod` is known to hold: those it runs, and of the others the ones most
    /// recently routed there, as many as it has slots left.
    fn held_by<'a>(
        &'a self,
        config: &AdapterConfig,
        pod: &'a PodLoad,
        stamp_of: impl Fn(u64) -> Option<u64>,
    ) -> Vec<&'a str> {
        let mut held: Vec<&str> = pod
            .metrics
            .adapters_running
            .iter()
            .map(String::as_str)
            .collect();
        let mut routed: Vec<(u64, &str)> = self
            .names
            .iter()
            .filter(|(name, _)| !held.contains(&name.as_str()))
            .filter_map(|(name, block)| Some((stamp_of(*block)?, name.as_str())))
            .collect();
        routed.sort_unstable_by(|a, b| b.cmp(a));
        let free = slots_of(config, pod).saturating_sub(held.len());
        held.extend(routed.into_iter().take(free).map(|(_, name)| name));
        held
    }

    /// The load time the next load is priced at.
    pub fn load_ms(&self, config: &AdapterConfig) -> f64 {
        match self.learned {
            Some((mean, _)) => mean,
            None => config.load_ms,
        }
    }

    /// A first byte of a request priced with a load: it came `observed_ms − base_predicted_ms`
    /// after what its tokens alone were predicted to take.
    pub fn learn(&mut self, config: &AdapterConfig, base_predicted_ms: f64, observed_ms: f64) {
        let sample = (observed_ms - base_predicted_ms).clamp(0.0, MAX_LOAD_MS);
        if !sample.is_finite() {
            return;
        }
        let (mean, n) = self
            .learned
            .unwrap_or((config.load_ms, config.prior_samples));
        let weight = (n + 1.0).min(TRACKED_SAMPLES);
        self.learned = Some((mean + (sample - mean) / weight, weight));
    }

    /// Adopts a new load table: the adapters its pods name.
    pub fn list_pods(&mut self, table: &LoadTable) {
        self.names.clear();
        for p in &table.pods {
            let listed = p.served.iter().filter(|m| m.parent.is_some());
            let listed = listed.map(|m| m.id.as_str());
            for name in listed.chain(p.metrics.adapters.iter().map(String::as_str)) {
                self.names
                    .entry_ref(name)
                    .or_insert_with(|| adapter_block(name));
            }
        }
    }
}

fn slots_of(config: &AdapterConfig, pod: &PodLoad) -> usize {
    pod.metrics
        .adapter_slots
        .unwrap_or(config.default_slots)
        .max(1) as usize
}

#[cfg(test)]
mod tests;
