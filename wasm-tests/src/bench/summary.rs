//! Several seeds of one policy comparison, summarised: per policy the median of each figure over the
//! seeds with its spread (min–max), kvroute's ratios against the other policies, and one verdict per
//! workload against issue 8's targets (p90 TTFT ≤ round-robin's and least-request's, ≤ 1.25× the
//! perfect-knowledge bound; on multi-tenant also ≥ 4× lower than round-robin). Verdicts are printed,
//! never asserted: the numbers are what was measured.

use std::fmt::Write as _;

use serde::Serialize;

use super::compare::Policy;
use super::report::{percentile, RunReport};

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
    /// Per run, the median |predicted − observed| / observed TTFT (kvroute's `predicted_ttft_ms`).
    pub prediction_error: Spread,
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
                prediction_error: of(&|r| r.prediction.median_abs_rel_error),
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

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// p90 TTFT of `label` in each run, by seed.
fn p90_by_seed(runs: &[Vec<(String, RunReport)>], label: &str) -> Vec<(u64, f64)> {
    runs.iter()
        .flatten()
        .filter(|(l, _)| l == label)
        .filter_map(|(_, r)| r.ttft_ms.p90.map(|p| (r.seed, p)))
        .collect()
}

/// The targets for `workload` from the summaries (and, for the per-seed spread of each
/// ratio, the runs).
pub fn verdict(
    workload: &str,
    runs: &[Vec<(String, RunReport)>],
    summaries: &[PolicySummary],
) -> Verdict {
    let find = |p: Policy| summaries.iter().find(|s| s.label == p.label());
    let kv = find(Policy::Kvroute);
    let kv_seeds = p90_by_seed(runs, Policy::Kvroute.label());
    let per_seed = |other: Policy, invert: bool| {
        let theirs = p90_by_seed(runs, other.label());
        let v: Vec<f64> = kv_seeds
            .iter()
            .filter_map(|(seed, k)| {
                let (_, o) = theirs.iter().find(|(s, _)| s == seed)?;
                if invert {
                    ratio(Some(*o), Some(*k))
                } else {
                    ratio(Some(*k), Some(*o))
                }
            })
            .collect();
        Spread::of(&v)
    };
    let mut checks = Vec::new();
    for (other, limit) in [
        (Policy::RoundRobin, 1.0),
        (Policy::LeastRequest, 1.0),
        (Policy::Oracle, 1.25),
    ] {
        let value = ratio(
            kv.and_then(|k| k.ttft_p90_ms.median),
            find(other).and_then(|o| o.ttft_p90_ms.median),
        );
        checks.push(Check {
            what: format!("p90 TTFT kvroute / {}", other.label()),
            value,
            per_seed: per_seed(other, false),
            target: format!("≤ {limit}"),
            met: value.map(|v| v <= limit),
        });
    }
    if workload == "multi-tenant" {
        let value = ratio(
            find(Policy::RoundRobin).and_then(|o| o.ttft_p90_ms.median),
            kv.and_then(|k| k.ttft_p90_ms.median),
        );
        checks.push(Check {
            what: "p90 TTFT round-robin / kvroute".to_owned(),
            value,
            per_seed: per_seed(Policy::RoundRobin, true),
            target: "≥ 4".to_owned(),
            met: value.map(|v| v >= 4.0),
        });
    }
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

/// The verdict's one line: `VERDICT multi-tenant: met` (or `not met: …`, or `incomplete: …`).
pub fn verdict_line(v: &Verdict) -> String {
    let failed: Vec<String> = v
        .checks
        .iter()
        .filter(|c| c.met != Some(true))
        .map(|c| {
            format!(
                "{} = {} (target {})",
                c.what,
                c.value.map_or("-".to_owned(), |x| format!("{x:.2}")),
                c.target
            )
        })
        .collect();
    match v.met {
        Some(true) => format!("VERDICT {}: met", v.workload),
        Some(false) => format!("VERDICT {}: not met: {}", v.workload, failed.join("; ")),
        None => format!(
            "VERDICT {}: incomplete (a policy was not run): {}",
            v.workload,
            failed.join("; ")
        ),
    }
}

/// The multi-seed table of one workload, the checks and the verdict line.
pub fn render_summary(workload: &str, summaries: &[PolicySummary], verdict: &Verdict) -> String {
    let seeds: Vec<String> = summaries
        .first()
        .map(|s| s.seeds.iter().map(u64::to_string).collect())
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== {workload}: median [min–max] over seeds {} (simulated ms; hit% from pod counters; pred err = median |predicted − observed| / observed TTFT, wall clock) ==",
        seeds.join(", ")
    );
    let head = [
        "policy", "TTFT p50", "TTFT p90", "TTFT p99", "hit%", "ok", "pred err",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
    for s in summaries {
        rows.push(vec![
            s.label.clone(),
            s.ttft_p50_ms.render(0, 1.0),
            s.ttft_p90_ms.render(0, 1.0),
            s.ttft_p99_ms.render(0, 1.0),
            s.cache_hit_ratio.render(1, 100.0),
            s.ok.render(0, 1.0),
            if s.prediction_error.n == 0 {
                if s.label == Policy::Kvroute.label() {
                    "n/a".to_owned()
                } else {
                    "-".to_owned()
                }
            } else {
                format!("{}%", s.prediction_error.render(0, 100.0))
            },
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |x| x.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| {
                if c == 0 {
                    format!("{s:<w$}")
                } else {
                    format!("{s:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    for c in &verdict.checks {
        let _ = writeln!(
            out,
            "  {:<40} {:>6}  per seed {:<18} target {:<6} {}",
            c.what,
            c.value.map_or("-".to_owned(), |x| format!("{x:.2}")),
            c.per_seed.render(2, 1.0),
            c.target,
            match c.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            }
        );
    }
    let _ = writeln!(out, "{}", verdict_line(verdict));
    out
}
