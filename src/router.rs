//! One VM's routing state and the request-path entry points: the VM's copy of the prefix index, the
//! leader's latest load table, and this VM's own in-flight counts. The host glue feeds it shared
//! data and request bodies; it answers with decisions. No host calls here, so all of it runs natively
//! in tests.

use crate::config::{BlockMode, Config, Role};
use crate::index::{PrefixIndex, MAX_SLOTS};
use crate::pd::uncached_tokens;
use crate::prefix::{chain_seed, char_block_hashes, token_block_hashes};
use crate::request::RequestView;
use crate::scheduler::{decide, Choice, Decision, Hints, PodView, RouteRequest};
use crate::state::load::LoadTable;
use crate::state::messages::{Observation, Page};
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
    /// Estimated prompt tokens (for P/D and in-flight token accounting).
    pub prompt_tokens: u64,
}

#[derive(Default)]
pub struct Router {
    index: PrefixIndex,
    slot_of: HashMap<String, usize>,
    load: LoadTable,
    /// This VM's unfinished requests per pod, live.
    local_inflight: HashMap<String, u32>,
    /// Every other VM's unfinished requests per pod, from the in-flight board.
    others_inflight: HashMap<String, u32>,
    /// Sequence number of the last delta page applied.
    pub applied_page: u64,
}

/// What `plan` decided about prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdOutcome {
    Disaggregated,
    /// Few enough uncached tokens that the decode pod prefills them itself.
    ShortOrCached,
    /// Worth disaggregating, but no healthy prefill pod serves the model.
    NoPrefillPod,
    /// The decode pod holds most of a long prompt that no prefill pod holds: recomputing it on a
    /// prefill pod would cost more than `max_prefill_work_ratio` times the local prefill.
    PrefillPodColder,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PdPlan {
    pub prefill: Option<Choice>,
    pub outcome: PdOutcome,
    pub uncached_tokens: u64,
    pub threshold: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    /// `None` where the pool is not split into prefill and decode (or an aggregated pod was chosen).
    pub pd: Option<PdPlan>,
}

/// Longest prompt, in blocks, that is hashed: bounds per-request work on huge prompts.
pub const MAX_BLOCKS_PER_REQUEST: usize = 8192;

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

    /// Adopts a newer load table: new pods get index slots, removed pods are forgotten, capacities
    /// follow what the pods report.
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
        self.applied_page = page.seq;
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
        Page { seq, observations }
    }

    pub fn blocks(
        config: &Config,
        view: &RequestView,
        tokenizer: Option<&dyn Tokenizer>,
    ) -> Blocks {
        let seed = chain_seed(&view.model, view.cache_salt.as_deref());
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

    /// In-flight requests to `addr`: the other VMs' rows on the board plus this VM's live count.
    fn inflight(&self, addr: &str) -> f64 {
        let others = self.others_inflight.get(addr).copied().unwrap_or(0);
        let live = self.local_inflight.get(addr).copied().unwrap_or(0);
        f64::from(others.saturating_add(live))
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
        let lengths = self.index.match_lengths(&blocks.hashes, MAX_SLOTS);
        let pods: Vec<PodView> = self
            .load
            .pods
            .iter()
            .map(|p| PodView {
                addr: &p.addr,
                role: p.role,
                fresh: p.is_fresh(now_ms, config.stale_after_ms),
                waiting: p.metrics.waiting,
                running: p.metrics.running,
                kv_usage: p.metrics.kv_usage,
                inflight: self.inflight(&p.addr),
                models: &p.metrics.models,
                matched_blocks: self
                    .slot_of
                    .get(&p.addr)
                    .and_then(|&s| lengths.get(s).copied())
                    .unwrap_or(0),
            })
            .collect();
        decide(
            config,
            &pods,
            &RouteRequest {
                model,
                roles,
                block_hashes: &blocks.hashes,
                affinity_key: blocks.affinity_key,
                hints,
            },
        )
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
        let decision = self.route(config, model, roles, blocks, hints, now_ms);
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
            return Plan { decision, pd: None };
        };
        let (prefill_queue, decode_queue) = self.load.pd_queues(now_ms, config.stale_after_ms);
        let threshold = config.pd.threshold(prefill_queue, decode_queue);
        let uncached = uncached_tokens(
            blocks.prompt_tokens,
            decode.matched_blocks,
            config.block.tokens_per_block,
        );
        let tokens_per_block = config.block.tokens_per_block;
        let (prefill, outcome) = if (uncached as f64) <= threshold {
            (None, PdOutcome::ShortOrCached)
        } else {
            // The decode pod already admitted the request: the prefill step is never shed.
            let prefill_hints = Hints {
                priority: 0,
                ..hints
            };
            match self.route(
                config,
                model,
                &[Role::Prefill],
                blocks,
                prefill_hints,
                now_ms,
            ) {
                Decision::Route { ranked, .. } => match ranked.into_iter().next() {
                    Some(p)
                        if uncached_tokens(blocks.prompt_tokens, p.matched_blocks, tokens_per_block)
                            as f64
                            > config.pd.max_prefill_work_ratio * uncached as f64 =>
                    {
                        (None, PdOutcome::PrefillPodColder)
                    }
                    Some(p) => (Some(p), PdOutcome::Disaggregated),
                    None => (None, PdOutcome::NoPrefillPod),
                },
                Decision::NoEndpoint(_) => (None, PdOutcome::NoPrefillPod),
            }
        };
        Plan {
            decision,
            pd: Some(PdPlan {
                prefill,
                outcome,
                uncached_tokens: uncached,
                threshold,
            }),
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

    /// This VM's unfinished requests per pod, for its row on the in-flight board.
    pub fn own_inflight(&mut self) -> Vec<(String, u32)> {
        self.local_inflight.retain(|_, n| *n > 0);
        let mut counts: Vec<(String, u32)> = self
            .local_inflight
            .iter()
            .map(|(a, n)| (a.clone(), *n))
            .collect();
        counts.sort();
        counts
    }

    /// Adopts the other VMs' counts read from the in-flight board.
    pub fn set_others_inflight(&mut self, others: HashMap<String, u32>) {
        self.others_inflight = others;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::PodMetrics;
    use crate::request::{parse, Endpoint};
    use crate::scheduler::Decision;
    use crate::state::load::PodLoad;

    fn table(addrs: &[&str], now: u64) -> LoadTable {
        LoadTable {
            version: 1,
            published_ms: now,
            pods: addrs
                .iter()
                .map(|a| PodLoad {
                    addr: a.to_string(),
                    role: Role::Aggregated,
                    metrics_at_ms: now,
                    failing: false,
                    metrics: PodMetrics {
                        block_size: Some(16),
                        num_gpu_blocks: Some(1024),
                        ..PodMetrics::default()
                    },
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
    fn removed_pods_leave_the_index_and_stale_tables_stop_routing() {
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
        assert!(matches!(
            r.route(
                &cfg,
                "m",
                &[Role::Aggregated],
                &b,
                Hints::default(),
                100 + cfg.stale_after_ms + 1
            ),
            Decision::NoEndpoint(_)
        ));
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
    fn other_vms_requests_count_as_soon_as_the_board_is_read() {
        use crate::state::inflight::Board;
        let cfg = Config::default();
        let (mut vm1, mut vm2) = (Router::new(), Router::new());
        for r in [&mut vm1, &mut vm2] {
            r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
        }
        let mut board = Board::default();
        vm1.inflight_start("a:1");
        vm1.inflight_start("a:1");
        board.put_row(1, 100, &vm1.own_inflight(), 3000);
        vm2.inflight_start("a:1");
        vm2.set_others_inflight(board.others(2, 100, 3000));
        assert_eq!(vm2.inflight("a:1"), 3.0);
        assert_eq!(vm2.inflight("b:1"), 0.0);
        vm1.inflight_end("a:1");
        vm1.inflight_end("a:1");
        assert!(
            vm1.own_inflight().is_empty(),
            "finished requests leave the row"
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
    use crate::prom::PodMetrics;
    use crate::state::load::PodLoad;

    fn pd_config() -> Config {
        Config::parse(
            br#"{"pools":[{"name":"p","role":"prefill","endpoints":["10.0.0.1:1","10.0.0.2:1"]},
                          {"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}]}"#,
        )
        .unwrap()
    }

    fn router(cfg: &Config, prefill_waiting: f64) -> Router {
        let mut pods = Vec::new();
        for pool in &cfg.pools {
            for ep in &pool.endpoints {
                pods.push(PodLoad {
                    addr: ep.clone(),
                    role: pool.role,
                    metrics_at_ms: 100,
                    failing: false,
                    // Decode pods run their streams; only queues count as pressure.
                    metrics: PodMetrics {
                        waiting: if pool.role == Role::Prefill {
                            prefill_waiting
                        } else {
                            0.0
                        },
                        running: if pool.role == Role::Decode { 20.0 } else { 0.0 },
                        ..PodMetrics::default()
                    },
                });
            }
        }
        let mut r = Router::new();
        r.apply_load_table(
            cfg,
            LoadTable {
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
        assert_eq!(short.outcome, PdOutcome::ShortOrCached);
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
        assert_eq!(pd.uncached_tokens, 0);
        assert_eq!(pd.outcome, PdOutcome::ShortOrCached);
    }

    #[test]
    fn a_busy_prefill_pool_raises_the_threshold_and_a_dead_one_means_decode_only() {
        let cfg = pd_config();
        let idle = router(&cfg, 0.0)
            .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
            .pd
            .unwrap();
        assert_eq!(idle.outcome, PdOutcome::Disaggregated);
        let busy = router(&cfg, 12.0)
            .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
            .pd
            .unwrap();
        assert!(busy.threshold > idle.threshold);
        assert_eq!(busy.outcome, PdOutcome::ShortOrCached);
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
        assert_eq!(pd.outcome, PdOutcome::PrefillPodColder);
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
