//! Prefill/decode disaggregation: whether a request gets a prefill pod in front of its decode pod.
//!
//! The decode pod is chosen first, exactly as an aggregated pod would be (predicted time to first
//! token, among decode and aggregated pods). Then the split is decided by cost, not by a threshold
//! (see `crate::router::Router::plan`):
//!
//! * **local** — the decode pod prefills the tokens it does not hold: its predicted TTFT, plus the
//!   harm to its streams: every sequence decoding there stalls for the prefill's length (on an idle
//!   decode pod, the next request it takes waits behind it: at least one).
//! * **split** — the best prefill pod's predicted TTFT (its queue and compute for the tokens *it*
//!   does not hold). Its cost model is learned from the split requests' own first bytes, so the KV
//!   transfer and the decode pod's first step are in it; the decode pod's streams are not stalled
//!   (the pull is asynchronous, as NIXL's reads are).
//!
//! The cheaper wins. So a short or mostly cached prompt stays local (the stall is short), a long one
//! beside running streams goes to a prefill pod, a long agent context that only the decode pod holds
//! stays there (a prefill pod would recompute it all), and a backed-up prefill pool sends prefills
//! back to decode pods with spare time while an idle one takes them: the rate matching that a fixed
//! threshold (the previous design: 512 uncached tokens scaled by the pools' queue ratio) only
//! approximated.
//!
//! Execution (`crate::flow` carries out what is decided here), in either of two modes:
//! * `sidecar` — the llm-d contract: route to the decode pod with `x-prefiller-host-port`; the
//!   routing sidecar in the decode pod calls the prefiller, then its local decoder.
//! * `inline` — no sidecar: kvroute itself sends the request to the prefill pod with `max_tokens: 1`,
//!   `stream: false` and `kv_transfer_params.do_remote_decode = true`, copies the `kv_transfer_params`
//!   of its answer into the original body, and routes that to the decode pod (`inline`).

pub mod inline;

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
    /// Inline mode: the client's request headers copied onto the prefill call, so a pool that
    /// requires an API key (vLLM's `--api-key`) accepts the prefill with the client's own key, and
    /// the call stays in the client's trace. Names are lower-cased when the configuration is read.
    pub forward_headers: Vec<String>,
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
            forward_headers: ["authorization", "traceparent", "tracestate", "x-request-id"]
                .map(String::from)
                .to_vec(),
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
        for (i, name) in self.forward_headers.iter().enumerate() {
            crate::common::HeaderName::parse(&format!("pd.forward_headers[{i}]"), name)?;
        }
        Ok(())
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
    /// The best prefill pod where the split lost on cost: what a probe would split to.
    pub probe: Option<Choice>,
    /// Prompt tokens the decode pod does not hold.
    pub uncached_tokens: f64,
    /// The two costs compared (ms): decode-pod TTFT + stall of its streams, and the prefill pod's
    /// predicted TTFT (absent without a prefill pod).
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

/// Whether and where to prefill a request whose decode pod is `decode` (see the module header),
/// given the prefill pods' ranking (`Router::route` over the prefill role with
/// [`prefill_hints`]) and the decode pod's learned cost per uncached token. Pure: both rankings
/// come in, the plan goes out. `keep_predictions` keeps every prefill candidate's prediction
/// for the debug line.
pub fn plan_split(
    decode: &Choice,
    decode_us_per_token: f64,
    prefill_ranking: Decision,
    keep_predictions: bool,
) -> PdPlan {
    let local = &decode.prediction;
    let prefill_ms = decode_us_per_token * local.uncached_tokens / 1e3;
    let local_cost = local_cost_ms(local.ttft_ms, prefill_ms, local.decoding);
    let mut prefill_predictions = Vec::new();
    let prefill = match prefill_ranking {
        Decision::Route { ranked, .. } => {
            if keep_predictions {
                prefill_predictions = ranked
                    .iter()
                    .map(|c| (c.addr.clone(), c.prediction))
                    .collect();
            }
            ranked.into_iter().next()
        }
        Decision::NoEndpoint(_) => None,
    };
    let split_cost = prefill.as_ref().map(|p| p.prediction.ttft_ms);
    let (prefill, outcome, probe) = match (prefill, split_cost) {
        (Some(p), Some(c)) if c < local_cost => (Some(p), PdOutcome::Disaggregated, None),
        (Some(p), _) => (None, PdOutcome::LocalCheaper, Some(p)),
        (None, _) => (None, PdOutcome::NoPrefillPod, None),
    };
    PdPlan {
        prefill,
        outcome,
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
}
