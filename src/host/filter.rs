//! The HTTP filter: strips client-supplied routing headers, buffers inference request bodies, asks
//! the router for a plan and carries it out: `x-gateway-destination-endpoint` for the pod (and its
//! fallbacks), plus, for a disaggregated request, `x-prefiller-host-port` (sidecar mode) or a
//! prefill call made by the filter itself (inline mode). Everything it does not understand
//! continues untouched to the cluster's own load balancer.

use super::root::Vm;
use super::stats::{Counter, Histogram};
use crate::config::NoEndpointPolicy;
use crate::headers::{DEBUG, DESTINATION, OWNED_REQUEST_HEADERS, PREFILLER};
use crate::pd::{self, PdMode};
use crate::request::{self, Endpoint};
use crate::router::{
    Blocks, CacheExpectation, CacheVerdict, FirstToken, PdOutcome, PdPlan, Plan, Router,
};
use crate::scheduler::saturation::parse_priority;
use crate::scheduler::session::session_key;
use crate::scheduler::slo::{parse_objective, Slo};
use crate::scheduler::{Choice, Decision, Hints, Rejection, RouteReason};
use crate::state::messages::Observation;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// An inline prefill under way: the client's body waits for the prefill pod's answer.
struct PendingPrefill {
    token: u32,
    body: Map<String, Value>,
    body_len: usize,
}

/// The request's prefill as the work board sees it, until its first response byte.
struct Awaiting {
    first: FirstToken,
    /// Handle of the board entry; `None` once its work stopped counting (an inline prefill that
    /// answered, or a deadline).
    pending: Option<u64>,
    routed_at_us: u64,
    /// A streamed response's first byte is its first token: that time teaches the cost model. A
    /// non-streamed one's first byte comes at the end, after the decode.
    learnable: bool,
}

pub struct Filter {
    vm: Option<Rc<RefCell<Vm>>>,
    endpoint: Option<Endpoint>,
    path: String,
    routed_to: Option<String>,
    debug: Option<String>,
    prefill: Option<PendingPrefill>,
    awaiting: Option<Awaiting>,
    response_ok: bool,
    /// Streamed responses: body chunks seen and when the first and last arrived (µs), for the
    /// pod's inter-token latency.
    chunks: u32,
    first_chunk_us: u64,
    last_chunk_us: u64,
    streamed: bool,
    /// What the index expects the response's `usage` to report, until it does.
    cache_check: Option<CacheExpectation>,
    /// The tail of the previous response chunk, so a `usage` object split across two is read.
    carry: Vec<u8>,
    hints: Hints,
}

/// Bytes of a chunk kept for the next one: more than a usage object's keys and numbers.
const CARRY_BYTES: usize = 256;

fn request_header(name: &str) -> Option<String> {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
}

fn set_request_header(name: &str, value: &str) -> bool {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value)).is_ok()
}

/// Answers the client directly with an OpenAI-shaped JSON error.
fn send_error(status: u32, kind: &str, message: &str, reason: &str) {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": status}});
    let mut headers = vec![
        ("content-type", "application/json"),
        ("x-kvroute-error", reason),
    ];
    if status == 429 {
        headers.push(("retry-after", "1"));
    }
    let _ = hostcalls::send_http_response(status, headers, Some(body.to_string().as_bytes()));
}

/// The session, priority and SLO headers, when configured and present. An unreadable value is
/// refused with its counter and reason code.
fn read_hints(config: &crate::config::Config) -> Result<Hints, (String, Counter, &'static str)> {
    let header = |name: &str| {
        if name.is_empty() {
            None
        } else {
            request_header(name)
        }
    };
    let session = header(&config.session.header)
        .filter(|id| !id.is_empty())
        .map(|id| session_key(&id));
    let priority = match header(&config.shedding.priority_header) {
        Some(value) => parse_priority(&value).map_err(|reason| {
            (
                format!(
                    "kvroute: header `{}` {reason}",
                    config.shedding.priority_header
                ),
                Counter::BadPriority,
                "bad_priority",
            )
        })?,
        None => 0,
    };
    let objective = |name: &str| -> Result<Option<f64>, (String, Counter, &'static str)> {
        header(name)
            .map(|value| {
                parse_objective(&value).map_err(|reason| {
                    (
                        format!("kvroute: header `{name}` {reason}"),
                        Counter::BadSlo,
                        "bad_slo",
                    )
                })
            })
            .transpose()
    };
    let slo = Slo {
        ttft_ms: objective(&config.slo.ttft_header)?,
        tpot_ms: objective(&config.slo.tpot_header)?,
    };
    Ok(Hints {
        session,
        priority,
        slo,
    })
}

fn debug_line(
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
        "pod={}; reason={}; matched_blocks={}/{}; predicted_ttft_ms={:.1}; uncached_tokens={:.0}; tokens_ahead={:.0}; decoding={:.0}; guarded={}; fallbacks={}; vm={:x}; page={}; pods={}; entries={}; longest={}",
        primary.addr,
        match reason {
            RouteReason::PrefixHit => "prefix",
            RouteReason::Load => "load",
            RouteReason::Session => "session",
        },
        primary.matched_blocks,
        blocks.hashes.len(),
        p.ttft_ms,
        p.uncached_tokens,
        p.tokens_ahead,
        p.decoding,
        primary.guarded,
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
    }
    line
}

impl Filter {
    pub fn new(vm: Option<Rc<RefCell<Vm>>>) -> Filter {
        Filter {
            vm,
            endpoint: None,
            path: String::new(),
            routed_to: None,
            debug: None,
            prefill: None,
            awaiting: None,
            response_ok: false,
            chunks: 0,
            first_chunk_us: 0,
            last_chunk_us: 0,
            streamed: false,
            cache_check: None,
            carry: Vec::new(),
            hints: Hints::default(),
        }
    }

    /// Looks for the response's `usage` in this chunk (and the end of the last one); once found,
    /// checks the index's expectation against it.
    fn read_usage(&mut self, body_size: usize) {
        let chunk = hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        self.carry.extend_from_slice(&chunk);
        let Some((cached, prompt)) = crate::usage::cache_report(&self.carry) else {
            let keep = self.carry.len().saturating_sub(CARRY_BYTES);
            self.carry.drain(..keep);
            return;
        };
        self.carry = Vec::new();
        let (Some(expected), Some(vm_rc)) = (self.cache_check.take(), self.vm.clone()) else {
            return;
        };
        let Ok(mut vm) = vm_rc.try_borrow_mut() else {
            return;
        };
        let share = expected.matched_blocks as f64 / expected.total_blocks.max(1) as f64;
        vm.stats.add(
            Counter::CachePredictedTokens,
            (share.min(1.0) * prompt as f64) as u64,
        );
        vm.stats.add(Counter::CacheReportedTokens, cached);
        if let CacheVerdict::Evicted { blocks, lost } =
            vm.router.on_cache_report(&expected, cached, prompt)
        {
            log::debug!(
                "kvroute: {} reported {cached} of {prompt} tokens cached, the index expected more; it keeps about {blocks} blocks",
                expected.addr
            );
            vm.stats.inc(Counter::CacheEvictionsDetected);
            vm.report_eviction(expected.addr.clone(), blocks, lost);
        }
    }

    /// The first response byte (or the end of a response without one): the prefill is done; a
    /// streamed 2xx teaches the pod's cost model.
    fn first_byte(&mut self) {
        let Some(awaiting) = self.awaiting.take() else {
            return;
        };
        let Some(vm_rc) = self.vm.clone() else {
            return;
        };
        let Ok(mut vm) = vm_rc.try_borrow_mut() else {
            return;
        };
        let now = super::now_ms();
        let changed = awaiting
            .pending
            .is_some_and(|id| vm.router.prefill_done(id));
        if awaiting.learnable && self.response_ok {
            let observed_ms = super::now_us().saturating_sub(awaiting.routed_at_us) as f64 / 1e3;
            let config = vm.config.clone();
            vm.router.learn(&config, &awaiting.first, observed_ms);
            vm.stats.record(Histogram::TtftMs, observed_ms as u64);
            if self.hints.slo.ttft_ms.is_some_and(|slo| observed_ms > slo) {
                vm.stats.inc(Counter::SloTtftMissed);
            }
            if observed_ms > 0.0 {
                let error = (awaiting.first.predicted_ms - observed_ms).abs() / observed_ms;
                vm.stats
                    .record(Histogram::TtftPredictionErrorPct, (error * 100.0) as u64);
            }
        }
        if changed {
            vm.write_inflight_row(now);
        }
    }

    fn route(&mut self, vm: &mut Vm, endpoint: Endpoint, body: &[u8]) -> Action {
        let view = match request::parse(endpoint, body) {
            Ok(v) => v,
            Err(e) => {
                // The model server gives the client its own error for a bad body.
                log::debug!("kvroute: pass-through: {}", e.as_str());
                vm.stats.inc(Counter::Passthrough);
                return Action::Continue;
            }
        };
        vm.sync_pages();
        let now = super::now_ms();
        vm.read_inflight_board(now);
        let blocks = Router::blocks(&vm.config, &view, vm.tokenizer.as_deref());
        let mut plan = vm
            .router
            .plan(&vm.config, &view.model, &blocks, self.hints, now);
        if matches!(
            plan.decision,
            Decision::NoEndpoint(Rejection::NoneHealthy | Rejection::NoPods)
        ) {
            // This VM's copy of the load table is as old as its last tick (and empty in a VM still
            // starting): re-read it once before deciding that nothing can serve the request.
            vm.refresh_load_table();
            plan = vm
                .router
                .plan(&vm.config, &view.model, &blocks, self.hints, now);
        }
        if vm.router.load_table().version == 0 {
            // No pool state yet (the first poll has not been published): let the cluster balance
            // rather than fail requests while kvroute starts.
            vm.stats.inc(Counter::Passthrough);
            return Action::Continue;
        }
        let first_token = plan.first_token();
        let Plan { decision, pd } = plan;
        let (ranked, reason) = match decision {
            Decision::Route { ranked, reason } => (ranked, reason),
            Decision::NoEndpoint(Rejection::SloUnattainable) => {
                vm.stats.inc(Counter::Shed);
                let message = format!(
                    "kvroute: {} (model `{}`, priority {})",
                    Rejection::SloUnattainable.as_str(),
                    view.model,
                    self.hints.priority
                );
                send_error(429, "RateLimitError", &message, "slo_unattainable");
                return Action::Pause;
            }
            Decision::NoEndpoint(Rejection::Saturated) => {
                // Shedding is what the client's priority asked for: never failed open.
                vm.stats.inc(Counter::Shed);
                let message = format!(
                    "kvroute: {} (model `{}`, priority {})",
                    Rejection::Saturated.as_str(),
                    view.model,
                    self.hints.priority
                );
                send_error(429, "RateLimitError", &message, "saturated");
                return Action::Pause;
            }
            Decision::NoEndpoint(rejection) => {
                vm.stats.inc(Counter::NoEndpoint);
                if vm.config.on_no_endpoint == NoEndpointPolicy::Passthrough {
                    return Action::Continue;
                }
                let (status, kind) = match rejection {
                    Rejection::UnknownModel => (404, "NotFoundError"),
                    _ => (503, "ServiceUnavailableError"),
                };
                let message = format!("kvroute: {} (model `{}`)", rejection.as_str(), view.model);
                send_error(status, kind, &message, rejection.as_str());
                return Action::Pause;
            }
        };
        let Some(primary) = ranked.first() else {
            return Action::Continue;
        };
        let header: Vec<&str> = ranked.iter().map(|c| c.addr.as_str()).collect();
        if !set_request_header(DESTINATION, &header.join(",")) {
            log::warn!("kvroute: could not set {DESTINATION}; leaving the request to the cluster");
            vm.stats.inc(Counter::Passthrough);
            return Action::Continue;
        }
        vm.stats.inc(Counter::Routed);
        if primary.meets_slo == Some(false) {
            vm.stats.inc(Counter::SloPredictedMiss);
        }
        vm.stats.inc(match reason {
            RouteReason::PrefixHit => Counter::RoutedPrefixHit,
            RouteReason::Load => Counter::RoutedLoad,
            RouteReason::Session => Counter::RoutedSession,
        });
        if vm.config.debug_header {
            self.debug = Some(debug_line(vm, &blocks, &ranked, reason, pd.as_ref()));
        }
        vm.router.inflight_start(&primary.addr);
        if let Some(first) = first_token {
            let pending = Some(vm.router.prefill_start(&first, now));
            self.awaiting = Some(Awaiting {
                first,
                pending,
                routed_at_us: super::now_us(),
                learnable: view.stream,
            });
        }
        self.streamed = view.stream;
        // A split request's decode pod reports the pulled KV as cached too: only check the rest.
        if pd.as_ref().is_none_or(|p| p.prefill.is_none()) {
            self.cache_check =
                vm.router
                    .expect_cache(&primary.addr, &blocks, primary.matched_blocks);
        }
        vm.write_inflight_row(now);
        self.routed_to = Some(primary.addr.clone());
        let prefill_pod = pd
            .as_ref()
            .and_then(|p| p.prefill.as_ref())
            .map(|c| c.addr.clone());
        if pd.as_ref().is_some_and(|p| p.prefill.is_none()) {
            vm.stats.inc(Counter::PdDecodeOnly);
        }
        vm.observe(Observation {
            addr: primary.addr.clone(),
            hashes: blocks.hashes.clone(),
        });
        let Some(prefill_addr) = prefill_pod else {
            return Action::Continue;
        };
        // The prefill pod computes the same blocks: its index learns them too.
        vm.observe(Observation {
            addr: prefill_addr.clone(),
            hashes: blocks.hashes,
        });
        match vm.config.pd.mode {
            PdMode::Sidecar => {
                if set_request_header(PREFILLER, &prefill_addr) {
                    vm.stats.inc(Counter::PdDisaggregated);
                } else {
                    vm.stats.inc(Counter::PdDecodeOnly);
                }
                Action::Continue
            }
            PdMode::Inline => self.start_inline_prefill(vm, &prefill_addr, body),
        }
    }

    /// Sends the prefill request; the client's request waits until `on_http_call_response`.
    fn start_inline_prefill(&mut self, vm: &mut Vm, prefill_addr: &str, body: &[u8]) -> Action {
        let Ok(Value::Object(original)) = serde_json::from_slice::<Value>(body) else {
            return Action::Continue;
        };
        let prefill_body = pd::prefill_body(&original);
        let headers = vec![
            (":method", "POST"),
            (":path", self.path.as_str()),
            (":authority", prefill_addr),
            ("content-type", "application/json"),
            (DESTINATION, prefill_addr),
        ];
        let timeout = Duration::from_millis(vm.config.pd.prefill_timeout_ms);
        match hostcalls::dispatch_http_call(
            &vm.config.poll_cluster,
            headers,
            Some(&prefill_body),
            vec![],
            timeout,
        ) {
            Ok(token) => {
                self.prefill = Some(PendingPrefill {
                    token,
                    body: original,
                    body_len: body.len(),
                });
                Action::Pause
            }
            Err(e) => {
                log::warn!("kvroute: inline prefill to {prefill_addr} not sent ({e:?}); decoding without it");
                vm.stats.inc(Counter::PdPrefillFailures);
                vm.stats.inc(Counter::PdDecodeOnly);
                Action::Continue
            }
        }
    }
}

impl Context for Filter {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(pending) = self.prefill.take_if(|p| p.token == token_id) else {
            return;
        };
        let (status, answer) = super::call_response(body_size);
        let vm_rc = self.vm.clone();
        if let (Some(vm), Some(awaiting)) = (&vm_rc, self.awaiting.as_mut()) {
            // The prefill pod's part is over: its work leaves the board now, while the sample
            // still waits for the client's first byte (the split path's whole time is learned).
            if let (Ok(mut vm), Some(id)) = (vm.try_borrow_mut(), awaiting.pending.take()) {
                if vm.router.prefill_done(id) {
                    vm.write_inflight_row(super::now_ms());
                }
            }
        }
        let vm = vm_rc.as_ref().and_then(|v| v.try_borrow().ok());
        let count = |c: Counter| {
            if let Some(vm) = &vm {
                vm.stats.inc(c);
            }
        };
        if (400..500).contains(&status) {
            // The request itself is at fault: the client gets the prefill pod's own answer.
            count(Counter::PdPrefillRejected);
            let _ = hostcalls::send_http_response(
                status,
                vec![("content-type", "application/json")],
                Some(&answer),
            );
            return;
        }
        match (status, pd::transfer_params(&answer)) {
            (200, Some(params)) => {
                let body = pd::decode_body(&pending.body, params);
                let rewritten =
                    hostcalls::set_buffer(BufferType::HttpRequestBody, 0, pending.body_len, &body)
                        .is_ok();
                if rewritten {
                    if request_header("content-length").is_some() {
                        set_request_header("content-length", &body.len().to_string());
                    }
                    count(Counter::PdDisaggregated);
                } else {
                    count(Counter::PdPrefillFailures);
                    count(Counter::PdDecodeOnly);
                }
            }
            _ => {
                // Failed, timed out (status 503/504 from the host) or no KV to hand over: the decode
                // pod prefills the prompt itself, so its first byte says nothing of the split path.
                if let Some(a) = self.awaiting.as_mut() {
                    a.learnable = false;
                }
                log::debug!("kvroute: inline prefill answered {status}; decoding without it");
                count(Counter::PdPrefillFailures);
                count(Counter::PdDecodeOnly);
            }
        }
        let _ = hostcalls::resume_http_request();
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let spoofed = OWNED_REQUEST_HEADERS
            .iter()
            .filter(|h| request_header(h).is_some())
            .filter(|h| hostcalls::set_map_value(MapType::HttpRequestHeaders, h, None).is_ok())
            .count();
        let Some(vm_rc) = self.vm.clone() else {
            return Action::Continue;
        };
        let Ok(vm) = vm_rc.try_borrow() else {
            return Action::Continue;
        };
        if spoofed > 0 {
            vm.stats.inc(Counter::SpoofedHeadersRemoved);
        }
        if vm.config.pools.is_empty() {
            return Action::Continue; // nothing to route to: kvroute only guards the headers
        }
        let method = request_header(":method").unwrap_or_default();
        let path = request_header(":path").unwrap_or_default();
        let endpoint = Endpoint::from_path(&path);
        let too_large = request_header("content-length")
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l > vm.config.max_body_bytes);
        match endpoint {
            Some(ep) if method == "POST" && !too_large && !end_of_stream => {
                match read_hints(&vm.config) {
                    Ok(hints) => self.hints = hints,
                    Err((message, counter, reason)) => {
                        log::debug!("{message}");
                        vm.stats.inc(counter);
                        send_error(400, "BadRequestError", &message, reason);
                        return Action::Pause;
                    }
                }
                self.endpoint = Some(ep);
                self.path = path;
                // Wait for the body; needs `allow_on_headers_stop_iteration: true` on Envoy ≥ 1.35.
                Action::Pause
            }
            _ => {
                vm.stats.inc(Counter::Passthrough);
                Action::Continue
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(endpoint) = self.endpoint else {
            return Action::Continue;
        };
        if !end_of_stream {
            return Action::Pause; // Envoy buffers until the whole body is here
        }
        self.endpoint = None;
        let Some(vm_rc) = self.vm.clone() else {
            return Action::Continue;
        };
        let Ok(mut vm) = vm_rc.try_borrow_mut() else {
            return Action::Continue;
        };
        if body_size > vm.config.max_body_bytes {
            vm.stats.inc(Counter::Passthrough);
            return Action::Continue;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        self.route(&mut vm, endpoint, &body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if let Some(debug) = &self.debug {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, DEBUG, Some(debug));
        }
        if self.routed_to.is_some() {
            self.response_ok = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
                .ok()
                .flatten()
                .is_some_and(|s| s.starts_with('2'));
            if end_of_stream || !self.response_ok {
                self.first_byte();
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.awaiting.is_some() && (body_size > 0 || end_of_stream) {
            self.first_byte();
        }
        if self.cache_check.is_some() && self.response_ok && body_size > 0 {
            self.read_usage(body_size);
        }
        if self.streamed && body_size > 0 {
            let now = super::now_us();
            if self.chunks == 0 {
                self.first_chunk_us = now;
            }
            self.last_chunk_us = now;
            self.chunks = self.chunks.saturating_add(1);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // Reset, timeout or a local reply before any response byte: the prefill stops counting,
        // and teaches nothing.
        let completed = self.response_ok;
        self.response_ok = false;
        self.first_byte();
        if let (Some(addr), Some(vm)) = (self.routed_to.take(), &self.vm) {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                if completed && self.chunks >= 3 {
                    let span_us = self.last_chunk_us.saturating_sub(self.first_chunk_us);
                    let itl_ms = span_us as f64 / 1e3 / f64::from(self.chunks - 1);
                    vm.router.observe_itl(&addr, itl_ms);
                }
                vm.router.inflight_end(&addr);
                vm.write_inflight_row(super::now_ms());
            }
        }
    }
}
