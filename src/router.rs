//! One VM's routing state and the request-path entry points: the VM's copy of the prefix index, the
//! leader's latest load table, this VM's own unfinished work per pod (and the other VMs', from the
//! work board), and the learned first-token cost of every pod. The host glue feeds it shared data,
//! request bodies and first-byte times; it answers with decisions. No host calls here, so all of it
//! runs natively in tests.

use crate::config::{BlockMode, Config, Role};
use crate::flow::parse::RequestView;
use crate::health::{health_of, Health};
pub use crate::pd::{PdOutcome, PdPlan};
use crate::prefix::index::{PrefixIndex, MAX_SLOTS};
use crate::prefix::{chain_seed, char_block_hashes, token_block_hashes};
use crate::scheduler::cost::{self, Coefficients, CostFit};
use crate::scheduler::{decide, Decision, Hints, PodView, RouteRequest};
use crate::state::fits::PodFit;
use crate::state::inflight::PodWork;
use crate::state::load::{LoadTable, PodLoad};
use crate::state::messages::{Observation, Page};
use crate::vm::prom::PodMetrics;
use hashbrown::HashMap;

/// Tokenizes text into token ids (tiktoken mode); injected so the core does not depend on it.
pub trait Tokenizer {
    fn encode(&self, text: &str) -> Vec<u32>;
}

/// The blocks of one request, ready for the scheduler and the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocks {
    pub hashes: Vec<u64>,
    pub affinity_key: u64,
    /// Estimated prompt tokens (for the prediction and the work board).
    pub prompt_tokens: u64,
}

/// A prefill this VM routed that has not produced its first byte yet.
#[derive(Debug, Clone, PartialEq)]
struct PendingPrefill {
    id: u64,
    addr: String,
    tokens: u64,
    /// When it counts as done even without a first byte seen (a non-streaming response shows its
    /// first byte only at the end): the predicted first token, with margin.
    until_ms: u64,
}

#[derive(Default)]
pub struct Router {
    index: PrefixIndex,
    slot_of: HashMap<String, usize>,
    load: LoadTable,
    /// This VM's unfinished requests per pod, live.
    local_inflight: HashMap<String, u32>,
    /// This VM's prefills not yet at their first byte.
    pending: Vec<PendingPrefill>,
    next_pending_id: u64,
    /// Every other VM's unfinished work per pod, from the work board.
    others_work: HashMap<String, PodWork>,
    /// This VM's own cost fits, learned from its own requests' first bytes.
    fits: HashMap<String, CostFit>,
    /// Every other VM's fits, from the fits board.
    others_fits: HashMap<String, Vec<PodFit>>,
    /// Running mean of the uncached tokens of the requests this VM routed.
    typical_tokens: Option<f64>,
    /// Running mean of each pod's inter-token latency, from the streams this VM timed.
    itl_ms: HashMap<String, f64>,
    /// Sequence number of the last delta page applied.
    pub applied_page: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    /// `None` where the pool is not split into prefill and decode (or an aggregated pod was chosen).
    pub pd: Option<PdPlan>,
    /// Every candidate's metrics were stale (see `crate::health`).
    pub observer_suspect: bool,
}

/// Whose prefill a routed request is and what was predicted for it: what the work board carries
/// until its first byte, and what that first byte teaches.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstToken {
    /// The pod that prefills (the prefill pod of a split request).
    pub addr: String,
    pub uncached_tokens: f64,
    /// The model's features at routing time: tokens ahead + uncached, sequences decoding.
    pub tokens: f64,
    pub decoding: f64,
    pub predicted_ms: f64,
}

impl Plan {
    pub fn first_token(&self) -> Option<FirstToken> {
        let choice = match (&self.pd, &self.decision) {
            (
                Some(PdPlan {
                    prefill: Some(p), ..
                }),
                _,
            ) => p,
            (_, Decision::Route { ranked, .. }) => ranked.first()?,
            _ => return None,
        };
        let p = &choice.prediction;
        Some(FirstToken {
            addr: choice.addr.clone(),
            uncached_tokens: p.uncached_tokens,
            tokens: p.tokens_ahead + p.uncached_tokens,
            decoding: p.decoding,
            predicted_ms: p.ttft_ms,
        })
    }
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
    /// it keeps about `blocks` of ours.
    Evicted { blocks: u32, lost: Vec<u64> },
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
/// Before any request was routed, requests a pod reports waiting that the board does not show are
/// counted at this size.
const DEFAULT_TYPICAL_TOKENS: f64 = 512.0;
/// Weight of the newest request in the running mean of request sizes.
const TYPICAL_TOKENS_ALPHA: f64 = 0.05;
/// Weight of the newest stream in a pod's running mean of inter-token latency.
const ITL_ALPHA: f64 = 0.1;
/// A prefill with no first byte seen counts as done after its predicted TTFT times this (plus
/// `PENDING_MARGIN_MS`): a non-streaming response only shows its first byte when it is complete.
const PENDING_SLACK: f64 = 2.0;
const PENDING_MARGIN_MS: u64 = 50;
/// At most this many prefills are tracked per VM; beyond it the oldest stops counting (bounded
/// memory whatever the traffic; a VM has far fewer requests in flight than this).
const MAX_PENDING: usize = 4096;

impl Router {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn load_table(&self) -> &LoadTable {
        &self.load
    }

    pub fn index_entries(&self) -> usize {
        self.index.entries()
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    pub fn slot_of(&self, addr: &str) -> Option<usize> {
        self.slot_of.get(addr).copied()
    }

    /// Adopts a newer load table: new pods get index slots, removed pods are forgotten (index, fits),
    /// capacities follow what the pods report.
    pub fn apply_load_table(&mut self, config: &Config, table: LoadTable) {
        let removed: Vec<String> = self
            .slot_of
            .keys()
            .filter(|addr| !table.pods.iter().any(|p| &p.addr == *addr))
            .cloned()
            .collect();
        for addr in removed {
            if let Some(slot) = self.slot_of.remove(&addr) {
                self.index.clear_slot(slot);
            }
        }
        self.fits
            .retain(|addr, _| table.pods.iter().any(|p| &p.addr == addr));
        self.itl_ms
            .retain(|addr, _| table.pods.iter().any(|p| &p.addr == addr));
        for pod in &table.pods {
            let slot = match self.slot_of.get(&pod.addr) {
                Some(&s) => s,
                None => {
                    let Some(free) =
                        (0..MAX_SLOTS).find(|s| !self.slot_of.values().any(|v| v == s))
                    else {
                        continue;
                    };
                    self.slot_of.insert(pod.addr.clone(), free);
                    free
                }
            };
            let capacity = pod.capacity_blocks(
                config.block.tokens_per_block,
                config.default_pod_capacity_blocks,
                config.max_pod_capacity_blocks,
            );
            self.index.set_capacity(slot, capacity);
        }
        self.load = table;
    }

    pub fn observe(&mut self, observation: &Observation) {
        if let Some(&slot) = self.slot_of.get(&observation.addr) {
            self.index.observe(slot, &observation.hashes);
        }
    }

    pub fn apply_page(&mut self, page: &Page) {
        for o in &page.observations {
            self.observe(o);
        }
        for e in &page.evictions {
            self.forget(e);
        }
        self.applied_page = page.seq;
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
    /// `crate::vm::models`); the name itself where no pod lists it.
    pub fn cache_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.load
            .pods
            .iter()
            .find_map(|p| crate::vm::models::cache_key(&p.served, model))
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
        let (hashes, prompt_tokens) = match (config.block.mode, tokenizer) {
            (BlockMode::Tiktoken, Some(t)) => {
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

    /// Unfinished work on `addr`: the other VMs' rows on the board plus this VM's live state.
    pub fn work(&self, addr: &str) -> PodWork {
        let mut w = self.others_work.get(addr).copied().unwrap_or_default();
        w.inflight = w
            .inflight
            .saturating_add(self.local_inflight.get(addr).copied().unwrap_or(0));
        for p in self.pending.iter().filter(|p| p.addr == addr) {
            w.prefill_tokens = w.prefill_tokens.saturating_add(p.tokens);
            w.prefill_requests = w.prefill_requests.saturating_add(1);
        }
        w
    }

    /// The cost model `addr` is predicted with: every VM's fit, weighted by samples. A pod nobody
    /// has timed yet predicts like the timed pods of its role on average (pods of one pool are
    /// usually alike, and a prior far from them would make an untimed pod look much faster or
    /// slower than it is until its first requests); with no timed pod at all, the configured prior
    /// (plus the split overhead for a prefill pod).
    pub fn cost_of(&self, config: &Config, addr: &str) -> Coefficients {
        let (own, samples) = self.own_cost(addr);
        if samples > 0.0 {
            return own;
        }
        let role = self
            .load
            .pods
            .iter()
            .find(|p| p.addr == addr)
            .map(|p| p.role);
        let peers = self
            .load
            .pods
            .iter()
            .filter(|p| Some(p.role) == role && p.addr != addr)
            .map(|p| self.own_cost(&p.addr))
            .filter(|(_, n)| *n > 0.0);
        cost::merge(self.prior_of(config, addr), peers)
    }

    /// `addr`'s own model from every VM's samples, and how many samples that is.
    fn own_cost(&self, addr: &str) -> (Coefficients, f64) {
        let own = self.fits.get(addr).map(|f| (f.coefficients(), f.samples()));
        let others = self
            .others_fits
            .get(addr)
            .into_iter()
            .flatten()
            .map(|f| (f.cost, f.samples));
        let fits: Vec<(Coefficients, f64)> = own.into_iter().chain(others).collect();
        let samples = fits.iter().map(|(_, n)| n).sum();
        (cost::merge(Coefficients::default(), fits), samples)
    }

    fn prior_of(&self, config: &Config, addr: &str) -> Coefficients {
        let mut prior = config.prediction.prior;
        if self
            .load
            .pods
            .iter()
            .any(|p| p.addr == addr && p.role == Role::Prefill)
        {
            prior.overhead_ms += config.pd.split_overhead_ms;
        }
        prior
    }

    pub fn route(
        &self,
        config: &Config,
        model: &str,
        roles: &[Role],
        blocks: &Blocks,
        hints: Hints,
        now_ms: u64,
    ) -> Decision {
        self.route_judging_health(config, model, roles, blocks, hints, now_ms)
            .0
    }

    /// [`Self::route`], and whether every candidate's metrics were stale (then the last known
    /// figures were used: the observer is suspect, see `crate::health`).
    fn route_judging_health(
        &self,
        config: &Config,
        model: &str,
        roles: &[Role],
        blocks: &Blocks,
        hints: Hints,
        now_ms: u64,
    ) -> (Decision, bool) {
        let lengths = self.index.match_lengths(&blocks.hashes, MAX_SLOTS);
        let of_role: Vec<(&PodLoad, Health)> = self
            .load
            .pods
            .iter()
            .filter(|p| roles.contains(&p.role))
            .map(|p| (p, health_of(p, now_ms, config.stale_after_ms)))
            .collect();
        let observer_suspect = of_role.iter().any(|(_, h)| *h == Health::Stale)
            && !of_role.iter().any(|(_, h)| *h == Health::Fresh);
        let pods: Vec<PodView> = of_role
            .into_iter()
            .map(|(p, health)| {
                let work = self.work(&p.addr);
                // A stale pod's figures are as old as its last answer: routed on the board alone,
                // unless every pod is stale (then all are equally old, and better than nothing).
                let polled = if health == Health::Stale && !observer_suspect {
                    PodMetrics::default()
                } else {
                    p.metrics.clone()
                };
                PodView {
                    addr: &p.addr,
                    role: p.role,
                    health,
                    waiting: polled.waiting,
                    running: polled.running,
                    kv_usage: polled.kv_usage,
                    inflight: f64::from(work.inflight),
                    queued_tokens: work.prefill_tokens as f64,
                    queued_requests: f64::from(work.prefill_requests),
                    cost: self.cost_of(config, &p.addr),
                    itl_ms: self.itl_of(&p.addr),
                    models: &p.serves,
                    matched_blocks: self
                        .slot_of
                        .get(&p.addr)
                        .and_then(|&s| lengths.get(s).copied())
                        .unwrap_or(0),
                }
            })
            .collect();
        let decision = decide(
            config,
            &pods,
            &RouteRequest {
                model,
                roles,
                block_hashes: &blocks.hashes,
                prompt_tokens: blocks.prompt_tokens,
                tokens_per_block: config.block.tokens_per_block,
                affinity_key: blocks.affinity_key,
                typical_tokens: self.typical_tokens.unwrap_or(DEFAULT_TYPICAL_TOKENS),
                hints,
            },
        );
        (decision, observer_suspect)
    }

    /// The full decision for a request: the decode (or aggregated) pod with fallbacks, and, where
    /// pools are split into prefill and decode, whether and where to prefill (see `crate::pd`).
    pub fn plan(
        &self,
        config: &Config,
        model: &str,
        blocks: &Blocks,
        hints: Hints,
        now_ms: u64,
    ) -> Plan {
        let split = config.pools.iter().any(|p| p.role == Role::Decode);
        let roles: &[Role] = if split {
            &[Role::Decode, Role::Aggregated]
        } else {
            &[Role::Aggregated]
        };
        let (decision, observer_suspect) =
            self.route_judging_health(config, model, roles, blocks, hints, now_ms);
        let decode = match &decision {
            Decision::Route { ranked, .. } if split => ranked.first(),
            _ => None,
        };
        let on_decode_pod = decode.filter(|c| {
            self.load
                .pods
                .iter()
                .any(|p| p.addr == c.addr && p.role == Role::Decode)
        });
        let Some(decode) = on_decode_pod else {
            return Plan {
                decision,
                pd: None,
                observer_suspect,
            };
        };
        let pd = crate::pd::plan_split(self, config, model, blocks, hints, now_ms, decode);
        Plan {
            pd: Some(pd),
            decision,
            observer_suspect,
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

    pub fn inflight_start(&mut self, addr: &str) {
        *self.local_inflight.entry_ref(addr).or_insert(0) += 1;
    }

    pub fn inflight_end(&mut self, addr: &str) {
        if let Some(n) = self.local_inflight.get_mut(addr) {
            *n = n.saturating_sub(1);
        }
    }

    /// Puts a routed request's prefill on the board until [`Router::prefill_done`] (or its deadline);
    /// returns its handle.
    pub fn prefill_start(&mut self, first: &FirstToken, now_ms: u64) -> u64 {
        let alpha = TYPICAL_TOKENS_ALPHA;
        self.typical_tokens = Some(match self.typical_tokens {
            Some(t) => t * (1.0 - alpha) + first.uncached_tokens * alpha,
            None => first.uncached_tokens,
        });
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.next_pending_id += 1;
        let wait = (first.predicted_ms.max(0.0) * PENDING_SLACK) as u64 + PENDING_MARGIN_MS;
        self.pending.push(PendingPrefill {
            id: self.next_pending_id,
            addr: first.addr.clone(),
            tokens: first.uncached_tokens.max(0.0) as u64,
            until_ms: now_ms.saturating_add(wait),
        });
        self.next_pending_id
    }

    /// The prefill's first byte arrived, or the request ended: it no longer counts as queued work.
    /// Returns whether it was still counted (the board row changed).
    pub fn prefill_done(&mut self, id: u64) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.id != id);
        self.pending.len() != before
    }

    /// Drops prefills past their deadline; returns whether any was dropped (the row changed).
    pub fn expire_prefills(&mut self, now_ms: u64) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.until_ms > now_ms);
        self.pending.len() != before
    }

    /// Learns from a first byte: the request's features at routing time and how long it took.
    pub fn learn(&mut self, config: &Config, first: &FirstToken, observed_ms: f64) {
        let mut learning = config.prediction.learning();
        learning.prior = self.prior_of(config, &first.addr);
        self.fits
            .entry_ref(first.addr.as_str())
            .or_insert_with(|| CostFit::new(&learning))
            .observe(&learning, first.tokens, first.decoding, observed_ms);
    }

    /// `addr`'s inter-token latency: the mean of what this VM and the others timed.
    fn itl_of(&self, addr: &str) -> Option<f64> {
        let values: Vec<f64> = self
            .itl_ms
            .get(addr)
            .copied()
            .into_iter()
            .chain(
                self.others_fits
                    .get(addr)
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.itl_ms),
            )
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
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
    /// the blocks touched since the first one it lost, and its index capacity is capped to that
    /// here at once (the caller tells the leader, which publishes it for every VM).
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
            blocks: u32::try_from(blocks).unwrap_or(u32::MAX),
            lost,
        }
    }

    /// A stream on `addr` delivered its tokens `itl_ms` apart on average.
    pub fn observe_itl(&mut self, addr: &str, itl_ms: f64) {
        let known = self.slot_of.contains_key(addr);
        if !(itl_ms.is_finite() && itl_ms >= 0.0 && known) {
            return;
        }
        let mean = self.itl_ms.entry_ref(addr).or_insert(itl_ms);
        *mean = *mean * (1.0 - ITL_ALPHA) + itl_ms * ITL_ALPHA;
    }

    /// This VM's unfinished work per pod, for its row on the work board.
    pub fn own_work(&mut self) -> Vec<(String, PodWork)> {
        self.local_inflight.retain(|_, n| *n > 0);
        let mut rows: HashMap<&str, PodWork> = HashMap::new();
        for (addr, n) in &self.local_inflight {
            rows.entry(addr.as_str()).or_default().inflight = *n;
        }
        for p in &self.pending {
            let w = rows.entry(p.addr.as_str()).or_default();
            w.prefill_tokens = w.prefill_tokens.saturating_add(p.tokens);
            w.prefill_requests = w.prefill_requests.saturating_add(1);
        }
        let mut out: Vec<(String, PodWork)> =
            rows.into_iter().map(|(a, w)| (a.to_string(), w)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Adopts the other VMs' work read from the board.
    pub fn set_others_work(&mut self, others: HashMap<String, PodWork>) {
        self.others_work = others;
    }

    /// This VM's fits and inter-token latencies, for its row on the fits board.
    pub fn own_fits(&self) -> Vec<PodFit> {
        let mut out: Vec<PodFit> = self
            .fits
            .iter()
            .map(|(a, f)| PodFit {
                addr: a.clone(),
                cost: f.coefficients(),
                samples: f.samples(),
                itl_ms: self.itl_ms.get(a).copied(),
            })
            .collect();
        for (addr, itl) in &self.itl_ms {
            if !self.fits.contains_key(addr) {
                out.push(PodFit {
                    addr: addr.clone(),
                    cost: Coefficients::default(),
                    samples: 0.0,
                    itl_ms: Some(*itl),
                });
            }
        }
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        out
    }

    /// Samples behind `addr`'s model, every VM's together (for the stats).
    pub fn fit_samples(&self, addr: &str) -> f64 {
        let own = self.fits.get(addr).map_or(0.0, |f| f.samples());
        let others: f64 = self
            .others_fits
            .get(addr)
            .into_iter()
            .flatten()
            .map(|f| f.samples)
            .sum();
        own + others
    }

    pub fn set_others_fits(&mut self, others: HashMap<String, Vec<PodFit>>) {
        self.others_fits = others;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::{parse, Endpoint};
    use crate::scheduler::Decision;
    use crate::state::load::PodLoad;
    use crate::vm::prom::PodMetrics;

    fn table(addrs: &[&str], now: u64) -> LoadTable {
        LoadTable {
            format: crate::state::load::LOAD_FORMAT,
            version: 1,
            published_ms: now,
            pods: addrs
                .iter()
                .map(|a| PodLoad {
                    addr: a.to_string(),
                    role: Role::Aggregated,
                    pool: String::new(),
                    metrics_at_ms: now,
                    failing: false,
                    metrics: PodMetrics {
                        block_size: Some(16),
                        num_gpu_blocks: Some(1024),
                        ..PodMetrics::default()
                    },
                    capacity_hint_blocks: None,
                    served: Vec::new(),
                    serves: Vec::new(),
                    late: false,
                    ejected_until_ms: 0,
                })
                .collect(),
        }
    }

    fn primary(d: &Decision) -> String {
        match d {
            Decision::Route { ranked, .. } => ranked[0].addr.clone(),
            Decision::NoEndpoint(r) => panic!("{r:?}"),
        }
    }

    fn chat(system: &str, user: &str) -> RequestView {
        let body = serde_json::json!({"model":"m","messages":[{"role":"system","content":system},{"role":"user","content":user}]});
        parse(Endpoint::ChatCompletions, body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_shared_prefix_follows_the_first_choice() {
        let cfg = Config::default();
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&["a:1", "b:1", "c:1", "d:1"], 100));
        let system = "You are a helpful assistant. ".repeat(100);
        let first = Router::blocks(&cfg, &chat(&system, "question one"), None);
        let d = r.route(
            &cfg,
            "m",
            &[Role::Aggregated],
            &first,
            Hints::default(),
            100,
        );
        let pod = primary(&d);
        r.observe(&Observation {
            addr: pod.clone(),
            hashes: first.hashes.clone(),
        });
        // The chosen pod is now a little busier than the others; the prefix keeps it first.
        let mut busier = table(&["a:1", "b:1", "c:1", "d:1"], 100);
        busier
            .pods
            .iter_mut()
            .find(|p| p.addr == pod)
            .unwrap()
            .metrics
            .running = 4.0;
        r.apply_load_table(&cfg, busier);
        let mut followed = 0;
        for i in 0..20 {
            let b = Router::blocks(&cfg, &chat(&system, &format!("another question {i}")), None);
            if primary(&r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100)) == pod {
                followed += 1;
            }
        }
        // Without the observation the same load sends it elsewhere.
        let mut fresh = Router::new();
        let mut busier = table(&["a:1", "b:1", "c:1", "d:1"], 100);
        busier
            .pods
            .iter_mut()
            .find(|p| p.addr == pod)
            .unwrap()
            .metrics
            .running = 4.0;
        fresh.apply_load_table(&cfg, busier);
        assert_ne!(
            primary(&fresh.route(
                &cfg,
                "m",
                &[Role::Aggregated],
                &first,
                Hints::default(),
                100
            )),
            pod
        );
        assert_eq!(followed, 20);
    }

    #[test]
    fn removed_pods_leave_the_index_and_stale_tables_still_route() {
        let cfg = Config::default();
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
        r.observe(&Observation {
            addr: "a:1".into(),
            hashes: vec![1, 2, 3],
        });
        assert_eq!(r.index_entries(), 3);
        r.apply_load_table(&cfg, table(&["b:1"], 100));
        assert_eq!(r.index_entries(), 0);
        assert_eq!(r.slot_of("a:1"), None);
        let b = Router::blocks(&cfg, &chat("x", "y"), None);
        let late = 100 + cfg.stale_after_ms + 1;
        let plan = r.plan(&cfg, "m", &b, Hints::default(), late);
        assert_eq!(
            primary(&plan.decision),
            "b:1",
            "stale metrics are not a dead pod"
        );
        assert!(
            plan.observer_suspect,
            "every pod is stale: the observer is suspect"
        );
        let mut failing = table(&["b:1"], 100);
        failing.pods[0].failing = true;
        r.apply_load_table(&cfg, failing);
        assert_eq!(
            r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100),
            Decision::NoEndpoint(crate::scheduler::Rejection::NoneHealthy)
        );
    }

    #[test]
    fn snapshot_reproduces_the_index() {
        let cfg = Config::default();
        let mut a = Router::new();
        a.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
        a.observe(&Observation {
            addr: "a:1".into(),
            hashes: vec![1, 2, 3],
        });
        a.observe(&Observation {
            addr: "b:1".into(),
            hashes: vec![1, 9],
        });
        let mut b = Router::new();
        b.apply_load_table(&cfg, table(&["b:1", "a:1"], 100));
        b.observe(&Observation {
            addr: "a:1".into(),
            hashes: vec![77],
        });
        b.load_snapshot(&a.snapshot(5));
        assert_eq!(b.applied_page, 5);
        assert_eq!(
            b.index().match_lengths(&[1, 2, 3], 64)[b.slot_of("a:1").unwrap()],
            3
        );
        assert_eq!(
            b.index().match_lengths(&[1, 9], 64)[b.slot_of("b:1").unwrap()],
            2
        );
        assert_eq!(
            b.index().match_lengths(&[77], 64)[b.slot_of("a:1").unwrap()],
            0
        );
        assert_eq!(
            a.index()
                .slot_blocks_oldest_first(a.slot_of("a:1").unwrap()),
            b.index()
                .slot_blocks_oldest_first(b.slot_of("a:1").unwrap())
        );
    }

    #[test]
    fn other_vms_work_counts_as_soon_as_the_board_is_read() {
        use crate::state::inflight::Board;
        let cfg = Config::default();
        let (mut vm1, mut vm2) = (Router::new(), Router::new());
        for r in [&mut vm1, &mut vm2] {
            r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
        }
        let mut board = Board::default();
        vm1.inflight_start("a:1");
        vm1.inflight_start("a:1");
        let first = FirstToken {
            addr: "a:1".into(),
            uncached_tokens: 3000.0,
            tokens: 3000.0,
            decoding: 0.0,
            predicted_ms: 100.0,
        };
        let id = vm1.prefill_start(&first, 100);
        board.put_row(1, 100, &vm1.own_work(), 3000);
        vm2.inflight_start("a:1");
        vm2.set_others_work(board.others(2, 100, 3000));
        let w = vm2.work("a:1");
        assert_eq!(
            (w.inflight, w.prefill_tokens, w.prefill_requests),
            (3, 3000, 1)
        );
        assert_eq!(vm2.work("b:1"), PodWork::default());
        // The other VM's queued prefill makes a new prompt cheaper on the idle pod.
        let b = Router::blocks(&cfg, &chat("fresh", "prompt"), None);
        assert_eq!(
            primary(&vm2.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100)),
            "b:1"
        );
        assert!(vm1.prefill_done(id));
        assert!(!vm1.prefill_done(id), "done once");
        vm1.inflight_end("a:1");
        vm1.inflight_end("a:1");
        assert!(vm1.own_work().is_empty(), "finished requests leave the row");
    }

    #[test]
    fn a_reported_miss_trims_what_the_pod_evidently_lost() {
        let cfg = Config::default();
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
        let older = Router::blocks(&cfg, &chat(&"older tenant ".repeat(200), "q"), None);
        let newer = Router::blocks(&cfg, &chat(&"newer tenant ".repeat(200), "q"), None);
        for b in [&older, &newer] {
            r.observe(&Observation {
                addr: "a:1".into(),
                hashes: b.hashes.clone(),
            });
        }
        let slot = r.slot_of("a:1").unwrap();
        let matched = r.index().match_lengths(&newer.hashes, 64)[slot];
        let expected = r.expect_cache("a:1", &newer, matched).unwrap();
        assert_eq!(expected.matched_blocks, newer.hashes.len());
        assert!(
            r.expect_cache("b:1", &newer, 0).is_none(),
            "b holds nothing"
        );
        // Routing observes the prompt again (the pod recomputes it) ...
        r.observe(&Observation {
            addr: "a:1".into(),
            hashes: newer.hashes.clone(),
        });
        // ... a report that matches changes nothing ...
        let prompt = newer.prompt_tokens;
        assert_eq!(
            r.on_cache_report(&expected, prompt - 10, prompt),
            CacheVerdict::Confirmed
        );
        assert_eq!(
            r.index().match_lengths(&older.hashes, 64)[slot],
            older.hashes.len()
        );
        // ... but "nothing cached" means the pod's LRU dropped the newer prompt, so the older one
        // is surely gone too; what was touched since (this request's own blocks) stays.
        let CacheVerdict::Evicted { blocks, lost } = r.on_cache_report(&expected, 0, prompt) else {
            panic!("not detected")
        };
        assert_eq!(blocks, newer.hashes.len() as u32);
        let mut lost_sorted = lost.clone();
        lost_sorted.sort();
        let mut older_sorted = older.hashes.clone();
        older_sorted.sort();
        older_sorted.dedup();
        assert_eq!(
            lost_sorted, older_sorted,
            "exactly the older prompt's blocks"
        );
        assert_eq!(r.index().match_lengths(&older.hashes, 64)[slot], 0);
        assert_eq!(
            r.index().match_lengths(&newer.hashes, 64)[slot],
            newer.hashes.len()
        );
        // The leader publishes the hint; every VM's index capacity follows it.
        let mut t = table(&["a:1", "b:1"], 100);
        t.pods[0].capacity_hint_blocks = Some(5);
        r.apply_load_table(&cfg, t);
        assert_eq!(r.index().blocks_held(slot), 5);
    }

    #[test]
    fn an_unseen_prefill_expires_and_the_pool_is_bounded() {
        let cfg = Config::default();
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&["a:1"], 100));
        let first = FirstToken {
            addr: "a:1".into(),
            uncached_tokens: 10.0,
            tokens: 10.0,
            decoding: 0.0,
            predicted_ms: 100.0,
        };
        r.prefill_start(&first, 1000);
        assert!(!r.expire_prefills(1000 + 200));
        assert!(r.expire_prefills(1000 + 251), "2 × 100 ms + 50 ms margin");
        for _ in 0..MAX_PENDING + 10 {
            r.prefill_start(&first, 1000);
        }
        assert_eq!(r.pending.len(), MAX_PENDING);
    }

    #[test]
    fn a_slow_pod_is_learned_and_gets_less_work() {
        let cfg = Config::default();
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&["fast:1", "slow:1"], 100));
        // Samples as the board gives them: the request's own tokens plus a queue ahead that varies.
        for i in 0..40 {
            let tokens = 500.0 + 800.0 * f64::from(i % 10);
            for (addr, us) in [("fast:1", 20.0), ("slow:1", 40.0)] {
                let first = FirstToken {
                    addr: addr.into(),
                    uncached_tokens: tokens,
                    tokens,
                    decoding: 0.0,
                    predicted_ms: 0.0,
                };
                r.learn(&cfg, &first, 2.0 + us * tokens / 1e3);
            }
        }
        let fast = r.cost_of(&cfg, "fast:1");
        let slow = r.cost_of(&cfg, "slow:1");
        assert!(
            (slow.us_per_token / fast.us_per_token - 2.0).abs() < 0.2,
            "{fast:?} {slow:?}"
        );
        // Queue equal work on both: new prompts keep choosing the fast pod until its queue is
        // about twice the slow one's.
        let mut queued = [0u64; 2];
        for i in 0..30 {
            let b = Router::blocks(
                &cfg,
                &chat(&format!("unique {i} "), &"w ".repeat(1000)),
                None,
            );
            let pod = primary(&r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100));
            let first = FirstToken {
                addr: pod.clone(),
                uncached_tokens: b.prompt_tokens as f64,
                tokens: 0.0,
                decoding: 0.0,
                predicted_ms: 1e9,
            };
            r.prefill_start(&first, 100);
            queued[usize::from(pod == "slow:1")] += 1;
        }
        assert!(
            queued[0] >= 18 && queued[0] <= 22,
            "fast pod took about two thirds: {queued:?}"
        );
    }

    #[test]
    fn an_observation_travels_from_one_vm_to_another() {
        use crate::state::messages::Message;
        let cfg = Config::default();
        let (mut w1, mut leader, mut w2) = (Router::new(), Router::new(), Router::new());
        for r in [&mut w1, &mut leader, &mut w2] {
            r.apply_load_table(&cfg, table(&["a:1", "b:1", "c:1", "d:1"], 100));
        }
        let blocks = Router::blocks(&cfg, &chat(&"word ".repeat(5000), "q"), None);
        let o = Observation {
            addr: "c:1".into(),
            hashes: blocks.hashes.clone(),
        };
        w1.observe(&o);
        let msg = Message::Observation {
            vm: 1,
            observation: o,
        }
        .encode();
        let Some(Message::Observation { observation, .. }) = Message::decode(&msg) else {
            panic!()
        };
        leader.observe(&observation);
        let page = Page {
            seq: 1,
            observations: vec![observation],
            evictions: vec![],
        }
        .encode();
        w2.apply_page(&Page::decode(&page).unwrap());
        let slot = w2.slot_of("c:1").unwrap();
        assert_eq!(
            w2.index().match_lengths(&blocks.hashes, 64)[slot],
            blocks.hashes.len()
        );
        assert_eq!(
            primary(&w2.route(
                &cfg,
                "m",
                &[Role::Aggregated],
                &blocks,
                Hints::default(),
                100
            )),
            "c:1"
        );
    }

    struct Words;
    impl Tokenizer for Words {
        fn encode(&self, text: &str) -> Vec<u32> {
            text.split_whitespace().map(|w| w.len() as u32).collect()
        }
    }

    #[test]
    fn tiktoken_mode_uses_the_tokenizer() {
        let mut cfg = Config::default();
        cfg.block.mode = BlockMode::Tiktoken;
        let v = chat(&"word ".repeat(64), "q");
        let b = Router::blocks(&cfg, &v, Some(&Words));
        assert_eq!(b.prompt_tokens, 65);
        assert_eq!(b.hashes.len(), 4);
        // Without a tokenizer it falls back to characters rather than failing.
        let c = Router::blocks(&cfg, &v, None);
        assert_eq!(c.hashes.len(), v.prompt.len() / 64);
    }
}

#[cfg(test)]
mod pd_tests {
    use super::*;
    use crate::state::load::PodLoad;
    use crate::vm::prom::PodMetrics;

    fn pd_config() -> Config {
        Config::parse(
            br#"{"pools":[{"name":"p","role":"prefill","endpoints":["10.0.0.1:1","10.0.0.2:1"]},
                          {"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}]}"#,
        )
        .unwrap()
    }

    fn router(cfg: &Config, prefill_waiting: f64) -> Router {
        router_with_streams(cfg, prefill_waiting, 0.0)
    }

    fn router_with_streams(cfg: &Config, prefill_waiting: f64, decode_running: f64) -> Router {
        let mut pods = Vec::new();
        for pool in &cfg.pools {
            for ep in &pool.endpoints {
                pods.push(PodLoad {
                    addr: ep.clone(),
                    role: pool.role,
                    pool: String::new(),
                    metrics_at_ms: 100,
                    failing: false,
                    // Decode pods run their streams; only queues count as pressure.
                    metrics: PodMetrics {
                        waiting: if pool.role == Role::Prefill {
                            prefill_waiting
                        } else {
                            0.0
                        },
                        running: if pool.role == Role::Decode {
                            decode_running
                        } else {
                            0.0
                        },
                        ..PodMetrics::default()
                    },
                    capacity_hint_blocks: None,
                    served: Vec::new(),
                    serves: Vec::new(),
                    late: false,
                    ejected_until_ms: 0,
                });
            }
        }
        let mut r = Router::new();
        r.apply_load_table(
            cfg,
            LoadTable {
                format: crate::state::load::LOAD_FORMAT,
                version: 1,
                published_ms: 100,
                pods,
            },
        );
        r
    }

    fn blocks(tokens: u64) -> Blocks {
        Blocks {
            hashes: (1..=tokens / 16).collect(),
            affinity_key: 1,
            prompt_tokens: tokens,
        }
    }

    #[test]
    fn long_uncached_prompts_get_a_prefill_pod_short_ones_do_not() {
        let cfg = pd_config();
        let r = router(&cfg, 0.0);
        let long = r.plan(&cfg, "m", &blocks(8000), Hints::default(), 100);
        let Decision::Route { ranked, .. } = &long.decision else {
            panic!()
        };
        assert_eq!(ranked[0].addr, "10.0.1.1:1", "decode pod first");
        let pd = long.pd.unwrap();
        assert_eq!(pd.outcome, PdOutcome::Disaggregated);
        assert!(pd.prefill.unwrap().addr.starts_with("10.0.0."));
        let short = r
            .plan(&cfg, "m", &blocks(100), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(short.outcome, PdOutcome::LocalCheaper);
        assert!(short.prefill.is_none());
    }

    #[test]
    fn a_prompt_cached_on_the_decode_pod_stays_there() {
        let cfg = pd_config();
        let mut r = router(&cfg, 0.0);
        let b = blocks(8000);
        r.observe(&Observation {
            addr: "10.0.1.1:1".into(),
            hashes: b.hashes.clone(),
        });
        let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
        assert_eq!(pd.uncached_tokens, 0.0);
        assert_eq!(pd.outcome, PdOutcome::LocalCheaper);
    }

    #[test]
    fn a_busy_prefill_pool_keeps_prefills_local_and_a_dead_one_means_decode_only() {
        let cfg = pd_config();
        let idle = router(&cfg, 0.0)
            .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(idle.outcome, PdOutcome::Disaggregated);
        // Each prefill pod reports 12 waiting requests the gateway did not send.
        let busy = router(&cfg, 12.0)
            .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
            .pd
            .unwrap();
        assert!(busy.split_cost_ms.unwrap() > idle.split_cost_ms.unwrap());
        assert_eq!(busy.outcome, PdOutcome::LocalCheaper);
        let mut dead = router(&cfg, 0.0);
        let mut table = dead.load_table().clone();
        for p in table.pods.iter_mut().filter(|p| p.role == Role::Prefill) {
            p.failing = true;
        }
        dead.apply_load_table(&cfg, table);
        let pd = dead
            .plan(&cfg, "m", &blocks(8000), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(pd.outcome, PdOutcome::NoPrefillPod);
    }

    #[test]
    fn a_long_prompt_beside_running_streams_is_split_but_not_on_an_idle_short_one() {
        let cfg = pd_config();
        // 20 streams decode on the decode pod: a 300-token prefill there stalls every one of them,
        // so even a short prompt is cheaper on a prefill pod ...
        let r = router_with_streams(&cfg, 0.0, 20.0);
        let pd = r
            .plan(&cfg, "m", &blocks(300), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(pd.outcome, PdOutcome::Disaggregated, "{pd:?}");
        // ... but a handful of tokens are not worth a split's overhead ...
        let pd = r
            .plan(&cfg, "m", &blocks(16), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(pd.outcome, PdOutcome::LocalCheaper, "{pd:?}");
        // ... and without streams to stall, 300 tokens stay local too.
        let pd = router(&cfg, 0.0)
            .plan(&cfg, "m", &blocks(300), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(pd.outcome, PdOutcome::LocalCheaper, "{pd:?}");
    }

    #[test]
    fn without_a_split_there_is_no_pd_plan() {
        let cfg = Config::parse(br#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1"]}]}"#).unwrap();
        let r = router(&cfg, 0.0);
        assert_eq!(
            r.plan(&cfg, "m", &blocks(8000), Hints::default(), 100).pd,
            None
        );
    }

    #[test]
    fn a_context_only_the_decode_pod_holds_is_prefilled_there() {
        let cfg = pd_config();
        let mut r = router(&cfg, 0.0);
        let b = blocks(12_000);
        // The decode pod holds all but the last 1,000 tokens; no prefill pod holds any of it.
        let held = (12_000 - 1_000) / 16;
        r.observe(&Observation {
            addr: "10.0.1.1:1".into(),
            hashes: b.hashes[..held].to_vec(),
        });
        let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
        assert_eq!(pd.outcome, PdOutcome::LocalCheaper);
        // Once a prefill pod holds the context too, the split pays again.
        r.observe(&Observation {
            addr: "10.0.0.1:1".into(),
            hashes: b.hashes[..held].to_vec(),
        });
        let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
        assert_eq!(pd.outcome, PdOutcome::Disaggregated);
        assert_eq!(pd.prefill.unwrap().addr, "10.0.0.1:1");
    }
}
