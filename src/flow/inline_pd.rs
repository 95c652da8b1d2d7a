//! Inline P/D: the prefill call's outcomes (step 3 in the module map in `super`).

use super::*;

impl RequestFlow {
    /// The host could not send the inline prefill call: decode without it.
    pub fn on_prefill_not_sent(&mut self, host: &mut dyn Host) {
        log::warn!("kvroute: inline prefill not sent; decoding without it");
        self.prefill_original = None;
        if let Some(a) = self.awaiting.as_mut() {
            a.learnable = false;
        }
        host.count(Counter::PdPrefillFailures, 1);
        host.count_in(Counter::PdDecodeOnly, &self.labels.pairs(), 1);
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
        let Some(original) = self.prefill_original.take() else {
            return PrefillOutcome::Resume(None);
        };
        match inline::answer(status, body, &original) {
            Answer::Decode(body) => {
                host.count_in(Counter::PdDisaggregated, &self.labels.pairs(), 1);
                PrefillOutcome::Resume(Some(body))
            }
            Answer::Refused { status, body } => {
                // The request itself is at fault: the client gets the prefill pod's own answer,
                // and neither pod computes its prompt.
                host.count(Counter::PdPrefillRejected, 1);
                host.export_decision_field(explain::PD, PdExport::PrefillRefused.as_str());
                self.provisional.withdraw(vm, host, None);
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
                let prefill_pod = self.prefill_pod.take();
                self.provisional.withdraw(vm, host, prefill_pod.as_deref());
                if let Some(a) = self.awaiting.as_mut() {
                    a.learnable = false;
                }
                host.count(Counter::PdPrefillFailures, 1);
                host.count_in(Counter::PdDecodeOnly, &self.labels.pairs(), 1);
                host.export_decision_field(explain::PD, PdExport::DecodeOnlyFallback.as_str());
                PrefillOutcome::Resume(None)
            }
        }
    }

    /// The body the host could not rewrite after a good prefill: counted as a fallback.
    pub fn on_body_not_rewritten(&mut self, host: &mut dyn Host) {
        host.count(Counter::PdPrefillFailures, 1);
        host.count_in(Counter::PdDecodeOnly, &self.labels.pairs(), 1);
        host.export_decision_field(explain::PD, PdExport::DecodeOnlyFallback.as_str());
    }
}
