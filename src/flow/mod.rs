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
//!    the blocks this request added, in every VM (`affinity::AffinityLeg`).
//! 5. [`RequestFlow::on_done`]: whatever is still counted stops counting.
//!
//! Files: `headers_step` (1), `body_steps` (2, the steps of the orchestrator here), `inline_pd`
//! (3), `response` (4 and 5); `affinity` (prefix affinity's hooks: what the index learns when a
//! request is routed, provisionally until the pod accepts it, and the check against `usage`),
//! `reply` (kvroute's own answers), `explain` (the debug line and the decision's filter state),
//! `models` (`GET /v1/models`).

mod affinity;
mod body_steps;
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod decision_tests;
mod explain;
mod headers_step;
mod held;
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod held_tests;
mod inline_pd;
pub mod models;
#[cfg(test)]
mod pd_leg_tests;
mod reply;
mod response;
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests;

use crate::common::{HeaderName, NoEndpointPolicy, Role};
use crate::cost::ItlTimer;
use crate::headers::DEBUG;
use crate::health::{RequestEnd, Verdict};
use crate::metrics::{self, Counter, Histogram};
use crate::pd::inline::{self, Answer};
use crate::pd::PdMode;
use crate::port::{Host, HttpCall};
use crate::protocol::parse::{self, Endpoint};
use crate::router::{FirstToken, Plan};
use crate::scheduler::saturation::parse_priority;
use crate::scheduler::session::session_key;
use crate::scheduler::slo::{parse_objective, Slo};
use crate::scheduler::{Hints, Rejection, RouteReason};
use crate::vm::Vm;
use affinity::AffinityLeg;
use explain::PdExport;
pub use held::{next_release, Release};
use inline_pd::SplitLeg;
pub use reply::{ErrorCode, Reply};

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
    /// `x-envoy-upstream-rq-per-try-timeout-ms`: the first-byte bound (see `crate::health`) of
    /// a stream, or of a non-streamed request's whole answer (`body_steps::whole_answer_timeout`).
    pub first_byte_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BodyOutcome {
    Continue,
    Reply(Reply),
    Route(Route),
    /// Flow control holds it: keep it paused until the host releases it ([`next_release`]).
    Hold,
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
    /// The pod's restarts as seen when the request was routed: one seen since means the first
    /// byte timed a recompute the prediction priced as whatever the old process held, which
    /// teaches the cost fit nothing true (the histograms still count it: it is what happened).
    restarts: u32,
}

/// One request's state between the host's callbacks.
#[derive(Debug, Default)]
pub struct RequestFlow {
    endpoint: Option<Endpoint>,
    path: String,
    hints: Hints,
    /// When the request's headers reached this filter: the start of the client's first-token
    /// objective (a request held by flow control waits after this, before it is routed).
    arrived_us: u64,
    routed_to: Option<String>,
    /// The client asked for the debug header and may have it (`debug_header`).
    debug_wanted: bool,
    debug: Option<String>,
    /// P/D's prefill leg, where the request is split (`inline_pd`).
    split: SplitLeg,
    awaiting: Option<Awaiting>,
    /// The response's status, once its headers came.
    status: Option<u32>,
    response_ok: bool,
    streamed: bool,
    /// The upstream's response arrived whole (its end of stream passed through this filter).
    response_complete: bool,
    /// The request stopped counting as in flight on its pod (`response::end_inflight`).
    inflight_ended: bool,
    /// Streamed responses: their chunks, timed (the pod's inter-token latency).
    itl: ItlTimer,
    /// Prefix affinity's part: the index's expectation, what it learned provisionally.
    affinity: AffinityLeg,
    /// See [`Self::take_rewritten_body`].
    rewritten_body: Option<Vec<u8>>,
    /// The host that answered, as the response headers named it ([`Self::on_upstream`]).
    upstream: Option<String>,
    /// The routed request's metric labels (its primary pod's pool and role, its model).
    labels: RouteLabels,
    /// A Responses API answer the server stores: its opening bytes, until its id is read and
    /// noted (`crate::stored_responses`).
    stored_answer: Option<Vec<u8>>,
    /// The body is past `max_body_bytes` (announced or grown): read to its end and dropped, then
    /// answered 413; and how much of it was dropped.
    discarding: bool,
    discarded: usize,
    /// The host's handle for this request (its HTTP context): what flow control's queue holds.
    context: u32,
    /// Flow control's part: the request's flow, and since when it is held.
    held: held::HeldLeg,
}

/// What the host does with the request body buffered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyChunk {
    /// Keep buffering it: it may be routed.
    Keep,
    /// Drop it and read on: the body is past `max_body_bytes`, its 413 waits for its end.
    Drop,
    /// Drop it and answer 413 now: too much has been read for nothing.
    AnswerNow,
}

/// How much past `max_body_bytes` a body is read and dropped before its 413 is sent. Sent while
/// the client is still writing, Envoy's reply ends its HTTP/1 connection with unread bytes in it,
/// and the client sees a reset instead of the 413 (measured on Envoy 1.40 with a 9 MiB body);
/// past this the client has only itself to blame.
const DISCARD_LIMIT_BYTES: usize = 64 << 20;

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

    /// The P/D counters' labels: these and why the request was or was not split.
    fn with_pd_reason(&self, reason: crate::pd::PdReason) -> [(&'static str, &str); 4] {
        let [pool, role, model] = self.pairs();
        [pool, role, model, (metrics::REASON, reason.as_str())]
    }
}

/// The body field kvroute owns: the P/D protocol's KV handle (vLLM's KV connectors read it).
const OWNED_BODY_FIELD: &str = "kv_transfer_params";

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

    /// The flow of the request the host knows as `context`.
    pub fn for_context(context: u32) -> RequestFlow {
        RequestFlow {
            context,
            ..RequestFlow::default()
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

    /// The host has buffered `buffered` bytes of an awaited body (since it last dropped some):
    /// keep them, or drop them because the body is past `max_body_bytes` (announced so by its
    /// `content-length` or grown past it), reading on to answer 413 at its end.
    pub fn on_body_chunk(&mut self, vm: &Vm, buffered: usize) -> BodyChunk {
        if !self.discarding && buffered <= vm.config.max_body_bytes {
            return BodyChunk::Keep;
        }
        self.discarding = true;
        self.discarded = self.discarded.saturating_add(buffered);
        if self.discarded > vm.config.max_body_bytes.saturating_add(DISCARD_LIMIT_BYTES) {
            BodyChunk::AnswerNow
        } else {
            BodyChunk::Drop
        }
    }

    /// Whether the body is being dropped (see [`Self::on_body_chunk`]).
    pub fn discarding_body(&self) -> bool {
        self.discarding
    }

    /// The whole body is here (`body` is `None` when it is larger than `max_body_bytes`): parse,
    /// catch up on what other VMs shared, plan (pure), commit the decision to every concern that
    /// keeps state about it, and answer the host (the steps are in `body_steps`). Called again
    /// for a held request each time the host releases it (`held`).
    pub fn on_request_body(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        body: Option<&[u8]>,
    ) -> BodyOutcome {
        let outcome = self.route_body(vm, host, body);
        if outcome != BodyOutcome::Hold {
            let now = host.now_ms();
            self.leave_queue(vm, host, now);
        }
        outcome
    }

    fn route_body(&mut self, vm: &mut Vm, host: &mut dyn Host, body: Option<&[u8]>) -> BodyOutcome {
        let Some(endpoint) = self.endpoint.take() else {
            return BodyOutcome::Continue;
        };
        let body = body.filter(|b| !self.discarding && b.len() <= vm.config.max_body_bytes);
        let Some(body) = body else {
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
        let decode_only = inline && !split_inline;
        let (mut planned, board) =
            match self.plan_unless_held(vm, host, (&view, endpoint), now, decode_only) {
                Ok(planned) => planned,
                Err(outcome) => return *outcome,
            };
        self.count_routed(vm, host, &view, endpoint, &planned);
        let (route, prefill_pod) = self.commit(vm, host, &view, &mut planned, (now, board));
        match prefill_pod {
            Some(prefill) => {
                let outcome = self.start_split(vm, host, route, planned, prefill.clone(), original);
                self.bound_prefill_leg(vm, host, outcome, prefill)
            }
            None => BodyOutcome::Route(route),
        }
    }

    /// The router's plan; `decode_only`: without a prefill pod (a split this request cannot take).
    /// A long prompt whose split lost on cost is split anyway when this VM's probe is due
    /// (`crate::pd::SplitClock`).
    fn plan(
        &mut self,
        vm: &Vm,
        model: &str,
        blocks: &crate::router::Blocks,
        now: u64,
        decode_only: bool,
    ) -> Plan {
        let waited_ms = now.saturating_sub(self.arrived_us / 1000) as f64;
        let hints = Hints {
            slo: self.hints.slo.after(waited_ms),
            ..self.hints
        };
        let mut plan = vm.router.plan(&vm.config, model, blocks, hints, now);
        self.split.probing = false;
        if let Some(pd) = plan.pd.as_mut() {
            if decode_only {
                pd.prefill = None;
            } else if pd.uncached_tokens >= crate::pd::PROBE_MIN_TOKENS
                && vm
                    .split_clock
                    .probe_due(now, vm.config.pd.probe_interval_ms)
            {
                if let Some(probe) = pd.probe.take() {
                    pd.prefill = Some(probe);
                    pd.outcome = crate::pd::PdOutcome::Disaggregated;
                    pd.reason = crate::pd::PdReason::Probe;
                    self.split.probing = true;
                }
            }
        }
        plan
    }

    /// What the filter sets in `x-prefiller-timeout-ms` (a sidecar split's prefill bound).
    pub fn prefill_bound_ms(&self) -> Option<u64> {
        self.split.bound_ms
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
            // Every pod is full: flow control holds it (`held`).
            Rejection::Full => return BodyOutcome::Hold,
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
}
