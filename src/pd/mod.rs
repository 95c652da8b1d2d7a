//! Prefill/decode disaggregation: whether a request gets a prefill pod in front of its decode pod.
//!
//! The decode pod is chosen first, exactly as an aggregated pod would be (predicted time to first
//! token, among decode and aggregated pods). Then the split is decided by cost, not by a threshold
//! (see `crate::router::Router::plan`):
//!
//! * **local** — the decode pod prefills the tokens it does not hold: its predicted TTFT, plus the
//!   harm to its streams where there is harm: if the gap the prefill puts between two of their
//!   tokens (their observed inter-token latency plus the prefill's length) breaks their
//!   inter-token objective, every sequence decoding there counts the stall (on an idle decode pod,
//!   the next request it takes waits behind it: at least one).
//! * **split** — the best prefill pod's predicted TTFT (its queue and compute for the tokens *it*
//!   does not hold). Its cost model is learned from the split requests' own first bytes, so the KV
//!   transfer and the decode pod's first step are in it; the decode pod's streams are not stalled
//!   (the pull is asynchronous, as NIXL's reads are).
//!
//! The cheaper wins. So a short or mostly cached prompt stays local (its stall stays within the
//! objective, and the decode pod answers sooner than a prefill pod busy with long prompts), a long
//! one beside running streams goes to a prefill pod, a long agent context that only the decode pod
//! holds stays there (a prefill pod would recompute it all), and a backed-up prefill pool sends
//! prefills back to decode pods with spare time while an idle one takes them: the rate matching
//! that a fixed threshold (the previous design: 512 uncached tokens scaled by the pools' queue
//! ratio) only approximated.
//!
//! **The objective** ([`StreamObjective`]): the request's `x-slo-tpot-ms` (`slo.tpot_header`),
//! else `pd.itl_objective_ms`, else `pd.itl_slack` times the decode pods' median observed
//! inter-token latency. Before any stream was timed there is none, and every stall counts. Why
//! only a broken objective counts: summing every stall (the rule before) priced a 150-token prefill
//! beside 18 streams at 18 stalls, so short prompts queued behind long ones on the prefill pods —
//! the median first token of an interference run went from 0.065 s to 0.6–0.8 s for no gain in the
//! streams' P99 inter-token latency (a stall that short is within their ordinary spread). The gap
//! is judged whole (an engine that chunks prefills spreads it over steps, so the bound is
//! conservative there).
//!
//! **Elastic P/D** (pools of role `both`, vLLM's `kv_role: kv_both`): every `both` pod is a decode
//! candidate as above and, for another pod's request, a prefill candidate; there is no fixed
//! split. A `both` pod prefilling for another stalls its own streams as a local prefill would, so
//! its cost is priced the same way ([`SharedPod`]), and the pod without streams prefills. Where even
//! the cheapest candidate keeps the request waiting longer than its own prefill takes, the `both`
//! pod decoding the fewest streams is opened for prefills (`open_another_prefill_pod`): the number
//! of pods prefilling follows the load. What it does not do (measured, docs/results.md): keep a
//! pod that prefills free of new streams, so the streams' tail gaps are not held as a fixed
//! split's are.
//!
//! Execution (`crate::flow` carries out what is decided here), in either of two modes:
//! * `sidecar` — the llm-d contract: route to the decode pod with `x-prefiller-host-port`; the
//!   routing sidecar in the decode pod calls the prefiller, then its local decoder.
//! * `inline` — no sidecar: kvroute itself sends the request to the prefill pod with `max_tokens: 1`,
//!   `stream: false` and `kv_transfer_params.do_remote_decode = true`, copies the `kv_transfer_params`
//!   of its answer into the original body, and routes that to the decode pod (`inline`).

pub mod inline;
pub mod topology;

use crate::health::HealthConfig;
use crate::scheduler::{Choice, Decision, Hints, Prediction};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PdMode {
    #[default]
    Sidecar,
    Inline,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct PdConfig {
    pub mode: PdMode,
    /// The longest a prefill leg may take before the request falls back to decode-only: the ceiling
    /// of the leg's first-byte bound ([`prefill_bound_ms`]), and the whole bound where
    /// `health.first_byte_timeout_ms` is 0.
    pub prefill_timeout_ms: u64,
    /// While splits are predicted to lose, one long prompt in this many ms is split anyway (per
    /// VM), so a prefill role whose estimate turned pessimistic is timed again and can recover;
    /// 0: never.
    pub probe_interval_ms: u64,
    /// What a split costs beyond the prefill itself, before any split request was observed: the
    /// second request, the KV transfer's setup, the decode pod's first step. Added to the prior of
    /// prefill pods' cost models only; their fits learn the real figure from split requests' first
    /// bytes, transfer included.
    pub split_overhead_ms: f64,
    /// The gap between two tokens of a stream that a local prefill may cause before the stall
    /// counts against it, ms; 0: `itl_slack` times the decode pods' median observed gap. A
    /// request's `x-slo-tpot-ms` overrides it.
    pub itl_objective_ms: f64,
    /// Without an objective: how many times the decode pods' median observed inter-token latency a
    /// stream's gap may become.
    pub itl_slack: f64,
    /// Inline mode: the client's request headers copied onto the prefill call, so a pool that
    /// requires an API key (vLLM's `--api-key`) accepts the prefill with the client's own key, and
    /// the call stays in the client's trace. Names are lower-cased when the configuration is read.
    pub forward_headers: Vec<String>,
    /// Where pods are and what a split's KV transfer costs between them (`topology`).
    pub topology: topology::TopologyConfig,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            mode: PdMode::Sidecar,
            prefill_timeout_ms: 60_000,
            // A probe costs one request at most the prefill bound; at 2 s each VM probes a handful
            // of requests in a recovery of seconds, not tens.
            probe_interval_ms: 2_000,
            split_overhead_ms: 20.0,
            itl_objective_ms: 0.0,
            // A stall of a few decode steps is within a stream's ordinary spread (its P99 gap is
            // several times its median beside any prefill); past that a user sees it.
            itl_slack: 4.0,
            forward_headers: ["authorization", "traceparent", "tracestate", "x-request-id"]
                .map(String::from)
                .to_vec(),
            topology: topology::TopologyConfig::default(),
        }
    }
}

impl PdConfig {
    pub fn validate(&self) -> Result<(), crate::common::ConfigError> {
        if self.prefill_timeout_ms == 0 {
            return Err(crate::common::ConfigError::at(
                "pd.prefill_timeout_ms",
                "must be positive",
            ));
        }
        crate::common::at_least("pd.split_overhead_ms", self.split_overhead_ms, 0.0)?;
        crate::common::at_least("pd.itl_objective_ms", self.itl_objective_ms, 0.0)?;
        crate::common::at_least("pd.itl_slack", self.itl_slack, 1.0)?;
        for (i, name) in self.forward_headers.iter().enumerate() {
            crate::common::HeaderName::parse(&format!("pd.forward_headers[{i}]"), name)?;
        }
        self.topology.validate()
    }

    /// The section as the runtime uses it: header names lower-cased (Envoy's form).
    pub fn compiled(&self) -> PdConfig {
        PdConfig {
            forward_headers: self
                .forward_headers
                .iter()
                .map(|n| n.to_ascii_lowercase())
                .collect(),
            ..self.clone()
        }
    }
}

/// The cost of prefilling on the decode pod: its predicted TTFT plus the stall it imposes on the
/// streams decoding there (at least one: the next request it takes waits too), in milliseconds.
pub fn local_cost_ms(ttft_ms: f64, prefill_ms: f64, decoding: f64) -> f64 {
    ttft_ms + decoding.max(1.0) * prefill_ms.max(0.0)
}

/// The decode pod's streams' inter-token objective and where they stand (see the module header).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamObjective {
    /// The gap between two tokens a stream may see, ms; absent before any stream was timed.
    pub objective_ms: Option<f64>,
    /// The decode pod's streams' observed gap, ms (absent before one was timed: 0).
    pub decode_itl_ms: Option<f64>,
}

impl StreamObjective {
    /// The request's TPOT objective, else the configured one, else `itl_slack` times the median
    /// of `pool_itls_ms` (the decode pods' observed gaps, gathered only when neither is given).
    pub fn resolve(
        pd: &PdConfig,
        request_tpot_ms: Option<f64>,
        decode_itl_ms: Option<f64>,
        pool_itls_ms: impl FnOnce() -> Vec<f64>,
    ) -> StreamObjective {
        let configured = (pd.itl_objective_ms > 0.0).then_some(pd.itl_objective_ms);
        let pool_median = || {
            let mut itls = pool_itls_ms();
            itls.retain(|v| v.is_finite() && *v > 0.0);
            itls.sort_by(f64::total_cmp);
            itls.get(itls.len() / 2).map(|m| m * pd.itl_slack)
        };
        StreamObjective {
            objective_ms: request_tpot_ms
                .filter(|t| *t > 0.0)
                .or(configured)
                .or_else(pool_median),
            decode_itl_ms,
        }
    }

    /// Whether a local prefill of `stall_ms` puts a gap past the objective between two tokens of
    /// the decode pod's streams (with no objective known, any stall does).
    pub fn broken_by(&self, stall_ms: f64) -> bool {
        stall_ms > 0.0
            && self
                .objective_ms
                .is_none_or(|t| self.decode_itl_ms.unwrap_or(0.0) + stall_ms > t)
    }
}

/// The first-byte bound of a prefill leg whose pod is predicted to answer in `predicted_ms`: the
/// decode leg's rule (`health.first_byte_timeout`: its floor, or its factor times the prediction if
/// longer), never beyond `pd.prefill_timeout_ms`. A prefill pod's answer is its first byte (one
/// token, not streamed), so a pod silent past the bound is as hung as a decode pod would be.
pub fn prefill_bound_ms(health: &HealthConfig, pd: &PdConfig, predicted_ms: f64) -> u64 {
    health
        .first_byte_timeout(predicted_ms)
        .map_or(pd.prefill_timeout_ms, |bound| {
            bound.min(pd.prefill_timeout_ms)
        })
}

/// Uncached tokens below which no probe is made: the previous design's split threshold. A split
/// of a shorter prompt seldom pays, so timing one teaches the estimate where it matters least, at
/// a client's expense.
pub const PROBE_MIN_TOKENS: f64 = 512.0;

/// When this VM last split a request, so a split predicted to lose is still tried once in a while.
///
/// The prefill role's cost model learns only from split requests: once it predicts every split to
/// lose (a spell of slow prefills taught it so), no split is made and nothing corrects it. A probe
/// is one split made against the prediction; its first byte is a fresh sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitClock {
    last_split_ms: Option<u64>,
}

impl SplitClock {
    /// Whether a request whose split lost on cost at `now_ms` should be split anyway.
    pub fn probe_due(&self, now_ms: u64, interval_ms: u64) -> bool {
        interval_ms > 0
            && self
                .last_split_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= interval_ms)
    }

    /// A request was split (by cost or as a probe) at `now_ms`.
    pub fn split_at(&mut self, now_ms: u64) {
        self.last_split_ms = Some(now_ms);
    }
}

/// Why a request on a split pool was or was not disaggregated: the `reason` of the P/D counters
/// and the debug line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdReason {
    /// The prefill pod is predicted to give the first token sooner than the decode pod.
    Sooner,
    /// Prefilling locally would break the decode pod's streams' objective, and the split costs
    /// the pool less than those stalls.
    Streams,
    /// Split against the prediction, to time the prefill role again (`pd.probe_interval_ms`).
    Probe,
    /// Local: its stall keeps the streams within their objective (or nothing is left to prefill),
    /// and the decode pod answers sooner.
    WithinObjective,
    /// Local although the stall breaks the objective: the prefill pool is further behind still.
    PrefillBusier,
    /// No healthy prefill pod serves the model.
    NoPrefillPod,
    /// Split, but the prefill leg failed: the decode pod served the request alone.
    PrefillFailed,
}

impl PdReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PdReason::Sooner => "sooner",
            PdReason::Streams => "streams_objective",
            PdReason::Probe => "probe",
            PdReason::WithinObjective => "within_objective",
            PdReason::PrefillBusier => "prefill_busier",
            PdReason::NoPrefillPod => "no_prefill_pod",
            PdReason::PrefillFailed => "prefill_failed",
        }
    }
}

/// What `plan` decided about prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdOutcome {
    Disaggregated,
    /// Prefilling on the decode pod is cheaper (short, cached, or the prefill pool is busier).
    LocalCheaper,
    /// No healthy prefill pod serves the model.
    NoPrefillPod,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PdPlan {
    pub prefill: Option<Choice>,
    pub outcome: PdOutcome,
    pub reason: PdReason,
    /// The streams' objective the decision was judged against.
    pub streams: StreamObjective,
    /// The best prefill pod where the split lost on cost: what a probe would split to.
    pub probe: Option<Choice>,
    /// Prompt tokens the decode pod does not hold.
    pub uncached_tokens: f64,
    /// The two costs compared (ms): decode-pod TTFT (+ the stall of its streams where it breaks
    /// their objective), and the prefill pod's predicted TTFT (absent without a prefill pod).
    pub local_cost_ms: f64,
    pub split_cost_ms: Option<f64>,
    /// Every prefill candidate's prediction, in rank order, for the debug line (empty unless
    /// `debug_header` is on: why this prefill pod and not another).
    pub prefill_predictions: Vec<(String, Prediction)>,
}

/// The hints the prefill step is ranked with: the decode pod already admitted the request, so
/// the prefill step is never shed, and a session pins its decode pod, not its prefill pod.
pub fn prefill_hints(hints: Hints) -> Hints {
    Hints {
        priority: 0,
        session: None,
        stored_at: None,
        ..hints
    }
}

/// A prefill candidate that decodes too (a `both` pod: elastic P/D): what a prefill there costs
/// its own streams is priced as a local prefill's on the decode pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedPod {
    /// Its learned cost per uncached token.
    pub us_per_token: f64,
    /// Its streams' observed gap between tokens, ms.
    pub itl_ms: Option<f64>,
}

/// What prefilling on `candidate` costs: its predicted first token, plus, on a pod that decodes
/// too, the stall of its own streams where it breaks their objective (as [`local_cost_ms`]).
fn split_cost_ms(candidate: &Choice, shared: Option<SharedPod>, streams: StreamObjective) -> f64 {
    let p = &candidate.prediction;
    let Some(shared) = shared else {
        return p.ttft_ms;
    };
    let prefill_ms = shared.us_per_token * p.uncached_tokens / 1e3;
    let theirs = StreamObjective {
        decode_itl_ms: shared.itl_ms,
        ..streams
    };
    if theirs.broken_by(prefill_ms) {
        local_cost_ms(p.ttft_ms, prefill_ms, p.decoding)
    } else {
        p.ttft_ms
    }
}

/// Elastic P/D: where even the cheapest prefill candidate keeps the request waiting longer than
/// its own prefill takes (the pods prefilling for others are falling behind), the `both` pod
/// decoding the fewest streams that answers sooner is put first, its streams' stall counted once
/// (one prefill's length, as for a pod without streams), so the pool has one more pod prefilling
/// while the load needs it. Charging every stream's stall there instead (the rule for a single
/// choice) let one pod's queue grow to tens of seconds before a pod with streams was ever taken.
/// The cost (docs/results.md, "Elastic prefill/decode"): each opening stalls that pod's streams.
fn open_another_prefill_pod(priced: &mut Vec<(Choice, f64, bool)>) {
    let Some((first, _, _)) = priced.first() else {
        return;
    };
    let waits = first.prediction.ttft_ms - first.prediction.own_compute_ms;
    if waits <= first.prediction.own_compute_ms {
        return;
    }
    let first_ttft = first.prediction.ttft_ms;
    let opened = priced
        .iter()
        .enumerate()
        .filter(|(_, (c, _, shared))| *shared && !c.guarded && c.prediction.ttft_ms < first_ttft)
        .min_by(|(_, a), (_, b)| {
            (a.0.prediction.decoding)
                .total_cmp(&b.0.prediction.decoding)
                .then(a.0.prediction.ttft_ms.total_cmp(&b.0.prediction.ttft_ms))
        })
        .map(|(i, _)| i);
    if let Some(i) = opened {
        let mut choice = priced.remove(i);
        choice.1 = choice.0.prediction.ttft_ms + choice.0.prediction.own_compute_ms;
        priced.insert(0, choice);
    }
}

/// Whether and where to prefill a request whose decode pod is `decode` (see the module header),
/// given the prefill candidates' ranking (`Router::route` over the prefill and `both` roles with
/// [`prefill_hints`], the decode pod left out), the decode pod's learned cost per uncached token,
/// its streams' objective, and which candidates decode too (`shared`). Pure: both rankings come
/// in, the plan goes out. `keep_predictions` keeps every prefill candidate's prediction for the
/// debug line.
pub fn plan_split(
    decode: &Choice,
    decode_us_per_token: f64,
    streams: StreamObjective,
    prefill_ranking: Decision,
    shared: impl Fn(&str) -> Option<SharedPod>,
    keep_predictions: bool,
) -> PdPlan {
    let local = &decode.prediction;
    let prefill_ms = decode_us_per_token * local.uncached_tokens / 1e3;
    let breaks = streams.broken_by(prefill_ms);
    let local_cost = if breaks {
        local_cost_ms(local.ttft_ms, prefill_ms, local.decoding)
    } else {
        local.ttft_ms
    };
    let mut prefill_predictions = Vec::new();
    let mut priced: Vec<(Choice, f64, bool)> = match prefill_ranking {
        Decision::Route { ranked, .. } => {
            if keep_predictions {
                prefill_predictions = ranked
                    .iter()
                    .map(|c| (c.addr.clone(), c.prediction))
                    .collect();
            }
            ranked
                .into_iter()
                .map(|c| {
                    let shared = shared(&c.addr);
                    let cost = split_cost_ms(&c, shared, streams);
                    (c, cost, shared.is_some())
                })
                .collect()
        }
        Decision::NoEndpoint(_) => Vec::new(),
    };
    // Where no candidate decodes, every cost is its predicted first token and the picker's order
    // (rendezvous among near-ties included) stands.
    if priced.iter().any(|(_, _, shared)| *shared) {
        priced.sort_by(|a, b| a.0.guarded.cmp(&b.0.guarded).then(a.1.total_cmp(&b.1)));
        open_another_prefill_pod(&mut priced);
    }
    let best = priced.into_iter().next();
    let split_cost = best.as_ref().map(|(_, cost, _)| *cost);
    // A `both` pod's cost is learned from its own requests too: no probe is needed to time it.
    let probe_worthy = best.as_ref().is_some_and(|(_, _, shared)| !*shared);
    let prefill = best.map(|(c, _, _)| c);
    let (prefill, outcome, reason, probe) = match (prefill, split_cost) {
        (Some(p), Some(c)) if c < local_cost => {
            let reason = if c < local.ttft_ms {
                PdReason::Sooner
            } else {
                PdReason::Streams
            };
            (Some(p), PdOutcome::Disaggregated, reason, None)
        }
        (Some(p), _) => {
            let reason = if breaks {
                PdReason::PrefillBusier
            } else {
                PdReason::WithinObjective
            };
            (
                None,
                PdOutcome::LocalCheaper,
                reason,
                probe_worthy.then_some(p),
            )
        }
        (None, _) => (None, PdOutcome::NoPrefillPod, PdReason::NoPrefillPod, None),
    };
    PdPlan {
        prefill,
        outcome,
        reason,
        streams,
        probe,
        uncached_tokens: local.uncached_tokens,
        local_cost_ms: local_cost,
        split_cost_ms: split_cost,
        prefill_predictions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let c = PdConfig {
            prefill_timeout_ms: 0,
            ..PdConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "pd.prefill_timeout_ms");
    }

    #[test]
    fn a_prefill_leg_is_bounded_like_a_decode_leg_under_the_configured_ceiling() {
        let health = HealthConfig::default();
        let pd = PdConfig::default();
        assert_eq!(prefill_bound_ms(&health, &pd, 100.0), 5_000, "the floor");
        assert_eq!(
            prefill_bound_ms(&health, &pd, 3_000.0),
            12_000,
            "4x the prediction"
        );
        assert_eq!(prefill_bound_ms(&health, &pd, 1e9), 60_000, "the ceiling");
        let off = HealthConfig {
            first_byte_timeout_ms: 0,
            ..HealthConfig::default()
        };
        assert_eq!(prefill_bound_ms(&off, &pd, 100.0), 60_000);
    }

    #[test]
    fn a_probe_is_due_once_per_interval_after_the_last_split() {
        let mut clock = SplitClock::default();
        assert!(clock.probe_due(0, 2_000), "never split yet");
        clock.split_at(1_000);
        assert!(!clock.probe_due(1_500, 2_000));
        assert!(!clock.probe_due(2_999, 2_000));
        assert!(clock.probe_due(3_000, 2_000));
        assert!(!clock.probe_due(10_000, 0), "0 turns probing off");
    }

    #[test]
    fn local_cost_counts_every_stalled_stream_and_at_least_one() {
        assert_eq!(local_cost_ms(100.0, 80.0, 0.0), 180.0);
        assert_eq!(local_cost_ms(100.0, 80.0, 10.0), 900.0);
    }

    #[test]
    fn the_objective_is_the_request_s_then_the_configured_then_a_slack_over_the_pool_median() {
        let pd = PdConfig::default();
        let pool = vec![20.0, 30.0, f64::NAN, 25.0];
        let derived = StreamObjective::resolve(&pd, None, Some(22.0), || pool.clone());
        assert_eq!(derived.objective_ms, Some(4.0 * 25.0), "slack × median");
        assert_eq!(derived.decode_itl_ms, Some(22.0));
        let configured = PdConfig {
            itl_objective_ms: 60.0,
            ..PdConfig::default()
        };
        let c = StreamObjective::resolve(&configured, None, None, || pool.clone());
        assert_eq!(c.objective_ms, Some(60.0));
        let r = StreamObjective::resolve(&configured, Some(40.0), None, || pool);
        assert_eq!(r.objective_ms, Some(40.0), "the request's header first");
        let none = StreamObjective::resolve(&pd, None, None, Vec::new);
        assert_eq!(none.objective_ms, None, "no stream timed yet");
    }

    fn candidate(addr: &str, ttft_ms: f64, decoding: f64) -> Choice {
        Choice {
            addr: addr.into(),
            matched_blocks: 0,
            former_blocks: 0,
            prediction: Prediction {
                ttft_ms,
                uncached_tokens: 8000.0,
                own_compute_ms: 3200.0,
                decoding,
                ..Prediction::default()
            },
            guarded: false,
            meets_slo: None,
            stale: false,
        }
    }

    fn ranking(choices: Vec<Choice>) -> Decision {
        Decision::Route {
            ranked: choices,
            reason: crate::scheduler::RouteReason::Load,
        }
    }

    #[test]
    fn a_both_pod_prefilling_for_another_is_charged_its_own_streams_stall() {
        let streams = StreamObjective {
            objective_ms: Some(100.0),
            decode_itl_ms: Some(25.0),
        };
        let decode = candidate("d", 500.0, 12.0);
        let both = |_: &str| {
            Some(SharedPod {
                us_per_token: 400.0,
                itl_ms: Some(25.0),
            })
        };
        let plan = |candidates: Vec<Choice>, shared: &dyn Fn(&str) -> Option<SharedPod>| {
            plan_split(&decode, 400.0, streams, ranking(candidates), shared, false)
        };
        // b answers sooner but decodes 12 streams; c decodes none: c prefills.
        let p = plan(
            vec![candidate("b", 3300.0, 12.0), candidate("c", 3400.0, 0.0)],
            &both,
        );
        assert_eq!(p.outcome, PdOutcome::Disaggregated);
        assert_eq!(p.prefill.unwrap().addr, "c");
        assert_eq!(p.reason, PdReason::Streams);
        // c's queue now holds the request longer than its own prefill: the pod decoding the
        // fewest streams among those that answer sooner is opened for prefills (b2, not b).
        let p = plan(
            vec![
                candidate("b", 3300.0, 12.0),
                candidate("b2", 3500.0, 4.0),
                candidate("c", 9000.0, 0.0),
            ],
            &both,
        );
        assert_eq!(p.prefill.unwrap().addr, "b2");
        assert_eq!(
            p.split_cost_ms,
            Some(3500.0 + 3200.0),
            "its streams' stall once"
        );
        // Every candidate decodes as many streams as the decode pod: moving the stall gains
        // nothing, and no probe is made to time a pod whose cost its own requests teach.
        let p = plan(vec![candidate("b", 3300.0, 12.0)], &both);
        assert_eq!(p.outcome, PdOutcome::LocalCheaper);
        assert_eq!(p.reason, PdReason::PrefillBusier);
        assert_eq!(p.probe, None);
        // A dedicated prefill pod is priced by its first token alone, and can be probed.
        let p = plan(vec![candidate("p", 1e9, 0.0)], &|_| None);
        assert_eq!(p.split_cost_ms, Some(1e9));
        assert_eq!(p.probe.unwrap().addr, "p");
    }

    #[test]
    fn only_a_stall_past_the_objective_breaks_it_and_any_does_without_one() {
        let s = StreamObjective {
            objective_ms: Some(100.0),
            decode_itl_ms: Some(25.0),
        };
        assert!(!s.broken_by(60.0), "25 + 60 ms within 100");
        assert!(s.broken_by(80.0), "25 + 80 ms past 100");
        assert!(!s.broken_by(0.0), "nothing to prefill");
        assert!(StreamObjective::default().broken_by(1.0));
    }
}
