//! The names of every stat the plugin emits, declared once: each metric is an enum variant with
//! its Envoy name, so reordering cannot mislabel one. Envoy prefixes custom Wasm metrics with
//! `wasmcustom.` in `/stats` (`wasmcustom.kvroute.*`) and drops that prefix in `/stats/prometheus`
//! (`kvroute_*`). Metrics are process-wide by name: every VM defines the same names and
//! increments the same counters; gauges are set by the leader alone. Recording goes through the
//! host port (`crate::port::Host`).

#[derive(Debug, Clone, Copy)]
pub enum Counter {
    /// Inference requests given a destination by kvroute.
    Routed,
    /// … whose primary pod already held part of the prompt.
    RoutedPrefixHit,
    /// … to a pod holding none of the prompt (chosen by predicted TTFT alone).
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
    /// Client-supplied `kv_transfer_params` removed from request bodies.
    ClientKvParamsRemoved,
    /// Inference requests refused with 413: the body was larger than `max_body_bytes`.
    BodyTooLarge,
    /// Inference requests refused with 413: parsing the body needed more than `max_parse_bytes`.
    ParseBudgetExceeded,
    /// Metrics polls that failed outright (refused, reset, non-200, garbage): the pod is down.
    PollFailures,
    /// Metrics polls that timed out: the pod's figures are stale, the pod still routed.
    PollsLate,
    /// Requests routed to a pod whose metrics were stale (on the gateway's own view of its work).
    RoutedStale,
    /// Decisions taken while every candidate's metrics were stale (the observer is suspect: a
    /// leader that missed ticks, a throttled proxy): routed on the last known figures.
    ObserverSuspect,
    /// Requests that failed on the pod they were sent to (5xx, reset, or a fallback answered).
    RequestFailures,
    /// Pods ejected by passive health (their requests failed).
    Ejections,
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
    /// Requests refused with 400: an SLO header was not a positive number.
    BadSlo,
    /// Requests with latency objectives routed although no pod was predicted to meet them.
    SloPredictedMiss,
    /// Requests with a TTFT objective whose first byte came later than it.
    SloTtftMissed,
    /// Prompt tokens the index expected cached, for responses that reported `cached_tokens`
    /// (counted in the engine's tokens: the expected share of its reported prompt).
    CachePredictedTokens,
    /// Prompt tokens those responses reported cached.
    CacheReportedTokens,
    /// Responses whose pod had evidently evicted blocks the index believed it held.
    CacheEvictionsDetected,
    /// Blocks a routed request had taught the index about a pod, withdrawn (one per pod): the pod
    /// (or Envoy for it) answered with a non-2xx status, or refused it and a retry took the
    /// request elsewhere.
    ObservationsWithdrawn,
}

#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    /// Pods that may take requests (fresh or stale metrics; not failing, not ejected).
    PodsHealthy,
    /// Of those, pods whose metrics are stale (polls late).
    PodsStale,
    /// Pods ejected by passive health.
    PodsEjected,
    /// Pods known (configured or discovered).
    PodsKnown,
    /// Block hashes in the leader's prefix index.
    IndexEntries,
    /// Mean queued (waiting) requests per prefill pod, × 1000.
    PdPrefillPoolQueueX1000,
    /// Mean queued requests per decode pod, × 1000.
    PdDecodePoolQueueX1000,
    /// 1, named after the module's version (`kvroute.build.version.<version>.info`): which
    /// module every gateway runs, during a rollout too.
    BuildInfo,
}

/// Histograms (Envoy keeps the quantiles; Prometheus gets buckets).
#[derive(Debug, Clone, Copy)]
pub enum Histogram {
    /// Time from the routing decision to the response's first body byte, streamed responses.
    TtftMs,
    /// |predicted − observed| / observed time to first byte, in percent.
    TtftPredictionErrorPct,
    /// Time kvroute spent deciding one request in the filter (parse, hash, predict, pick), µs.
    DecisionUs,
}

impl Counter {
    pub const ALL: [Counter; 30] = [
        Counter::Routed,
        Counter::RoutedPrefixHit,
        Counter::RoutedLoad,
        Counter::Passthrough,
        Counter::NoEndpoint,
        Counter::RoutedSession,
        Counter::Shed,
        Counter::BadPriority,
        Counter::SpoofedHeadersRemoved,
        Counter::ClientKvParamsRemoved,
        Counter::BodyTooLarge,
        Counter::ParseBudgetExceeded,
        Counter::PollFailures,
        Counter::PollsLate,
        Counter::RoutedStale,
        Counter::ObserverSuspect,
        Counter::RequestFailures,
        Counter::Ejections,
        Counter::LeaderChanges,
        Counter::PdDisaggregated,
        Counter::PdDecodeOnly,
        Counter::PdPrefillFailures,
        Counter::PdPrefillRejected,
        Counter::BadSlo,
        Counter::SloPredictedMiss,
        Counter::SloTtftMissed,
        Counter::CachePredictedTokens,
        Counter::CacheReportedTokens,
        Counter::CacheEvictionsDetected,
        Counter::ObservationsWithdrawn,
    ];

    /// The Envoy stat name, declared once here: reordering cannot mislabel a metric.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Routed => "kvroute.requests_routed",
            Counter::RoutedPrefixHit => "kvroute.routed_prefix_hit",
            Counter::RoutedLoad => "kvroute.routed_load",
            Counter::Passthrough => "kvroute.passthrough",
            Counter::NoEndpoint => "kvroute.no_endpoint",
            Counter::RoutedSession => "kvroute.routed_session",
            Counter::Shed => "kvroute.shed",
            Counter::BadPriority => "kvroute.bad_priority",
            Counter::SpoofedHeadersRemoved => "kvroute.spoofed_headers_removed",
            Counter::ClientKvParamsRemoved => "kvroute.spoofed_kv_transfer_params_removed",
            Counter::BodyTooLarge => "kvroute.body_too_large",
            Counter::ParseBudgetExceeded => "kvroute.parse_budget_exceeded",
            Counter::PollFailures => "kvroute.poll_failures",
            Counter::PollsLate => "kvroute.health.polls_late",
            Counter::RoutedStale => "kvroute.health.routed_stale",
            Counter::ObserverSuspect => "kvroute.health.observer_suspect",
            Counter::RequestFailures => "kvroute.health.request_failures",
            Counter::Ejections => "kvroute.health.ejections",
            Counter::LeaderChanges => "kvroute.leader_changes",
            Counter::PdDisaggregated => "kvroute.pd.disaggregated",
            Counter::PdDecodeOnly => "kvroute.pd.decode_only",
            Counter::PdPrefillFailures => "kvroute.pd.prefill_failures",
            Counter::PdPrefillRejected => "kvroute.pd.prefill_rejected",
            Counter::BadSlo => "kvroute.bad_slo",
            Counter::SloPredictedMiss => "kvroute.slo.predicted_miss",
            Counter::SloTtftMissed => "kvroute.slo.ttft_missed",
            Counter::CachePredictedTokens => "kvroute.cache.predicted_tokens",
            Counter::CacheReportedTokens => "kvroute.cache.reported_tokens",
            Counter::CacheEvictionsDetected => "kvroute.cache.evictions_detected",
            Counter::ObservationsWithdrawn => "kvroute.cache.observations_withdrawn",
        }
    }
}

impl Gauge {
    pub const ALL: [Gauge; 8] = [
        Gauge::PodsHealthy,
        Gauge::PodsStale,
        Gauge::PodsEjected,
        Gauge::PodsKnown,
        Gauge::IndexEntries,
        Gauge::PdPrefillPoolQueueX1000,
        Gauge::PdDecodePoolQueueX1000,
        Gauge::BuildInfo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gauge::PodsHealthy => "kvroute.pods_healthy",
            Gauge::PodsStale => "kvroute.pods_stale",
            Gauge::PodsEjected => "kvroute.pods_ejected",
            Gauge::PodsKnown => "kvroute.pods_known",
            Gauge::IndexEntries => "kvroute.index_entries",
            Gauge::PdPrefillPoolQueueX1000 => "kvroute.pd.prefill_pool_queue_x1000",
            Gauge::PdDecodePoolQueueX1000 => "kvroute.pd.decode_pool_queue_x1000",
            Gauge::BuildInfo => {
                concat!("kvroute.build.version.", env!("CARGO_PKG_VERSION"), ".info")
            }
        }
    }
}

impl Histogram {
    pub const ALL: [Histogram; 3] = [
        Histogram::TtftMs,
        Histogram::TtftPredictionErrorPct,
        Histogram::DecisionUs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::TtftMs => "kvroute.ttft_ms",
            Histogram::TtftPredictionErrorPct => "kvroute.ttft_prediction_error_pct",
            Histogram::DecisionUs => "kvroute.decision_us",
        }
    }
}
