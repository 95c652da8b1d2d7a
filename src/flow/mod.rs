//! One request through kvroute, from its headers to its last response byte: the whole request
//! path's policy, written against the host port so it runs natively in tests. The proxy binding
//! (`crate::host::filter`) only reads what a step needs, calls the step, and carries out the
//! outcome it gets back.
//!
//! 1. [`RequestFlow::on_request_headers`]: an inference `POST` with a body and readable hint headers
//!    waits for its body; a bad hint header gets a 400; `GET /metrics` is refused (it would be a
//!    random pod's page), `GET /v1/models` answered from the load table ([`models`]) and another
//!    gateway replica's ask for placements from shared data (`crate::peers`); anything else
//!    passes through.
//! 2. [`RequestFlow::on_request_body`]: parse once, catch up with the shared state, plan (the
//!    scheduler, then P/D), and answer with one [`BodyOutcome`]: pass through, a local reply (an
//!    OpenAI-style error with a stable code), or a route (destinations, the prefiller header, or the
//!    inline prefill call to make first). The decision's side effects (in-flight and prefill work on
//!    the board, the index observations) happen here, after the pure decision.
//! 3. [`RequestFlow::on_prefill_answer`] (inline P/D): the prefill pod's answer becomes the decode
//!    pod's body, a refusal for the client, or a fallback to decode-only.
//! 4. [`RequestFlow::on_response_headers`] / [`RequestFlow::on_response_body`]: the first byte ends
//!    the prefill's work on the board and teaches the pod's cost model; `usage.cached_tokens` checks
//!    the index; chunk times give the pod's inter-token latency. The index learns a routed prompt's
//!    blocks as soon as the request is routed (the next request with the same prefix must find it
//!    even while this one is still prefilling), and only provisionally: a 2xx makes it final, a
//!    4xx/5xx (the pod refused the request, or Envoy answered for an upstream that failed) withdraws
//!    the blocks this request added, in every VM (`Provisional`).
//! 5. [`RequestFlow::on_done`]: whatever is still counted stops counting.

mod body_steps;
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod decision_tests;
mod explain;
pub mod models;
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests;

use crate::common::{HeaderName, NoEndpointPolicy, Role};
use crate::headers::DEBUG;
use crate::health::{RequestEnd, Verdict};
use crate::metrics::{self, Counter, Histogram};
use crate::pd::inline::{self, Answer};
use crate::pd::PdMode;
use crate::port::{Host, HttpCall};
use crate::protocol::parse::{self, Endpoint};
use crate::router::{CacheExpectation, CacheVerdict, FirstToken, Plan};
use crate::scheduler::saturation::parse_priority;
use crate::scheduler::session::session_key;
use crate::scheduler::slo::{parse_objective, Slo};
use crate::scheduler::{Hints, Rejection, RouteReason};
use crate::state::messages::Observation;
use crate::vm::Vm;
use explain::PdExport;

/// Why `GET /metrics` through the gateway is refused, and where to scrape instead.
const METRICS_NOT_PROXIED: &str = "kvroute: /metrics is not proxied to a model server: through the gateway it would be a different pod's page on every scrape. Scrape each model server's own /metrics, and kvroute's and Envoy's stats from Envoy's admin /stats/prometheus (kvroute_*)";

/// Bytes of a response chunk kept for the next one, so a `usage` object split across two is read.
const CARRY_BYTES: usize = 256;

/// A stable, machine-readable reason, in the error body's `code` and the `x-kvroute-error` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadPriority,
    BadSlo,
    Saturated,
    SloUnattainable,
    UnknownModel,
    NoHealthyPod,
    NoPods,
    MetricsNotProxied,
    BodyTooLarge,
    ParseBudgetExceeded,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadPriority => "bad_priority",
            ErrorCode::BadSlo => "bad_slo",
            ErrorCode::Saturated => "saturated",
            ErrorCode::SloUnattainable => "slo_unattainable",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::NoHealthyPod => "no_healthy_pod",
            ErrorCode::NoPods => "no_pods",
            ErrorCode::MetricsNotProxied => "metrics_not_proxied",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::ParseBudgetExceeded => "parse_budget_exceeded",
        }
    }

    fn status_and_kind(self) -> (u32, &'static str) {
        match self {
            ErrorCode::BadPriority | ErrorCode::BadSlo => (400, "BadRequestError"),
            ErrorCode::BodyTooLarge | ErrorCode::ParseBudgetExceeded => (413, "BadRequestError"),
            ErrorCode::Saturated | ErrorCode::SloUnattainable => (429, "RateLimitError"),
            ErrorCode::UnknownModel | ErrorCode::MetricsNotProxied => (404, "NotFoundError"),
            ErrorCode::NoHealthyPod | ErrorCode::NoPods => (503, "ServiceUnavailableError"),
        }
    }
}

/// A response kvroute gives itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// An OpenAI-shaped JSON error.
    pub fn error(code: ErrorCode, message: &str) -> Reply {
        let (status, kind) = code.status_and_kind();
        let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code.as_str()}});
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("x-kvroute-error", code.as_str().to_string()),
        ];
        if status == 429 {
            headers.push(("retry-after", "1".to_string()));
        }
        Reply {
            status,
            headers,
            body: body.to_string().into_bytes(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum HeadersOutcome {
    /// Not ours to route: on to the cluster's own balancer.
    Continue,
    /// An inference request: hold it until its whole body is here.
    WaitForBody,
    Reply(Reply),
    /// A request about a stored response (`GET /v1/responses/{id}`, its cancel): to the pod
    /// that stored it (`x-gateway-destination-endpoint`).
    Route(String),
}

/// Where the request goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// `x-gateway-destination-endpoint`: primary, then fallbacks.
    pub destinations: String,
    /// `x-prefiller-host-port` (sidecar P/D).
    pub prefiller: Option<String>,
    /// Inline P/D: make this call first and give its answer to [`RequestFlow::on_prefill_answer`].
    pub prefill_call: Option<HttpCall>,
    /// `x-envoy-upstream-rq-per-try-timeout-ms` (streamed requests, see `crate::health`).
    pub first_byte_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BodyOutcome {
    Continue,
    Reply(Reply),
    Route(Route),
}

#[derive(Debug, Clone, PartialEq)]
pub enum PrefillOutcome {
    /// Send the request on to its decode pod, with this body if there is one (then fix
    /// `content-length`).
    Resume(Option<Vec<u8>>),
    Reply(Reply),
}

/// The request's prefill as the work board sees it, until its first response byte.
#[derive(Debug, Clone)]
struct Awaiting {
    first: FirstToken,
    /// Handle of the board entry; `None` once its work stopped counting (an inline prefill that
    /// answered).
    pending: Option<u64>,
    routed_at_us: u64,
    /// A streamed response's first byte is its first token: that time teaches the cost model. A
    /// non-streamed one's first byte comes at the end, after the decode.
    learnable: bool,
}

/// Blocks a request taught the index about a pod before the pod accepted it: the blocks past the
/// leading run the index already believed the pod held (those were there before this request and
/// stay). Withdrawn if the answer is not a 2xx; a request with the same prefix routed in between
/// loses them too, until the next observation (the window is one pod's time to refuse).
#[derive(Debug, Clone, Default, PartialEq)]
struct Provisional {
    learned: Vec<Observation>,
}

impl Provisional {
    fn add(&mut self, addr: &str, hashes: &[u64], already_held: usize) {
        let added = hashes.get(already_held..).unwrap_or_default();
        if !added.is_empty() {
            self.learned.push(Observation {
                addr: addr.to_string(),
                hashes: added.to_vec(),
            });
        }
    }

    /// The pod answered 2xx: the observations are final.
    fn confirm(&mut self) {
        self.learned.clear();
    }

    /// Withdraws what was learned about `addr` (every pod with `None`).
    fn withdraw(&mut self, vm: &mut Vm, host: &mut dyn Host, addr: Option<&str>) {
        let (gone, kept) = std::mem::take(&mut self.learned)
            .into_iter()
            .partition(|o| addr.is_none_or(|a| o.addr == a));
        self.learned = kept;
        for observation in gone {
            host.count(Counter::ObservationsWithdrawn, 1);
            vm.withdraw(host, observation);
        }
    }
}

/// One request's state between the host's callbacks.
#[derive(Debug, Default)]
pub struct RequestFlow {
    endpoint: Option<Endpoint>,
    path: String,
    hints: Hints,
    routed_to: Option<String>,
    /// The client asked for the debug header and may have it (`debug_header`).
    debug_wanted: bool,
    debug: Option<String>,
    /// Inline P/D: the client's body (as sent on, without what kvroute owns), waiting for the
    /// prefill pod's answer, and that pod.
    prefill_original: Option<Vec<u8>>,
    prefill_pod: Option<String>,
    /// Inline P/D: the client's headers the prefill call carries (`pd.forward_headers`).
    forwarded: Vec<(String, String)>,
    /// Sidecar P/D: the request was sent to its decode pod with a prefiller, whose part is over
    /// when the decode pod's response headers come (see [`Self::on_response_headers`]).
    sidecar_split: bool,
    awaiting: Option<Awaiting>,
    /// The response's status, once its headers came.
    status: Option<u32>,
    response_ok: bool,
    streamed: bool,
    /// The upstream's response arrived whole (its end of stream passed through this filter).
    response_complete: bool,
    /// Streamed responses: chunks seen, and when the first and last arrived (µs).
    chunks: u32,
    first_chunk_us: u64,
    last_chunk_us: u64,
    /// What the index expects the response's `usage` to report, until it does.
    cache_check: Option<CacheExpectation>,
    carry: Vec<u8>,
    /// What this request taught the index, until the pod accepts it.
    provisional: Provisional,
    /// The request's block hashes, until the upstream that answers is known (Envoy's retries may
    /// have taken it to a fallback).
    hashes: Vec<u64>,
    /// See [`Self::take_rewritten_body`].
    rewritten_body: Option<Vec<u8>>,
    /// The host that answered, as the response headers named it ([`Self::on_upstream`]).
    upstream: Option<String>,
    /// The routed request's metric labels (its primary pod's pool and role, its model).
    labels: RouteLabels,
    /// A Responses API answer the server stores: its opening bytes, until its id is read and
    /// noted (`crate::stored_responses`).
    stored_answer: Option<Vec<u8>>,
}

/// The `pool`, `role` and `model` labels of a routed request's series (see `crate::metrics`).
#[derive(Debug, Default, Clone)]
struct RouteLabels {
    pool: String,
    role: &'static str,
    /// The request's model where some pod serves that name; empty (no label) otherwise, so a
    /// client cannot mint series.
    model: String,
}

impl RouteLabels {
    fn of(vm: &Vm, addr: &str, model: &str) -> RouteLabels {
        let table = vm.router.load_table();
        let pod = table.pods.iter().find(|p| p.addr == addr);
        let served = table
            .pods
            .iter()
            .any(|p| p.serves.iter().any(|s| s == model));
        RouteLabels {
            pool: pod.map(|p| p.pool.clone()).unwrap_or_default(),
            role: metrics::role_label(pod.map_or(Role::Aggregated, |p| p.role)),
            model: if served {
                model.to_string()
            } else {
                String::new()
            },
        }
    }

    fn pairs(&self) -> [(&'static str, &str); 3] {
        [
            (metrics::POOL, self.pool.as_str()),
            (metrics::ROLE, self.role),
            (metrics::MODEL, self.model.as_str()),
        ]
    }
}

/// The body field kvroute owns: the P/D protocol's KV handle (vLLM's KV connectors read it).
const OWNED_BODY_FIELD: &str = "kv_transfer_params";

/// Whether `addr` is a pod of the pools that is not down (a stored response's pod may have left).
fn serving(vm: &Vm, now_ms: u64, addr: &str) -> bool {
    vm.router.load_table().pods.iter().any(|p| {
        p.addr == addr
            && crate::health::health_of(p, now_ms, vm.config.stale_after_ms)
                != crate::health::Health::Down
    })
}

fn too_large_reply(vm: &Vm, host: &mut dyn Host) -> Reply {
    host.count(Counter::BodyTooLarge, 1);
    let message = format!(
        "kvroute: the request body is larger than max_body_bytes ({} bytes); an inference request is read whole to be routed",
        vm.config.max_body_bytes
    );
    Reply::error(ErrorCode::BodyTooLarge, &message)
}

impl RequestFlow {
    pub fn new() -> RequestFlow {
        RequestFlow::default()
    }

    /// `header` reads a request header by (lower-case) name.
    #[allow(clippy::too_many_lines)] // tools/size_allowlist.txt
    pub fn on_request_headers(
        &mut self,
        vm: &Vm,
        host: &mut dyn Host,
        header: &dyn Fn(&str) -> Option<String>,
        end_of_stream: bool,
    ) -> HeadersOutcome {
        if vm.config.pools.is_empty() {
            return HeadersOutcome::Continue; // nothing to route to: kvroute only guards the headers
        }
        let method = header(":method").unwrap_or_default();
        let path = header(":path").unwrap_or_default();
        let peers = &vm.config.peers;
        if method == "GET"
            && peers.serves(&path)
            && peers.admits(header(crate::peers::TOKEN_HEADER).as_deref())
        {
            // Another gateway replica asking where this one placed prefixes. Without the token
            // (when one is set) the path is nothing special: it passes through like any other.
            return HeadersOutcome::Reply(Reply {
                status: 200,
                headers: vec![
                    ("content-type", "application/octet-stream".to_string()),
                    ("cache-control", "no-store".to_string()),
                ],
                body: crate::peers::answer(host, &path, crate::vm::INFLIGHT_ROW_TTL_MS),
            });
        }
        if path.split('?').next() == Some("/metrics") {
            // Passed through, a scrape of the gateway would get one pod's page, a different pod
            // each time: a Prometheus job would mix them into one series.
            return HeadersOutcome::Reply(Reply::error(
                ErrorCode::MetricsNotProxied,
                METRICS_NOT_PROXIED,
            ));
        }
        if method == "GET" {
            let now = host.now_ms();
            let table = vm.router.load_table();
            if let Some(reply) = models::answer(table, &path, now, vm.config.stale_after_ms) {
                return HeadersOutcome::Reply(reply);
            }
        }
        if let Some(id) = crate::stored_responses::id_in_path(parse::without_prefix(
            &path,
            &vm.config.api_path_prefix,
        )) {
            // Retrieve, delete, input items (GET/DELETE) and cancel (POST): on the storing pod.
            let cancel = path
                .split('?')
                .next()
                .is_some_and(|p| p.ends_with("/cancel"));
            if method != "POST" || cancel {
                let addr =
                    crate::stored_responses::lookup(host, id, vm.config.stored_response_ttl_ms)
                        .filter(|addr| serving(vm, host.now_ms(), addr));
                return match addr {
                    Some(addr) => {
                        host.count(Counter::StoredResponsePinned, 1);
                        // Routed from the headers: no prediction, no prompt, no split to log.
                        host.export_decision_field(explain::POD, &addr);
                        host.export_decision_field(
                            explain::REASON,
                            explain::reason_name(RouteReason::StoredResponse),
                        );
                        HeadersOutcome::Route(addr)
                    }
                    None => {
                        host.count(Counter::StoredResponseUnplaced, 1);
                        host.count(Counter::Passthrough, 1);
                        HeadersOutcome::Continue
                    }
                };
            }
        }
        let too_large = header("content-length")
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l > vm.config.max_body_bytes);
        match Endpoint::from_path(&path, &vm.config.api_path_prefix) {
            Some(_) if method == "POST" && too_large => {
                HeadersOutcome::Reply(too_large_reply(vm, host))
            }
            Some(endpoint) if method == "POST" && !end_of_stream => {
                match read_hints(vm, header) {
                    Ok(hints) => self.hints = hints,
                    Err((code, counter, message)) => {
                        log::debug!("{message}");
                        host.count(counter, 1);
                        return HeadersOutcome::Reply(Reply::error(code, &message));
                    }
                }
                self.endpoint = Some(endpoint);
                self.path = parse::without_prefix(&path, &vm.config.api_path_prefix).to_string();
                self.debug_wanted = vm.config.debug_header
                    && vm.config.debug_trigger.as_ref().is_none_or(|trigger| {
                        trigger.admits(header(trigger.header.as_str()).as_deref())
                    });
                if vm.config.pd.mode == PdMode::Inline {
                    self.forwarded = vm
                        .config
                        .pd
                        .forward_headers
                        .iter()
                        .filter_map(|name| Some((name.clone(), header(name)?)))
                        .collect();
                }
                HeadersOutcome::WaitForBody
            }
            _ => {
                host.count(Counter::Passthrough, 1);
                HeadersOutcome::Continue
            }
        }
    }

    /// The body to send instead of the client's, if kvroute had to change it (a client-supplied
    /// `kv_transfer_params` removed); the host writes it and fixes `content-length`.
    pub fn take_rewritten_body(&mut self) -> Option<Vec<u8>> {
        self.rewritten_body.take()
    }

    /// Whether [`Self::on_request_headers`] asked for the body (and it has not come yet).
    pub fn waiting_for_body(&self) -> bool {
        self.endpoint.is_some()
    }

    /// The whole body is here (`body` is `None` when it is larger than `max_body_bytes`): parse,
    /// catch up on what other VMs shared, plan (pure), commit the decision to every concern that
    /// keeps state about it, and answer the host (the steps are in `body_steps`).
    pub fn on_request_body(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        body: Option<&[u8]>,
    ) -> BodyOutcome {
        let Some(endpoint) = self.endpoint.take() else {
            return BodyOutcome::Continue;
        };
        let Some(body) = body.filter(|b| b.len() <= vm.config.max_body_bytes) else {
            return BodyOutcome::Reply(too_large_reply(vm, host));
        };
        let view = match self.read_body(vm, host, endpoint, body) {
            Ok(view) => view,
            Err(outcome) => return *outcome,
        };
        // Inline P/D reads the KV handle from the prefill pod's answer, which vLLM gives for
        // completions and chat; any other request is decoded where it is routed.
        let inline = vm.config.pd.mode == PdMode::Inline;
        let split_inline = inline && endpoint.splits_inline();
        let original =
            split_inline.then(|| self.rewritten_body.clone().unwrap_or_else(|| body.to_vec()));
        vm.sync_pages(host);
        let now = host.now_ms();
        let board = vm.read_inflight_board(host, now);
        let mut planned = match self.plan_request(vm, host, &view, now, inline && !split_inline) {
            Ok(planned) => planned,
            Err(outcome) => return *outcome,
        };
        self.count_routed(vm, host, &view, endpoint, &planned);
        let (route, prefill_pod) = self.commit(vm, host, &view, &mut planned, (now, board));
        match prefill_pod {
            Some(prefill) => self.start_split(vm, host, route, planned, prefill, original),
            None => BodyOutcome::Route(route),
        }
    }

    /// The router's plan; `decode_only`: without a prefill pod (a split this request cannot take).
    fn plan(
        &self,
        vm: &Vm,
        model: &str,
        blocks: &crate::router::Blocks,
        now: u64,
        decode_only: bool,
    ) -> Plan {
        let mut plan = vm.router.plan(&vm.config, model, blocks, self.hints, now);
        if decode_only {
            if let Some(pd) = plan.pd.as_mut() {
                pd.prefill = None;
            }
        }
        plan
    }

    fn refuse(
        &mut self,
        vm: &Vm,
        host: &mut dyn Host,
        rejection: Rejection,
        model: &str,
    ) -> BodyOutcome {
        let code = match rejection {
            Rejection::Saturated => ErrorCode::Saturated,
            Rejection::SloUnattainable => ErrorCode::SloUnattainable,
            Rejection::UnknownModel => ErrorCode::UnknownModel,
            Rejection::NoneHealthy | Rejection::NoneKnownYet => ErrorCode::NoHealthyPod,
            Rejection::NoPods => ErrorCode::NoPods,
        };
        if matches!(code, ErrorCode::Saturated | ErrorCode::SloUnattainable) {
            // Shedding is what the client's priority asked for: never failed open.
            host.count(Counter::Shed, 1);
            let message = format!(
                "kvroute: {} (model `{model}`, priority {})",
                rejection.as_str(),
                self.hints.priority
            );
            return BodyOutcome::Reply(Reply::error(code, &message));
        }
        host.count(Counter::NoEndpoint, 1);
        if vm.config.on_no_endpoint == NoEndpointPolicy::Passthrough {
            return BodyOutcome::Continue;
        }
        let message = format!("kvroute: {} (model `{model}`)", rejection.as_str());
        BodyOutcome::Reply(Reply::error(code, &message))
    }

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

    /// The host Envoy sent the request to, as its response headers arrive. Another than the
    /// primary means the primary refused or failed it and a retry took it to a fallback: what the
    /// request taught the index moves to the host that answered, and neither its `usage` nor its
    /// first byte says anything about the primary.
    pub fn on_upstream(&mut self, vm: &mut Vm, host: &mut dyn Host, upstream: &str) {
        let Some(primary) = self.routed_to.clone() else {
            return;
        };
        self.upstream = Some(upstream.to_string());
        let hashes = std::mem::take(&mut self.hashes);
        if upstream == primary || hashes.is_empty() {
            return;
        }
        log::debug!("kvroute: {primary} did not serve the request; {upstream} did");
        self.provisional.withdraw(vm, host, Some(&primary));
        self.cache_check = None;
        if let Some(a) = self.awaiting.as_mut() {
            a.learnable = false;
        }
        let Some(slot) = vm.router.slot_of(upstream) else {
            return;
        };
        let held = vm
            .router
            .index()
            .match_lengths(&hashes, crate::prefix::index::MAX_SLOTS)
            .get(slot)
            .copied()
            .unwrap_or(0);
        self.provisional.add(upstream, &hashes, held);
        vm.observe(
            host,
            Observation {
                addr: upstream.to_string(),
                hashes,
            },
        );
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
            self.settle_observations(vm, host);
            self.response_complete = end_of_stream;
            if std::mem::take(&mut self.sidecar_split) {
                self.prefill_pod_done(vm, host);
            }
            if end_of_stream || !self.response_ok {
                self.first_byte(vm, host);
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
    fn prefill_pod_done(&mut self, vm: &mut Vm, host: &mut dyn Host) {
        if let Some(id) = self.awaiting.as_mut().and_then(|a| a.pending.take()) {
            let now = host.now_ms();
            if vm.router.prefill_done(id, now) {
                vm.write_inflight_row(host, now);
            }
        }
    }

    /// A 2xx makes what the index learned final; anything else withdraws it.
    fn settle_observations(&mut self, vm: &mut Vm, host: &mut dyn Host) {
        if self.response_ok {
            self.provisional.confirm();
        } else {
            self.provisional.withdraw(vm, host, None);
        }
    }

    /// Whether the next response chunk's bytes are wanted (to read `usage`); the host copies a
    /// chunk out only then.
    pub fn wants_response_bytes(&self) -> bool {
        (self.cache_check.is_some() || self.stored_answer.is_some()) && self.response_ok
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
        if self.awaiting.is_some() && (size > 0 || end_of_stream) {
            self.first_byte(vm, host);
        }
        self.response_complete |= end_of_stream;
        if let Some(bytes) = bytes {
            self.note_stored_answer(host, bytes);
            if self.cache_check.is_some() {
                self.read_usage(vm, host, bytes);
            }
        }
        if self.streamed && size > 0 {
            let now = host.now_us();
            if self.chunks == 0 {
                self.first_chunk_us = now;
            }
            self.last_chunk_us = now;
            self.chunks = self.chunks.saturating_add(1);
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
        // Reset, timeout or a local reply before any response byte: the prefill stops counting,
        // and teaches nothing.
        let completed = self.response_ok;
        self.response_ok = false;
        self.first_byte(vm, host);
        let Some(addr) = self.routed_to.take() else {
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
        vm.record_verdicts(verdicts);
        if completed && self.chunks >= 3 {
            let span_us = self.last_chunk_us.saturating_sub(self.first_chunk_us);
            let itl_ms = span_us as f64 / 1e3 / f64::from(self.chunks - 1);
            vm.router.observe_itl(&addr, itl_ms);
        }
        vm.router.inflight_end(&addr);
        let now = host.now_ms();
        vm.write_inflight_row(host, now);
    }

    /// The first response byte (or the end of a response without one): the prefill is done; a
    /// streamed 2xx teaches the pod's cost model.
    ///
    /// The work board hears of the prefill's end at once, streamed or not. Leaving a whole
    /// response's prefill end for `on_done` (one board write fewer) was tried and undone: Envoy
    /// runs `on_log` after the client may already have the response, so a client's next request,
    /// taken by another worker, still saw the finished prefill queued on its pod and was sent
    /// elsewhere (`envoy_routing::tiktoken_mode_routes_like_chars_mode` failed in CI that way).
    fn first_byte(&mut self, vm: &mut Vm, host: &mut dyn Host) {
        let Some(awaiting) = self.awaiting.take() else {
            return;
        };
        let now = host.now_ms();
        let changed = awaiting
            .pending
            .is_some_and(|id| vm.router.prefill_done(id, now));
        if awaiting.learnable && self.response_ok {
            let observed_ms = host.now_us().saturating_sub(awaiting.routed_at_us) as f64 / 1e3;
            vm.learn(&awaiting.first, observed_ms);
            let labels = self.labels.pairs();
            host.histogram_in(Histogram::TtftMs, &labels, observed_ms as u64);
            host.histogram_in(
                Histogram::TtftPredictedMs,
                &labels,
                awaiting.first.predicted_ms.max(0.0) as u64,
            );
            if self.hints.slo.ttft_ms.is_some_and(|slo| observed_ms > slo) {
                host.count(Counter::SloTtftMissed, 1);
            }
            if observed_ms > 0.0 {
                let error = (awaiting.first.predicted_ms - observed_ms).abs() / observed_ms;
                host.histogram(Histogram::TtftPredictionErrorPct, (error * 100.0) as u64);
            }
        }
        if changed {
            vm.write_inflight_row(host, now);
        }
    }

    /// A stored Responses answer: reads its id from its opening bytes and notes the pod that
    /// answered as the one storing it.
    fn note_stored_answer(&mut self, host: &mut dyn Host, chunk: &[u8]) {
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

    /// Looks for the response's `usage` in this chunk (and the end of the last one); once found,
    /// checks the index's expectation against it.
    fn read_usage(&mut self, vm: &mut Vm, host: &mut dyn Host, chunk: &[u8]) {
        self.carry.extend_from_slice(chunk);
        let Some((cached, prompt)) = crate::protocol::usage::cache_report(&self.carry) else {
            let keep = self.carry.len().saturating_sub(CARRY_BYTES);
            self.carry.drain(..keep);
            return;
        };
        self.carry = Vec::new();
        let Some(expected) = self.cache_check.take() else {
            return;
        };
        if !crate::protocol::usage::plausible(cached, prompt) {
            let pod = expected.addr.as_str();
            log::debug!(
                "kvroute: {pod} reported {cached} of {prompt} tokens cached: impossible, ignored"
            );
            let labels = [
                (metrics::POOL, self.labels.pool.as_str()),
                (metrics::ROLE, self.labels.role),
                (metrics::POD, pod),
            ];
            host.count_in(Counter::PodReportedImplausible, &labels, 1);
            return;
        }
        let share = expected.matched_blocks as f64 / expected.total_blocks.max(1) as f64;
        let labels = self.labels.pairs();
        host.count_in(
            Counter::CachePredictedTokens,
            &labels,
            (share.min(1.0) * prompt as f64) as u64,
        );
        host.count_in(Counter::CacheReportedTokens, &labels, cached);
        if let CacheVerdict::Evicted { kept, lost } =
            vm.router.on_cache_report(&expected, cached, prompt)
        {
            log::debug!(
                "kvroute: {} reported {cached} of {prompt} tokens cached, the index expected more; it keeps about {kept} blocks",
                expected.addr
            );
            host.count(Counter::CacheEvictionsDetected, 1);
            vm.report_eviction(host, expected.addr.clone(), lost);
        }
    }
}

/// The session, priority and SLO headers, when configured and present. An unreadable value is
/// refused with its code, counter and message.
fn read_hints(
    vm: &Vm,
    header: &dyn Fn(&str) -> Option<String>,
) -> Result<Hints, (ErrorCode, Counter, String)> {
    let config = &vm.config;
    let named = |name: &Option<HeaderName>| name.as_ref().and_then(|n| header(n.as_str()));
    let session = named(&config.session.header)
        .filter(|id| !id.is_empty())
        .map(|id| session_key(&id));
    let priority = match named(&config.shedding.priority_header) {
        Some(value) => parse_priority(&value).map_err(|reason| {
            (
                ErrorCode::BadPriority,
                Counter::BadPriority,
                format!(
                    "kvroute: header `{}` {reason}",
                    config
                        .shedding
                        .priority_header
                        .as_ref()
                        .map_or("", HeaderName::as_str)
                ),
            )
        })?,
        None => 0,
    };
    let objective =
        |name: &Option<HeaderName>| -> Result<Option<f64>, (ErrorCode, Counter, String)> {
            named(name)
                .map(|value| {
                    parse_objective(&value).map_err(|reason| {
                        (
                            ErrorCode::BadSlo,
                            Counter::BadSlo,
                            format!(
                                "kvroute: header `{}` {reason}",
                                name.as_ref().map_or("", HeaderName::as_str)
                            ),
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
        stored_at: None,
    })
}
