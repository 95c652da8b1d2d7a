//! The names of every stat the plugin emits, declared once: each metric is an enum variant with
//! its Envoy name and the labels it carries, so reordering cannot mislabel one.
//!
//! **Naming scheme** (what Prometheus scrapes from Envoy's `/stats/prometheus`):
//! * Envoy exports a Wasm metric `kvroute.a.b` as `kvroute_a_b` (it drops its `wasmcustom.`
//!   namespace and turns dots into underscores) and adds no suffix of its own, so the names here
//!   carry Prometheus' suffixes themselves: every counter ends in `_total`, a unit follows the
//!   quantity (`_tokens_total`, `_milliseconds`), gauges are plain counts.
//! * Envoy's Wasm gauges and histogram samples are integers. A fraction is never fixed-point: a
//!   mean is exported as its two integer terms (a sum and a count, divided in PromQL), a rate as
//!   per-second integers, and a duration too short for whole seconds in the unit its name says
//!   (histograms in milliseconds or microseconds, as Envoy's own `upstream_rq_time`). The recording
//!   rules of `deploy/monitoring` give the seconds and the ratios.
//! * Labels are part of the Envoy name, in Istio's tag encoding: `kvroute.pool=.=llama;.;role=.=
//!   decode;.;requests_routed_total`. A `stats_tags` regex `(pool=\.=(.*?);\.;)` per label (plain
//!   Envoy: `stats_config`; Istio: `extraStatTags`, which generates exactly that regex) removes each
//!   pair from the name and makes it a label: `kvroute_requests_routed_total{pool="llama",…}`.
//!   Without the regexes the names still work but carry their labels. [`LABELS`] lists them all.
//! * Cardinality is bounded by configuration: `pool` and `role` by the configured pools, `model` by
//!   the names the pods serve (any other name is not a label value), `pod` by the pools' members,
//!   `reason`, `version` and `band` by the code.
//!
//! Metrics are process-wide by name: every VM defines the same names and increments the same
//! counters; gauges are set by the leader alone. Recording goes through the host port
//! (`crate::port::Host`).

use crate::common::Role;

/// Every label a kvroute series can carry: the tag names a proxy's stats configuration extracts.
pub const LABELS: [&str; 7] = [POOL, ROLE, MODEL, REASON, POD, VERSION, BAND];
/// The configured pool (`pools[].name`) of the pod a series is about.
pub const POOL: &str = "pool";
/// That pool's role: `aggregated`, `prefill` or `decode`.
pub const ROLE: &str = "role";
/// The request's model, where some pod serves that name.
pub const MODEL: &str = "model";
/// Why a request went where it did (`requests_routed_total`).
pub const REASON: &str = "reason";
/// A pod's `ip:port`.
pub const POD: &str = "pod";
/// The module's version (`build_info`).
pub const VERSION: &str = "version";
/// Flow control's priority band: `high` (priority > 0), `default` (0) or `sheddable` (< 0).
pub const BAND: &str = "band";

/// A series' labels: (label, value) pairs, in the order of the metric's [`Counter::labels`] (or
/// the gauge's or histogram's).
pub type Labels<'a> = [(&'static str, &'a str)];

const POOL_ROLE: &[&str] = &[POOL, ROLE];
const POOL_ROLE_MODEL: &[&str] = &[POOL, ROLE, MODEL];

pub fn role_label(role: Role) -> &'static str {
    match role {
        Role::Aggregated => "aggregated",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Both => "both",
    }
}

/// The Envoy name of one series: the metric's name with its labels encoded after `kvroute.`.
/// A value cannot end its pair early: `;` becomes `_`.
pub fn series_name(name: &str, labels: &Labels<'_>) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let rest = name.strip_prefix("kvroute.").unwrap_or(name);
    let mut out = String::with_capacity(name.len() + 24 * labels.len());
    out.push_str("kvroute.");
    for (label, value) in labels {
        out.push_str(label);
        out.push_str("=.=");
        out.extend(value.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out.push_str(rest);
    out
}

/// A defined series: its metric's name and its (label, value) pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeriesKey {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
}

/// A series as a caller names it, looked up without building its Envoy name or owning its values
/// (in V8, building the name cost more than the host call that follows).
struct SeriesQuery<'a> {
    name: &'a str,
    labels: &'a Labels<'a>,
}

fn hash_series<'a, H: std::hash::Hasher>(
    state: &mut H,
    name: &str,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) {
    std::hash::Hash::hash(name, state);
    for (label, value) in labels {
        std::hash::Hash::hash(label, state);
        std::hash::Hash::hash(value, state);
    }
}

impl std::hash::Hash for SeriesKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_series(
            state,
            self.name,
            self.labels.iter().map(|(l, v)| (*l, v.as_str())),
        );
    }
}

impl std::hash::Hash for SeriesQuery<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        hash_series(state, self.name, self.labels.iter().copied());
    }
}

impl hashbrown::Equivalent<SeriesKey> for SeriesQuery<'_> {
    fn equivalent(&self, key: &SeriesKey) -> bool {
        self.name == key.name
            && self.labels.len() == key.labels.len()
            && self
                .labels
                .iter()
                .zip(&key.labels)
                .all(|((l, v), (kl, kv))| l == kl && v == kv)
    }
}

/// Something per series (the host's metric ids), found by metric name and labels without
/// allocating.
#[derive(Debug, Clone)]
pub struct SeriesMap<V> {
    entries: hashbrown::HashMap<SeriesKey, V>,
}

impl<V> Default for SeriesMap<V> {
    fn default() -> Self {
        SeriesMap {
            entries: hashbrown::HashMap::new(),
        }
    }
}

impl<V> SeriesMap<V> {
    pub fn get(&self, name: &str, labels: &Labels<'_>) -> Option<&V> {
        self.entries.get(&SeriesQuery { name, labels })
    }

    pub fn insert(&mut self, name: &'static str, labels: &Labels<'_>, value: V) {
        let labels = labels.iter().map(|(l, v)| (*l, v.to_string())).collect();
        self.entries.insert(SeriesKey { name, labels }, value);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Counter {
    /// Inference requests given a destination by kvroute, by `reason`: `prefix_hit` (the primary
    /// pod already held part of the prompt), `load` (it held none; chosen by predicted TTFT
    /// alone) or `session` (the session's pod).
    RequestsRouted,
    /// Requests left to the cluster's own load balancer (not inference, unparsable, too large).
    Passthrough,
    /// Routable requests with no pod to take them (503 or fail-open).
    NoEndpoint,
    /// Negative-priority requests refused with 429 because every pod was saturated.
    Shed,
    /// Requests refused with 400 because their priority header was not an integer.
    BadPriority,
    /// Client-supplied routing headers removed.
    SpoofedHeadersRemoved,
    /// Client-supplied `kv_transfer_params` removed from request bodies.
    ClientKvParamsRemoved,
    /// Requests naming a stored Responses API answer, sent to the pod that stored it.
    StoredResponsePinned,
    /// Requests naming a stored response kvroute could not place (not seen stored, expired, its
    /// pod gone): routed as if they named none.
    StoredResponseUnplaced,
    /// Inference requests refused with 413: the body was larger than `max_body_bytes`.
    BodyTooLarge,
    /// Inference requests refused with 413: parsing the body needed more than `max_parse_bytes`.
    ParseBudgetExceeded,
    /// Inference requests refused with 400: the body was not JSON kvroute's strict parse reads
    /// (see `passthrough_unparseable_bodies`).
    UnparseableBody,
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
    /// Requests sent through a prefill pod and a decode pod (labelled with the decode pod's pool),
    /// by `reason` (`crate::pd::PdReason`): `sooner`, `streams_objective` or `probe`.
    PdDisaggregated,
    /// Requests on a split pool served by the decode pod alone, by `reason`: `within_objective`,
    /// `prefill_busier`, `no_prefill_pod` or `prefill_failed`.
    PdDecodeOnly,
    /// Inline prefill calls that failed or timed out (the request fell back to decode-only).
    PdPrefillFailures,
    /// Inline prefill calls the prefill pod refused with a 4xx (returned to the client as is).
    PdPrefillRejected,
    /// Inline prefill calls the prefill pod refused with 401/403: kvroute's call lacked the
    /// credential the pool wants (the request fell back to decode-only; not the client's fault).
    PdPrefillUnauthorized,
    /// Prefill legs (inline calls, sidecar splits) that outran their first-byte bound: the
    /// request went on decode-only, and the prefill pod was judged failed.
    PdPrefillTimeouts,
    /// Requests split although the split was predicted to lose (`pd.probe_interval_ms`).
    PdProbes,
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
    /// Blocks learned from other gateway replicas' placements (`peers`).
    PeerBlocksLearned,
    /// Asks for a gateway replica's placements that failed (refused, timed out, unreadable).
    PeerSyncFailures,
    /// Numbers a pod reported that cannot be true (per pod): a response's `usage` with more
    /// cached than prompt tokens or a prompt longer than any model takes (ignored), a `/metrics`
    /// sample beyond what an engine holds (clamped to that bound).
    PodReportedImplausible,
    /// Restarts the leader saw in a pod's polls (its process start time changed, or its metrics
    /// came back after polls that failed outright): its prefix entries were dropped.
    PodRestarts,
    /// Requests flow control held at the gateway because every pod was full.
    FlowHeld,
    /// Held requests released (routed, or answered or passed on as they would have been).
    FlowReleased,
    /// Held requests that left the queue unserved, by `reason`: `queue_full` (429 at once, the
    /// worker already held `flow_control.max_held`), `queue_timeout` (429 after
    /// `flow_control.ttl_ms`) or `disconnected` (the client went away).
    FlowDropped,
}

#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    /// Pods that may take requests (fresh or stale metrics; not failing, not ejected), per pool.
    PodsHealthy,
    /// Of those, pods whose metrics are stale (polls late).
    PodsStale,
    /// Pods ejected by passive health.
    PodsEjected,
    /// Pods known (configured or discovered).
    PodsKnown,
    /// Block hashes in the leader's prefix index.
    IndexEntries,
    /// Requests waiting in the engines of the pool's pods with fresh metrics (their sum: divided
    /// by those pods, `pods_healthy − pods_stale`, it is the mean queue the P/D split and the
    /// autoscalers read).
    PoolRequestsWaiting,
    /// Requests running in the engines of the pool's pods with fresh metrics (their sum; GIE's
    /// `inference_pool_average_running_requests` is it over those pods).
    PoolRequestsRunning,
    /// The KV-cache use of the pool's pods with fresh metrics, in per mille, summed (over those
    /// pods and 1000 it is GIE's `inference_pool_average_kv_cache_utilization`, a fraction).
    PoolKvCacheUsagePermille,
    /// 1, labelled with the module's version: which module every gateway runs, during a rollout
    /// too.
    BuildInfo,
    /// A pod's learned fixed cost before its first token (the TTFT model's intercept), µs.
    PodTtftOverheadUs,
    /// A pod's learned prefill speed: uncached prompt tokens per second (the inverse of the TTFT
    /// model's per-token cost).
    PodPrefillTokensPerSecond,
    /// First bytes the pod's TTFT model has learned from (decayed).
    PodFitSamples,
    /// The engine's cap on requests running at once that the overload guard uses: configured
    /// (`overload_guard.max_running`) or learned from the pod's polls (`crate::pod::seats`); 0:
    /// none known, the guard is off for the pod.
    PodSeats,
    /// Requests flow control holds in the whole Envoy (every worker), per `band`.
    FlowHeldRequests,
    /// Distinct flows (tenants) with requests held, per `band`: how many share the queue.
    FlowWaitingFlows,
}

/// Histograms (Envoy keeps the quantiles; Prometheus gets buckets).
#[derive(Debug, Clone, Copy)]
pub enum Histogram {
    /// Time from the routing decision to the response's first body byte, streamed responses, ms.
    TtftMs,
    /// kvroute's prediction of that time for the same responses, ms.
    TtftPredictedMs,
    /// |predicted − observed| / observed time to first byte, in percent.
    TtftPredictionErrorPct,
    /// Time kvroute spent deciding one request in the filter (parse, hash, predict, pick), µs.
    DecisionUs,
    /// With `phase_timing`: the time each filter callback spent from entry to return, host calls
    /// included (µs). What Envoy's Wasm machinery costs outside the callbacks is the request's added
    /// latency minus their sum.
    PhaseRequestHeadersUs,
    PhaseRequestBodyUs,
    PhaseResponseHeadersUs,
    PhaseResponseBodyUs,
    PhaseLogUs,
    /// How long released requests were held by flow control, ms, per `band`.
    FlowWaitMs,
}

impl Counter {
    pub const ALL: [Counter; 40] = [
        Counter::RequestsRouted,
        Counter::Passthrough,
        Counter::NoEndpoint,
        Counter::Shed,
        Counter::BadPriority,
        Counter::SpoofedHeadersRemoved,
        Counter::ClientKvParamsRemoved,
        Counter::StoredResponsePinned,
        Counter::StoredResponseUnplaced,
        Counter::BodyTooLarge,
        Counter::ParseBudgetExceeded,
        Counter::UnparseableBody,
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
        Counter::PdPrefillUnauthorized,
        Counter::PdPrefillTimeouts,
        Counter::PdProbes,
        Counter::BadSlo,
        Counter::SloPredictedMiss,
        Counter::SloTtftMissed,
        Counter::CachePredictedTokens,
        Counter::CacheReportedTokens,
        Counter::CacheEvictionsDetected,
        Counter::ObservationsWithdrawn,
        Counter::PeerBlocksLearned,
        Counter::PeerSyncFailures,
        Counter::PodReportedImplausible,
        Counter::PodRestarts,
        Counter::FlowHeld,
        Counter::FlowReleased,
        Counter::FlowDropped,
    ];

    /// The Envoy stat name, declared once here: reordering cannot mislabel a metric.
    pub fn name(self) -> &'static str {
        match self {
            Counter::RequestsRouted => "kvroute.requests_routed_total",
            Counter::Passthrough => "kvroute.passthrough_total",
            Counter::NoEndpoint => "kvroute.no_endpoint_total",
            Counter::Shed => "kvroute.shed_total",
            Counter::BadPriority => "kvroute.bad_priority_total",
            Counter::SpoofedHeadersRemoved => "kvroute.spoofed_headers_removed_total",
            Counter::ClientKvParamsRemoved => "kvroute.spoofed_kv_transfer_params_removed_total",
            Counter::StoredResponsePinned => "kvroute.stored_response_pinned_total",
            Counter::StoredResponseUnplaced => "kvroute.stored_response_unplaced_total",
            Counter::BodyTooLarge => "kvroute.body_too_large_total",
            Counter::ParseBudgetExceeded => "kvroute.parse_budget_exceeded_total",
            Counter::UnparseableBody => "kvroute.unparseable_body_total",
            Counter::PollFailures => "kvroute.poll_failures_total",
            Counter::PollsLate => "kvroute.health.polls_late_total",
            Counter::RoutedStale => "kvroute.health.routed_stale_total",
            Counter::ObserverSuspect => "kvroute.health.observer_suspect_total",
            Counter::RequestFailures => "kvroute.health.request_failures_total",
            Counter::Ejections => "kvroute.health.ejections_total",
            Counter::LeaderChanges => "kvroute.leader_changes_total",
            Counter::PdDisaggregated => "kvroute.pd.disaggregated_total",
            Counter::PdDecodeOnly => "kvroute.pd.decode_only_total",
            Counter::PdPrefillFailures => "kvroute.pd.prefill_failures_total",
            Counter::PdPrefillRejected => "kvroute.pd.prefill_rejected_total",
            Counter::PdPrefillUnauthorized => "kvroute.pd.prefill_unauthorized_total",
            Counter::PdPrefillTimeouts => "kvroute.pd.prefill_timeouts_total",
            Counter::PdProbes => "kvroute.pd.probes_total",
            Counter::BadSlo => "kvroute.bad_slo_total",
            Counter::SloPredictedMiss => "kvroute.slo.predicted_miss_total",
            Counter::SloTtftMissed => "kvroute.slo.ttft_missed_total",
            Counter::CachePredictedTokens => "kvroute.cache.predicted_tokens_total",
            Counter::CacheReportedTokens => "kvroute.cache.reported_tokens_total",
            Counter::CacheEvictionsDetected => "kvroute.cache.evictions_detected_total",
            Counter::ObservationsWithdrawn => "kvroute.cache.observations_withdrawn_total",
            Counter::PeerBlocksLearned => "kvroute.replicas.blocks_learned_total",
            Counter::PeerSyncFailures => "kvroute.replicas.sync_failures_total",
            Counter::PodReportedImplausible => "kvroute.pod.reported_implausible_total",
            Counter::PodRestarts => "kvroute.pod.restarts_total",
            Counter::FlowHeld => "kvroute.flow.held_total",
            Counter::FlowReleased => "kvroute.flow.released_total",
            Counter::FlowDropped => "kvroute.flow.dropped_total",
        }
    }

    /// The labels its series carry (none: one gateway-wide series, defined at start).
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Counter::RequestsRouted | Counter::PdDisaggregated | Counter::PdDecodeOnly => {
                &[POOL, ROLE, MODEL, REASON]
            }
            Counter::RequestFailures
            | Counter::CachePredictedTokens
            | Counter::CacheReportedTokens => POOL_ROLE_MODEL,
            Counter::PodReportedImplausible | Counter::PodRestarts => &[POOL, ROLE, POD],
            Counter::FlowDropped => &[REASON],
            _ => &[],
        }
    }
}

impl Gauge {
    pub const ALL: [Gauge; 15] = [
        Gauge::PodsHealthy,
        Gauge::PodsStale,
        Gauge::PodsEjected,
        Gauge::PodsKnown,
        Gauge::IndexEntries,
        Gauge::PoolRequestsWaiting,
        Gauge::PoolRequestsRunning,
        Gauge::PoolKvCacheUsagePermille,
        Gauge::BuildInfo,
        Gauge::PodTtftOverheadUs,
        Gauge::PodPrefillTokensPerSecond,
        Gauge::PodFitSamples,
        Gauge::PodSeats,
        Gauge::FlowHeldRequests,
        Gauge::FlowWaitingFlows,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gauge::PodsHealthy => "kvroute.pods_healthy",
            Gauge::PodsStale => "kvroute.pods_stale",
            Gauge::PodsEjected => "kvroute.pods_ejected",
            Gauge::PodsKnown => "kvroute.pods_known",
            Gauge::IndexEntries => "kvroute.index_entries",
            Gauge::PoolRequestsWaiting => "kvroute.pool_requests_waiting",
            Gauge::PoolRequestsRunning => "kvroute.pool_requests_running",
            Gauge::PoolKvCacheUsagePermille => "kvroute.pool_kv_cache_usage_permille",
            Gauge::BuildInfo => "kvroute.build_info",
            Gauge::PodTtftOverheadUs => "kvroute.pod.ttft_overhead_microseconds",
            Gauge::PodPrefillTokensPerSecond => "kvroute.pod.prefill_tokens_per_second",
            Gauge::PodFitSamples => "kvroute.pod.fit_samples",
            Gauge::PodSeats => "kvroute.pod.seats",
            Gauge::FlowHeldRequests => "kvroute.flow.held_requests",
            Gauge::FlowWaitingFlows => "kvroute.flow.waiting_flows",
        }
    }

    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Gauge::PodsHealthy
            | Gauge::PodsStale
            | Gauge::PodsEjected
            | Gauge::PodsKnown
            | Gauge::PoolRequestsWaiting
            | Gauge::PoolRequestsRunning
            | Gauge::PoolKvCacheUsagePermille => POOL_ROLE,
            Gauge::BuildInfo => &[VERSION],
            Gauge::PodTtftOverheadUs
            | Gauge::PodPrefillTokensPerSecond
            | Gauge::PodFitSamples
            | Gauge::PodSeats => &[POOL, ROLE, POD],
            Gauge::IndexEntries => &[],
            Gauge::FlowHeldRequests | Gauge::FlowWaitingFlows => &[BAND],
        }
    }
}

impl Histogram {
    pub const ALL: [Histogram; 10] = [
        Histogram::TtftMs,
        Histogram::TtftPredictedMs,
        Histogram::TtftPredictionErrorPct,
        Histogram::DecisionUs,
        Histogram::PhaseRequestHeadersUs,
        Histogram::PhaseRequestBodyUs,
        Histogram::PhaseResponseHeadersUs,
        Histogram::PhaseResponseBodyUs,
        Histogram::PhaseLogUs,
        Histogram::FlowWaitMs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Histogram::TtftMs => "kvroute.ttft_milliseconds",
            Histogram::TtftPredictedMs => "kvroute.ttft_predicted_milliseconds",
            Histogram::TtftPredictionErrorPct => "kvroute.ttft_prediction_error_percent",
            Histogram::DecisionUs => "kvroute.decision_microseconds",
            Histogram::PhaseRequestHeadersUs => "kvroute.phase.request_headers_microseconds",
            Histogram::PhaseRequestBodyUs => "kvroute.phase.request_body_microseconds",
            Histogram::PhaseResponseHeadersUs => "kvroute.phase.response_headers_microseconds",
            Histogram::PhaseResponseBodyUs => "kvroute.phase.response_body_microseconds",
            Histogram::PhaseLogUs => "kvroute.phase.log_microseconds",
            Histogram::FlowWaitMs => "kvroute.flow.wait_milliseconds",
        }
    }

    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Histogram::TtftMs | Histogram::TtftPredictedMs => POOL_ROLE_MODEL,
            Histogram::FlowWaitMs => &[BAND],
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_names() -> Vec<(&'static str, &'static [&'static str])> {
        Counter::ALL
            .iter()
            .map(|c| (c.name(), c.labels()))
            .chain(Gauge::ALL.iter().map(|g| (g.name(), g.labels())))
            .chain(Histogram::ALL.iter().map(|h| (h.name(), h.labels())))
            .collect()
    }

    #[test]
    fn names_follow_the_scheme() {
        let names = all_names();
        for (name, labels) in &names {
            assert!(name.starts_with("kvroute."), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.'),
                "{name}: lower case, `_` and `.` only"
            );
            assert!(
                labels.iter().all(|l| LABELS.contains(l)),
                "{name}: a label missing from LABELS"
            );
        }
        for c in Counter::ALL {
            assert!(c.name().ends_with("_total"), "counter {}", c.name());
        }
        for g in Gauge::ALL {
            assert!(!g.name().ends_with("_total"), "gauge {}", g.name());
            assert!(!g.name().contains("x1000"), "fixed point: {}", g.name());
        }
        for h in Histogram::ALL {
            let unit = ["_milliseconds", "_microseconds", "_percent"];
            assert!(
                unit.iter().any(|u| h.name().ends_with(u)),
                "histogram {} names its unit",
                h.name()
            );
        }
        let mut prometheus: Vec<String> = names.iter().map(|(n, _)| n.replace('.', "_")).collect();
        prometheus.sort();
        prometheus.dedup();
        assert_eq!(prometheus.len(), names.len(), "two metrics, one name");
    }

    #[test]
    fn labels_go_after_the_namespace_in_istio_encoding() {
        assert_eq!(
            series_name(
                Counter::RequestsRouted.name(),
                &[
                    (POOL, "llama"),
                    (ROLE, "decode"),
                    (MODEL, "meta-llama/Llama-3.1-8B"),
                    (REASON, "prefix_hit")
                ]
            ),
            "kvroute.pool=.=llama;.;role=.=decode;.;model=.=meta-llama/Llama-3.1-8B;.;\
             reason=.=prefix_hit;.;requests_routed_total"
        );
        assert_eq!(
            series_name(Gauge::PodFitSamples.name(), &[(POD, "10.0.0.1:8000")]),
            "kvroute.pod=.=10.0.0.1:8000;.;pod.fit_samples"
        );
        assert_eq!(series_name("kvroute.shed_total", &[]), "kvroute.shed_total");
        // A value cannot close its pair early.
        assert_eq!(
            series_name("kvroute.x_total", &[(MODEL, "a;.;b")]),
            "kvroute.model=.=a_._b;.;x_total"
        );
    }

    #[test]
    fn a_series_is_found_by_its_name_and_labels_and_no_other() {
        let mut ids: SeriesMap<u32> = SeriesMap::default();
        let a = [(POOL, "p"), (ROLE, "decode"), (MODEL, "m")];
        ids.insert("kvroute.x_total", &a, 1);
        ids.insert("kvroute.x_total", &[], 2);
        ids.insert("kvroute.y_total", &a, 3);
        assert_eq!(ids.len(), 3);
        let find = |name, labels: &Labels<'_>| ids.get(name, labels).copied();
        assert_eq!(find("kvroute.x_total", &a), Some(1));
        assert_eq!(find("kvroute.x_total", &[]), Some(2));
        assert_eq!(find("kvroute.y_total", &a), Some(3));
        assert_eq!(
            find("kvroute.x_total", &[(POOL, "p"), (ROLE, "decode")]),
            None
        );
        assert_eq!(
            find(
                "kvroute.x_total",
                &[(POOL, "p"), (ROLE, "decode"), (MODEL, "n")]
            ),
            None
        );
        // Values that run together differently are different series.
        assert_eq!(
            find(
                "kvroute.x_total",
                &[(POOL, "pdecode"), (ROLE, ""), (MODEL, "m")]
            ),
            None
        );
    }
}
