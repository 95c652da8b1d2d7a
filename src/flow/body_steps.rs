//! The steps of [`RequestFlow::on_request_body`], in the order it runs them:
//!
//! 1. [`RequestFlow::read_body`]: parse the body into the rendering the engines cache (the
//!    client's KV handle removed); a body kvroute cannot read is passed through or refused.
//! 2. (the caller catches up on shared state: pages of the prefix index, the in-flight board)
//! 3. [`RequestFlow::plan_request`]: the blocks, the stored-response pin, the router's plan —
//!    pure but for one re-read of the load table when nothing could serve the request.
//! 4. [`RequestFlow::count_routed`] and [`RequestFlow::commit`]: every concern that keeps state
//!    about a decision learns it (work in flight, the first-token watch, the cache check, the
//!    index's observation, the decision's filter state and debug line).
//! 5. [`RequestFlow::start_split`]: a P/D split, sidecar or inline.

use super::affinity::RouteShape;
use super::explain::{self, DecisionFields, PdExport};
use super::{
    Awaiting, BodyOutcome, ErrorCode, Reply, RequestFlow, Route, RouteLabels, OWNED_BODY_FIELD,
};
use crate::metrics::{self, Counter};
use crate::pd::inline;
use crate::pd::{PdMode, PdPlan, PdReason};
use crate::port::Host;
use crate::protocol::body;
use crate::protocol::parse::{self, Endpoint, ParseError, RequestView};
use crate::router::{Blocks, FirstToken, Plan};
use crate::scheduler::{Choice, Decision, Rejection, RouteReason};
use crate::state::messages::Observation;
use crate::vm::Vm;
use crate::work::Board;

/// A request the router placed: what the commit step records.
pub(super) struct Planned {
    blocks: Blocks,
    /// The first of `ranked`.
    primary: Choice,
    ranked: Vec<Choice>,
    reason: RouteReason,
    pd: Option<PdPlan>,
    observer_suspect: bool,
    first_token: Option<FirstToken>,
}

impl Planned {
    fn prefill(&self) -> Option<&Choice> {
        self.pd.as_ref().and_then(|p| p.prefill.as_ref())
    }
}

impl RequestFlow {
    /// Step 1: the request as the engines render it, or what to answer instead.
    pub(super) fn read_body(
        &mut self,
        vm: &Vm,
        host: &mut dyn Host,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<RequestView, Box<BodyOutcome>> {
        let parsed = parse::parse_request(endpoint, body, vm.config.parse_budget());
        if parsed.owned_field && !vm.config.trust_client_kv_transfer_params {
            // A KV handle names the host and port a decode pod pulls from: kvroute's to give, never
            // the client's. Removed whatever happens next (routed, passed through, refused).
            host.count(Counter::ClientKvParamsRemoved, 1);
            self.rewritten_body = body::edit(body, &[(OWNED_BODY_FIELD, body::Change::Remove)]);
        }
        match parsed.view {
            Ok(view) => Ok(view),
            Err(ParseError::OverBudget) => {
                host.count(Counter::ParseBudgetExceeded, 1);
                let message = format!(
                    "kvroute: reading this request for routing needs more than max_parse_bytes ({} bytes of rendered prompt and parse buffers)",
                    vm.config.parse_budget()
                );
                Err(Box::new(BodyOutcome::Reply(Reply::error(
                    ErrorCode::ParseBudgetExceeded,
                    &message,
                ))))
            }
            Err(ParseError::NotJson) => Err(Box::new(self.unparseable(vm, host, body))),
            Err(e) => {
                // The model server gives the client its own error for a bad body.
                log::debug!("kvroute: pass-through: {}", e.as_str());
                host.count(Counter::Passthrough, 1);
                Err(Box::new(BodyOutcome::Continue))
            }
        }
    }

    /// A body serde_json refuses that Python's `json` (the engines' servers) may read, with a
    /// `kv_transfer_params` kvroute's strict edit cannot take out: refused, or with
    /// `passthrough_unparseable_bodies` passed on without that member (`protocol::lenient`).
    fn unparseable(&mut self, vm: &Vm, host: &mut dyn Host, body: &[u8]) -> BodyOutcome {
        if !vm.config.passthrough_unparseable_bodies {
            host.count(Counter::UnparseableBody, 1);
            return BodyOutcome::Reply(Reply::error(
                ErrorCode::UnparseableBody,
                "kvroute: the request body is not JSON kvroute can read (strict RFC 8259 in UTF-8: no NaN or Infinity, no number out of range, no byte order mark or UTF-16, no lone surrogate, at most 127 levels deep)",
            ));
        }
        if !vm.config.trust_client_kv_transfer_params {
            if let Some(without) = crate::protocol::lenient::remove_member(body, OWNED_BODY_FIELD) {
                host.count(Counter::ClientKvParamsRemoved, 1);
                self.rewritten_body = Some(without);
            }
        }
        log::debug!("kvroute: pass-through: {}", ParseError::NotJson.as_str());
        host.count(Counter::Passthrough, 1);
        BodyOutcome::Continue
    }

    /// Step 3: where the request goes, or what to answer instead; `decode_only`: without a
    /// prefill pod (a split this request cannot take).
    pub(super) fn plan_request(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        view: &RequestView,
        now: u64,
        decode_only: bool,
    ) -> Result<Planned, Box<BodyOutcome>> {
        let blocks = Blocks::in_cache(
            &vm.config.block,
            view,
            vm.router.cache_model(&view.model),
            vm.tokenizer.as_deref(),
        );
        let stored_at = view.previous_response_id.as_deref().and_then(|id| {
            crate::stored_responses::lookup(host, id, vm.config.stored_response_ttl_ms)
        });
        self.hints.stored_at = stored_at.as_deref().map(crate::stored_responses::addr_key);
        let mut plan = self.plan(vm, &view.model, &blocks, now, decode_only);
        if matches!(
            plan.decision,
            Decision::NoEndpoint(
                Rejection::NoneHealthy | Rejection::NoPods | Rejection::NoneKnownYet
            )
        ) {
            // This VM's copy of the load table is as old as its last tick (and empty in a VM still
            // starting): re-read it once before deciding that nothing can serve the request.
            vm.refresh_load_table(host);
            plan = self.plan(vm, &view.model, &blocks, now, decode_only);
        }
        if vm.router.load_table().version == 0
            || plan.decision == Decision::NoEndpoint(Rejection::NoneKnownYet)
        {
            // No pool state yet (no table published, or no pod has answered a poll): let the
            // cluster balance rather than fail requests while kvroute starts.
            host.count(Counter::Passthrough, 1);
            return Err(Box::new(BodyOutcome::Continue));
        }
        let first_token = plan.first_token(&blocks);
        let Plan {
            decision,
            pd,
            observer_suspect,
        } = plan;
        let (ranked, reason) = match decision {
            Decision::Route { ranked, reason } => (ranked, reason),
            Decision::NoEndpoint(rejection) => {
                return Err(Box::new(self.refuse(vm, host, rejection, &view.model)));
            }
        };
        let Some(primary) = ranked.first().cloned() else {
            return Err(Box::new(BodyOutcome::Continue));
        };
        Ok(Planned {
            blocks,
            primary,
            ranked,
            reason,
            pd,
            observer_suspect,
            first_token,
        })
    }

    /// Step 4a: the decision in the counters (labelled by the primary's pool, role and model).
    pub(super) fn count_routed(
        &mut self,
        vm: &Vm,
        host: &mut dyn Host,
        view: &RequestView,
        endpoint: Endpoint,
        planned: &Planned,
    ) {
        let primary = &planned.primary;
        self.labels = RouteLabels::of(vm, &primary.addr, &view.model);
        let [pool, role, model] = self.labels.pairs();
        let reason = (metrics::REASON, explain::reason_name(planned.reason));
        host.count_in(Counter::RequestsRouted, &[pool, role, model, reason], 1);
        if view.previous_response_id.is_some() {
            let placed = planned.reason == RouteReason::StoredResponse;
            let counter = if placed {
                Counter::StoredResponsePinned
            } else {
                Counter::StoredResponseUnplaced
            };
            host.count(counter, 1);
        }
        if endpoint == Endpoint::Responses && view.store {
            self.stored_answer = Some(Vec::new());
        }
        if planned.observer_suspect {
            host.count(Counter::ObserverSuspect, 1);
        } else if primary.stale {
            host.count(Counter::RoutedStale, 1);
        }
        if primary.meets_slo == Some(false) {
            host.count(Counter::SloPredictedMiss, 1);
        }
        if let Some(pd) = planned.pd.as_ref().filter(|p| p.prefill.is_none()) {
            host.count_in(
                Counter::PdDecodeOnly,
                &self.labels.with_pd_reason(pd.reason),
                1,
            );
        }
    }

    /// Step 4b: every concern that keeps state about a decision learns it (`board`: the
    /// in-flight board read before planning, written back with this request on it); returns the
    /// route to the primary and the prefill pod of a split.
    pub(super) fn commit(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        view: &RequestView,
        planned: &mut Planned,
        (now, board): (u64, (Board, Option<u32>)),
    ) -> (Route, Option<String>) {
        let first_token = planned.first_token.take();
        let (blocks, ranked, primary) = (&planned.blocks, &planned.ranked, &planned.primary);
        if self.debug_wanted {
            let pd = planned.pd.as_ref();
            self.debug = Some(explain::debug_line(vm, blocks, ranked, planned.reason, pd));
        }
        vm.router.work.inflight_start(&primary.addr);
        if let Some(adapter) = vm.router.adapter_of(&view.model) {
            // A split's decode and prefill pods both run the adapter.
            let prefill = planned.prefill().map(|c| c.addr.clone());
            for addr in std::iter::once(primary.addr.clone()).chain(prefill) {
                let hashes = vec![crate::adapters::adapter_block(adapter)];
                vm.observe(host, Observation { addr, hashes });
            }
        }
        let (first_byte_timeout_ms, attempt_timeout_ms) = attempt_timeouts(vm, ranked, view);
        if let Some(first) = first_token {
            let pending = Some(
                vm.router
                    .work
                    .prefill_start(&first, now, first_byte_timeout_ms),
            );
            self.awaiting = Some(Awaiting {
                restarts: vm.router.affinity.restarts_of(&first.addr),
                first,
                pending,
                routed_at_us: host.now_us(),
                learnable: view.stream,
            });
        }
        self.streamed = view.stream;
        let prefill_pod = planned.prefill().map(|c| c.addr.clone());
        let pd_export = match (&planned.pd, &prefill_pod, vm.config.pd.mode) {
            (None, _, _) => PdExport::None,
            (Some(_), None, _) => PdExport::DecodeOnly,
            (Some(_), Some(_), PdMode::Inline) => PdExport::SplitInline,
            (Some(_), Some(_), _) => PdExport::SplitSidecar,
        };
        let tokens_per_block = vm.config.block.tokens_per_block;
        DecisionFields::of(
            primary,
            planned.prefill(),
            planned.reason,
            blocks,
            tokens_per_block,
            pd_export,
        )
        .export(host);
        vm.write_inflight_row_over(host, now, Some(board));
        self.routed_to = Some(primary.addr.clone());
        // A stream the client did not ask `usage` of carries none: its chunks would be copied
        // into the VM and scanned for nothing.
        let shape = RouteShape {
            split: prefill_pod.is_some(),
            usage_in_response: !view.stream || view.stream_usage,
            has_fallbacks: ranked.len() > 1,
        };
        self.affinity
            .on_routed(vm, host, (primary, blocks), shape, now);
        let destinations = ranked
            .iter()
            .map(|c| c.addr.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let route = Route {
            destinations,
            prefiller: None,
            prefill_call: None,
            first_byte_timeout_ms: attempt_timeout_ms,
        };
        (route, prefill_pod)
    }

    /// Step 5: the prefill pod learns the blocks too, and the split starts: the sidecar's header,
    /// or the inline prefill call with the body as the client sent it (`original`).
    pub(super) fn start_split(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        mut route: Route,
        planned: Planned,
        prefill_addr: String,
        original: Option<Vec<u8>>,
    ) -> BodyOutcome {
        let prefill_held = planned.prefill().map_or(0, |c| c.matched_blocks);
        let reason = planned.pd.as_ref().map_or(PdReason::Sooner, |p| p.reason);
        self.split.reason = Some(reason);
        self.affinity
            .on_split(vm, host, &prefill_addr, planned.blocks, prefill_held);
        match (vm.config.pd.mode, original) {
            (PdMode::Inline, Some(original)) => {
                route.prefill_call = Some(inline::prefill_call(
                    &vm.config.poll_cluster,
                    &self.path,
                    &prefill_addr,
                    &original,
                    &self.split.forwarded,
                    vm.config.pd.prefill_timeout_ms,
                ));
                self.split.original = Some(original);
                self.split.pod = Some(prefill_addr);
            }
            _ => {
                host.count_in(
                    Counter::PdDisaggregated,
                    &self.labels.with_pd_reason(reason),
                    1,
                );
                route.prefiller = Some(prefill_addr);
                self.split.sidecar = true;
            }
        }
        BodyOutcome::Route(route)
    }
}

/// A request's first-byte timeout (streams only) and its per-attempt timeout: the first-byte
/// rule on the slowest destination's predicted TTFT for a stream, on its whole answer otherwise.
fn attempt_timeouts(vm: &Vm, ranked: &[Choice], view: &RequestView) -> (Option<u64>, Option<u64>) {
    if !view.stream {
        return (None, whole_answer_timeout(vm, ranked, view.max_tokens));
    }
    let slowest = ranked
        .iter()
        .map(|c| c.prediction.ttft_ms)
        .fold(0.0, f64::max);
    let first_byte = vm.config.health.first_byte_timeout(slowest);
    (first_byte, first_byte)
}

/// The per-attempt timeout of a non-streamed request: its first byte is its whole answer, so the
/// first-byte rule (`health`) applies to the predicted end, each destination's predicted TTFT
/// plus `max_tokens` times an inter-token latency — the slowest this gateway timed among the
/// destinations (a pod not yet timed is taken to be as slow). Without `max_tokens`, or before any
/// destination has streamed, there is no prediction: `health.non_streamed_timeout_ms` is the
/// bound. A timed-out attempt is retried on the next pod and
/// counted against the first by passive health, as for streams, so a frozen pod costs a
/// non-streamed request about the bound instead of its freeze, and is ejected after
/// `consecutive_failures` of them.
fn whole_answer_timeout(vm: &Vm, ranked: &[Choice], max_tokens: Option<u64>) -> Option<u64> {
    let health = &vm.config.health;
    health.non_streamed_timeout(predicted_whole_answer_timeout(vm, ranked, max_tokens))
}

/// The first-byte rule on the slowest destination's predicted whole answer, where one is predicted.
fn predicted_whole_answer_timeout(
    vm: &Vm,
    ranked: &[Choice],
    max_tokens: Option<u64>,
) -> Option<u64> {
    let tokens = max_tokens? as f64;
    let itl_ms = ranked
        .iter()
        .filter_map(|c| vm.router.costs.itl_of(&c.addr))
        .reduce(f64::max)?;
    let slowest_end_ms = ranked
        .iter()
        .map(|c| c.prediction.ttft_ms + tokens * itl_ms)
        .fold(0.0, f64::max);
    vm.config.health.first_byte_timeout(slowest_end_ms)
}
