//! One VM's routing state and the decision. The host glue feeds it shared data, request bodies
//! and first-byte times; it answers with decisions. No host calls here, so all of it runs natively
//! in tests. The state is one part per concern, each in its own folder with its own hooks: what
//! the pods hold (`crate::affinity`), the work they have to do first (`crate::work`) and how fast
//! they do it (`crate::cost`), beside the leader's load table. [`Router::route`] puts them in one
//! view per pod for the scheduler and ranks one role's pods; [`Router::plan`] adds the
//! prefill/decode split.

pub use crate::affinity::Tokenizer;
pub use crate::affinity::{Blocks, CacheExpectation, CacheVerdict, MAX_BLOCKS_PER_REQUEST};
pub use crate::cost::PoolCosts;
pub use crate::pd::{PdOutcome, PdPlan};

use crate::adapters::Adapters;
use crate::affinity::{Affinity, IndexSizes};
use crate::config::{Config, Role};
use crate::cost::Costs;
use crate::health::{health_of, Health};
use crate::pod::load::{LoadTable, PodLoad};
use crate::pod::prom::PodMetrics;
use crate::scheduler::predict::head_progress;
use crate::scheduler::{decide, Choice, Decision, Hints, PodView, RouteRequest};
use crate::state::messages::Observation;
pub use crate::work::FirstToken;
use crate::work::WorkBook;

#[derive(Default)]
pub struct Router {
    /// What each pod holds: the prefix index and its place in the leader's pages.
    pub affinity: Affinity,
    load: LoadTable,
    /// Work in flight per pod: this VM's and the other VMs' from the work board.
    pub work: WorkBook,
    /// How fast each pod works: learned costs and inter-token latencies.
    pub costs: Costs,
    /// Which pods hold which LoRA adapter, and what loading one costs.
    pub adapters: Adapters,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    /// `None` where the pool is not split into prefill and decode (or an aggregated pod was chosen).
    pub pd: Option<PdPlan>,
    /// Every candidate's metrics were stale (see `crate::health`).
    pub observer_suspect: bool,
}

impl Plan {
    /// What the work board and the cost fit keep of the request, of `blocks`, until its first
    /// byte.
    pub fn first_token(&self, blocks: &Blocks) -> Option<FirstToken> {
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
            prompt_tokens: blocks.prompt_tokens as f64,
            held_prefix: choice
                .matched_blocks
                .checked_sub(1)
                .and_then(|i| blocks.hashes.get(i))
                .copied()
                .unwrap_or(0),
            tokens: p.tokens_ahead + p.uncached_tokens,
            decoding: p.decoding,
            predicted_ms: p.ttft_ms,
            adapter_load_ms: p.adapter_load_ms,
            warm_load_ms: p.warm_load_ms,
        })
    }
}

impl Router {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn load_table(&self) -> &LoadTable {
        &self.load
    }

    /// `model` when it names a LoRA adapter on some pod (`crate::adapters`).
    pub fn adapter_of<'a>(&self, model: &'a str) -> Option<&'a str> {
        self.adapters.is_adapter(model).then_some(model)
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

    /// Adopts a newer load table: new pods get index slots, removed pods are forgotten (index, fits),
    /// capacities follow what the pods report. Returns what this VM routed to restarted pods
    /// after their new process started, for the other VMs to observe ([`crate::affinity::Restarts::held_again`]).
    pub fn apply_load_table(&mut self, config: &Config, table: LoadTable) -> Vec<Observation> {
        let sizes = IndexSizes {
            tokens_per_block: config.block.tokens_per_block,
            default_pod_blocks: config.default_pod_capacity_blocks,
            max_pod_blocks: config.max_pod_capacity_blocks,
            max_index_blocks: config.max_index_blocks,
            warm_pod_blocks: crate::affinity::tiers::warm_capacity_blocks(
                &config.kv_tiers,
                config.block.tokens_per_block,
            ),
        };
        let restarts = self.affinity.list_pods(&table, &sizes);
        for addr in &restarts.pods {
            self.work.pod_restarted(addr);
        }
        self.costs.list_pods(&table);
        self.adapters.list_pods(&table);
        self.load = table;
        restarts.held_again
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
        let keep = config.max_endpoints_in_header;
        self.route_judging_health(config, model, roles, blocks, hints, now_ms, keep)
            .0
    }

    /// [`Self::route`] ranking up to `keep` pods, and whether every candidate's metrics were stale
    /// (then the last known figures were used: the observer is suspect, see `crate::health`).
    #[allow(clippy::too_many_arguments)]
    fn route_judging_health(
        &self,
        config: &Config,
        model: &str,
        roles: &[Role],
        blocks: &Blocks,
        hints: Hints,
        now_ms: u64,
        keep: usize,
    ) -> (Decision, bool) {
        let lengths = self.affinity.match_lengths(&blocks.hashes);
        let former = self.affinity.former_lengths(&blocks.hashes);
        let of_role: Vec<(&PodLoad, Health)> = self
            .load
            .pods
            .iter()
            .filter(|p| roles.contains(&p.role))
            .map(|p| (p, health_of(p, now_ms, config.stale_after_ms)))
            .collect();
        let observer_suspect = of_role.iter().any(|(_, h)| *h == Health::Stale)
            && !of_role.iter().any(|(_, h)| *h == Health::Fresh);
        let pool_costs = self.costs.pool_costs();
        let settings = config.costs();
        let adapter = self.adapter_of(model);
        let pods: Vec<PodView> = of_role
            .into_iter()
            .map(|(p, health)| {
                let work = self.work.of(&p.addr);
                let matched = self.affinity.matched_of(&lengths, &p.addr);
                let cost = self.costs.cost_in(&settings, &p.addr, p.role, &pool_costs);
                let adapter_load =
                    self.adapters
                        .load_ms_on(&config.adapters, p, adapter, |block| {
                            self.affinity.stamp_of(&p.addr, block)
                        });
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
                    seats: config.overload_guard.seats(p.seats),
                    seat_hold_ms: self.costs.decode_of(&p.addr),
                    inflight: f64::from(work.inflight),
                    queued_tokens: work.prefill_tokens as f64 - head_progress(&work, &cost, now_ms),
                    queued_requests: f64::from(work.prefill_requests),
                    ours_at_poll: polled.ours,
                    cost,
                    ttft_scale: self.costs.ttft_scale_of(p.role).factor(),
                    error_band: self.costs.error_band_of(p.role).log_width(),
                    itl_ms: self.costs.itl_of(&p.addr),
                    models: &p.serves,
                    matched_blocks: matched,
                    former_blocks: self.affinity.matched_of(&former, &p.addr),
                    warm_load_ms: self.warm_load_ms(config, &p.addr, blocks, matched),
                    adapter_load_ms: adapter_load.load_ms,
                    adapter_reload_ms: adapter_load.reload_ms,
                }
            })
            .collect();
        let selection = crate::scheduler::SelectionConfig {
            max_endpoints_in_header: keep,
            ..config.selection()
        };
        let decision = decide(
            &selection,
            &pods,
            &RouteRequest {
                model,
                roles,
                block_hashes: &blocks.hashes,
                prompt_tokens: blocks.prompt_tokens,
                tokens_per_block: config.block.tokens_per_block,
                affinity_key: blocks.affinity_key,
                typical_tokens: self.work.typical_tokens(),
                hints,
            },
        );
        (decision, observer_suspect)
    }

    /// Milliseconds `addr` would spend loading those of its `matched` leading blocks of the
    /// request that lie in a tier beyond the GPU.
    fn warm_load_ms(&self, config: &Config, addr: &str, blocks: &Blocks, matched: usize) -> f64 {
        self.affinity
            .tier_split(
                &config.kv_tiers,
                addr,
                &blocks.hashes,
                matched,
                config.block.tokens_per_block,
            )
            .load_ms
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
        let split = config
            .pools
            .iter()
            .any(|p| p.role.decodes_remote_prefills());
        let roles: &[Role] = if split {
            &[Role::Decode, Role::Both, Role::Aggregated]
        } else {
            &[Role::Aggregated]
        };
        let keep = config.max_endpoints_in_header;
        let (decision, observer_suspect) =
            self.route_judging_health(config, model, roles, blocks, hints, now_ms, keep);
        let decode = match &decision {
            Decision::Route { ranked, .. } if split => ranked.first(),
            _ => None,
        };
        let on_decode_pod = decode.filter(|c| {
            self.load
                .pods
                .iter()
                .any(|p| p.addr == c.addr && p.role.decodes_remote_prefills())
        });
        let Some(decode) = on_decode_pod else {
            return Plan {
                decision,
                pd: None,
                observer_suspect,
            };
        };
        let prefill_ranking = self.prefill_ranking(config, model, blocks, hints, now_ms, decode);
        // The pool's costs once for the decode pod and every `both` candidate.
        let settings = config.costs();
        let pool_costs = self.costs.pool_costs();
        let decode_role = self.costs.role_of(&decode.addr).unwrap_or(Role::Aggregated);
        let decode_cost = self
            .costs
            .cost_in(&settings, &decode.addr, decode_role, &pool_costs);
        let pool_itls = || {
            self.load
                .pods
                .iter()
                .filter(|p| p.role.decodes_remote_prefills())
                .filter_map(|p| self.costs.itl_of(&p.addr))
                .collect()
        };
        let streams = crate::pd::StreamObjective::resolve(
            &config.pd,
            hints.slo.tpot_ms,
            self.costs.itl_of(&decode.addr),
            pool_itls,
        );
        // A `both` pod prefilling for another stalls its own streams as a local prefill would.
        let shared = |addr: &str| {
            (self.costs.role_of(addr)? == Role::Both).then(|| crate::pd::SharedPod {
                us_per_token: self
                    .costs
                    .cost_in(&settings, addr, Role::Both, &pool_costs)
                    .us_per_token,
                itl_ms: self.costs.itl_of(addr),
            })
        };
        let pd = crate::pd::plan_split(
            decode,
            decode_cost.us_per_token,
            streams,
            prefill_ranking,
            shared,
            config.debug_header,
        );
        Plan {
            pd: Some(pd),
            decision,
            observer_suspect,
        }
    }

    /// The prefill pods for a split onto `decode` (prefill pods, and `both` pods but `decode`
    /// itself), each priced with its KV transfer there (`crate::pd::topology`).
    fn prefill_ranking(
        &self,
        config: &Config,
        model: &str,
        blocks: &Blocks,
        hints: Hints,
        now_ms: u64,
        decode: &Choice,
    ) -> Decision {
        // Priced by their links, every prefill pod is a candidate: the nearest may rank past the
        // header's few before its transfer is counted.
        let topology = &config.pd.topology;
        // So are `both` pods, whose own streams a prefill stalls (`crate::pd::plan_split`).
        let elastic = config.pools.iter().any(|p| p.role == Role::Both);
        let keep = if topology.enabled() || elastic {
            crate::common::MAX_PODS
        } else {
            config.max_endpoints_in_header
        };
        let (mut ranking, _) = self.route_judging_health(
            config,
            model,
            &[Role::Prefill, Role::Both],
            blocks,
            crate::pd::prefill_hints(hints),
            now_ms,
            keep,
        );
        if let Decision::Route { ranked, .. } = &mut ranking {
            ranked.retain(|c| c.addr != decode.addr);
            if ranked.is_empty() {
                ranking = Decision::NoEndpoint(crate::scheduler::Rejection::NoPods);
            }
        }
        let reported = |addr: &str| {
            self.load
                .pods
                .iter()
                .find(|p| p.addr == addr)
                .and_then(|p| p.locality.as_ref())
        };
        crate::pd::topology::price_transfers(
            topology,
            ranking,
            &decode.addr,
            decode.prediction.uncached_tokens,
            reported,
            config.max_endpoints_in_header,
        )
    }
}

#[cfg(test)]
mod pd_tests;
#[cfg(test)]
mod tests;
