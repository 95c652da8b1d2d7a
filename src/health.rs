//! Pod health: which pods may take a request, judged from what the gateway itself sees as well as
//! from what the pods' metrics say. A model server's `/metrics` is answered by the same busy API
//! process that serves requests, and the leader that polls it shares a worker thread with traffic:
//! under exactly the load that matters a poll can be late while the pod serves normally. A late
//! poll therefore makes a pod's *load figures* stale, never the pod dead; only failures do.
//!
//! Each pod is, at every decision:
//!
//! * **Fresh** — its last poll answered within `stale_after_ms`: ranked on its polled load and the
//!   work board. A pod whose page is Prometheus text naming no load gauge kvroute knows (an engine
//!   other than vLLM, SGLang, TRT-LLM, llama.cpp and TGI) is fresh with waiting and running 0:
//!   ranked on the board alone, as a stale pod is, without being reported stale (its polls are
//!   not late; see `crate::vm::leader::Leader::on_poll`).
//! * **Stale** — its polls are late (they time out, or the last answer is older than
//!   `stale_after_ms`) but nothing says it fails: still routed, by prefix as ever, on the gateway's
//!   own view of its work (the board) with the polled figures ignored. When every candidate is
//!   stale at once, the observer is the suspect (a leader that missed ticks, a CPU-throttled proxy)
//!   and the last known figures are used alongside the board (`kvroute.health.observer_suspect`).
//! * **Unknown** — never heard from yet (a pod just configured or discovered whose first poll
//!   has neither answered nor timed out): not routed (its models are not known either) unless no
//!   pod is known at all, at start-up, when requests go to the cluster's own balancer.
//! * **Down** — its poll failed outright (connection refused or reset well before the poll
//!   timeout, a non-200 answer, a page that is not Prometheus text or is empty, or one naming a
//!   known engine's load gauges with unusable values: see `crate::pod::prom`), or it is
//!   **ejected** for failing the requests sent to it. Never routed; when every pod of a role is
//!   down the request is refused.
//!
//! **Passive ejection** (Envoy's outlier detection, over the pods kvroute picks). Every VM sorts
//! each finished request into served or failed for the pod it chose ([`judge`]): a 5xx, a reset
//! before the response, or a response that came from a fallback pod (Envoy's retry walked past the
//! primary: it refused, reset, timed out or answered 503) count against the pod; a client that
//! went away counts for nobody. VMs send their counts to the leader once a tick; the leader keeps a
//! window per pod (exponentially decayed, time constant `window_ms`) and ejects a pod when
//! `consecutive_failures` requests in a row failed, or when at least `min_requests` ended in the
//! window and more than `max_failure_ratio` of them failed. The same ratio is also judged over a
//! window twenty times shorter (500 ms at the default): a pod that turns bad after serving well
//! has the long window full of its old successes, which dilute its new failures for several time
//! constants, while each failure moves the failed prefix to the fallback that served it and starves
//! the pod of the traffic that would show them (the fault matrix saw a pod failing half its
//! requests, 28 of them in 3 s, never ejected). An ejection lasts `base_ejection_ms`, doubling
//! with each ejection in a row up to `max_ejection_ms`; then the pod takes traffic again
//! and a clean window forgives its past. At most `max_ejected_share` of a role's pods are ejected
//! at once (rounded down): a fault that hits every pod alike (a bad model version, a poison
//! prompt) must not empty the pool of pods that still serve most requests.

use crate::common::Role;
use crate::pod::load::PodLoad;
use hashbrown::HashMap;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Fresh,
    Stale,
    Down,
    /// Never heard from (its first poll has not answered or timed out yet): not routed while
    /// any pod is known; when none is (start-up), requests pass to the cluster's balancer.
    Unknown,
}

/// The pod's health at `now_ms` (see the module header).
pub fn health_of(pod: &PodLoad, now_ms: u64, stale_after_ms: u64) -> Health {
    if pod.failing || pod.ejected_until_ms > now_ms {
        Health::Down
    } else if pod.is_fresh(now_ms, stale_after_ms) {
        Health::Fresh
    } else if pod.metrics_at_ms > 0 || pod.late {
        Health::Stale
    } else {
        Health::Unknown
    }
}

/// A poll call that ended without an answer after this share of its timeout timed out (the pod is
/// late); one that ended sooner was refused or reset (the pod is down). Envoy reports both alike.
const TIMED_OUT_SHARE: f64 = 0.8;

pub fn poll_timed_out(elapsed_ms: u64, timeout_ms: u64) -> bool {
    elapsed_ms as f64 >= TIMED_OUT_SHARE * timeout_ms as f64
}

/// How a routed request ended, as the proxy reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestEnd {
    /// The response status the client got, if any.
    pub status: Option<u32>,
    /// The pod the last upstream attempt went to (`ip:port`), if any.
    pub upstream: Option<String>,
    /// The proxy's reason for the response (Envoy's `response.code_details`).
    pub details: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Served,
    Failed,
}

/// What a request's end says about the pods involved: the primary's verdict, and the verdict of the
/// fallback pod that answered instead, if one did.
pub fn judge(primary: &str, end: &RequestEnd) -> Vec<(String, Verdict)> {
    let details = end.details.as_deref().unwrap_or("");
    if details.starts_with("downstream") || details.contains("client_disconnect") {
        return Vec::new(); // the client left: nothing is known about the pod
    }
    // A pod that dies mid-stream leaves the 200 it had already sent as the status: only the
    // details tell the client's stream was cut.
    let cut = details.starts_with("upstream_reset_after_response_started");
    let by_status = |status: Option<u32>| match status {
        _ if cut => Some(Verdict::Failed),
        Some(500..=599) | None => Some(Verdict::Failed),
        // An engine's 429 is back-pressure, not a fault.
        Some(429) => None,
        Some(_) => Some(Verdict::Served),
    };
    match end.upstream.as_deref().filter(|u| !u.is_empty()) {
        Some(upstream) if upstream != primary => {
            let mut verdicts = vec![(primary.to_string(), Verdict::Failed)];
            if let Some(v) = by_status(end.status) {
                verdicts.push((upstream.to_string(), v));
            }
            verdicts
        }
        _ => by_status(end.status)
            .map(|v| vec![(primary.to_string(), v)])
            .unwrap_or_default(),
    }
}

/// One VM's verdicts per pod since it last reported them to the leader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub served: u32,
    pub failed: u32,
    /// Failures since the last success, in this batch.
    pub trailing_failures: u32,
}

impl Tally {
    pub fn add(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Served => {
                self.served = self.served.saturating_add(1);
                self.trailing_failures = 0;
            }
            Verdict::Failed => {
                self.failed = self.failed.saturating_add(1);
                self.trailing_failures = self.trailing_failures.saturating_add(1);
            }
        }
    }
}

/// `health` in the configuration: passive ejection's thresholds and the first-byte timeout (see
/// the module header).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Streamed requests: how long Envoy waits for a pod to start answering before it retries on
    /// the next fallback, at least; 0 leaves the route's own timeouts alone.
    pub first_byte_timeout_ms: u64,
    /// … or this many times the slowest predicted TTFT among the destinations, if longer.
    pub first_byte_timeout_factor: f64,
    /// Non-streamed requests: the per-attempt timeout where kvroute cannot predict the whole
    /// answer (no `max_tokens`, or no inter-token latency timed among the destinations yet);
    /// 0: none (the route's own timeout).
    pub non_streamed_timeout_ms: u64,
    pub consecutive_failures: u32,
    pub min_requests: f64,
    pub max_failure_ratio: f64,
    pub window_ms: u64,
    pub base_ejection_ms: u64,
    pub max_ejection_ms: u64,
    pub max_ejected_share: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            // A model server answers a stream's headers before its first token (vLLM, SGLang and
            // TRT-LLM return a streaming response at once), so a pod silent this long is hung
            // (SIGSTOP, a wedged API process), not busy.
            first_byte_timeout_ms: 5_000,
            first_byte_timeout_factor: 4.0,
            // A non-streamed answer arrives whole, so only its length can bound it; without
            // `max_tokens` nothing says how long it may be. Five minutes is ~15,000 tokens at
            // 20 ms each and well inside the 900 s `stream_idle_timeout` of the shipped Envoy
            // configurations (which already cut any answer silent for longer), yet it lets passive
            // health see a frozen pod instead of it holding such requests until that idle timeout.
            non_streamed_timeout_ms: 300_000,
            // Envoy's outlier detection ejects after 5 consecutive 5xx; the ratio catches a pod
            // failing every other request, which rarely fails five in a row.
            consecutive_failures: 5,
            min_requests: 5.0,
            max_failure_ratio: 0.3,
            window_ms: 10_000,
            base_ejection_ms: 5_000,
            max_ejection_ms: 60_000,
            max_ejected_share: 0.5,
        }
    }
}

impl HealthConfig {
    pub fn validate(&self) -> Result<(), crate::common::ConfigError> {
        let field = |name: &str, reason: &str| {
            Err(crate::common::ConfigError::at(
                format!("health.{name}"),
                reason,
            ))
        };
        if !(self.first_byte_timeout_factor.is_finite() && self.first_byte_timeout_factor >= 1.0) {
            return field("first_byte_timeout_factor", "must be at least 1");
        }
        if self.consecutive_failures == 0 {
            return field("consecutive_failures", "must be at least 1");
        }
        if !(self.min_requests.is_finite() && self.min_requests >= 1.0) {
            return field("min_requests", "must be at least 1");
        }
        if !(self.max_failure_ratio.is_finite() && (0.0..=1.0).contains(&self.max_failure_ratio)) {
            return field("max_failure_ratio", "must be in [0, 1]");
        }
        if self.window_ms < 100 {
            return field("window_ms", "must be at least 100");
        }
        if self.base_ejection_ms == 0 || self.max_ejection_ms < self.base_ejection_ms {
            return field(
                "max_ejection_ms",
                "base_ejection_ms must be positive and max_ejection_ms at least as large",
            );
        }
        if !(self.max_ejected_share.is_finite() && (0.0..=1.0).contains(&self.max_ejected_share)) {
            return field("max_ejected_share", "must be in [0, 1]");
        }
        Ok(())
    }
}

impl HealthConfig {
    /// The per-attempt timeout for a streamed request whose destinations are predicted to give their
    /// first token within `slowest_predicted_ms` at worst.
    pub fn first_byte_timeout(&self, slowest_predicted_ms: f64) -> Option<u64> {
        (self.first_byte_timeout_ms > 0).then(|| {
            let relative = (slowest_predicted_ms.max(0.0) * self.first_byte_timeout_factor) as u64;
            self.first_byte_timeout_ms.max(relative)
        })
    }

    /// The per-attempt timeout for a non-streamed request: `predicted` (the first-byte rule on
    /// its predicted whole answer), or `non_streamed_timeout_ms` where nothing predicts it. A
    /// prediction is not capped by the ceiling: a client that sets a large `max_tokens` allows an
    /// answer that long, and cutting it would only retry the same work on another pod.
    pub fn non_streamed_timeout(&self, predicted: Option<u64>) -> Option<u64> {
        predicted.or((self.non_streamed_timeout_ms > 0).then_some(self.non_streamed_timeout_ms))
    }
}

/// Requests served and failed, each counting less as it ages (exponentially decayed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Decayed {
    served: f64,
    failed: f64,
}

impl Decayed {
    fn decay(&mut self, dt_ms: f64, time_constant_ms: f64) {
        let keep = (-dt_ms / time_constant_ms).exp();
        self.served *= keep;
        self.failed *= keep;
    }

    fn fails(&self, config: &HealthConfig) -> bool {
        let total = self.served + self.failed;
        total >= config.min_requests && self.failed / total > config.max_failure_ratio
    }
}

/// The short window's time constant is the configured window's divided by this. A busy pod's short
/// window holds its last half second or so: with `min_requests` 5 it judges only pods taking 10 or
/// more requests a second (there the long window's dilution is worst; a quieter pod's long window
/// holds few old successes), and a pod whose traffic fell tenfold as it began failing half of it
/// shows the change within about a second (`a_pod_that_turns_bad_after_serving_well_...`).
const SHORT_WINDOW_DIVISOR: f64 = 20.0;

/// The leader's passive view of one pod.
#[derive(Debug, Clone, Default, PartialEq)]
struct Window {
    /// Over `window_ms`.
    long: Decayed,
    /// Over `window_ms / SHORT_WINDOW_DIVISOR`.
    short: Decayed,
    decayed_at_ms: u64,
    consecutive_failures: u32,
    /// Ejections in a row (reset by a clean window after the last one).
    ejections: u32,
    ejected_until_ms: u64,
    last_failure_ms: u64,
}

impl Window {
    fn decay(&mut self, config: &HealthConfig, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.decayed_at_ms) as f64;
        let window = config.window_ms as f64;
        self.long.decay(dt, window);
        self.short.decay(dt, window / SHORT_WINDOW_DIVISOR);
        self.decayed_at_ms = now_ms;
    }
}

/// The leader's passive health of every pod: fed with the VMs' tallies, asked which pods are
/// ejected.
#[derive(Debug, Default)]
pub struct PassiveHealth {
    pods: HashMap<String, Window>,
}

impl PassiveHealth {
    pub fn record(&mut self, config: &HealthConfig, addr: &str, tally: Tally, now_ms: u64) {
        let w = self.pods.entry_ref(addr).or_default();
        w.decay(config, now_ms);
        for d in [&mut w.long, &mut w.short] {
            d.served += f64::from(tally.served);
            d.failed += f64::from(tally.failed);
        }
        if tally.failed > 0 {
            w.last_failure_ms = now_ms;
        }
        w.consecutive_failures = if tally.served > 0 {
            tally.trailing_failures
        } else {
            w.consecutive_failures
                .saturating_add(tally.trailing_failures)
        };
    }

    /// Ejects the pods that crossed a threshold (within each role's share); returns how many were
    /// ejected now. `pods` are every known pod with its role.
    pub fn update(&mut self, config: &HealthConfig, pods: &[(&str, Role)], now_ms: u64) -> u32 {
        self.pods
            .retain(|addr, _| pods.iter().any(|(a, _)| *a == addr.as_str()));
        let mut ejected_now = 0;
        for (addr, role) in pods {
            let Some(w) = self.pods.get_mut(*addr) else {
                continue;
            };
            w.decay(config, now_ms);
            if w.ejected_until_ms > now_ms {
                continue;
            }
            if w.ejections > 0
                && now_ms.saturating_sub(w.ejected_until_ms.max(w.last_failure_ms))
                    > config.window_ms
            {
                w.ejections = 0; // a clean window since it came back
            }
            let failing = w.consecutive_failures >= config.consecutive_failures
                || w.long.fails(config)
                || w.short.fails(config);
            if !failing {
                continue;
            }
            let of_role = pods.iter().filter(|(_, r)| r == role).count();
            let allowed = (of_role as f64 * config.max_ejected_share).floor() as usize;
            if self.ejected(pods, *role, now_ms) >= allowed {
                continue;
            }
            let Some(w) = self.pods.get_mut(*addr) else {
                continue;
            };
            w.ejections = w.ejections.saturating_add(1);
            let factor = 1u64 << w.ejections.saturating_sub(1).min(16);
            let span = config
                .base_ejection_ms
                .saturating_mul(factor)
                .min(config.max_ejection_ms);
            w.ejected_until_ms = now_ms.saturating_add(span);
            w.long = Decayed::default();
            w.short = Decayed::default();
            w.consecutive_failures = 0;
            ejected_now += 1;
            log::warn!(
                "kvroute: pod {addr} ejected for {span} ms: its requests fail (ejection {} in a row)",
                w.ejections
            );
        }
        ejected_now
    }

    fn ejected(&self, pods: &[(&str, Role)], role: Role, now_ms: u64) -> usize {
        pods.iter()
            .filter(|(a, r)| {
                *r == role
                    && self
                        .pods
                        .get(*a)
                        .is_some_and(|w| w.ejected_until_ms > now_ms)
            })
            .count()
    }

    /// Until when `addr` is ejected (0: it is not).
    pub fn ejected_until(&self, addr: &str) -> u64 {
        self.pods.get(addr).map_or(0, |w| w.ejected_until_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(status: Option<u32>, upstream: Option<&str>, details: &str) -> RequestEnd {
        RequestEnd {
            status,
            upstream: upstream.map(str::to_string),
            details: Some(details.to_string()),
        }
    }

    #[test]
    fn request_ends_are_judged_for_the_pod_that_caused_them() {
        let p = "10.0.0.1:8000";
        let f = "10.0.0.2:8000";
        assert_eq!(
            judge(p, &end(Some(200), Some(p), "via_upstream")),
            vec![(p.to_string(), Verdict::Served)]
        );
        assert_eq!(
            judge(p, &end(Some(500), Some(p), "via_upstream")),
            vec![(p.to_string(), Verdict::Failed)]
        );
        assert_eq!(
            judge(p, &end(Some(400), Some(p), "via_upstream")),
            vec![(p.to_string(), Verdict::Served)],
            "a client error is the client's"
        );
        assert!(judge(p, &end(Some(429), Some(p), "via_upstream")).is_empty());
        assert_eq!(
            judge(p, &end(Some(200), Some(f), "via_upstream")),
            vec![
                (p.to_string(), Verdict::Failed),
                (f.to_string(), Verdict::Served)
            ],
            "a fallback answered: the retry walked past the primary"
        );
        assert_eq!(
            judge(
                p,
                &end(
                    Some(503),
                    Some(p),
                    "upstream_reset_before_response_started{connection_failure}"
                )
            ),
            vec![(p.to_string(), Verdict::Failed)]
        );
        assert_eq!(
            judge(
                p,
                &end(None, Some(p), "upstream_reset_after_response_started")
            ),
            vec![(p.to_string(), Verdict::Failed)]
        );
        // Envoy keeps the 200 the pod sent before it died mid-stream.
        assert_eq!(
            judge(
                p,
                &end(
                    Some(200),
                    Some(p),
                    "upstream_reset_after_response_started{connection_termination}"
                )
            ),
            vec![(p.to_string(), Verdict::Failed)]
        );
        assert!(
            judge(p, &end(None, Some(p), "downstream_remote_disconnect")).is_empty(),
            "the client left"
        );
    }

    #[test]
    fn a_pod_is_unknown_until_a_poll_answers_or_times_out() {
        let mut pod = PodLoad {
            addr: "a:1".into(),
            role: Role::Aggregated,
            pool: String::new(),
            metrics_at_ms: 0,
            failing: false,
            late: false,
            ejected_until_ms: 0,
            metrics: Default::default(),
            served: Vec::new(),
            serves: Vec::new(),
            locality: None,
            restarts: 0,
            seats: None,
        };
        assert_eq!(health_of(&pod, 5000, 2000), Health::Unknown);
        pod.late = true;
        assert_eq!(
            health_of(&pod, 5000, 2000),
            Health::Stale,
            "it took the connection"
        );
        pod.late = false;
        pod.metrics_at_ms = 4000;
        assert_eq!(health_of(&pod, 5000, 2000), Health::Fresh);
        assert_eq!(health_of(&pod, 6001, 2000), Health::Stale);
        pod.ejected_until_ms = 7000;
        assert_eq!(health_of(&pod, 6001, 2000), Health::Down);
        pod.ejected_until_ms = 0;
        pod.failing = true;
        assert_eq!(health_of(&pod, 4000, 2000), Health::Down);
    }

    #[test]
    fn a_late_poll_is_told_from_a_refused_one_by_its_duration() {
        assert!(poll_timed_out(1000, 1000));
        assert!(poll_timed_out(850, 1000));
        assert!(!poll_timed_out(3, 1000));
    }

    fn tally(served: u32, failed: u32, trailing: u32) -> Tally {
        Tally {
            served,
            failed,
            trailing_failures: trailing,
        }
    }

    #[test]
    fn a_pod_failing_half_its_requests_is_ejected_and_comes_back() {
        let cfg = HealthConfig::default();
        let pods = [
            ("a", Role::Aggregated),
            ("b", Role::Aggregated),
            ("c", Role::Aggregated),
        ];
        let mut h = PassiveHealth::default();
        // Alternating: never five in a row, but half of them.
        h.record(&cfg, "a", tally(2, 1, 0), 1000);
        assert_eq!(h.update(&cfg, &pods, 1000), 0, "too few requests yet");
        h.record(&cfg, "a", tally(2, 2, 1), 1200);
        h.record(&cfg, "b", tally(10, 0, 0), 1200);
        assert_eq!(h.update(&cfg, &pods, 1200), 1);
        assert_eq!(h.ejected_until("a"), 1200 + cfg.base_ejection_ms);
        assert_eq!(h.ejected_until("b"), 0);
        // Back after the ejection, failing again: ejected twice as long.
        let back = 1200 + cfg.base_ejection_ms;
        h.record(&cfg, "a", tally(0, 5, 5), back + 100);
        assert_eq!(h.update(&cfg, &pods, back + 100), 1);
        assert_eq!(h.ejected_until("a"), back + 100 + 2 * cfg.base_ejection_ms);
        // A clean window after it returns forgives the past.
        let back = back + 100 + 2 * cfg.base_ejection_ms;
        h.record(&cfg, "a", tally(20, 0, 0), back + cfg.window_ms + 1);
        h.update(&cfg, &pods, back + cfg.window_ms + 1);
        let later = back + 3 * cfg.window_ms;
        h.record(&cfg, "a", tally(0, 5, 5), later);
        assert_eq!(h.update(&cfg, &pods, later), 1);
        assert_eq!(h.ejected_until("a"), later + cfg.base_ejection_ms);
    }

    #[test]
    fn a_pod_that_turns_bad_after_serving_well_is_ejected_in_about_a_second() {
        let cfg = HealthConfig::default();
        let pods = [("a", Role::Aggregated), ("b", Role::Aggregated)];
        let mut h = PassiveHealth::default();
        // Busy and healthy for ten seconds (as in the fault matrix: ~100 requests a second) ...
        for t in 0..100 {
            h.record(&cfg, "a", tally(10, 0, 0), t * 100);
        }
        assert_eq!(h.update(&cfg, &pods, 9_900), 0);
        // ... then failing half of the few requests it still gets, never two in a row.
        let mut ejected_at = None;
        for t in 1..=30u64 {
            let now = 9_900 + t * 100;
            h.record(&cfg, "a", tally(1, 1, 0), now);
            if h.update(&cfg, &pods, now) == 1 {
                ejected_at = Some(t * 100);
                break;
            }
        }
        let after = ejected_at.expect("never ejected in 3 s");
        assert!(after <= 1_500, "ejected {after} ms after it turned bad");
    }

    #[test]
    fn a_healthy_pods_occasional_failure_ejects_nothing() {
        let cfg = HealthConfig::default();
        let pods = [("a", Role::Aggregated), ("b", Role::Aggregated)];
        let mut h = PassiveHealth::default();
        // 20 requests a second, one in twenty failing (a poison prompt now and then).
        for t in 0..600u64 {
            let failed = u32::from(t % 10 == 9);
            h.record(&cfg, "a", tally(2 - failed, failed, failed), t * 100);
            assert_eq!(h.update(&cfg, &pods, t * 100), 0, "at {} ms", t * 100);
        }
    }

    #[test]
    fn consecutive_failures_count_across_batches_and_a_success_resets_them() {
        let cfg = HealthConfig::default();
        let pods = [("a", Role::Aggregated), ("b", Role::Aggregated)];
        let mut h = PassiveHealth::default();
        h.record(&cfg, "a", tally(50, 0, 0), 0);
        h.record(&cfg, "a", tally(0, 2, 2), 100);
        h.record(&cfg, "a", tally(1, 2, 2), 200);
        assert_eq!(h.update(&cfg, &pods, 200), 0, "a success broke the run");
        h.record(&cfg, "a", tally(0, 3, 3), 300);
        assert_eq!(h.update(&cfg, &pods, 300), 1, "2 + 3 in a row");
    }

    #[test]
    fn a_fault_on_every_pod_ejects_at_most_the_configured_share() {
        let cfg = HealthConfig::default();
        let pods = [
            ("a", Role::Aggregated),
            ("b", Role::Aggregated),
            ("c", Role::Aggregated),
            ("d", Role::Aggregated),
            ("p", Role::Prefill),
        ];
        let mut h = PassiveHealth::default();
        for (addr, _) in &pods {
            h.record(&cfg, addr, tally(0, 10, 10), 0);
        }
        assert_eq!(
            h.update(&cfg, &pods, 0),
            2,
            "half of four; none of one prefill pod"
        );
        assert_eq!(h.ejected_until("p"), 0);
    }

    #[test]
    fn a_non_streamed_attempt_is_bounded_by_its_prediction_or_else_the_ceiling() {
        let mut c = HealthConfig::default();
        assert_eq!(c.non_streamed_timeout(None), Some(300_000), "no prediction");
        assert_eq!(c.non_streamed_timeout(Some(8_000)), Some(8_000));
        assert_eq!(
            c.non_streamed_timeout(Some(900_000)),
            Some(900_000),
            "not capped"
        );
        c.non_streamed_timeout_ms = 0;
        assert_eq!(c.non_streamed_timeout(None), None, "the route's timeout");
        assert_eq!(c.non_streamed_timeout(Some(900_000)), Some(900_000));
    }

    #[test]
    fn config_is_validated_by_field() {
        let mut c = HealthConfig::default();
        assert!(c.validate().is_ok());
        c.max_failure_ratio = 2.0;
        assert_eq!(c.validate().unwrap_err().field, "health.max_failure_ratio");
    }
}
