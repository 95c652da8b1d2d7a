//! P/D's prefill leg: its first-byte bound, the inline prefill call's outcomes (step 3 in the
//! module map in `super`), and what either mode's leg tells passive health about the prefill pod.
//!
//! The prefill leg is held to the decode leg's rules (`crate::health`): bounded by the same
//! first-byte timeout (inline: the call's timeout; sidecar: `x-prefiller-timeout-ms`, and the
//! decode attempt's per-try timeout stretched by it), judged served or failed, and a leg that
//! failed or outran its bound teaches the prefill role nothing.

use super::*;
use crate::pd::{prefill_bound_ms, PdReason};

/// What one split request holds of its prefill leg between the host's callbacks.
#[derive(Debug, Default)]
pub(super) struct SplitLeg {
    /// Inline P/D: the client's body (as sent on, without what kvroute owns), waiting for the
    /// prefill pod's answer, and that pod.
    pub(super) original: Option<Vec<u8>>,
    pub(super) pod: Option<String>,
    /// Inline P/D: the client's headers the prefill call carries (`pd.forward_headers`).
    pub(super) forwarded: Vec<(String, String)>,
    /// Sidecar P/D: the request was sent to its decode pod with a prefiller, whose part is over
    /// when the decode pod's response headers come (see [`RequestFlow::on_response_headers`]).
    pub(super) sidecar: bool,
    /// The leg's first-byte bound (`crate::pd::prefill_bound_ms`), and when the split was routed
    /// (µs).
    pub(super) bound_ms: Option<u64>,
    pub(super) routed_us: u64,
    /// The plan splits although the split was predicted to lose (`pd.probe_interval_ms`).
    pub(super) probing: bool,
    /// Why the plan split it (the P/D counters' `reason`).
    pub(super) reason: Option<PdReason>,
}

impl RequestFlow {
    /// A split was routed (`outcome`, to `prefill`): bound its prefill leg and note the split.
    pub(super) fn bound_prefill_leg(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        outcome: BodyOutcome,
        prefill: String,
    ) -> BodyOutcome {
        let BodyOutcome::Route(mut route) = outcome else {
            return outcome;
        };
        let predicted = self.awaiting.as_ref().map_or(0.0, |a| a.first.predicted_ms);
        let bound = prefill_bound_ms(&vm.config.health, &vm.config.pd, predicted);
        self.split.bound_ms = Some(bound);
        self.split.routed_us = host.now_us();
        vm.split_clock.split_at(host.now_ms());
        if std::mem::take(&mut self.split.probing) {
            host.count(Counter::PdProbes, 1);
        }
        if let Some(call) = route.prefill_call.as_mut() {
            call.timeout_ms = bound;
        } else if route.prefiller.is_some() {
            self.split.pod = Some(prefill);
            // The decode pod's response starts only after its sidecar's prefill: the attempt's
            // first byte may take the prefill's bound and then the decode's own.
            route.first_byte_timeout_ms = route
                .first_byte_timeout_ms
                .map(|ms| ms.saturating_add(bound));
        }
        BodyOutcome::Route(route)
    }

    /// Whether the prefill leg ran past its bound, as of now (by the share a poll is judged
    /// timed out at: the leg's clock starts a little after this one).
    fn prefill_leg_late(&self, host: &dyn Host) -> bool {
        let elapsed_ms = host.now_us().saturating_sub(self.split.routed_us) / 1000;
        self.split
            .bound_ms
            .is_some_and(|bound| crate::health::poll_timed_out(elapsed_ms, bound))
    }

    /// Sidecar mode: the decode pod's response headers came, or the request ended without them
    /// (`failed`: and failed, by `crate::health::judge`). kvroute never sees the sidecar's prefill
    /// call: a leg
    /// past its bound means the sidecar gave up on the prefiller (or Envoy's per-try timeout
    /// did), which is the prefill pod's failure and no sample of its speed; one within it that
    /// the decode pod answered with a 2xx is the pod's success (a prefiller failing fast is hidden
    /// by the sidecar's own fallback: see the reliability notes).
    pub(super) fn judge_sidecar_leg(&mut self, vm: &mut Vm, host: &mut dyn Host, failed: bool) {
        let Some(pod) = self.split.pod.take() else {
            return;
        };
        let verdict = if self.prefill_leg_late(host) || failed {
            host.count(Counter::PdPrefillTimeouts, 1);
            if let Some(a) = self.awaiting.as_mut() {
                a.learnable = false;
            }
            Verdict::Failed
        } else if self.response_ok {
            Verdict::Served
        } else {
            return;
        };
        vm.record_verdicts(vec![(pod, verdict)]);
    }

    /// The host could not send the inline prefill call: decode without it.
    pub fn on_prefill_not_sent(&mut self, host: &mut dyn Host) {
        log::warn!("kvroute: inline prefill not sent; decoding without it");
        self.split.original = None;
        if let Some(a) = self.awaiting.as_mut() {
            a.learnable = false;
        }
        host.count(Counter::PdPrefillFailures, 1);
        host.count_in(
            Counter::PdDecodeOnly,
            &self.labels.with_pd_reason(PdReason::PrefillFailed),
            1,
        );
        host.export_decision_field(explain::PD, PdExport::DecodeOnlyFallback.as_str());
    }

    /// The prefill pod answered (status 503/504 from the host: it failed or timed out).
    pub fn on_prefill_answer(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        status: u32,
        body: &[u8],
    ) -> PrefillOutcome {
        self.prefill_pod_done(vm, host);
        let Some(original) = self.split.original.take() else {
            return PrefillOutcome::Resume(None);
        };
        if let Some(pod) = self.split.pod.clone() {
            if let Some(verdict) = inline::leg_verdict(status, body) {
                vm.record_verdicts(vec![(pod, verdict)]);
            }
            if status != 200 && self.prefill_leg_late(host) {
                host.count(Counter::PdPrefillTimeouts, 1);
            }
        }
        match inline::answer(status, body, &original) {
            Answer::Decode(body) => {
                let reason = self.split.reason.unwrap_or(PdReason::Sooner);
                host.count_in(
                    Counter::PdDisaggregated,
                    &self.labels.with_pd_reason(reason),
                    1,
                );
                PrefillOutcome::Resume(Some(body))
            }
            Answer::Refused { status, body } => {
                // The request itself is at fault: the client gets the prefill pod's own answer,
                // and neither pod computes its prompt.
                host.count(Counter::PdPrefillRejected, 1);
                host.export_decision_field(explain::PD, PdExport::PrefillRefused.as_str());
                self.affinity.withdraw(vm, host, None);
                PrefillOutcome::Reply(Reply {
                    status,
                    headers: vec![("content-type", "application/json".to_string())],
                    body,
                })
            }
            answer @ (Answer::Unauthorized | Answer::Fallback) => {
                // The decode pod prefills by itself, so its first byte says nothing of the split;
                // the prefill pod holds nothing of it. A 401/403 is the prefill pod refusing
                // kvroute's call (the client's key was not forwarded, or the pool wants another):
                // counted as the pod's refusal; the decode pod judges the client's own key.
                if answer == Answer::Unauthorized {
                    log::warn!("kvroute: prefill pod refused the inline prefill call with {status} (pd.forward_headers, the pool's API key); decoding without it");
                    host.count(Counter::PdPrefillUnauthorized, 1);
                } else {
                    log::debug!("kvroute: inline prefill answered {status}; decoding without it");
                }
                let prefill_pod = self.split.pod.take();
                self.affinity.withdraw(vm, host, prefill_pod.as_deref());
                if let Some(a) = self.awaiting.as_mut() {
                    a.learnable = false;
                }
                host.count(Counter::PdPrefillFailures, 1);
                host.count_in(
                    Counter::PdDecodeOnly,
                    &self.labels.with_pd_reason(PdReason::PrefillFailed),
                    1,
                );
                host.export_decision_field(explain::PD, PdExport::DecodeOnlyFallback.as_str());
                PrefillOutcome::Resume(None)
            }
        }
    }

    /// The body the host could not rewrite after a good prefill: counted as a fallback.
    pub fn on_body_not_rewritten(&mut self, host: &mut dyn Host) {
        host.count(Counter::PdPrefillFailures, 1);
        host.count_in(
            Counter::PdDecodeOnly,
            &self.labels.with_pd_reason(PdReason::PrefillFailed),
            1,
        );
        host.export_decision_field(explain::PD, PdExport::DecodeOnlyFallback.as_str());
    }
}
