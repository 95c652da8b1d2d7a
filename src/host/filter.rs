//! The HTTP filter's callbacks: strip client-supplied routing headers, then hand each step of the
//! request to `crate::flow::RequestFlow` and carry out what it returns (pause or continue, a local
//! reply, the destination and prefiller headers, the inline prefill call and the rewritten body).

use super::abi;
use super::node::Node;
use crate::flow::{BodyChunk, BodyOutcome, HeadersOutcome, PrefillOutcome, Reply, RequestFlow};
use crate::headers::{
    DESTINATION, OWNED_REQUEST_HEADERS, PER_TRY_TIMEOUT, PREFILLER, PREFILLER_TIMEOUT,
};
use crate::metrics::{Counter, Histogram};
use crate::port::Host;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::cell::RefCell;
use std::rc::Rc;

pub struct Filter {
    node: Option<Rc<RefCell<Node>>>,
    flow: RequestFlow,
    /// The inline prefill call under way, and the body length it will replace.
    prefill_token: Option<u32>,
    body_len: usize,
    /// Flow control holds the request, paused, until `super::held` releases it.
    held: bool,
}

fn set_request_header(name: &str, value: &str) -> bool {
    abi::set_header(MapType::HttpRequestHeaders, name, value)
}

/// A string attribute of the stream (Envoy's `upstream.address`, `response.code_details`).
fn property(path: &[&str]) -> Option<String> {
    String::from_utf8(abi::property(path)?).ok()
}

pub(super) fn send(reply: &Reply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    if !abi::send_response(reply.status, &headers, &reply.body) {
        log::warn!("kvroute: Envoy refused the local reply {}", reply.status);
    }
}

fn resume() {
    if !abi::resume_request() {
        log::warn!("kvroute: Envoy refused to resume a paused request");
    }
}

impl Filter {
    pub fn new(node: Option<Rc<RefCell<Node>>>, context_id: u32) -> Filter {
        Filter {
            node,
            flow: RequestFlow::for_context(context_id),
            prefill_token: None,
            body_len: 0,
            held: false,
        }
    }

    /// Whether flow control holds the request (paused after its body).
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Flow control releases the held request (the host's calls already act on its stream, see
    /// `super::held`): it is planned again and routed, answered or passed on and resumed — `true`
    /// — or, every pod still full, stays held — `false`.
    pub fn release(&mut self) -> bool {
        self.held = false;
        let action = self.timed(Histogram::PhaseRequestBodyUs, Filter::route_body);
        if self.held {
            return false;
        }
        if action == Action::Continue {
            resume();
        }
        true
    }

    /// The whole body is buffered (`self.body_len` bytes): route it and carry out the outcome.
    fn route_body(&mut self) -> Action {
        let body_size = self.body_len;
        let outcome = self.with_node(|flow, node| {
            let Node { vm, host } = node;
            let started_us = host.now_us();
            // Oversize bodies are never copied out of the host.
            let keep = !flow.discarding_body() && body_size <= vm.config.max_body_bytes;
            let body = keep.then(|| {
                abi::buffer(BufferType::HttpRequestBody, 0, body_size).unwrap_or_default()
            });
            let outcome = flow.on_request_body(vm, host, body.as_deref());
            let spent_us = host.now_us().saturating_sub(started_us);
            host.histogram(Histogram::DecisionUs, spent_us);
            outcome
        });
        if let Some(body) = self.flow.take_rewritten_body() {
            self.write_body(&body);
        }
        match outcome {
            Some(BodyOutcome::Reply(reply)) => {
                send(&reply);
                Action::Pause
            }
            Some(BodyOutcome::Hold) => {
                self.held = true;
                Action::Pause
            }
            Some(BodyOutcome::Route(route)) => {
                if !set_request_header(DESTINATION, &route.destinations) {
                    log::warn!("kvroute: could not set {DESTINATION}; the cluster balances it");
                }
                if let Some(prefiller) = &route.prefiller {
                    set_request_header(PREFILLER, prefiller);
                    if let Some(ms) = self.flow.prefill_bound_ms() {
                        set_request_header(PREFILLER_TIMEOUT, &ms.to_string());
                    }
                }
                if let Some(ms) = route.first_byte_timeout_ms {
                    set_request_header(PER_TRY_TIMEOUT, &ms.to_string());
                }
                let Some(call) = route.prefill_call else {
                    return Action::Continue;
                };
                let token = self
                    .with_node(|_, node| node.host.http_call(&call))
                    .flatten();
                match token {
                    Some(token) => {
                        self.prefill_token = Some(token);
                        Action::Pause
                    }
                    None => {
                        self.with_node(|flow, node| flow.on_prefill_not_sent(&mut node.host));
                        Action::Continue
                    }
                }
            }
            _ => Action::Continue,
        }
    }

    /// Replaces the buffered request body (and its `content-length`, when it has one).
    fn write_body(&mut self, body: &[u8]) -> bool {
        let written = abi::set_buffer(BufferType::HttpRequestBody, 0, self.body_len, body);
        if written {
            self.body_len = body.len();
            if abi::header(MapType::HttpRequestHeaders, "content-length").is_some() {
                set_request_header("content-length", &body.len().to_string());
            }
        }
        written
    }

    /// Runs `callback`, and with `phase_timing` on records its time, entry to return, in `phase`.
    fn timed<T>(&mut self, phase: Histogram, callback: impl FnOnce(&mut Self) -> T) -> T {
        let on = self
            .node
            .as_ref()
            .and_then(|n| n.try_borrow().ok().map(|n| n.vm.config.phase_timing))
            .unwrap_or(false);
        if !on {
            return callback(self);
        }
        let started_us = super::now_us();
        let out = callback(self);
        let spent_us = super::now_us().saturating_sub(started_us);
        self.with_node(|_, node| node.host.histogram(phase, spent_us));
        out
    }

    /// Runs `step` with this VM's state and host port; `None` when the VM is busy (re-entrance)
    /// or has no configuration.
    fn with_node<T>(&mut self, step: impl FnOnce(&mut RequestFlow, &mut Node) -> T) -> Option<T> {
        let node = self.node.clone()?;
        let mut node = node.try_borrow_mut().ok()?;
        Some(step(&mut self.flow, &mut node))
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
        if self.prefill_token.take_if(|t| *t == token_id).is_none() {
            return;
        }
        let (status, answer) = super::call_response(body_size);
        let outcome = self.with_node(|flow, node| {
            let Node { vm, host } = node;
            flow.on_prefill_answer(vm, host, status, &answer)
        });
        match outcome {
            Some(PrefillOutcome::Reply(reply)) => send(&reply),
            Some(PrefillOutcome::Resume(Some(body))) => {
                if !self.write_body(&body) {
                    self.with_node(|flow, node| flow.on_body_not_rewritten(&mut node.host));
                }
                resume();
            }
            // A busy or unconfigured VM (`None`) must not leave the request paused either.
            _ => resume(),
        }
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.timed(Histogram::PhaseRequestHeadersUs, |f| {
            f.request_headers(end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.flow.waiting_for_body() {
            return Action::Continue;
        }
        let chunk = self
            .with_node(|flow, node| flow.on_body_chunk(&node.vm, body_size))
            .unwrap_or(BodyChunk::Keep);
        self.body_len = body_size;
        if chunk != BodyChunk::Keep {
            // Emptied, Envoy's buffer never reaches its own limit (its 413 would come while the
            // client is still sending, as a reset).
            if body_size > 0 && abi::set_buffer(BufferType::HttpRequestBody, 0, body_size, &[]) {
                self.body_len = 0;
            }
        }
        if !end_of_stream && chunk != BodyChunk::AnswerNow {
            return Action::Pause; // Envoy buffers until the whole body is here (or trailers come)
        }
        self.timed(Histogram::PhaseRequestBodyUs, Filter::route_body)
    }

    /// A body that ends in trailers (HTTP/2, gRPC-style clients) is complete here.
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if !self.flow.waiting_for_body() {
            return Action::Continue;
        }
        self.timed(Histogram::PhaseRequestBodyUs, Filter::route_body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.timed(Histogram::PhaseResponseHeadersUs, |f| {
            f.response_headers(end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.timed(Histogram::PhaseResponseBodyUs, |f| {
            f.response_body(body_size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        self.timed(Histogram::PhaseLogUs, Filter::log);
    }
}

/// The callbacks' bodies (timed by [`Filter::timed`]).
impl Filter {
    fn request_headers(&mut self, end_of_stream: bool) -> Action {
        // All of them in one host call, then looked up here: kvroute reads up to a dozen names
        // (its own four to strip, method, path, length, the hint headers), and a host call per
        // name made this phase ~5 µs slower at p50 (`make bench-phases`: 32 against 27 µs).
        // Values are bytes; one that is not UTF-8 reads as absent (`crate::headermap`).
        let serialised = abi::header_map(MapType::HttpRequestHeaders).unwrap_or_default();
        let headers = crate::headermap::decode(&serialised).unwrap_or_default();
        let header = |name: &str| crate::headermap::find(&headers, name).map(str::to_string);
        let spoofed = OWNED_REQUEST_HEADERS
            .iter()
            .filter(|h| crate::headermap::has(&headers, h))
            .filter(|h| abi::remove_header(MapType::HttpRequestHeaders, h))
            .count();
        let outcome = self.with_node(|flow, node| {
            if spoofed > 0 {
                node.host.count(Counter::SpoofedHeadersRemoved, 1);
            }
            let trigger = node.vm.config.debug_trigger.as_ref();
            if let Some(trigger) = trigger.filter(|t| header(t.header.as_str()).is_some()) {
                super::decision::strip_debug_trigger(trigger.header.as_str());
            }
            flow.on_request_headers(&node.vm, &mut node.host, &header, end_of_stream)
        });
        match outcome {
            Some(HeadersOutcome::WaitForBody) => Action::Pause, // needs allow_on_headers_stop_iteration
            Some(HeadersOutcome::Reply(reply)) => {
                send(&reply);
                Action::Pause
            }
            Some(HeadersOutcome::Route(pod)) => {
                if !set_request_header(DESTINATION, &pod) {
                    log::warn!("kvroute: could not set {DESTINATION}; the cluster balances it");
                }
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn response_headers(&mut self, end_of_stream: bool) -> Action {
        let status = abi::header(MapType::HttpResponseHeaders, ":status")
            .and_then(|s| String::from_utf8(s).ok());
        // The host that answered, after Envoy's retries (absent for a local reply).
        let upstream = property(&["upstream", "address"]);
        let debug = self
            .with_node(|flow, node| {
                let Node { vm, host } = node;
                if let Some(upstream) = &upstream {
                    flow.on_upstream(vm, host, upstream);
                }
                flow.on_response_headers(vm, host, status.as_deref(), end_of_stream)
            })
            .flatten();
        if let Some((name, value)) = debug {
            abi::set_header(MapType::HttpResponseHeaders, name, &value);
        }
        Action::Continue
    }

    fn response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let bytes = (self.flow.wants_response_bytes() && body_size > 0)
            .then(|| abi::buffer(BufferType::HttpResponseBody, 0, body_size))
            .flatten();
        self.with_node(|flow, node| {
            let Node { vm, host } = node;
            flow.on_response_body(vm, host, body_size, bytes.as_deref(), end_of_stream)
        });
        Action::Continue
    }

    fn log(&mut self) {
        let (upstream, details) = if self.flow.wants_end() {
            let upstream = if self.flow.knows_upstream() {
                None
            } else {
                property(&["upstream", "address"])
            };
            let details = self
                .flow
                .wants_end_details()
                .then(|| property(&["response", "code_details"]))
                .flatten();
            (upstream, details)
        } else {
            (None, None)
        };
        self.with_node(|flow, node| {
            let Node { vm, host } = node;
            flow.on_done(vm, host, upstream, details)
        });
    }
}
