//! The HTTP filter: strips client-supplied routing headers, buffers inference request bodies, asks
//! the router for a pod and writes `x-gateway-destination-endpoint`. Everything it does not
//! understand continues untouched to the cluster's own load balancer.

use super::root::Vm;
use super::stats::Counter;
use crate::config::{NoEndpointPolicy, Role};
use crate::headers::{DEBUG, DESTINATION, OWNED_REQUEST_HEADERS};
use crate::request::{self, Endpoint};
use crate::router::Router;
use crate::scheduler::{Decision, Rejection, RouteReason};
use crate::state::messages::Observation;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::cell::RefCell;
use std::rc::Rc;

pub struct Filter {
    vm: Option<Rc<RefCell<Vm>>>,
    endpoint: Option<Endpoint>,
    routed_to: Option<String>,
    debug: Option<String>,
}

impl Filter {
    pub fn new(vm: Option<Rc<RefCell<Vm>>>) -> Filter {
        Filter {
            vm,
            endpoint: None,
            routed_to: None,
            debug: None,
        }
    }

    fn request_header(name: &str) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
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
        if vm.router.load_table().version == 0 {
            // No pool state yet (the first poll has not been published): let the cluster balance
            // rather than fail requests while kvroute starts.
            vm.stats.inc(Counter::Passthrough);
            return Action::Continue;
        }
        let now = super::now_ms();
        let blocks = Router::blocks(&vm.config, &view, vm.tokenizer.as_deref());
        match vm
            .router
            .route(&vm.config, &view.model, Role::Aggregated, &blocks, now)
        {
            Decision::Route { ranked, reason } => {
                let header: Vec<&str> = ranked.iter().map(|c| c.addr.as_str()).collect();
                if hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    DESTINATION,
                    Some(&header.join(",")),
                )
                .is_err()
                {
                    log::warn!(
                        "kvroute: could not set {DESTINATION}; leaving the request to the cluster"
                    );
                    vm.stats.inc(Counter::Passthrough);
                    return Action::Continue;
                }
                let Some(primary) = ranked.first() else {
                    return Action::Continue;
                };
                vm.stats.inc(Counter::Routed);
                vm.stats.inc(match reason {
                    RouteReason::PrefixHit => Counter::RoutedPrefixHit,
                    RouteReason::Load => Counter::RoutedLoad,
                });
                if vm.config.debug_header {
                    let s = &primary.scores;
                    self.debug = Some(format!(
                        "pod={}; reason={}; matched_blocks={}/{}; score={:.3}; prefix={:.3}; queue={:.3}; kv={:.3}; inflight={:.3}; capped={}; fallbacks={}; vm={:x}; page={}; pods={}; entries={}; longest={}",
                        primary.addr,
                        if reason == RouteReason::PrefixHit { "prefix" } else { "load" },
                        primary.matched_blocks,
                        blocks.hashes.len(),
                        s.total,
                        s.prefix,
                        s.queue,
                        s.kv_cache,
                        s.inflight,
                        s.capped,
                        header.get(1..).map(|f| f.join(",")).unwrap_or_default(),
                        vm.id(),
                        vm.router.applied_page,
                        vm.router.load_table().pods.len(),
                        vm.router.index_entries(),
                        vm.router
                            .longest_holder(&blocks.hashes)
                            .map(|(a, n)| format!("{a}/{n}"))
                            .unwrap_or_default(),
                    ));
                }
                vm.router.inflight_start(&primary.addr);
                self.routed_to = Some(primary.addr.clone());
                vm.observe(Observation {
                    addr: primary.addr.clone(),
                    hashes: blocks.hashes,
                });
                Action::Continue
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
                let body = serde_json::json!({"error": {
                    "message": format!("kvroute: {} (model `{}`)", rejection.as_str(), view.model),
                    "type": kind, "param": null, "code": status}});
                let _ = hostcalls::send_http_response(
                    status,
                    vec![
                        ("content-type", "application/json"),
                        ("x-kvroute-error", rejection.as_str()),
                    ],
                    Some(body.to_string().as_bytes()),
                );
                Action::Pause
            }
        }
    }
}

impl Context for Filter {}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let spoofed = OWNED_REQUEST_HEADERS
            .iter()
            .filter(|h| Self::request_header(h).is_some())
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
        let method = Self::request_header(":method").unwrap_or_default();
        let endpoint = Self::request_header(":path").and_then(|p| Endpoint::from_path(&p));
        let too_large = Self::request_header("content-length")
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l > vm.config.max_body_bytes);
        match endpoint {
            Some(ep) if method == "POST" && !too_large && !end_of_stream => {
                self.endpoint = Some(ep);
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

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(debug) = &self.debug {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, DEBUG, Some(debug));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let (Some(addr), Some(vm)) = (self.routed_to.take(), &self.vm) {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                vm.router.inflight_end(&addr);
            }
        }
    }
}
