//! Turning a run's request records and pod counters into figures, a comparison table and JSON.
//!
//! Latency percentiles are taken over successful requests only (a refused request has no TTFT), and
//! inter-token latencies are pooled over all of them, as vLLM's own benchmark does. With a time scale
//! F ≠ 1 every time is divided by F and every rate multiplied by F, so a run on a 20× faster simulator
//! reads like the real-speed experiment; the table says so.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::driver::RequestRecord;
use super::metrics::{cluster_hit_ratio, PodDelta};
use super::overload::OverloadStats;
use super::table::Table;
use super::workload::{Load, WorkloadSpec};

/// The `p`-th percentile (0–100) of `values`, linearly interpolated between closest ranks (NumPy's
/// default), ignoring NaNs. `None` for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, p)
}

fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p.clamp(0.0, 100.0) / 100.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let (a, b) = (*sorted.get(lo)?, *sorted.get(hi)?);
    Some(a + (b - a) * (rank - lo as f64))
}

/// Distribution summary of one latency, in simulated milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Summary {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let mean = (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        Self {
            count: v.len(),
            mean,
            p50: percentile_sorted(&v, 50.0),
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
        }
    }
}

/// How well kvroute's per-request TTFT prediction (`predicted_ttft_ms` in its `x-kvroute-debug`
/// response header) matched the TTFT the client observed, over successful requests that carried
/// one. Both sides are wall-clock milliseconds (the plugin lives in wall time, whatever the
/// simulator's time scale).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PredictionQuality {
    /// Successful requests with both a prediction and an observed TTFT.
    pub requests: usize,
    /// Median of |predicted − observed| / observed; `None` without predictions.
    pub median_abs_rel_error: Option<f64>,
    pub p90_abs_rel_error: Option<f64>,
    /// Median of (predicted − observed) / observed: the sign says which way it errs.
    pub median_rel_bias: Option<f64>,
}

impl PredictionQuality {
    /// From the driver's wall-clock records.
    pub fn of(records: &[&RequestRecord]) -> Self {
        let pairs: Vec<(f64, f64)> = records
            .iter()
            .filter_map(|r| Some((r.predicted_ttft_ms?, r.ttft_s? * 1000.0)))
            .filter(|(p, o)| p.is_finite() && o.is_finite() && *o > 0.0)
            .collect();
        let rel: Vec<f64> = pairs.iter().map(|(p, o)| (p - o) / o).collect();
        let abs: Vec<f64> = rel.iter().map(|x| x.abs()).collect();
        Self {
            requests: pairs.len(),
            median_abs_rel_error: percentile(&abs, 50.0),
            p90_abs_rel_error: percentile(&abs, 90.0),
            median_rel_bias: percentile(&rel, 50.0),
        }
    }
}

/// With the shadow probe (`kvbench compare --shadow-probe`): the gateway's choices against the
/// pods' own estimates, taken just before it chose. The estimate is the simulator stepping its
/// real batch (`POST /sim/probe`), what the perfect-knowledge bound routes by; *regret* is the
/// chosen pod's estimate minus the earliest pod's, in simulated ms.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShadowRegret {
    /// Requests whose every pod answered the probe and whose serving pod is known.
    pub requests: usize,
    /// Of those, the share sent to a pod whose estimate was within 5% of the earliest (the
    /// gateway's default tie band).
    pub earliest_share: f64,
    pub regret_p50_ms: f64,
    pub regret_p90_ms: f64,
    pub regret_mean_ms: f64,
    /// Mean of regret / the earliest estimate.
    pub relative_regret_mean: f64,
    /// Per pod: requests the gateway sent it, and requests whose earliest pod it was.
    pub per_pod: BTreeMap<String, (usize, usize)>,
}

impl ShadowRegret {
    /// `None` when no record carries a full probe.
    pub fn of(records: &[&RequestRecord]) -> Option<Self> {
        let mut out = ShadowRegret::default();
        let mut regrets = Vec::new();
        let mut relative = 0.0;
        let mut near = 0;
        for r in records {
            let Some(pod) = &r.pod else { continue };
            let Some(chosen) = r.probed_ttft_ms.iter().find(|(p, _)| p == pod).map(|e| e.1) else {
                continue;
            };
            let Some((best_pod, best)) = r
                .probed_ttft_ms
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .cloned()
            else {
                continue;
            };
            let regret = (chosen - best).max(0.0);
            regrets.push(regret);
            if best > 0.0 {
                relative += regret / best;
            }
            if chosen <= best * 1.05 {
                near += 1;
            }
            out.per_pod.entry(pod.clone()).or_insert((0, 0)).0 += 1;
            out.per_pod.entry(best_pod).or_insert((0, 0)).1 += 1;
        }
        if regrets.is_empty() {
            return None;
        }
        let n = regrets.len() as f64;
        out.requests = regrets.len();
        out.earliest_share = near as f64 / n;
        out.regret_p50_ms = percentile(&regrets, 50.0).unwrap_or(0.0);
        out.regret_p90_ms = percentile(&regrets, 90.0).unwrap_or(0.0);
        out.regret_mean_ms = regrets.iter().sum::<f64>() / n;
        out.relative_regret_mean = relative / n;
        Some(out)
    }

    /// One paragraph for the run's text report.
    pub fn describe(&self, label: &str) -> String {
        let pods: Vec<String> = self
            .per_pod
            .iter()
            .map(|(p, (sent, earliest))| format!("{p} sent {sent} / earliest {earliest}"))
            .collect();
        format!(
            "{label} vs the pods' own estimates (shadow probe, {} requests): the earliest pod (within 5%) in {:.1}%; regret p50 {:.0} ms, p90 {:.0} ms, mean {:.0} ms ({:.1}% of the earliest estimate)\n  {}",
            self.requests,
            self.earliest_share * 100.0,
            self.regret_p50_ms,
            self.regret_p90_ms,
            self.regret_mean_ms,
            self.relative_regret_mean * 100.0,
            pods.join(", ")
        )
    }
}

/// The result of one run. Times are simulated milliseconds or seconds and rates per simulated
/// second (wall-clock values when `time_scale` is 1).
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// `multi-tenant`, `multi-turn` or `agent`.
    pub workload: String,
    /// `rate 2/s` or `concurrency 8`.
    pub load: String,
    pub seed: u64,
    pub time_scale: f64,
    /// True when `time_scale` ≠ 1, i.e. the figures are not wall-clock figures.
    pub simulated_time: bool,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// The same in simulated seconds.
    pub duration_s: f64,
    /// Requests sent (abandoned ones excluded).
    pub requests: usize,
    pub ok: usize,
    pub failed: usize,
    /// Turns that never got sent because their session's previous turn was still running at the
    /// drain deadline.
    pub abandoned: usize,
    /// ok / requests.
    pub success_rate: Option<f64>,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Output tokens of successful requests per second.
    pub output_tokens_per_s: f64,
    /// Prompt tokens of successful requests per second.
    pub prompt_tokens_per_s: f64,
    pub ttft_ms: Summary,
    /// Every successful request's TTFT, sorted, rounded to 0.1 ms: the data of the TTFT CDF
    /// (`kvbench compare`'s `<workload>-ttft-cdf.png`).
    pub ttft_samples_ms: Vec<f64>,
    pub itl_ms: Summary,
    pub e2e_ms: Summary,
    /// Σ Δhits / Σ Δqueries over the pods' prefix-cache counters.
    pub cache_hit_ratio: Option<f64>,
    /// Mean over successful responses of `cached_tokens / prompt_tokens` from their usage.
    pub mean_cached_fraction: Option<f64>,
    /// kvroute's TTFT predictions against the observed TTFT (wall clock).
    pub prediction: PredictionQuality,
    /// With the shadow probe: the gateway's choices against the pods' own estimates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowRegret>,
    /// Requests (sent, with an `x-kvsim-pod` header) per serving pod.
    pub pod_requests: BTreeMap<String, usize>,
    /// Counter deltas per scraped pod.
    pub pods: Vec<PodDelta>,
    /// Failures by class.
    pub errors: BTreeMap<String, usize>,
    pub spec: WorkloadSpec,
    /// Per-request records in simulated seconds, when `spec.keep_records`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<RequestRecord>,
    /// With `kvbench compare --reset-caches-at`: every pod's cache emptied during the run, and
    /// the hit ratio in windows around it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_reset: Option<CacheReset>,
    /// With a workload whose requests carry a priority (`overload`): the figures per class and
    /// tenant, fairness and whether every request was answered in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadStats>,
    /// kvroute's `kvroute.flow.*` counters at the end of the run, each summed over its labels but
    /// `dropped_total`'s reason (`flow.dropped_total{reason=queue_timeout}`); empty without kvroute.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gateway_flow: BTreeMap<String, u64>,
}

/// How far the hit ratio may be below its steady level and count as back
/// ([`CacheReset::recovered_after_s`]).
pub const RECOVERY_TOLERANCE: f64 = 0.05;

/// Simulated seconds per window of [`CacheReset::windows`].
pub const RESET_WINDOW_S: f64 = 10.0;

/// One window of a run with a cache reset: the requests started in it and their hit ratio.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HitWindow {
    /// Simulated seconds from the start of the run (warm-up included).
    pub start_s: f64,
    /// Successful requests started in the window that reported their prompt's tokens.
    pub requests: usize,
    /// Σ cached_tokens / Σ prompt_tokens of those requests (their responses' usage); `None`
    /// without any.
    pub hit_ratio: Option<f64>,
}

/// Every pod's prefix cache emptied (`POST /sim/reset` to each pod) `reset_at_s` simulated
/// seconds into the run, and how the hit ratio came back: per [`RESET_WINDOW_S`] window of request
/// start times, from the responses' `cached_tokens` (the pods' counters cover the whole run only).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CacheReset {
    /// Simulated seconds from the start of the run (warm-up included).
    pub reset_at_s: f64,
    /// Pods that answered the reset.
    pub pods_reset: usize,
    /// Pods that did not, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// The hit ratio of the requests started from the end of the warm-up to the reset: the level
    /// to come back to.
    pub steady_hit_ratio: Option<f64>,
    /// Simulated seconds from the reset to the end of the first window after it whose hit ratio
    /// is within [`RECOVERY_TOLERANCE`] of the steady level; `None`: never, in this run.
    pub recovered_after_s: Option<f64>,
    /// Every window from the start of the run.
    pub windows: Vec<HitWindow>,
}

impl CacheReset {
    /// From the driver's wall-clock `records` (start times from the start of the run): the
    /// windows, the steady level over `[warmup_s, reset_at_s)` and the recovery. Times in
    /// simulated seconds.
    pub fn of(
        records: &[RequestRecord],
        time_scale: f64,
        warmup_s: f64,
        reset_at_s: f64,
        pods_reset: usize,
        errors: Vec<String>,
    ) -> Self {
        // (simulated start, cached, prompt) of each successful request that reported both.
        let tokens: Vec<(f64, u64, u64)> = records
            .iter()
            .filter(|r| r.sent && r.ok)
            .filter_map(|r| match (r.cached_tokens, r.prompt_tokens) {
                (Some(c), Some(p)) if p > 0 => Some((r.start_s / time_scale, c.min(p), p)),
                _ => None,
            })
            .collect();
        let ratio_in = |from: f64, to: f64| {
            let (n, c, p) = tokens
                .iter()
                .filter(|(t, _, _)| *t >= from && *t < to)
                .fold((0, 0u64, 0u64), |(n, c, p), (_, ci, pi)| {
                    (n + 1, c + ci, p + pi)
                });
            (n, (p > 0).then(|| c as f64 / p as f64))
        };
        let last = tokens.iter().map(|t| t.0).fold(0.0, f64::max);
        let mut windows = Vec::new();
        let mut start = 0.0;
        while start <= last {
            let (requests, hit_ratio) = ratio_in(start, start + RESET_WINDOW_S);
            windows.push(HitWindow {
                start_s: start,
                requests,
                hit_ratio,
            });
            start += RESET_WINDOW_S;
        }
        let steady_hit_ratio = ratio_in(warmup_s.min(reset_at_s), reset_at_s).1;
        let recovered_after_s = steady_hit_ratio.and_then(|steady| {
            windows
                .iter()
                .filter(|w| w.start_s >= reset_at_s)
                .find(|w| {
                    w.hit_ratio
                        .is_some_and(|h| h >= steady - RECOVERY_TOLERANCE)
                })
                .map(|w| w.start_s + RESET_WINDOW_S - reset_at_s)
        });
        Self {
            reset_at_s,
            pods_reset,
            errors,
            steady_hit_ratio,
            recovered_after_s,
            windows,
        }
    }

    /// One paragraph for the run's text report.
    pub fn describe(&self, label: &str) -> String {
        let pct = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{:.0}%", x * 100.0));
        let windows: Vec<String> = self
            .windows
            .iter()
            .map(|w| {
                let mark = if w.start_s >= self.reset_at_s
                    && w.start_s < self.reset_at_s + RESET_WINDOW_S
                {
                    "|"
                } else {
                    ""
                };
                format!("{mark}{}", pct(w.hit_ratio))
            })
            .collect();
        let back = match self.recovered_after_s {
            Some(s) => format!("back within {RECOVERY_TOLERANCE} of it {s:.0} s after the reset"),
            None => format!("not back within {RECOVERY_TOLERANCE} of it by the end of the run"),
        };
        let errors = if self.errors.is_empty() {
            String::new()
        } else {
            format!(" (not reset: {})", self.errors.join("; "))
        };
        format!(
            "{label}: every pod's cache emptied at {} s ({} pods{errors}); hit ratio of the requests started in each {} s window from the start (responses' cached tokens; | = the reset): {}\n  steady level {} (from the end of the warm-up to the reset), {back}",
            trim_float(self.reset_at_s),
            self.pods_reset,
            trim_float(RESET_WINDOW_S),
            windows.join(" "),
            pct(self.steady_hit_ratio),
        )
    }
}

impl RunReport {
    /// Builds the report from the driver's wall-clock records and the pods' counter deltas.
    pub fn build(
        spec: &WorkloadSpec,
        time_scale: f64,
        wall_s: f64,
        records: &[RequestRecord],
        pods: Vec<PodDelta>,
    ) -> Self {
        let ms = |s: f64| s * 1000.0 / time_scale;
        let sent: Vec<&RequestRecord> = records.iter().filter(|r| r.sent).collect();
        let ok: Vec<&RequestRecord> = sent.iter().copied().filter(|r| r.ok).collect();
        let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).map(ms).collect();
        let itl: Vec<f64> = ok
            .iter()
            .flat_map(|r| r.itl_s.iter().copied())
            .map(ms)
            .collect();
        let e2e: Vec<f64> = ok.iter().filter_map(|r| r.e2e_s).map(ms).collect();
        let duration_s = wall_s / time_scale;
        let per_s = |n: f64| {
            if duration_s > 0.0 {
                n / duration_s
            } else {
                0.0
            }
        };
        let output: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let prompt: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
        let fractions: Vec<f64> = ok
            .iter()
            .filter_map(|r| match (r.cached_tokens, r.prompt_tokens) {
                (Some(c), Some(p)) if p > 0 => Some(c as f64 / p as f64),
                _ => None,
            })
            .collect();
        let mut pod_requests = BTreeMap::new();
        for pod in sent.iter().filter_map(|r| r.pod.as_ref()) {
            *pod_requests.entry(pod.clone()).or_insert(0) += 1;
        }
        let mut errors = BTreeMap::new();
        for class in records
            .iter()
            .filter(|r| !r.ok)
            .filter_map(|r| r.error.as_ref())
        {
            *errors.entry(class.clone()).or_insert(0) += 1;
        }
        let load = match spec.load {
            Load::Open { rate } => format!("rate {}/s", trim_float(rate)),
            Load::Closed { concurrency } => format!("concurrency {concurrency}"),
        };
        Self {
            workload: spec.workload.name().to_owned(),
            load,
            seed: spec.seed,
            time_scale,
            simulated_time: time_scale != 1.0,
            wall_s,
            duration_s,
            requests: sent.len(),
            ok: ok.len(),
            failed: sent.len() - ok.len(),
            abandoned: records.len() - sent.len(),
            success_rate: (!sent.is_empty()).then(|| ok.len() as f64 / sent.len() as f64),
            requests_per_s: per_s(ok.len() as f64),
            output_tokens_per_s: per_s(output as f64),
            prompt_tokens_per_s: per_s(prompt as f64),
            ttft_ms: Summary::of(&ttft),
            ttft_samples_ms: ttft_samples(&ttft),
            itl_ms: Summary::of(&itl),
            e2e_ms: Summary::of(&e2e),
            cache_hit_ratio: cluster_hit_ratio(&pods),
            mean_cached_fraction: (!fractions.is_empty())
                .then(|| fractions.iter().sum::<f64>() / fractions.len() as f64),
            prediction: PredictionQuality::of(&ok),
            shadow: ShadowRegret::of(&sent),
            pod_requests,
            pods,
            errors,
            spec: spec.clone(),
            records: if spec.keep_records {
                records.iter().map(|r| r.scaled(time_scale)).collect()
            } else {
                Vec::new()
            },
            cache_reset: None,
            overload: OverloadStats::applies(&sent).then(|| OverloadStats::of(&sent, time_scale)),
            gateway_flow: BTreeMap::new(),
        }
    }
}

fn ttft_samples(ttft_ms: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = ttft_ms
        .iter()
        .filter(|x| x.is_finite())
        .map(|x| (x * 10.0).round() / 10.0)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "-".to_owned(),
    }
}

fn pct(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{:.1}", x * 100.0),
        _ => "-".to_owned(),
    }
}

/// A side-by-side comparison of labelled runs: one row per run, then the spread over pods and the
/// failure classes of each run.
pub fn render_table(rows: &[(String, RunReport)]) -> String {
    const HEAD: [&str; 18] = [
        "run",
        "workload",
        "load",
        "reqs",
        "ok%",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "p90",
        "p99",
        "ITL p50",
        "p99",
        "E2E p50",
        "p99",
        "hit%",
        "cached%",
        "pods",
        "max pod%",
    ];
    let mut table = Table::new(&HEAD).left(3);
    for (label, r) in rows {
        let total: usize = r.pod_requests.values().sum();
        let max_share = r
            .pod_requests
            .values()
            .max()
            .map(|&m| m as f64 / total.max(1) as f64);
        table.row([
            label.clone(),
            r.workload.clone(),
            r.load.clone(),
            r.requests.to_string(),
            pct(r.success_rate),
            num(Some(r.requests_per_s), 2),
            num(Some(r.output_tokens_per_s), 1),
            num(r.ttft_ms.p50, 0),
            num(r.ttft_ms.p90, 0),
            num(r.ttft_ms.p99, 0),
            num(r.itl_ms.p50, 1),
            num(r.itl_ms.p99, 1),
            num(r.e2e_ms.p50, 0),
            num(r.e2e_ms.p99, 0),
            pct(r.cache_hit_ratio),
            pct(r.mean_cached_fraction),
            r.pod_requests.len().to_string(),
            pct(max_share),
        ]);
    }
    let mut out = String::new();
    let scales: Vec<f64> = rows.iter().map(|(_, r)| r.time_scale).collect();
    if scales.iter().any(|&s| s != 1.0) {
        let list: Vec<String> = scales.iter().map(|&s| trim_float(s)).collect();
        let _ = writeln!(
            out,
            "Figures are in SIMULATED time (wall times ÷ time scale, rates × time scale; time scale {}).",
            list.join(", ")
        );
    } else {
        let _ = writeln!(out, "Figures are in wall-clock time.");
    }
    let _ = writeln!(
        out,
        "Latencies in ms (percentiles over successful requests); rates per second; hit% from pod counters, cached% from responses' usage."
    );
    out.push_str(&table.text());
    for (label, r) in rows {
        let total: usize = r.pod_requests.values().sum();
        let spread: Vec<String> = r
            .pod_requests
            .iter()
            .map(|(pod, n)| {
                format!(
                    "{pod} {n} ({:.0}%)",
                    *n as f64 * 100.0 / total.max(1) as f64
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{label}: pods: {}",
            if spread.is_empty() {
                "-".to_owned()
            } else {
                spread.join(", ")
            }
        );
        for p in r.pods.iter().filter(|p| p.error.is_some()) {
            let _ = writeln!(
                out,
                "{label}: metrics of {} unavailable: {}",
                p.pod,
                p.error.as_deref().unwrap_or_default()
            );
        }
        if !r.errors.is_empty() || r.abandoned > 0 {
            let errs: Vec<String> = r.errors.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            let _ = writeln!(out, "{label}: failures: {}", errs.join(", "));
        }
    }
    out
}

/// The runs as a JSON array of reports, each with its `label`.
pub fn render_json(rows: &[(String, RunReport)]) -> Value {
    Value::Array(
        rows.iter()
            .map(|(label, r)| {
                let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut v {
                    map.insert("label".to_owned(), Value::String(label.clone()));
                }
                v
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probed(pod: &str, estimates: &[(&str, f64)]) -> RequestRecord {
        RequestRecord {
            pod: Some(pod.to_owned()),
            probed_ttft_ms: estimates.iter().map(|(p, t)| (p.to_string(), *t)).collect(),
            sent: true,
            ..RequestRecord::default()
        }
    }

    /// A successful request started at `start_s` (wall) with `cached` of its 100 prompt tokens.
    fn cached(start_s: f64, cached: u64) -> RequestRecord {
        RequestRecord {
            start_s,
            prompt_tokens: Some(100),
            cached_tokens: Some(cached),
            ok: true,
            sent: true,
            ..RequestRecord::default()
        }
    }

    #[test]
    fn a_cache_reset_reads_the_hit_ratio_per_window_and_its_recovery() {
        // Time scale 0.5: wall 5 s = simulated 10 s. Steady 90% from the warm-up (20 s) to the
        // reset (60 s), 0% in the window after it, 50% in the next, 88% in the one after.
        let mut records = vec![cached(0.0, 0), cached(6.0, 50)];
        for t in [10.0, 15.0, 20.0, 25.0] {
            records.push(cached(t, 90));
        }
        records.push(cached(31.0, 0));
        records.push(cached(36.0, 50));
        records.push(cached(41.0, 88));
        // Failed requests and ones without usage do not count.
        records.push(RequestRecord {
            ok: false,
            ..cached(42.0, 0)
        });
        records.push(RequestRecord {
            prompt_tokens: None,
            ..cached(43.0, 0)
        });
        let r = CacheReset::of(&records, 0.5, 20.0, 60.0, 4, Vec::new());
        assert_eq!(r.steady_hit_ratio, Some(0.9));
        assert_eq!(r.windows.len(), 9, "0–90 s: {:?}", r.windows);
        assert_eq!(r.windows[6].hit_ratio, Some(0.0));
        assert_eq!(r.windows[7].hit_ratio, Some(0.5));
        assert_eq!(r.windows[8].requests, 1);
        assert_eq!(r.recovered_after_s, Some(30.0), "88% ≥ 90% − 5% in 80–90 s");
        let text = r.describe("kvroute");
        assert!(text.contains("emptied at 60 s (4 pods)"), "{text}");
        assert!(text.contains("|0%"), "{text}");
        assert!(text.contains("30 s after the reset"), "{text}");
        let never = CacheReset::of(&records[..8], 0.5, 20.0, 60.0, 4, vec!["x: 500".into()]);
        assert_eq!(never.recovered_after_s, None);
        assert!(never.describe("kvroute").contains("not back"));
        assert!(never.describe("kvroute").contains("not reset: x: 500"));
    }

    #[test]
    fn shadow_regret_measures_each_choice_against_the_earliest_pod() {
        let records = [
            probed("a", &[("a", 100.0), ("b", 200.0)]),
            probed("b", &[("a", 100.0), ("b", 104.0)]),
            probed("b", &[("a", 100.0), ("b", 300.0)]),
            // Not counted: the serving pod was not probed, or nothing was.
            probed("c", &[("a", 100.0), ("b", 300.0)]),
            probed("a", &[]),
        ];
        let refs: Vec<&RequestRecord> = records.iter().collect();
        let s = ShadowRegret::of(&refs).unwrap();
        assert_eq!(s.requests, 3);
        assert!((s.earliest_share - 2.0 / 3.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s.regret_p50_ms, 4.0);
        assert!((s.regret_mean_ms - 68.0).abs() < 1e-9);
        assert!((s.relative_regret_mean - 0.68).abs() < 1e-9);
        assert_eq!(s.per_pod.get("a"), Some(&(1, 3)));
        assert_eq!(s.per_pod.get("b"), Some(&(2, 0)));
        assert!(ShadowRegret::of(&refs[4..]).is_none());
    }
}
