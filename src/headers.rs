//! Request headers kvroute owns. Envoy does not sanitise them, so the filter deletes any value a
//! client sent, on every request, routed or not: a client must never pick its own pod or prefiller.

/// Primary pod then fallbacks, `ip:port,ip:port`, read by the `override_host` LB policy (or an
/// ORIGINAL_DST cluster, which uses the first).
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The prefill pod for the llm-d routing sidecar in the decode pod.
pub const PREFILLER: &str = "x-prefiller-host-port";
/// How long the decode pod's sidecar may wait for the prefiller (ms) before it prefills locally:
/// the prefill leg's first-byte bound (see `crate::pd::prefill_bound_ms`). kvroute's own; kvsim's
/// sidecar honours it, llm-d's routing sidecar does not read it.
pub const PREFILLER_TIMEOUT: &str = "x-prefiller-timeout-ms";
/// Opt-in response header describing the decision.
pub const DEBUG: &str = "x-kvroute-debug";
/// Envoy's per-attempt timeout, which only runs until the response starts: set on streamed
/// requests so a pod that never starts answering is retried on a fallback (see `crate::health`).
pub const PER_TRY_TIMEOUT: &str = "x-envoy-upstream-rq-per-try-timeout-ms";

pub const OWNED_REQUEST_HEADERS: [&str; 5] = [
    DESTINATION,
    PREFILLER,
    PREFILLER_TIMEOUT,
    DEBUG,
    PER_TRY_TIMEOUT,
];
