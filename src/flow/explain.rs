//! What a routing decision tells the outside: the decision fields exported to the proxy for every
//! routed request (Envoy filter state, read by access logs and tracing tags), and the
//! `x-kvroute-debug` line, why this pod in `key=value; …` form (opt-in, `debug_header`).

use crate::pd::{PdOutcome, PdPlan};
use crate::port::Host;
use crate::router::Blocks;
use crate::scheduler::{Choice, RouteReason};
use crate::vm::Vm;

/// The exported fields' names (Envoy: `%FILTER_STATE(wasm.<name>:PLAIN)%`).
pub const POD: &str = "kvroute_pod";
pub const REASON: &str = "kvroute_reason";
pub const PREDICTED_TTFT_MS: &str = "kvroute_predicted_ttft_ms";
pub const EXPECTED_CACHED_TOKENS: &str = "kvroute_expected_cached_tokens";
pub const PD: &str = "kvroute_pd";
pub const PREFILL_POD: &str = "kvroute_prefill_pod";

/// The prefill/decode outcome as exported (`kvroute_pd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdExport {
    /// No decode pool: nothing to split.
    None,
    /// Split, the prefill made by kvroute's own call before the decode pod gets the request.
    SplitInline,
    /// Split, the prefill made by the decode pod's routing sidecar (`x-prefiller-host-port`).
    SplitSidecar,
    /// Decided at routing: the decode pod prefills (cheaper there, no prefill pod, or a request
    /// shape that cannot be split).
    DecodeOnly,
    /// An inline split that failed (not sent, refused with 401/403, an error, a timeout, a body
    /// that could not be rewritten): the decode pod prefilled after all.
    DecodeOnlyFallback,
    /// The prefill pod refused the request itself (4xx): the client got that answer.
    PrefillRefused,
}

impl PdExport {
    pub fn as_str(self) -> &'static str {
        match self {
            PdExport::None => "none",
            PdExport::SplitInline => "split_inline",
            PdExport::SplitSidecar => "split_sidecar",
            PdExport::DecodeOnly => "decode_only",
            PdExport::DecodeOnlyFallback => "decode_only_fallback",
            PdExport::PrefillRefused => "prefill_refused",
        }
    }
}

/// The reason as exported and as the `reason` label of `kvroute_requests_routed_total`.
pub fn reason_name(reason: RouteReason) -> &'static str {
    match reason {
        RouteReason::PrefixHit => "prefix_hit",
        RouteReason::Load => "load",
        RouteReason::Session => "session",
        RouteReason::StoredResponse => "stored_response",
    }
}

/// One routed request's decision as the proxy's logs see it. The prediction and the cached
/// tokens are those of the pod that prefills: the prefill pod of a split, the chosen pod otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionFields {
    pub pod: String,
    pub reason: RouteReason,
    pub predicted_ttft_ms: f64,
    /// The prefilling pod's matched blocks × tokens per block, at most the prompt's tokens.
    pub expected_cached_tokens: u64,
    pub pd: PdExport,
    pub prefill_pod: Option<String>,
}

impl DecisionFields {
    /// `primary` is the chosen (decode) pod; `prefill` the prefill pod of a split.
    pub fn of(
        primary: &Choice,
        prefill: Option<&Choice>,
        reason: RouteReason,
        blocks: &Blocks,
        tokens_per_block: u32,
        pd: PdExport,
    ) -> DecisionFields {
        let prefilling = prefill.unwrap_or(primary);
        let matched_tokens =
            (prefilling.matched_blocks as u64).saturating_mul(u64::from(tokens_per_block));
        DecisionFields {
            pod: primary.addr.clone(),
            reason,
            predicted_ttft_ms: prefilling.prediction.ttft_ms,
            expected_cached_tokens: matched_tokens.min(blocks.prompt_tokens),
            pd,
            prefill_pod: prefill.map(|c| c.addr.clone()),
        }
    }

    /// Hands every field to the proxy (the prefill pod only for a split).
    pub fn export(&self, host: &mut dyn Host) {
        host.export_decision_field(POD, &self.pod);
        host.export_decision_field(REASON, reason_name(self.reason));
        host.export_decision_field(
            PREDICTED_TTFT_MS,
            &format!("{:.1}", self.predicted_ttft_ms.max(0.0)),
        );
        host.export_decision_field(
            EXPECTED_CACHED_TOKENS,
            &self.expected_cached_tokens.to_string(),
        );
        host.export_decision_field(PD, self.pd.as_str());
        if let Some(prefill) = &self.prefill_pod {
            host.export_decision_field(PREFILL_POD, prefill);
        }
    }
}

/// Every ranked pod's prediction, in rank order (why the primary won), and the pods the overload
/// guard ranked behind the others whatever their prediction.
fn write_ranking(line: &mut String, ranked: &[Choice]) {
    use std::fmt::Write as _;
    let predictions: Vec<String> = ranked
        .iter()
        .map(|c| format!("{}/{:.1}", c.addr, c.prediction.ttft_ms))
        .collect();
    let _ = write!(line, "; predictions={}", predictions.join(","));
    let guarded: Vec<&str> = ranked
        .iter()
        .filter(|c| c.guarded)
        .map(|c| c.addr.as_str())
        .collect();
    if !guarded.is_empty() {
        let _ = write!(line, "; guarded_pods={}", guarded.join(","));
    }
}

/// The chosen pod's learned model (its role's fit times its speed) and the role's median
/// calibration: what a prediction that looks wrong was computed from.
fn write_model(line: &mut String, vm: &Vm, addr: &str) {
    use std::fmt::Write as _;
    let costs = &vm.router.costs;
    let model = costs.cost_of(&vm.config.costs(), addr);
    let scale = costs
        .role_of(addr)
        .map_or(1.0, |role| costs.ttft_scale_of(role).factor());
    let _ = write!(
        line,
        "; model_overhead_ms={:.1}; model_us_per_token={:.1}; model_us_per_decoding={:.1}; ttft_scale={:.2}",
        model.overhead_ms, model.us_per_token, model.us_per_decoding, scale
    );
}

/// The chosen pod's loads beside its prefill, where some candidate has one: an adapter it lacks
/// (and the reload of the one it evicts), prompt blocks in a KV tier beyond the GPU.
fn write_loads(line: &mut String, ranked: &[Choice]) {
    use std::fmt::Write as _;
    let Some(p) = ranked.first().map(|c| &c.prediction) else {
        return;
    };
    if ranked.iter().any(|c| c.prediction.adapter_load_ms > 0.0) {
        let _ = write!(
            line,
            "; adapter_load_ms={:.1}; adapter_reload_ms={:.1}",
            p.adapter_load_ms, p.adapter_reload_ms
        );
    }
    if ranked.iter().any(|c| c.prediction.warm_load_ms > 0.0) {
        let _ = write!(line, "; warm_load_ms={:.1}", p.warm_load_ms);
    }
    if ranked.iter().any(|c| c.prediction.seat_wait_ms > 0.0) {
        let _ = write!(line, "; seat_wait_ms={:.1}", p.seat_wait_ms);
    }
}

pub fn debug_line(
    vm: &Vm,
    blocks: &Blocks,
    ranked: &[Choice],
    reason: RouteReason,
    pd: Option<&PdPlan>,
) -> String {
    use std::fmt::Write as _;
    let Some(primary) = ranked.first() else {
        return String::new();
    };
    let fallbacks: Vec<&str> = ranked.iter().skip(1).map(|c| c.addr.as_str()).collect();
    let p = &primary.prediction;
    let mut line = format!(
        "pod={}; reason={}; matched_blocks={}/{}; former_blocks={}; predicted_ttft_ms={:.1}; uncached_tokens={:.0}; tokens_ahead={:.0}; decoding={:.0}; guarded={}; stale={}; fallbacks={}; vm={:x}; page={}; pods={}; entries={}; longest={}",
        primary.addr,
        match reason {
            RouteReason::PrefixHit => "prefix",
            RouteReason::Load => "load",
            RouteReason::Session => "session",
            RouteReason::StoredResponse => "stored_response",
        },
        primary.matched_blocks,
        blocks.hashes.len(),
        primary.former_blocks,
        p.ttft_ms,
        p.uncached_tokens,
        p.tokens_ahead,
        p.decoding,
        primary.guarded,
        primary.stale,
        fallbacks.join(","),
        vm.id(),
        vm.router.affinity.applied_page,
        vm.router.load_table().pods.len(),
        vm.router.affinity.index_entries(),
        vm.router
            .affinity.longest_holder(&blocks.hashes)
            .map(|(a, n)| format!("{a}/{n}"))
            .unwrap_or_default(),
    );
    write_ranking(&mut line, ranked);
    write_model(&mut line, vm, &primary.addr);
    write_loads(&mut line, ranked);
    if let Some(slo) = primary.meets_slo {
        let _ = write!(line, "; meets_slo={slo}");
    }
    if let Some(pd) = pd {
        let outcome = match pd.outcome {
            PdOutcome::Disaggregated => "disaggregated",
            PdOutcome::LocalCheaper => "decode_only",
            PdOutcome::NoPrefillPod => "decode_only_no_prefill_pod",
        };
        let _ = write!(
            line,
            "; pd={outcome}; pd_reason={}; itl_objective_ms={}; prefill={}; pd_uncached_tokens={:.0}; local_cost_ms={:.1}; split_cost_ms={}",
            pd.reason.as_str(),
            pd.streams.objective_ms.map(|t| format!("{t:.1}")).unwrap_or_default(),
            pd.prefill.as_ref().map_or("", |c| c.addr.as_str()),
            pd.uncached_tokens,
            pd.local_cost_ms,
            pd.split_cost_ms.map(|c| format!("{c:.1}")).unwrap_or_default(),
        );
        if let Some(prefill) = &pd.prefill {
            let _ = write!(
                line,
                "; prefill_predicted_ttft_ms={:.1}",
                prefill.prediction.ttft_ms
            );
        }
        if !pd.prefill_predictions.is_empty() {
            // With the work each was predicted to finish first: a ranking that looks wrong is
            // usually a queue estimate that was.
            let (each, ahead): (Vec<String>, Vec<String>) = pd
                .prefill_predictions
                .iter()
                .map(|(addr, p)| {
                    (
                        format!("{addr}/{:.1}", p.ttft_ms),
                        format!("{addr}/{:.0}", p.tokens_ahead),
                    )
                })
                .unzip();
            let _ = write!(line, "; prefill_predictions={}", each.join(","));
            let _ = write!(line, "; prefill_tokens_ahead={}", ahead.join(","));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::predict::Prediction;

    fn choice(addr: &str, matched_blocks: usize, ttft_ms: f64) -> Choice {
        Choice {
            addr: addr.to_string(),
            matched_blocks,
            former_blocks: 0,
            prediction: Prediction {
                ttft_ms,
                ..Prediction::default()
            },
            guarded: false,
            meets_slo: None,
            stale: false,
        }
    }

    fn prompt_of(blocks: usize, prompt_tokens: u64) -> Blocks {
        Blocks {
            hashes: (0..blocks as u64).collect(),
            affinity_key: 0,
            prompt_tokens,
        }
    }

    #[test]
    fn expected_cached_tokens_are_matched_blocks_times_their_tokens_capped_at_the_prompt() {
        let blocks = prompt_of(10, 150);
        let of = |matched| {
            DecisionFields::of(
                &choice("10.0.0.1:8000", matched, 50.0),
                None,
                RouteReason::PrefixHit,
                &blocks,
                16,
                PdExport::None,
            )
            .expected_cached_tokens
        };
        assert_eq!(of(0), 0);
        assert_eq!(of(3), 48);
        assert_eq!(of(9), 144);
        // The last block is partial: 10 × 16 = 160 exceeds the prompt's 150 tokens.
        assert_eq!(of(10), 150);
    }

    #[test]
    fn a_split_reports_the_prefill_pods_cache_and_prediction_and_every_field_is_exported() {
        let decode = choice("10.0.0.2:8000", 1, 900.0);
        let prefill = choice("10.0.0.9:8000", 4, 120.5);
        let fields = DecisionFields::of(
            &decode,
            Some(&prefill),
            RouteReason::Load,
            &prompt_of(8, 128),
            16,
            PdExport::SplitInline,
        );
        let store = std::rc::Rc::new(std::cell::RefCell::new(Default::default()));
        let mut host = crate::testing::FakeHost::new(&store);
        fields.export(&mut host);
        let exported = |name| host.decision_field(name).map(str::to_string);
        assert_eq!(
            exported(POD).as_deref(),
            Some("10.0.0.2:8000"),
            "the chosen pod"
        );
        assert_eq!(exported(PREFILL_POD).as_deref(), Some("10.0.0.9:8000"));
        assert_eq!(exported(REASON).as_deref(), Some("load"));
        assert_eq!(exported(PREDICTED_TTFT_MS).as_deref(), Some("120.5"));
        assert_eq!(exported(EXPECTED_CACHED_TOKENS).as_deref(), Some("64"));
        assert_eq!(exported(PD).as_deref(), Some("split_inline"));
    }

    #[test]
    fn the_ranking_names_each_pods_prediction_and_only_the_guarded_pods() {
        let mut ranked = vec![
            choice("10.0.0.1:8000", 0, 300.0),
            choice("10.0.0.2:8000", 9, 100.0),
        ];
        let mut line = String::new();
        write_ranking(&mut line, &ranked);
        assert_eq!(
            line,
            "; predictions=10.0.0.1:8000/300.0,10.0.0.2:8000/100.0"
        );
        ranked[1].guarded = true;
        let mut line = String::new();
        write_ranking(&mut line, &ranked);
        assert!(line.ends_with("; guarded_pods=10.0.0.2:8000"), "{line}");
    }
}
