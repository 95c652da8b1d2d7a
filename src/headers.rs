//! Request headers kvroute owns. Envoy does not sanitise them, so the filter deletes any value a
//! client sent, on every request, routed or not: a client must never pick its own pod or prefiller.

/// Primary pod then fallbacks, `ip:port,ip:port`, read by the `override_host` LB policy (or an
/// ORIGINAL_DST cluster, which uses the first).
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The prefill pod for the llm-d routing sidecar in the decode pod.
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Opt-in response header describing the decision.
pub const DEBUG: &str = "x-kvroute-debug";

pub const OWNED_REQUEST_HEADERS: [&str; 3] = [DESTINATION, PREFILLER, DEBUG];
