//! Envoy stats emitted by the plugin. Envoy prefixes custom Wasm metrics with `wasmcustom.`, so they
//! appear as `wasmcustom.kvroute.*` in `/stats` and as `envoy_wasmcustom_kvroute_*` in
//! `/stats/prometheus`. Metrics are process-wide by name: every VM defines the same names and
//! increments the same counters; gauges are set by the leader alone.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

#[derive(Debug, Clone, Copy)]
pub enum Counter {
    /// Inference requests given a destination by kvroute.
    Routed,
    /// … whose primary pod already held part of the prompt.
    RoutedPrefixHit,
    /// … chosen by load alone (no known prefix, or the affinity cap applied).
    RoutedLoad,
    /// Requests left to the cluster's own load balancer (not inference, unparsable, too large).
    Passthrough,
    /// Routable requests with no pod to take them (503 or fail-open).
    NoEndpoint,
    /// Requests routed to their session's pod.
    RoutedSession,
    /// Negative-priority requests refused with 429 because every pod was saturated.
    Shed,
    /// Requests refused with 400 because their priority header was not an integer.
    BadPriority,
    /// Client-supplied routing headers removed.
    SpoofedHeadersRemoved,
    /// Metrics polls that failed (refused, timeout, non-200, garbage).
    PollFailures,
    /// This VM became the leader.
    LeaderChanges,
    /// Requests sent through a prefill pod and a decode pod.
    PdDisaggregated,
    /// Requests on a split pool served by the decode pod alone (short, cached, or prefill failed).
    PdDecodeOnly,
    /// Inline prefill calls that failed or timed out (the request fell back to decode-only).
    PdPrefillFailures,
    /// Inline prefill calls the prefill pod refused with a 4xx (returned to the client as is).
    PdPrefillRejected,
}

#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    /// Pods with fresh metrics.
    PodsHealthy,
    /// Pods known (configured or discovered).
    PodsKnown,
    /// Block hashes in the leader's prefix index.
    IndexEntries,
    /// The current disaggregation threshold (uncached prompt tokens), set by the leader.
    PdThresholdTokens,
    /// Mean queued (waiting) requests per prefill pod, × 1000: the P/D threshold's pressure input.
    PdPrefillPoolQueueX1000,
    /// Mean queued requests per decode pod, × 1000.
    PdDecodePoolQueueX1000,
}

const COUNTERS: [(Counter, &str); 15] = [
    (Counter::Routed, "kvroute.requests_routed"),
    (Counter::RoutedPrefixHit, "kvroute.routed_prefix_hit"),
    (Counter::RoutedLoad, "kvroute.routed_load"),
    (Counter::Passthrough, "kvroute.passthrough"),
    (Counter::NoEndpoint, "kvroute.no_endpoint"),
    (Counter::RoutedSession, "kvroute.routed_session"),
    (Counter::Shed, "kvroute.shed"),
    (Counter::BadPriority, "kvroute.bad_priority"),
    (
        Counter::SpoofedHeadersRemoved,
        "kvroute.spoofed_headers_removed",
    ),
    (Counter::PollFailures, "kvroute.poll_failures"),
    (Counter::LeaderChanges, "kvroute.leader_changes"),
    (Counter::PdDisaggregated, "kvroute.pd.disaggregated"),
    (Counter::PdDecodeOnly, "kvroute.pd.decode_only"),
    (Counter::PdPrefillFailures, "kvroute.pd.prefill_failures"),
    (Counter::PdPrefillRejected, "kvroute.pd.prefill_rejected"),
];

const GAUGES: [(Gauge, &str); 6] = [
    (Gauge::PodsHealthy, "kvroute.pods_healthy"),
    (Gauge::PodsKnown, "kvroute.pods_known"),
    (Gauge::IndexEntries, "kvroute.index_entries"),
    (Gauge::PdThresholdTokens, "kvroute.pd.threshold_tokens"),
    (
        Gauge::PdPrefillPoolQueueX1000,
        "kvroute.pd.prefill_pool_queue_x1000",
    ),
    (
        Gauge::PdDecodePoolQueueX1000,
        "kvroute.pd.decode_pool_queue_x1000",
    ),
];

#[derive(Debug, Default, Clone)]
pub struct Stats {
    counters: Vec<Option<u32>>,
    gauges: Vec<Option<u32>>,
}

impl Stats {
    /// Defines every metric once per VM; a metric the host refuses is skipped, never fatal.
    pub fn define() -> Stats {
        Stats {
            counters: COUNTERS
                .iter()
                .map(|(_, name)| hostcalls::define_metric(MetricType::Counter, name).ok())
                .collect(),
            gauges: GAUGES
                .iter()
                .map(|(_, name)| hostcalls::define_metric(MetricType::Gauge, name).ok())
                .collect(),
        }
    }

    pub fn inc(&self, c: Counter) {
        if let Some(Some(id)) = self.counters.get(c as usize) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    pub fn set(&self, g: Gauge, value: u64) {
        if let Some(Some(id)) = self.gauges.get(g as usize) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }
}
