//! The `x-kvroute-debug` line: why this pod, in `key=value; …` form (opt-in, `debug_header`).

use crate::pd::{PdOutcome, PdPlan};
use crate::router::Blocks;
use crate::scheduler::{Choice, RouteReason};
use crate::vm::Vm;

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
        "pod={}; reason={}; matched_blocks={}/{}; predicted_ttft_ms={:.1}; uncached_tokens={:.0}; tokens_ahead={:.0}; decoding={:.0}; guarded={}; stale={}; fallbacks={}; vm={:x}; page={}; pods={}; entries={}; longest={}",
        primary.addr,
        match reason {
            RouteReason::PrefixHit => "prefix",
            RouteReason::Load => "load",
            RouteReason::Session => "session",
            RouteReason::StoredResponse => "stored_response",
        },
        primary.matched_blocks,
        blocks.hashes.len(),
        p.ttft_ms,
        p.uncached_tokens,
        p.tokens_ahead,
        p.decoding,
        primary.guarded,
        primary.stale,
        fallbacks.join(","),
        vm.id(),
        vm.router.applied_page,
        vm.router.load_table().pods.len(),
        vm.router.index_entries(),
        vm.router
            .longest_holder(&blocks.hashes)
            .map(|(a, n)| format!("{a}/{n}"))
            .unwrap_or_default(),
    );
    // Every ranked pod's prediction, in rank order: why the primary won.
    let predictions: Vec<String> = ranked
        .iter()
        .map(|c| format!("{}/{:.1}", c.addr, c.prediction.ttft_ms))
        .collect();
    let _ = write!(line, "; predictions={}", predictions.join(","));
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
            "; pd={outcome}; prefill={}; pd_uncached_tokens={:.0}; local_cost_ms={:.1}; split_cost_ms={}",
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
