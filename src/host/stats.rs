//! Envoy stats emitted by the plugin. Envoy prefixes custom Wasm metrics with `wasmcustom.`, so they
//! appear as `wasmcustom.kvroute.*` in `/stats` and as `envoy_wasmcustom_kvroute_*` in
//! `/stats/prometheus`. Metrics are process-wide by name: every VM defines the same names and
//! increments the same counters; gauges are set by the leader alone.

use crate::cost::Coefficients;
use hashbrown::HashMap;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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
}

#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    /// Pods with fresh metrics.
    PodsHealthy,
    /// Pods known (configured or discovered).
    PodsKnown,
    /// Block hashes in the leader's prefix index.
    IndexEntries,
    /// Mean queued (waiting) requests per prefill pod, × 1000.
    PdPrefillPoolQueueX1000,
    /// Mean queued requests per decode pod, × 1000.
    PdDecodePoolQueueX1000,
}

/// Histograms (Envoy keeps the quantiles; Prometheus gets buckets).
#[derive(Debug, Clone, Copy)]
pub enum Histogram {
    /// Time from the routing decision to the response's first body byte, streamed responses.
    TtftMs,
    /// |predicted − observed| / observed time to first byte, in percent.
    TtftPredictionErrorPct,
}

impl Counter {
    const ALL: [Counter; 21] = [
        Counter::Routed,
        Counter::RoutedPrefixHit,
        Counter::RoutedLoad,
        Counter::Passthrough,
        Counter::NoEndpoint,
        Counter::RoutedSession,
        Counter::Shed,
        Counter::BadPriority,
        Counter::SpoofedHeadersRemoved,
        Counter::PollFailures,
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
            Counter::PollFailures => "kvroute.poll_failures",
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
        }
    }
}

impl Gauge {
    const ALL: [Gauge; 5] = [
        Gauge::PodsHealthy,
        Gauge::PodsKnown,
        Gauge::IndexEntries,
        Gauge::PdPrefillPoolQueueX1000,
        Gauge::PdDecodePoolQueueX1000,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gauge::PodsHealthy => "kvroute.pods_healthy",
            Gauge::PodsKnown => "kvroute.pods_known",
            Gauge::IndexEntries => "kvroute.index_entries",
            Gauge::PdPrefillPoolQueueX1000 => "kvroute.pd.prefill_pool_queue_x1000",
            Gauge::PdDecodePoolQueueX1000 => "kvroute.pd.decode_pool_queue_x1000",
        }
    }
}

impl Histogram {
    const ALL: [Histogram; 2] = [Histogram::TtftMs, Histogram::TtftPredictionErrorPct];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::TtftMs => "kvroute.ttft_ms",
            Histogram::TtftPredictionErrorPct => "kvroute.ttft_prediction_error_pct",
        }
    }
}

/// One pod's learned cost as gauges named after the pod: `kvroute.pod.<ip>_<port>.*`, the
/// address's dots and colons made underscores so that Envoy's stat tags leave it whole.
#[derive(Debug, Clone, Copy)]
struct PodCostIds {
    overhead_us: Option<u32>,
    ns_per_token: Option<u32>,
    fit_samples: Option<u32>,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    ids: HashMap<&'static str, u32>,
    pods: HashMap<String, PodCostIds>,
}

impl Stats {
    /// Defines every metric once per VM; a metric the host refuses is skipped, never fatal.
    pub fn define() -> Stats {
        let names = Counter::ALL
            .iter()
            .map(|c| (MetricType::Counter, c.name()))
            .chain(Gauge::ALL.iter().map(|g| (MetricType::Gauge, g.name())))
            .chain(
                Histogram::ALL
                    .iter()
                    .map(|h| (MetricType::Histogram, h.name())),
            );
        Stats {
            ids: names
                .filter_map(|(kind, name)| Some((name, hostcalls::define_metric(kind, name).ok()?)))
                .collect(),
            pods: HashMap::new(),
        }
    }

    pub fn inc(&self, c: Counter) {
        self.add(c, 1);
    }

    pub fn add(&self, c: Counter, n: u64) {
        if let Some(id) = self.ids.get(c.name()) {
            let _ = hostcalls::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn set(&self, g: Gauge, value: u64) {
        if let Some(id) = self.ids.get(g.name()) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    pub fn record(&self, h: Histogram, value: u64) {
        if let Some(id) = self.ids.get(h.name()) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    /// Publishes a pod's learned cost (the leader, on its tick; bounded by the pool size).
    pub fn set_pod_cost(&mut self, addr: &str, cost: &Coefficients, samples: f64) {
        let ids = match self.pods.get(addr) {
            Some(ids) => *ids,
            None => {
                let base: String = addr
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                let gauge = |what: &str| {
                    let name = format!("kvroute.pod.{base}.{what}");
                    hostcalls::define_metric(MetricType::Gauge, &name).ok()
                };
                let ids = PodCostIds {
                    overhead_us: gauge("overhead_us"),
                    ns_per_token: gauge("prefill_ns_per_token"),
                    fit_samples: gauge("fit_samples"),
                };
                self.pods.insert(addr.to_string(), ids);
                ids
            }
        };
        for (id, value) in [
            (ids.overhead_us, cost.overhead_ms * 1e3),
            (ids.ns_per_token, cost.us_per_token * 1e3),
            (ids.fit_samples, samples),
        ] {
            if let Some(id) = id {
                let _ = hostcalls::record_metric(id, value.max(0.0) as u64);
            }
        }
    }
}
