//! Step 1 of a request: its headers (see the module map in `super`).

use super::*;

/// Why `GET /metrics` through the gateway is refused, and where to scrape instead.
const METRICS_NOT_PROXIED: &str = "kvroute: /metrics is not proxied to a model server: through the gateway it would be a different pod's page on every scrape. Scrape each model server's own /metrics, and kvroute's and Envoy's stats from Envoy's admin /stats/prometheus (kvroute_*)";

/// Whether `addr` is a pod of the pools that is not down (a stored response's pod may have left).
pub(super) fn serving(vm: &Vm, now_ms: u64, addr: &str) -> bool {
    vm.router.load_table().pods.iter().any(|p| {
        p.addr == addr
            && crate::health::health_of(p, now_ms, vm.config.stale_after_ms)
                != crate::health::Health::Down
    })
}

impl RequestFlow {
    /// `header` reads a request header by (lower-case) name.
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
        if let Some(reply) = answer_here(vm, host, header, &method, &path) {
            return HeadersOutcome::Reply(reply);
        }
        if let Some(outcome) = route_stored_response(vm, host, &method, &path) {
            return outcome;
        }
        let announced = header("content-length").and_then(|l| l.parse::<usize>().ok());
        let too_large = announced.is_some_and(|l| l > vm.config.max_body_bytes);
        let discard_limit = vm.config.max_body_bytes.saturating_add(DISCARD_LIMIT_BYTES);
        match Endpoint::from_path(&path, &vm.config.api_path_prefix) {
            Some(_) if method == "POST" && announced.is_some_and(|l| l > discard_limit) => {
                HeadersOutcome::Reply(too_large_reply(vm, host))
            }
            Some(endpoint) if method == "POST" && too_large && !end_of_stream => {
                // Answered once the client has sent it all (see `DISCARD_LIMIT_BYTES`).
                self.endpoint = Some(endpoint);
                self.discarding = true;
                HeadersOutcome::WaitForBody
            }
            Some(endpoint) if method == "POST" && !end_of_stream => {
                self.wait_for_body(vm, host, header, endpoint, &path)
            }
            _ => {
                host.count(Counter::Passthrough, 1);
                HeadersOutcome::Continue
            }
        }
    }

    /// An inference request: its hints read (or refused), and what its body's step needs kept.
    fn wait_for_body(
        &mut self,
        vm: &Vm,
        host: &mut dyn Host,
        header: &dyn Fn(&str) -> Option<String>,
        endpoint: Endpoint,
        path: &str,
    ) -> HeadersOutcome {
        self.arrived_us = host.now_us();
        match read_hints(vm, header) {
            Ok(hints) => self.hints = hints,
            Err((code, counter, message)) => {
                log::debug!("{message}");
                host.count(counter, 1);
                return HeadersOutcome::Reply(Reply::error(code, &message));
            }
        }
        self.endpoint = Some(endpoint);
        self.held.flow = super::held::flow_of(vm, header, self.hints.session);
        self.path = parse::without_prefix(path, &vm.config.api_path_prefix).to_string();
        self.debug_wanted =
            vm.config.debug_header
                && vm.config.debug_trigger.as_ref().is_none_or(|trigger| {
                    trigger.admits(header(trigger.header.as_str()).as_deref())
                });
        if vm.config.pd.mode == PdMode::Inline {
            self.split.forwarded = vm
                .config
                .pd
                .forward_headers
                .iter()
                .filter_map(|name| Some((name.clone(), header(name)?)))
                .collect();
        }
        HeadersOutcome::WaitForBody
    }
}

/// What kvroute answers itself from its headers: another replica's ask for placements,
/// `GET /metrics` (refused), `GET /v1/models`.
fn answer_here(
    vm: &Vm,
    host: &mut dyn Host,
    header: &dyn Fn(&str) -> Option<String>,
    method: &str,
    path: &str,
) -> Option<Reply> {
    let peers = &vm.config.peers;
    if method == "GET"
        && peers.serves(path)
        && peers.admits(header(crate::peers::TOKEN_HEADER).as_deref())
    {
        // Another gateway replica asking where this one placed prefixes. Without the token
        // (when one is set) the path is nothing special: it passes through like any other.
        return Some(Reply {
            status: 200,
            headers: vec![
                ("content-type", "application/octet-stream".to_string()),
                ("cache-control", "no-store".to_string()),
            ],
            body: crate::peers::answer(host, path, crate::work::ROW_TTL_MS),
        });
    }
    if path.split('?').next() == Some("/metrics") {
        // Passed through, a scrape of the gateway would get one pod's page, a different pod
        // each time: a Prometheus job would mix them into one series.
        return Some(Reply::error(
            ErrorCode::MetricsNotProxied,
            METRICS_NOT_PROXIED,
        ));
    }
    if method == "GET" {
        let now = host.now_ms();
        let table = vm.router.load_table();
        return models::answer(table, path, now, vm.config.stale_after_ms);
    }
    None
}

/// A request about a stored response (retrieve, delete, input items with GET/DELETE; cancel with
/// POST): to the pod that stored it, or on to the cluster when that pod is unknown or gone.
fn route_stored_response(
    vm: &Vm,
    host: &mut dyn Host,
    method: &str,
    path: &str,
) -> Option<HeadersOutcome> {
    let id = crate::stored_responses::id_in_path(parse::without_prefix(
        path,
        &vm.config.api_path_prefix,
    ))?;
    let cancel = path
        .split('?')
        .next()
        .is_some_and(|p| p.ends_with("/cancel"));
    if method == "POST" && !cancel {
        return None;
    }
    let addr = crate::stored_responses::lookup(host, id, vm.config.stored_response_ttl_ms)
        .filter(|addr| serving(vm, host.now_ms(), addr));
    Some(match addr {
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
    })
}

/// The session, priority and SLO headers, when configured and present. An unreadable value is
/// refused with its code, counter and message.
pub(super) fn read_hints(
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
