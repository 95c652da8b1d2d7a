//! The response: upstream, headers, body chunks and the end (steps 4 and 5 in the module map
//! in `super`).

use super::*;

impl RequestFlow {
    /// The host Envoy sent the request to, as its response headers arrive. Another than the
    /// primary means the primary refused or failed it and a retry took it to a fallback: what the
    /// request taught the index moves to the host that answered, and neither its `usage` nor its
    /// first byte says anything about the primary.
    pub fn on_upstream(&mut self, vm: &mut Vm, host: &mut dyn Host, upstream: &str) {
        let Some(primary) = self.routed_to.clone() else {
            return;
        };
        self.upstream = Some(upstream.to_string());
        if !self.affinity.on_upstream(vm, host, &primary, upstream) {
            return;
        }
        log::debug!("kvroute: {primary} did not serve the request; {upstream} did");
        if let Some(a) = self.awaiting.as_mut() {
            a.learnable = false;
        }
    }

    /// Response headers: returns the debug header to add, if any.
    pub fn on_response_headers(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        status: Option<&str>,
        end_of_stream: bool,
    ) -> Option<(&'static str, String)> {
        if self.routed_to.is_some() {
            self.status = status.and_then(|s| s.parse().ok());
            self.response_ok = status.is_some_and(|s| s.starts_with('2'));
            self.affinity
                .on_response_headers(vm, host, self.response_ok);
            self.response_complete = end_of_stream;
            if std::mem::take(&mut self.split.sidecar) {
                self.prefill_pod_done(vm, host);
                self.judge_sidecar_leg(vm, host, false);
            }
            if (end_of_stream || !self.response_ok) && self.first_byte(vm, host) {
                let now = host.now_ms();
                vm.write_inflight_row(host, now);
            }
        }
        self.debug.take().map(|d| (DEBUG, d))
    }

    /// A split request's prefill pod finished its part: the prefill leaves the board now, while the
    /// sample still waits for the client's first byte (the split path's whole time is learned).
    ///
    /// Inline, that is the prefill call's answer. In sidecar mode kvroute never sees the prefill
    /// call; the decode pod's response headers are the first sign: the sidecar sends the decode
    /// request only once the prefiller answered (llm-d's routing sidecar; kvsim does the same), and
    /// the KV pull and the first decode step follow. Waiting for the first byte instead kept a
    /// finished prompt on the prefill pod's queue for the length of its transfer, and the prompts
    /// behind it counted as started that much later: the pod looked busier than it was.
    pub(super) fn prefill_pod_done(&mut self, vm: &mut Vm, host: &mut dyn Host) {
        if let Some(id) = self.awaiting.as_mut().and_then(|a| a.pending.take()) {
            let now = host.now_ms();
            if vm.router.work.prefill_done(id, now) {
                vm.write_inflight_row(host, now);
            }
        }
    }

    /// Whether the next response chunk's bytes are wanted (to read `usage`); the host copies a
    /// chunk out only then.
    pub fn wants_response_bytes(&self) -> bool {
        (self.affinity.wants_response_bytes() || self.stored_answer.is_some()) && self.response_ok
    }

    /// A response chunk of `size` bytes (`bytes` when [`Self::wants_response_bytes`] asked).
    pub fn on_response_body(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        size: usize,
        bytes: Option<&[u8]>,
        end_of_stream: bool,
    ) {
        // A whole answer (not streamed) reaches the client only with its end, and its first byte
        // came after the decode anyway: its prefill's end and the request's end go to the work
        // board in one write there, before the client can send its next request. A stream's
        // first byte is its first token: the board hears of it at once.
        let mut board_changed = false;
        if self.awaiting.is_some() && (self.streamed && size > 0 || end_of_stream) {
            board_changed |= self.first_byte(vm, host);
        }
        if end_of_stream {
            board_changed |= self.end_inflight(vm);
        }
        if board_changed {
            let now = host.now_ms();
            vm.write_inflight_row(host, now);
        }
        self.response_complete |= end_of_stream;
        if let Some(bytes) = bytes {
            self.note_stored_answer(host, bytes);
            self.affinity
                .on_response_body(vm, host, bytes, &self.labels);
        }
        if self.streamed && size > 0 {
            self.itl.on_chunk(host.now_us());
        }
    }

    /// Whether [`Self::on_done`] wants to know how the request ended upstream (it was routed).
    pub fn wants_end(&self) -> bool {
        self.routed_to.is_some()
    }

    /// Whether [`Self::on_done`] needs the proxy's account of how the stream ended
    /// (`response.code_details`): only where the response did not arrive whole. A whole response
    /// was neither cut by the pod nor abandoned before the pod finished it, so its status says
    /// everything (`crate::health::judge`), and the property read (a host call that copies a
    /// string into the VM) is saved on nearly every request.
    pub fn wants_end_details(&self) -> bool {
        self.wants_end() && !self.response_complete
    }

    /// Whether the host that answered is already known (from the response headers): then the
    /// host need not read it again at the end.
    pub fn knows_upstream(&self) -> bool {
        self.upstream.is_some()
    }

    /// The request is over (done, reset, timed out or answered locally). `upstream` and `details`
    /// are the proxy's account of the last upstream attempt, when [`Self::wants_end`] asked
    /// (`upstream` only where [`Self::knows_upstream`] did not).
    pub fn on_done(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        upstream: Option<String>,
        details: Option<String>,
    ) {
        self.abandon_queue(vm, host);
        // Reset, timeout or a local reply before any response byte: the prefill stops counting,
        // and teaches nothing.
        let completed = self.response_ok;
        self.response_ok = false;
        let mut board_changed = self.first_byte(vm, host);
        board_changed |= self.end_inflight(vm);
        let Some(addr) = self.routed_to.take() else {
            if board_changed {
                let now = host.now_ms();
                vm.write_inflight_row(host, now);
            }
            return;
        };
        let end = RequestEnd {
            status: self.status,
            upstream: self.upstream.take().or(upstream),
            details,
        };
        let verdicts = crate::health::judge(&addr, &end);
        let failed = verdicts
            .iter()
            .filter(|(_, v)| *v == Verdict::Failed)
            .count();
        if failed > 0 {
            log::debug!("kvroute: a request failed on {addr}: {end:?}");
            host.count_in(
                Counter::RequestFailures,
                &self.labels.pairs(),
                failed as u64,
            );
        }
        if std::mem::take(&mut self.split.sidecar) && !verdicts.is_empty() {
            // No response headers: the sidecar's prefill never ended within the attempts.
            self.judge_sidecar_leg(vm, host, failed > 0);
        }
        vm.record_verdicts(verdicts);
        if let Some(itl_ms) = self.itl.itl_ms().filter(|_| completed) {
            vm.router.costs.observe_itl(&addr, itl_ms);
        }
        if let Some(span_ms) = self.itl.span_ms().filter(|_| completed) {
            vm.router.costs.observe_decode(&addr, span_ms);
        }
        if board_changed {
            let now = host.now_ms();
            vm.write_inflight_row(host, now);
        }
    }

    /// The routed request no longer counts as in flight on its pod (once, at the response's end
    /// of stream or at the end of the request): whether the work board changed.
    fn end_inflight(&mut self, vm: &mut Vm) -> bool {
        if self.inflight_ended {
            return false;
        }
        let Some(addr) = self.routed_to.as_deref() else {
            return false;
        };
        vm.router.work.inflight_end(addr);
        self.inflight_ended = true;
        true
    }

    /// The first response byte (or the end of a response without one): the prefill is done; a
    /// streamed 2xx teaches the pod's cost model.
    ///
    /// Whether the work board changed (the prefill stopped counting): the caller writes the
    /// board before it returns to the host. Leaving a whole response's prefill end for `on_done`
    /// was tried and undone: Envoy runs `on_log` after the client may already have the response,
    /// so a client's next request, taken by another worker, still saw the finished prefill queued
    /// on its pod and was sent elsewhere (`envoy_routing::tiktoken_mode_routes_like_chars_mode`
    /// failed in CI that way). The response's end of stream comes before the client has it.
    #[must_use]
    pub(super) fn first_byte(&mut self, vm: &mut Vm, host: &mut dyn Host) -> bool {
        let Some(awaiting) = self.awaiting.take() else {
            return false;
        };
        let now = host.now_ms();
        let changed = awaiting
            .pending
            .is_some_and(|id| vm.router.work.prefill_done(id, now));
        if awaiting.learnable && self.response_ok {
            let observed_ms = host.now_us().saturating_sub(awaiting.routed_at_us) as f64 / 1e3;
            if vm.router.affinity.restarts_of(&awaiting.first.addr) == awaiting.restarts {
                vm.learn(&awaiting.first, observed_ms);
            }
            let labels = self.labels.pairs();
            host.histogram_in(Histogram::TtftMs, &labels, observed_ms as u64);
            host.histogram_in(
                Histogram::TtftPredictedMs,
                &labels,
                awaiting.first.predicted_ms.max(0.0) as u64,
            );
            // The objective is the client's: from its request's arrival, a hold included.
            let since_arrival_ms = host.now_us().saturating_sub(self.arrived_us) as f64 / 1e3;
            if self
                .hints
                .slo
                .ttft_ms
                .is_some_and(|slo| since_arrival_ms > slo)
            {
                host.count(Counter::SloTtftMissed, 1);
            }
            if observed_ms > 0.0 {
                let error = (awaiting.first.predicted_ms - observed_ms).abs() / observed_ms;
                host.histogram(Histogram::TtftPredictionErrorPct, (error * 100.0) as u64);
            }
        }
        changed
    }

    /// A stored Responses answer: reads its id from its opening bytes and notes the pod that
    /// answered as the one storing it.
    pub(super) fn note_stored_answer(&mut self, host: &mut dyn Host, chunk: &[u8]) {
        use crate::stored_responses::{first_id, record, ID_SCAN_BYTES};
        let Some(opening) = self.stored_answer.as_mut() else {
            return;
        };
        let room = ID_SCAN_BYTES.saturating_sub(opening.len());
        opening.extend_from_slice(chunk.get(..chunk.len().min(room)).unwrap_or_default());
        let full = opening.len() >= ID_SCAN_BYTES;
        let Some(id) = first_id(opening) else {
            if full {
                self.stored_answer = None;
            }
            return;
        };
        let pod = self.upstream.as_deref().or(self.routed_to.as_deref());
        if let Some(pod) = pod {
            record(host, id, pod);
        }
        self.stored_answer = None;
    }
}
