//! Several seeds of one policy comparison, summarised: per policy the median of each figure over the
//! seeds with its spread (min–max), kvroute's ratios against the other policies, and one verdict per
//! workload against issue 8's targets (p90 TTFT ≤ round-robin's and least-request's, ≤ 1.25× the
//! perfect-knowledge bound; on multi-tenant also ≥ 4× lower than round-robin; kvroute's TTFT
//! prediction within 20% (median), once the plugin reports predictions). Verdicts are printed,
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
    /// Output tokens per simulated second.
    pub output_tokens_per_s: Spread,
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
                output_tokens_per_s: of(&|r| Some(r.output_tokens_per_s)),
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
    // Prediction quality, once the plugin reports predictions (absent: "n/a" in the table, no check).
    if let Some(k) = kv.filter(|k| k.prediction_error.n > 0) {
        let value = k.prediction_error.median;
        checks.push(Check {
            what: "kvroute median |pred − obs| / obs TTFT".to_owned(),
            value,
            per_seed: k.prediction_error,
            target: "≤ 0.2".to_owned(),
            met: value.map(|v| v <= 0.2),
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
        "== {workload}: median [min–max] over seeds {} (simulated ms; hit% from pod counters; pred err = median |predicted − observed| / observed TTFT, wall clock: kvroute's predicted_ttft_ms, the bound's chosen-pod estimate) ==",
        seeds.join(", ")
    );
    let head = [
        "policy", "TTFT p50", "TTFT p90", "TTFT p99", "hit%", "tok/s", "success%", "ok", "pred err",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
    for s in summaries {
        rows.push(vec![
            s.label.clone(),
            s.ttft_p50_ms.render(0, 1.0),
            s.ttft_p90_ms.render(0, 1.0),
            s.ttft_p99_ms.render(0, 1.0),
            s.cache_hit_ratio.render(1, 100.0),
            s.output_tokens_per_s.render(0, 1.0),
            s.success_rate.render(1, 100.0),
            s.ok.render(0, 1.0),
            if s.prediction_error.n == 0 {
                if s.label == Policy::Kvroute.label() || s.label.starts_with(Policy::Oracle.label())
                {
                    "n/a".to_owned()
                } else {
                    "-".to_owned()
                }
            } else {
                format!("{}%", s.prediction_error.render(0, 100.0))
            },
        ]);
    }
    write_table(&mut out, &rows, 1);
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

/// Writes `rows` (the first is the header, underlined) as aligned columns: the first `left`
/// columns left-aligned, the others right-aligned.
fn write_table(out: &mut String, rows: &[Vec<String>], left: usize) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
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
                if c < left {
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
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
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
            rows.push(vec![
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
    write_table(&mut out, &rows, 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::driver::RequestRecord;
    use crate::bench::workload::{Load, WorkloadKind, WorkloadSpec};

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
                    ("perfect-knowledge".to_owned(), report(seed, &[0.9 * k; 10])),
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
        assert_eq!(s[1].prediction_error.n, 0);
        let v = verdict("multi-tenant", &runs, &s);
        assert_eq!(v.checks.len(), 5, "with predictions, their check too");
        assert_eq!(v.checks[4].met, Some(true), "10% ≤ 20%");
        assert_eq!(v.checks[0].met, Some(true), "{:?}", v.checks[0]);
        assert_eq!(v.checks[1].met, Some(true), "2 s vs 3 s");
        assert_eq!(v.checks[2].met, Some(true), "1/0.9 ≤ 1.25");
        assert_eq!(v.checks[3].met, Some(false), "2× is not 4× lower");
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
