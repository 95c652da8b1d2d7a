//! Several seeds of one policy comparison, summarised: per policy the median of each figure over the
//! seeds with its spread (min–max), kvroute's ratios against the other policies, and one verdict per
//! workload. The verdict judges kvroute against what else was run in the same comparison, not
//! against its own bound alone ([`verdict`]): the peer routers and round-robin, the previous
//! version's module, the perfect-knowledge bound, and kvroute's own prediction error. Verdicts are
//! printed, never asserted: the numbers are what was measured.

use std::fmt::Write as _;

use serde::Serialize;

use super::compare::Policy;
use super::peers::PeerPolicy;
use super::report::{percentile, RunReport};
use super::table::{Align, Table};

/// Median and range of one figure over runs (seeds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Runs that had the figure.
    pub n: usize,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Spread {
    /// Over the finite values (NaNs and infinities are left out).
    pub fn of(values: &[f64]) -> Self {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        Self {
            n: v.len(),
            median: percentile(&v, 50.0),
            min: v.iter().copied().reduce(f64::min),
            max: v.iter().copied().reduce(f64::max),
        }
    }

    /// Over the values present.
    pub fn of_options(values: &[Option<f64>]) -> Self {
        let v: Vec<f64> = values.iter().flatten().copied().collect();
        Self::of(&v)
    }

    /// `median [min–max]` with `decimals` decimals, the value scaled by `scale` first; `-` when
    /// empty; the median alone for one run.
    pub fn render(&self, decimals: usize, scale: f64) -> String {
        let f = |x: f64| format!("{:.decimals$}", x * scale);
        match (self.median, self.min, self.max) {
            (Some(m), Some(lo), Some(hi)) if self.n > 1 => {
                format!("{} [{}–{}]", f(m), f(lo), f(hi))
            }
            (Some(m), _, _) => f(m),
            _ => "-".to_owned(),
        }
    }
}

/// One policy over the seeds.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    pub label: String,
    pub seeds: Vec<u64>,
    pub ttft_p90_ms: Spread,
    pub ttft_p50_ms: Spread,
    pub ttft_p99_ms: Spread,
    pub cache_hit_ratio: Spread,
    /// Successful requests measured.
    pub ok: Spread,
    pub success_rate: Spread,
    /// Output tokens per simulated second.
    pub output_tokens_per_s: Spread,
    /// Per run, the median |predicted − observed| / observed TTFT (kvroute's `predicted_ttft_ms`).
    pub prediction_error: Spread,
    /// Per run, the median (predicted − observed) / observed: an error with a bias near it is an
    /// offset (the prediction low or high throughout), one with a bias near 0 a spread.
    pub prediction_bias: Spread,
    /// Runs with a cache reset (`--reset-caches-at`).
    pub resets: usize,
    /// Of those, simulated seconds until the hit ratio was back within 0.05 of its steady level
    /// ([`CacheReset::recovered_after_s`](super::report::CacheReset)), over the runs where it was.
    pub recovered_after_s: Spread,
    /// Runs with a reset where it never was.
    pub not_recovered: usize,
}

/// Summarises `runs` (one comparison per seed, each a list of labelled reports), policies in the
/// order of their first appearance.
pub fn summarize(runs: &[Vec<(String, RunReport)>]) -> Vec<PolicySummary> {
    let mut labels: Vec<String> = Vec::new();
    for (label, _) in runs.iter().flatten() {
        if !labels.contains(label) {
            labels.push(label.clone());
        }
    }
    labels
        .into_iter()
        .map(|label| {
            let reports: Vec<&RunReport> = runs
                .iter()
                .flatten()
                .filter(|(l, _)| *l == label)
                .map(|(_, r)| r)
                .collect();
            let of = |f: &dyn Fn(&RunReport) -> Option<f64>| {
                Spread::of_options(&reports.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            PolicySummary {
                seeds: reports.iter().map(|r| r.seed).collect(),
                ttft_p90_ms: of(&|r| r.ttft_ms.p90),
                ttft_p50_ms: of(&|r| r.ttft_ms.p50),
                ttft_p99_ms: of(&|r| r.ttft_ms.p99),
                cache_hit_ratio: of(&|r| r.cache_hit_ratio),
                ok: of(&|r| Some(r.ok as f64)),
                success_rate: of(&|r| r.success_rate),
                output_tokens_per_s: of(&|r| Some(r.output_tokens_per_s)),
                prediction_error: of(&|r| r.prediction.median_abs_rel_error),
                prediction_bias: of(&|r| r.prediction.median_rel_bias),
                resets: reports.iter().filter(|r| r.cache_reset.is_some()).count(),
                recovered_after_s: of(&|r| r.cache_reset.as_ref()?.recovered_after_s),
                not_recovered: reports
                    .iter()
                    .filter_map(|r| r.cache_reset.as_ref())
                    .filter(|c| c.recovered_after_s.is_none())
                    .count(),
                label,
            }
        })
        .collect()
}

/// One target of a workload's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// e.g. `p90 TTFT kvroute / round-robin`.
    pub what: String,
    /// The ratio of the medians.
    pub value: Option<f64>,
    /// The same ratio seed by seed.
    pub per_seed: Spread,
    /// e.g. `≤ 1`.
    pub target: String,
    /// `None` when a side was not measured.
    pub met: Option<bool>,
}

/// A workload's verdict: every check, and whether all were met.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub workload: String,
    pub checks: Vec<Check>,
    /// `Some(true)` only when every check was measured and met.
    pub met: Option<bool>,
}

impl Verdict {
    /// `checks` judged together: not met when any is not, met when every one is, else incomplete.
    pub fn of(workload: &str, checks: Vec<Check>) -> Self {
        let met = if checks.iter().any(|c| c.met == Some(false)) {
            Some(false)
        } else if checks.iter().all(|c| c.met == Some(true)) {
            Some(true)
        } else {
            None
        };
        Verdict {
            workload: workload.to_owned(),
            checks,
            met,
        }
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// `f` of `label`'s report in each run, by seed.
fn by_seed(
    runs: &[Vec<(String, RunReport)>],
    label: &str,
    f: impl Fn(&RunReport) -> Option<f64>,
) -> Vec<(u64, f64)> {
    runs.iter()
        .flatten()
        .filter(|(l, _)| l == label)
        .filter_map(|(_, r)| f(r).filter(|v| v.is_finite()).map(|v| (r.seed, v)))
        .collect()
}

/// p90 TTFT of `label` in each run, by seed.
fn p90_by_seed(runs: &[Vec<(String, RunReport)>], label: &str) -> Vec<(u64, f64)> {
    by_seed(runs, label, |r| r.ttft_ms.p90)
}

/// Seed by seed, `combine(kvroute's, the others')` where kvroute and every one of `others` ran
/// that seed (the others' values as a list, in the order of `others`).
fn combine_by_seed(
    kv: &[(u64, f64)],
    others: &[Vec<(u64, f64)>],
    combine: impl Fn(f64, &[f64]) -> Option<f64>,
) -> Spread {
    let v: Vec<f64> = kv
        .iter()
        .filter_map(|(seed, k)| {
            let theirs: Option<Vec<f64>> = others
                .iter()
                .map(|o| o.iter().find(|(s, _)| s == seed).map(|(_, v)| *v))
                .collect();
            combine(*k, &theirs?)
        })
        .collect();
    Spread::of(&v)
}

/// The routers kvroute must keep up with ([`verdict`]): each peer router's cache-aware policy and
/// Envoy's round-robin.
pub fn peer_labels() -> Vec<&'static str> {
    std::iter::once(Policy::RoundRobin.label())
        .chain(
            PeerPolicy::ALL
                .into_iter()
                .filter(|p| p.cache_aware)
                .map(PeerPolicy::label),
        )
        .collect()
}

/// p90 TTFT within this factor of the best peer's ([`verdict`]).
pub const PEER_P90_FACTOR: f64 = 1.1;
/// Hit ratio at most this far below the best peer's ([`verdict`]).
pub const PEER_HIT_SLACK: f64 = 0.02;
/// p90 TTFT within this factor of the perfect-knowledge bound's ([`verdict`]).
pub const BOUND_P90_FACTOR: f64 = 1.25;
/// The median |predicted − observed| / observed TTFT allowed ([`verdict`]).
pub const PREDICTION_ERROR_LIMIT: f64 = 0.2;
/// After a cache reset, the hit ratio back within 0.05 of its steady level within this many
/// simulated seconds ([`verdict`]).
pub const RECOVERY_LIMIT_S: f64 = 60.0;

/// The targets for `workload` from the summaries (and, for the per-seed spread of each figure, the
/// runs). Every check compares medians over the seeds; a check whose other side was not run is
/// "not measured" (the verdict is then incomplete, never met), except least-request's, which is
/// left out when least-request was not run:
///
/// * p90 TTFT kvroute ≤ round-robin's, and ≤ least-request's where it ran;
/// * p90 TTFT kvroute ≤ 1.25 × the perfect-knowledge bound's (`perfect-knowledge-total`: each
///   request to the pod that minimises its TTFT plus the wait it adds to those queued there; the
///   greedy `perfect-knowledge` is not a bound the verdicts use);
/// * on `multi-tenant`, round-robin's p90 ≥ 4 × kvroute's;
/// * p90 TTFT kvroute ≤ 1.1 × the best peer's: the lowest median p90 of round-robin and of each
///   peer router's cache-aware policy that ran (sglang-router, smg, vllm-router); not measured when
///   no peer router ran;
/// * hit ratio (pod counters) kvroute ≥ the best of the same peers' − 0.02;
/// * kvroute against the previous version's module (`kvroute-previous`): kvroute's median p90 ≤
///   the previous module's median p90 + the spread between seeds, the larger of the two policies'
///   ranges (max − min over the seeds; 0 with one seed, so one seed is judged strictly). The value
///   is the ratio of the medians, the target that allowance as a ratio;
/// * kvroute's median |predicted − observed| / observed TTFT ≤ 0.2, once it reports predictions;
/// * with a cache reset (`--reset-caches-at`): kvroute's hit ratio back within 0.05 of its steady
///   level within 60 simulated seconds (median over the seeds; a seed where it never was counts as
///   never).
pub fn verdict(
    workload: &str,
    runs: &[Vec<(String, RunReport)>],
    summaries: &[PolicySummary],
) -> Verdict {
    let find_label = |label: &str| summaries.iter().find(|s| s.label == label);
    let find = |p: Policy| find_label(p.label());
    let kv = find(Policy::Kvroute);
    let kv_p90 = kv.and_then(|k| k.ttft_p90_ms.median);
    let kv_seeds = p90_by_seed(runs, Policy::Kvroute.label());
    let per_seed = |other: &str, invert: bool| {
        combine_by_seed(&kv_seeds, &[p90_by_seed(runs, other)], |k, o| {
            if invert {
                ratio(Some(o[0]), Some(k))
            } else {
                ratio(Some(k), Some(o[0]))
            }
        })
    };
    let mut checks = Vec::new();
    for (other, limit) in [
        (Policy::RoundRobin, 1.0),
        (Policy::LeastRequest, 1.0),
        (Policy::OracleTotal, BOUND_P90_FACTOR),
    ] {
        if other == Policy::LeastRequest && find(other).is_none() {
            continue;
        }
        let value = ratio(kv_p90, find(other).and_then(|o| o.ttft_p90_ms.median));
        checks.push(Check {
            what: format!("p90 TTFT kvroute / {}", other.label()),
            value,
            per_seed: per_seed(other.label(), false),
            target: format!("≤ {limit}"),
            met: value.map(|v| v <= limit),
        });
    }
    if workload == "multi-tenant" {
        let value = ratio(
            find(Policy::RoundRobin).and_then(|o| o.ttft_p90_ms.median),
            kv_p90,
        );
        checks.push(Check {
            what: "p90 TTFT round-robin / kvroute".to_owned(),
            value,
            per_seed: per_seed(Policy::RoundRobin.label(), true),
            target: "≥ 4".to_owned(),
            met: value.map(|v| v >= 4.0),
        });
    }
    checks.extend(peer_checks(runs, summaries, &kv_seeds));
    checks.push(previous_check(runs, kv, find(Policy::KvroutePrevious)));
    // Prediction quality, once the plugin reports predictions (absent: "n/a" in the table, no check).
    if let Some(k) = kv.filter(|k| k.prediction_error.n > 0) {
        let value = k.prediction_error.median;
        checks.push(Check {
            what: "kvroute median |pred − obs| / obs TTFT".to_owned(),
            value,
            per_seed: k.prediction_error,
            target: format!("≤ {PREDICTION_ERROR_LIMIT}"),
            met: value.map(|v| v <= PREDICTION_ERROR_LIMIT),
        });
    }
    if let Some(k) = kv.filter(|k| k.resets > 0) {
        // A seed whose hit ratio never came back counts as never.
        let mut v: Vec<f64> = runs
            .iter()
            .flatten()
            .filter(|(l, _)| l == Policy::Kvroute.label())
            .filter_map(|(_, r)| r.cache_reset.as_ref())
            .map(|c| c.recovered_after_s.unwrap_or(f64::INFINITY))
            .collect();
        v.sort_by(f64::total_cmp);
        let value = percentile(&v, 50.0);
        checks.push(Check {
            what: "kvroute s to hit ratio within 0.05 after reset".to_owned(),
            value,
            per_seed: k.recovered_after_s,
            target: format!("≤ {RECOVERY_LIMIT_S}"),
            met: value.map(|v| v <= RECOVERY_LIMIT_S),
        });
    }
    Verdict::of(workload, checks)
}

/// kvroute against the best of [`peer_labels`] that ran: p90 TTFT and hit ratio.
fn peer_checks(
    runs: &[Vec<(String, RunReport)>],
    summaries: &[PolicySummary],
    kv_seeds: &[(u64, f64)],
) -> [Check; 2] {
    let kv = summaries
        .iter()
        .find(|s| s.label == Policy::Kvroute.label());
    let ran: Vec<&PolicySummary> = peer_labels()
        .into_iter()
        .filter_map(|l| summaries.iter().find(|s| s.label == l))
        .collect();
    let any_router = ran.iter().any(|s| s.label != Policy::RoundRobin.label());
    let best_by = |f: &dyn Fn(&PolicySummary) -> Option<f64>, lowest: bool| {
        ran.iter()
            .filter_map(|s| f(s).map(|v| (s, v)))
            .reduce(|a, b| if (b.1 < a.1) == lowest { b } else { a })
    };
    let none = || "best peer (no peer router run)".to_owned();
    // p90: kvroute over the lowest.
    let best_p90 = best_by(&|s| s.ttft_p90_ms.median, true);
    let p90_what = match (any_router, best_p90) {
        (true, Some((s, _))) => format!("p90 TTFT kvroute / best peer ({})", s.label),
        _ => format!("p90 TTFT kvroute / {}", none()),
    };
    let p90_value = best_p90
        .filter(|_| any_router)
        .and_then(|(_, b)| ratio(kv.and_then(|k| k.ttft_p90_ms.median), Some(b)));
    let peer_p90: Vec<Vec<(u64, f64)>> = ran.iter().map(|s| p90_by_seed(runs, &s.label)).collect();
    let p90_seeds = combine_by_seed(kv_seeds, &peer_p90, |k, o| {
        ratio(Some(k), o.iter().copied().reduce(f64::min))
    });
    // Hit ratio: kvroute minus the highest.
    let best_hit = best_by(&|s| s.cache_hit_ratio.median, false);
    let hit_what = match (any_router, best_hit) {
        (true, Some((s, _))) => format!("hit ratio kvroute − best peer ({})", s.label),
        _ => format!("hit ratio kvroute − {}", none()),
    };
    let hit_value = match (
        any_router,
        kv.and_then(|k| k.cache_hit_ratio.median),
        best_hit,
    ) {
        (true, Some(k), Some((_, b))) => Some(k - b),
        _ => None,
    };
    let kv_hits = by_seed(runs, Policy::Kvroute.label(), |r| r.cache_hit_ratio);
    let peer_hits: Vec<Vec<(u64, f64)>> = ran
        .iter()
        .map(|s| by_seed(runs, &s.label, |r| r.cache_hit_ratio))
        .collect();
    let hit_seeds = combine_by_seed(&kv_hits, &peer_hits, |k, o| {
        o.iter().copied().reduce(f64::max).map(|b| k - b)
    });
    [
        Check {
            what: p90_what,
            value: p90_value,
            per_seed: p90_seeds,
            target: format!("≤ {PEER_P90_FACTOR}"),
            met: p90_value.map(|v| v <= PEER_P90_FACTOR),
        },
        Check {
            what: hit_what,
            value: hit_value,
            per_seed: hit_seeds,
            target: format!("≥ −{PEER_HIT_SLACK}"),
            met: hit_value.map(|v| v >= -PEER_HIT_SLACK - 1e-12),
        },
    ]
}

/// kvroute's median p90 against the previous module's, allowing the spread between seeds.
fn previous_check(
    runs: &[Vec<(String, RunReport)>],
    kv: Option<&PolicySummary>,
    previous: Option<&PolicySummary>,
) -> Check {
    let label = Policy::KvroutePrevious.label();
    let range = |s: &Spread| match (s.min, s.max) {
        (Some(lo), Some(hi)) => hi - lo,
        _ => 0.0,
    };
    let sides = kv
        .and_then(|k| Some((k, k.ttft_p90_ms.median?)))
        .zip(previous.and_then(|p| Some((p, p.ttft_p90_ms.median?))));
    let (value, target, met) = match sides {
        Some(((k, kv_p90), (p, prev_p90))) if prev_p90 > 0.0 => {
            let allowance = range(&k.ttft_p90_ms).max(range(&p.ttft_p90_ms));
            let limit = (prev_p90 + allowance) / prev_p90;
            (
                Some(kv_p90 / prev_p90),
                format!("≤ {limit:.2}"),
                Some(kv_p90 <= prev_p90 + allowance),
            )
        }
        _ => (None, "≤ 1 + spread".to_owned(), None),
    };
    let kv_seeds = p90_by_seed(runs, Policy::Kvroute.label());
    Check {
        what: format!("p90 TTFT kvroute / {label}"),
        value,
        per_seed: combine_by_seed(&kv_seeds, &[p90_by_seed(runs, label)], |k, o| {
            ratio(Some(k), Some(o[0]))
        }),
        target,
        met,
    }
}

/// A check's value: two decimals, three below 1 in size (a hit-ratio difference of −0.024 is not
/// −0.02).
fn fmt_value(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() < 1.0 => format!("{x:.3}"),
        Some(x) => format!("{x:.2}"),
        None => "-".to_owned(),
    }
}

/// The verdict's one line: `VERDICT multi-tenant: met` (or `not met: …`, or `incomplete: …`).
pub fn verdict_line(v: &Verdict) -> String {
    let failed: Vec<String> = v
        .checks
        .iter()
        .filter(|c| c.met == Some(false))
        .map(|c| format!("{} = {} (target {})", c.what, fmt_value(c.value), c.target))
        .collect();
    let unmeasured: Vec<&str> = v
        .checks
        .iter()
        .filter(|c| c.met.is_none())
        .map(|c| c.what.as_str())
        .collect();
    let unmeasured = if unmeasured.is_empty() {
        String::new()
    } else {
        format!(" [not measured: {}]", unmeasured.join("; "))
    };
    match v.met {
        Some(true) => format!("VERDICT {}: met", v.workload),
        Some(false) => format!(
            "VERDICT {}: not met: {}{unmeasured}",
            v.workload,
            failed.join("; ")
        ),
        None => format!(
            "VERDICT {}: incomplete (a policy was not run){unmeasured}",
            v.workload
        ),
    }
}

/// The verdict in a few words: `met`, `not met (<checks>)`, `incomplete (not measured: <checks>)`.
pub fn verdict_brief(v: &Verdict) -> String {
    let whats = |f: &dyn Fn(&Check) -> bool| {
        v.checks
            .iter()
            .filter(|c| f(c))
            .map(|c| c.what.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    };
    match v.met {
        Some(true) => "met".to_owned(),
        Some(false) => format!("NOT MET ({})", whats(&|c| c.met == Some(false))),
        None => format!("incomplete (not measured: {})", whats(&|c| c.met.is_none())),
    }
}

/// The multi-seed table of one workload, the checks and the verdict line.
/// A policy's prediction error and bias in percent (`25 [24–30]%, bias -5%`), `None` without
/// predictions.
pub fn render_prediction(s: &PolicySummary) -> Option<String> {
    (s.prediction_error.n > 0).then(|| {
        format!(
            "{}%, bias {}%",
            s.prediction_error.render(0, 100.0),
            s.prediction_bias.render(0, 100.0)
        )
    })
}

pub fn render_summary(workload: &str, summaries: &[PolicySummary], verdict: &Verdict) -> String {
    let seeds: Vec<String> = summaries
        .first()
        .map(|s| s.seeds.iter().map(u64::to_string).collect())
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== {workload}: median [min–max] over seeds {} (simulated ms; hit% from pod counters; pred err = median |predicted − observed| / observed TTFT, bias = median (predicted − observed) / observed, wall clock: kvroute's predicted_ttft_ms, the bound's chosen-pod estimate) ==",
        seeds.join(", ")
    );
    let resets = summaries.iter().any(|s| s.resets > 0);
    let mut head = vec![
        "policy",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "hit%",
        "tok/s",
        "success%",
        "ok",
        "pred err, bias",
    ];
    if resets {
        head.push("back after reset");
    }
    let mut table = Table::new(&head).left(1);
    for s in summaries {
        let mut row = vec![
            s.label.clone(),
            s.ttft_p50_ms.render(0, 1.0),
            s.ttft_p90_ms.render(0, 1.0),
            s.ttft_p99_ms.render(0, 1.0),
            s.cache_hit_ratio.render(1, 100.0),
            s.output_tokens_per_s.render(0, 1.0),
            s.success_rate.render(1, 100.0),
            s.ok.render(0, 1.0),
            render_prediction(s).unwrap_or_else(|| {
                if s.label.starts_with(Policy::Kvroute.label())
                    || s.label.starts_with(Policy::Oracle.label())
                {
                    "n/a".to_owned()
                } else {
                    "-".to_owned()
                }
            }),
        ];
        if resets {
            row.push(match (s.resets, s.not_recovered) {
                (0, _) => "-".to_owned(),
                (_, 0) => format!("{} s", s.recovered_after_s.render(0, 1.0)),
                (n, never) if never == n => "never".to_owned(),
                (_, never) => format!("{} s, never ×{never}", s.recovered_after_s.render(0, 1.0)),
            });
        }
        table.row(row);
    }
    out.push_str(&table.text());
    let mut checks = Table::headless().indent(2).aligns(&[
        Align::Left,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
    ]);
    for c in &verdict.checks {
        checks.row([
            c.what.clone(),
            fmt_value(c.value),
            format!("per seed {}", c.per_seed.render(2, 1.0)),
            format!("target {}", c.target),
            match c.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            }
            .to_owned(),
        ]);
    }
    out.push_str(&checks.text());
    let _ = writeln!(out, "{}", verdict_line(verdict));
    out
}

/// One table over every workload of a run: per workload and policy the medians and spreads of
/// TTFT p50/p90/p99, output throughput, success rate and cluster cache-hit ratio, and the policy's
/// median p90 over kvroute's (`× kvroute p90`: above 1, kvroute's p90 is lower).
pub fn render_overview(workloads: &[(String, Vec<PolicySummary>)]) -> String {
    let seeds = workloads
        .first()
        .and_then(|(_, s)| s.first())
        .map_or(0, |s| s.seeds.len());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== overview: median [min–max] over {seeds} seeds (TTFT in simulated ms, tok/s = output tokens per simulated second, hit% = cluster prefix-cache hits from pod counters) =="
    );
    let head = [
        "workload",
        "router",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "tok/s",
        "success%",
        "hit%",
        "p90 / kvroute's",
    ];
    let mut table = Table::new(&head).left(2);
    for (workload, summaries) in workloads {
        let kv = summaries
            .iter()
            .find(|s| s.label == Policy::Kvroute.label())
            .and_then(|s| s.ttft_p90_ms.median);
        for (i, s) in summaries.iter().enumerate() {
            let versus = match (s.ttft_p90_ms.median, kv) {
                (Some(p), Some(k)) if k > 0.0 && s.label != Policy::Kvroute.label() => {
                    format!("{:.2}", p / k)
                }
                _ => "-".to_owned(),
            };
            table.row([
                if i == 0 {
                    workload.clone()
                } else {
                    String::new()
                },
                s.label.clone(),
                s.ttft_p50_ms.render(0, 1.0),
                s.ttft_p90_ms.render(0, 1.0),
                s.ttft_p99_ms.render(0, 1.0),
                s.output_tokens_per_s.render(0, 1.0),
                s.success_rate.render(1, 100.0),
                s.cache_hit_ratio.render(1, 100.0),
                versus,
            ]);
        }
    }
    out.push_str(&table.text());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::RequestRecord;
    use crate::workload::{Load, WorkloadKind, WorkloadSpec};

    #[test]
    fn spread_is_the_median_and_the_range() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!(
            (s.n, s.median, s.min, s.max),
            (3, Some(2.0), Some(1.0), Some(3.0))
        );
        let even = Spread::of(&[4.0, 1.0, 2.0, 10.0]);
        assert_eq!(even.median, Some(3.0), "the mean of the middle two");
        let none = Spread::of(&[f64::NAN]);
        assert_eq!((none.n, none.median), (0, None));
        assert_eq!(s.render(0, 1.0), "2 [1–3]");
        assert_eq!(Spread::of(&[0.5]).render(1, 100.0), "50.0");
        assert_eq!(none.render(0, 1.0), "-");
        assert_eq!(
            Spread::of_options(&[Some(1.0), None, Some(3.0)]).median,
            Some(2.0)
        );
    }

    /// A report whose successful requests have these TTFTs (simulated = wall seconds).
    fn report(seed: u64, ttfts_s: &[f64]) -> RunReport {
        report_predicted(seed, ttfts_s, false)
    }

    /// With `predicted`, seed 1's requests carry a prediction 10% high.
    fn report_predicted(seed: u64, ttfts_s: &[f64], predicted: bool) -> RunReport {
        let mut spec = WorkloadSpec::new(
            WorkloadKind::from_name("multi-tenant").expect("known"),
            Load::Open { rate: 1.0 },
        );
        spec.seed = seed;
        let records: Vec<RequestRecord> = ttfts_s
            .iter()
            .enumerate()
            .map(|(i, &t)| RequestRecord {
                index: i as u64,
                ttft_s: Some(t),
                e2e_s: Some(t + 1.0),
                status: Some(200),
                ok: true,
                sent: true,
                predicted_ttft_ms: (predicted && seed == 1).then_some(t * 1000.0 * 1.1),
                ..RequestRecord::default()
            })
            .collect();
        RunReport::build(&spec, 1.0, 100.0, &records, Vec::new())
    }

    #[test]
    fn summaries_take_medians_over_seeds_and_judge_the_ratios() {
        // p90 of n equal values is that value.
        let runs: Vec<Vec<(String, RunReport)>> = (1..=3)
            .map(|seed| {
                let k = seed as f64;
                vec![
                    (
                        "kvroute".to_owned(),
                        report_predicted(seed, &[1.0 * k; 10], true),
                    ),
                    ("round-robin".to_owned(), report(seed, &[2.0 * k; 10])),
                    ("least-request".to_owned(), report(seed, &[3.0; 10])),
                    (
                        "perfect-knowledge-total".to_owned(),
                        report(seed, &[0.9 * k; 10]),
                    ),
                ]
            })
            .collect();
        let s = summarize(&runs);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].label, "kvroute");
        assert_eq!(s[0].seeds, vec![1, 2, 3]);
        let p90 = s[0].ttft_p90_ms;
        assert_eq!(p90.median.map(f64::round), Some(2000.0));
        assert_eq!(p90.min.map(f64::round), Some(1000.0));
        assert_eq!(p90.max.map(f64::round), Some(3000.0));
        assert_eq!(s[0].ok.median, Some(10.0));
        // Only seed 1 carried predictions, 10% high.
        assert_eq!(s[0].prediction_error.n, 1);
        assert!((s[0].prediction_error.median.expect("one") - 0.1).abs() < 1e-9);
        assert!((s[0].prediction_bias.median.expect("one") - 0.1).abs() < 1e-9);
        assert_eq!(render_prediction(&s[0]).as_deref(), Some("10%, bias 10%"));
        assert_eq!(s[1].prediction_error.n, 0);
        assert_eq!(render_prediction(&s[1]), None);
        let v = verdict("multi-tenant", &runs, &s);
        let whats: Vec<&str> = v.checks.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "p90 TTFT kvroute / round-robin",
                "p90 TTFT kvroute / least-request",
                "p90 TTFT kvroute / perfect-knowledge-total",
                "p90 TTFT round-robin / kvroute",
                "p90 TTFT kvroute / best peer (no peer router run)",
                "hit ratio kvroute − best peer (no peer router run)",
                "p90 TTFT kvroute / kvroute-previous",
                "kvroute median |pred − obs| / obs TTFT",
            ],
            "with predictions, their check too"
        );
        assert_eq!(v.checks[7].met, Some(true), "10% ≤ 20%");
        assert_eq!(v.checks[0].met, Some(true), "{:?}", v.checks[0]);
        assert_eq!(v.checks[1].met, Some(true), "2 s vs 3 s");
        assert_eq!(v.checks[2].met, Some(true), "1/0.9 ≤ 1.25");
        assert_eq!(v.checks[3].met, Some(false), "2× is not 4× lower");
        for c in &v.checks[4..7] {
            assert_eq!(c.met, None, "not run, not passed: {c:?}");
        }
        assert_eq!(v.met, Some(false));
        assert!(verdict_line(&v).starts_with("VERDICT multi-tenant: not met"));
        let per_seed = v.checks[0].per_seed;
        assert_eq!(per_seed.n, 3);
        assert!((per_seed.median.expect("3") - 0.5).abs() < 1e-9);
        let text = render_summary("multi-tenant", &s, &v);
        assert!(text.contains("NOT MET"), "{text}");
        assert!(text.contains("10%"), "{text}");
        // Without the bound's row the verdict cannot be complete.
        let partial: Vec<Vec<(String, RunReport)>> = runs
            .iter()
            .map(|r| r.iter().take(3).cloned().collect())
            .collect();
        let sp = summarize(&partial);
        let v = verdict("shared-agent", &partial, &sp);
        assert_eq!(v.met, None);
        assert!(verdict_line(&v).contains("incomplete"));
        assert!(render_summary("shared-agent", &sp, &v).contains("not measured"));
        // Least-request's check is there only where least-request ran.
        let no_lr: Vec<Vec<(String, RunReport)>> = runs
            .iter()
            .map(|r| {
                r.iter()
                    .filter(|(l, _)| l != "least-request")
                    .cloned()
                    .collect()
            })
            .collect();
        let v = verdict("shared-agent", &no_lr, &summarize(&no_lr));
        assert!(v.checks.iter().all(|c| !c.what.contains("least-request")));
    }

    /// A report with a hit ratio from the pods' counters.
    fn report_hit(seed: u64, ttfts_s: &[f64], hit: f64) -> RunReport {
        let mut r = report(seed, ttfts_s);
        r.cache_hit_ratio = Some(hit);
        r
    }

    #[test]
    fn kvroute_is_judged_against_the_best_peer_and_the_previous_module() {
        // Seeds 1–3: kvroute's p90 1.0/1.2/1.1 s, the previous module's 1.0/1.05/1.1 s (range
        // 0.1 s; kvroute's 0.2 s), vllm-router 1.0 s flat, sglang-router slower, round-robin worst.
        let kv = [1.0, 1.2, 1.1];
        let prev = [1.0, 1.05, 1.1];
        let runs: Vec<Vec<(String, RunReport)>> = (1..=3u64)
            .map(|seed| {
                let i = (seed - 1) as usize;
                vec![
                    ("kvroute".to_owned(), report_hit(seed, &[kv[i]; 10], 0.95)),
                    (
                        "kvroute-previous".to_owned(),
                        report_hit(seed, &[prev[i]; 10], 0.90),
                    ),
                    ("round-robin".to_owned(), report_hit(seed, &[5.0; 10], 0.4)),
                    (
                        "sglang-router".to_owned(),
                        report_hit(seed, &[2.0; 10], 0.99),
                    ),
                    ("vllm-router".to_owned(), report_hit(seed, &[1.0; 10], 0.96)),
                    (
                        "perfect-knowledge-total".to_owned(),
                        report_hit(seed, &[1.0; 10], 0.9),
                    ),
                ]
            })
            .collect();
        let s = summarize(&runs);
        let v = verdict("tenants-stall", &runs, &s);
        let check = |prefix: &str| {
            v.checks
                .iter()
                .find(|c| c.what.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} check in {:?}", v.checks))
        };
        let p90 = check("p90 TTFT kvroute / best peer");
        assert_eq!(p90.what, "p90 TTFT kvroute / best peer (vllm-router)");
        assert!((p90.value.expect("measured") - 1.1).abs() < 1e-9, "{p90:?}");
        assert_eq!(p90.met, Some(true), "1.1 ≤ 1.1");
        assert_eq!(p90.per_seed.n, 3);
        let hit = check("hit ratio kvroute");
        assert_eq!(hit.what, "hit ratio kvroute − best peer (sglang-router)");
        assert!(
            (hit.value.expect("measured") + 0.04).abs() < 1e-9,
            "{hit:?}"
        );
        assert_eq!(hit.met, Some(false), "0.95 is more than 0.02 below 0.99");
        let previous = check("p90 TTFT kvroute / kvroute-previous");
        // Medians 1.1 vs 1.05, allowance the larger range (0.2 s): 1.1 ≤ 1.25.
        assert_eq!(previous.met, Some(true), "{previous:?}");
        assert_eq!(previous.target, format!("≤ {:.2}", 1.25 / 1.05));
        assert_eq!(v.met, Some(false));
        assert!(verdict_line(&v).contains("hit ratio kvroute − best peer (sglang-router)"));
        // The greedy bound is not the verdicts' bound: only the total one is checked.
        assert!(v
            .checks
            .iter()
            .any(|c| c.what.ends_with("perfect-knowledge-total")));
        // One seed: no spread, so no allowance.
        let one: Vec<Vec<(String, RunReport)>> = runs[1..2].to_vec();
        let v = verdict("tenants-stall", &one, &summarize(&one));
        let previous = v
            .checks
            .iter()
            .find(|c| c.what.ends_with("kvroute-previous"))
            .expect("checked");
        assert_eq!(previous.met, Some(false), "1.2 > 1.05: {previous:?}");
    }

    #[test]
    fn the_overview_lists_every_workload_and_policy_against_kvroute() {
        let runs: Vec<Vec<(String, RunReport)>> = (1..=3)
            .map(|seed| {
                vec![
                    ("kvroute".to_owned(), report(seed, &[1.0; 10])),
                    ("sglang-router".to_owned(), report(seed, &[2.0; 10])),
                ]
            })
            .collect();
        let s = summarize(&runs);
        assert_eq!(s[0].output_tokens_per_s.n, 3);
        let text = render_overview(&[
            ("multi-tenant".to_owned(), s.clone()),
            ("long-unique".to_owned(), s),
        ]);
        assert!(text.contains("over 3 seeds"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.len(),
            3 + 4,
            "title, header, rule, 2 × 2 rows: {text}"
        );
        assert!(lines[3].starts_with("multi-tenant  kvroute"), "{text}");
        assert!(lines[4].trim_start().starts_with("sglang-router"), "{text}");
        assert!(
            lines[4].trim_end().ends_with("2.00"),
            "twice kvroute's p90: {text}"
        );
        assert!(lines[3].trim_end().ends_with('-'), "{text}");
        assert!(lines[5].starts_with("long-unique"), "{text}");
    }

    #[test]
    fn kvroute_without_predictions_reads_n_a() {
        let runs = vec![vec![("kvroute".to_owned(), report(2, &[1.0; 4]))]];
        let s = summarize(&runs);
        let v = verdict("agent", &runs, &s);
        assert!(render_summary("agent", &s, &v).contains("n/a"));
    }
}
