//! The overload benchmark's figures (`kvbench compare --workload overload`, `make bench-overload`):
//! flow control (`kvroute-flow`) against kvroute without it and against round-robin, on arrivals
//! above the pool's capacity for a while, two priority classes and tenants of which one bursts.
//!
//! Per run ([`OverloadStats`], from the driver's records):
//!
//! * TTFT per priority class, from the client's send (a request held at the gateway waits inside
//!   its TTFT), over the requests that completed;
//! * requests completed, and the failures: 429s by kvroute's `x-kvroute-error` code
//!   (`queue_full`, `queue_timeout`), the rest by class;
//! * goodput per tenant: its requests that completed with a TTFT within [`GOODPUT_TTFT_SLO_S`];
//!   Jain's fairness index over the tenants' goodput, each normalised by the tenant's *max-min fair
//!   share* ([`max_min_shares`]) of the run's total goodput given what each tenant asked for. That
//!   normalisation is the one that rewards fairness: a tenant that asks for less than an equal
//!   share is owed all of it, the bursting tenant only what is left. Normalising by demand alone
//!   (goodput / requests sent, also reported) would score a FIFO that serves every tenant the same
//!   fraction of its requests as perfectly fair, however much the burst crowded the others out;
//! * whether every request heard back (its status line) within the TTL + [`ANSWER_SLACK_S`]: a
//!   held request must be answered (released or 429 `queue_timeout`) before its TTL runs out.
//!
//! Over the seeds ([`summarize`]): the median and range of each; the verdict ([`verdict`]) takes
//! kvroute-flow's figures as ratios to the baselines' in the same comparison, never absolute
//! timings.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::compare::{Policy, FLOW_TTL_S};
use super::driver::RequestRecord;
use super::report::{RunReport, Summary};
use super::summary::{Check, Spread, Verdict};
use super::table::Table;
use super::workload::HIGH_PRIORITY;

/// A request counts towards goodput when it completed with a TTFT (from the client's send) within
/// this many simulated seconds: a third of the TTL, what an interactive user still waits for.
pub const GOODPUT_TTFT_SLO_S: f64 = 10.0;

/// How late past the TTL an answer may come and still count as in time, simulated seconds: the
/// gateway notices an expired request on its next event or tick (the bench polls every 100 ms
/// wall-clock, 2 s simulated at time scale 0.05).
pub const ANSWER_SLACK_S: f64 = 5.0;

/// One priority class of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassStats {
    pub sent: usize,
    pub ok: usize,
    /// Over completed requests, simulated ms from the client's send.
    pub ttft_ms: Summary,
}

/// One tenant (flow) of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TenantStats {
    pub sent: usize,
    pub ok: usize,
    /// Completed with TTFT ≤ [`GOODPUT_TTFT_SLO_S`].
    pub goodput: usize,
}

/// The overload figures of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OverloadStats {
    pub high: ClassStats,
    pub low: ClassStats,
    pub sent: usize,
    pub completed: usize,
    /// Replies kvroute made itself, by `x-kvroute-error` (`queue_timeout`, `queue_full`, …).
    pub gateway_errors: BTreeMap<String, usize>,
    /// Other failures by class (`http 503`, `timeout`, …).
    pub other_errors: BTreeMap<String, usize>,
    /// By session (`tenant-N`).
    pub tenants: BTreeMap<String, TenantStats>,
    pub goodput: usize,
    /// Jain's index over goodput / max-min fair share.
    pub jain_fair_share: Option<f64>,
    /// Jain's index over goodput / requests sent.
    pub jain_demand: Option<f64>,
    /// The longest a request waited for its status line, simulated s (`None`: none answered).
    pub longest_answer_s: Option<f64>,
    /// Requests with no status line within [`FLOW_TTL_S`] + [`ANSWER_SLACK_S`] (never answered
    /// included).
    pub late_answers: usize,
}

/// Jain's fairness index (Σx)² / (n·Σx²) over `x`: 1 when all are equal, 1/n when one has
/// everything. `None` for no values or all zero.
pub fn jain(x: &[f64]) -> Option<f64> {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    (!x.is_empty() && squares > 0.0).then(|| sum * sum / (x.len() as f64 * squares))
}

/// The max-min fair split of `capacity` between `demands` (water-filling): every demand below the
/// common level gets all of it, the others the level, the shares summing to `capacity` (to the
/// sum of demands when that is less).
pub fn max_min_shares(demands: &[f64], capacity: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| demands[a].total_cmp(&demands[b]));
    let mut shares = vec![0.0; demands.len()];
    let mut left = capacity.max(0.0);
    for (i, &k) in order.iter().enumerate() {
        let level = left / (order.len() - i) as f64;
        let share = demands[k].max(0.0).min(level);
        shares[k] = share;
        left -= share;
    }
    shares
}

impl OverloadStats {
    /// From the driver's wall-clock `records` (those that were sent).
    pub fn of(records: &[&RequestRecord], time_scale: f64) -> Self {
        let sim = |s: f64| s / time_scale;
        let mut out = OverloadStats::default();
        let (mut high_ttft, mut low_ttft) = (Vec::new(), Vec::new());
        let deadline_s = FLOW_TTL_S + ANSWER_SLACK_S;
        for r in records {
            out.sent += 1;
            let ttft_s = r.ttft_s.map(sim).filter(|_| r.ok);
            let high = r.priority == Some(HIGH_PRIORITY);
            let (class, ttfts) = if high {
                (&mut out.high, &mut high_ttft)
            } else {
                (&mut out.low, &mut low_ttft)
            };
            class.sent += 1;
            let tenant = out.tenants.entry(r.session.clone()).or_default();
            tenant.sent += 1;
            if let Some(t) = ttft_s {
                class.ok += 1;
                ttfts.push(t * 1000.0);
                out.completed += 1;
                tenant.ok += 1;
                if t <= GOODPUT_TTFT_SLO_S {
                    tenant.goodput += 1;
                    out.goodput += 1;
                }
            } else if let Some(code) = &r.gateway_error {
                *out.gateway_errors.entry(code.clone()).or_default() += 1;
            } else if !r.ok {
                let class = r
                    .error
                    .clone()
                    .unwrap_or_else(|| "no first token".to_owned());
                *out.other_errors.entry(class).or_default() += 1;
            }
            let answered = r.headers_s.map(sim);
            if let Some(a) = answered {
                out.longest_answer_s = Some(out.longest_answer_s.map_or(a, |m| m.max(a)));
            }
            if answered.is_none_or(|a| a > deadline_s) {
                out.late_answers += 1;
            }
        }
        out.high.ttft_ms = Summary::of(&high_ttft);
        out.low.ttft_ms = Summary::of(&low_ttft);
        let demands: Vec<f64> = out.tenants.values().map(|t| t.sent as f64).collect();
        let goodput: Vec<f64> = out.tenants.values().map(|t| t.goodput as f64).collect();
        let shares = max_min_shares(&demands, goodput.iter().sum());
        let normalised = |by: &[f64]| -> Vec<f64> {
            goodput
                .iter()
                .zip(by)
                .filter(|(_, d)| **d > 0.0)
                .map(|(g, d)| g / d)
                .collect()
        };
        out.jain_fair_share = jain(&normalised(&shares));
        out.jain_demand = jain(&normalised(&demands));
        out
    }

    /// Whether any of `records` carries a priority: a workload with classes.
    pub fn applies(records: &[&RequestRecord]) -> bool {
        records.iter().any(|r| r.priority.is_some())
    }

    /// Failures by cause in a few words: `429 queue_timeout 12, http 503 1`.
    pub fn failures(&self) -> String {
        let parts: Vec<String> = self
            .gateway_errors
            .iter()
            .map(|(k, v)| format!("429 {k} {v}"))
            .chain(self.other_errors.iter().map(|(k, v)| format!("{k} {v}")))
            .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// One policy's overload figures over the seeds.
#[derive(Clone, Debug, Serialize)]
pub struct OverloadSummary {
    pub label: String,
    pub seeds: Vec<u64>,
    pub high_ttft_p50_ms: Spread,
    pub high_ttft_p90_ms: Spread,
    pub low_ttft_p90_ms: Spread,
    pub sent: Spread,
    pub completed: Spread,
    pub queue_timeout: Spread,
    pub queue_full: Spread,
    /// Failures other than the gateway's own 429s.
    pub other_failures: Spread,
    pub goodput: Spread,
    pub jain_fair_share: Spread,
    pub jain_demand: Spread,
    pub longest_answer_s: Spread,
    /// Summed over the seeds.
    pub late_answers: usize,
    /// kvroute's own `kvroute.flow.*` counters (summed over labels), medians over the seeds.
    pub gateway_flow: BTreeMap<String, Spread>,
}

/// Per policy (in order of first appearance), over the runs that have overload figures.
pub fn summarize(runs: &[Vec<(String, RunReport)>]) -> Vec<OverloadSummary> {
    let mut labels: Vec<&str> = Vec::new();
    for (label, r) in runs.iter().flatten() {
        if r.overload.is_some() && !labels.contains(&label.as_str()) {
            labels.push(label);
        }
    }
    labels
        .into_iter()
        .map(|label| {
            let reports: Vec<(&RunReport, &OverloadStats)> = runs
                .iter()
                .flatten()
                .filter(|(l, _)| l == label)
                .filter_map(|(_, r)| Some((r, r.overload.as_ref()?)))
                .collect();
            let of = |f: &dyn Fn(&OverloadStats) -> Option<f64>| {
                Spread::of_options(&reports.iter().map(|(_, o)| f(o)).collect::<Vec<_>>())
            };
            let code = |c: &'static str| {
                move |o: &OverloadStats| Some(o.gateway_errors.get(c).copied().unwrap_or(0) as f64)
            };
            let mut names: Vec<&String> = reports
                .iter()
                .flat_map(|(r, _)| r.gateway_flow.keys())
                .collect();
            names.sort();
            names.dedup();
            let gateway_flow = names
                .into_iter()
                .map(|n| {
                    let v: Vec<f64> = reports
                        .iter()
                        .map(|(r, _)| r.gateway_flow.get(n).copied().unwrap_or(0) as f64)
                        .collect();
                    (n.clone(), Spread::of(&v))
                })
                .collect();
            OverloadSummary {
                label: label.to_owned(),
                seeds: reports.iter().map(|(r, _)| r.seed).collect(),
                high_ttft_p50_ms: of(&|o| o.high.ttft_ms.p50),
                high_ttft_p90_ms: of(&|o| o.high.ttft_ms.p90),
                low_ttft_p90_ms: of(&|o| o.low.ttft_ms.p90),
                sent: of(&|o| Some(o.sent as f64)),
                completed: of(&|o| Some(o.completed as f64)),
                queue_timeout: of(&code("queue_timeout")),
                queue_full: of(&code("queue_full")),
                other_failures: of(&|o| Some(o.other_errors.values().sum::<usize>() as f64)),
                goodput: of(&|o| Some(o.goodput as f64)),
                jain_fair_share: of(&|o| o.jain_fair_share),
                jain_demand: of(&|o| o.jain_demand),
                longest_answer_s: of(&|o| o.longest_answer_s),
                late_answers: reports.iter().map(|(_, o)| o.late_answers).sum(),
                gateway_flow,
            }
        })
        .collect()
}

/// `f` of `label`'s overload figures, seed by seed.
fn by_seed(
    runs: &[Vec<(String, RunReport)>],
    label: &str,
    f: &dyn Fn(&OverloadStats) -> Option<f64>,
) -> BTreeMap<u64, f64> {
    runs.iter()
        .flatten()
        .filter(|(l, _)| l == label)
        .filter_map(|(_, r)| Some((r.seed, f(r.overload.as_ref()?)?)))
        .filter(|(_, v)| v.is_finite())
        .collect()
}

/// kvroute-flow's `f` over `base`'s, as the ratio of the medians and seed by seed; met when the
/// ratio is ≤ 1 (`lower`) or ≥ 1.
fn ratio_check(
    runs: &[Vec<(String, RunReport)>],
    what: &str,
    base: Policy,
    lower: bool,
    f: &dyn Fn(&OverloadStats) -> Option<f64>,
) -> Check {
    let flow = by_seed(runs, Policy::KvrouteFlow.label(), f);
    let other = by_seed(runs, base.label(), f);
    let median = |m: &BTreeMap<u64, f64>| Spread::of(&m.values().copied().collect::<Vec<_>>());
    let value = match (median(&flow).median, median(&other).median) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let per_seed: Vec<f64> = flow
        .iter()
        .filter_map(|(s, a)| other.get(s).filter(|b| **b > 0.0).map(|b| a / b))
        .collect();
    Check {
        what: format!("{what} kvroute-flow / {}", base.label()),
        value,
        per_seed: Spread::of(&per_seed),
        target: if lower { "≤ 1" } else { "≥ 1" }.to_owned(),
        met: value.map(|v| if lower { v <= 1.0 } else { v >= 1.0 }),
    }
}

/// The overload verdict, every figure of kvroute-flow against kvroute (flow control off) and
/// against round-robin in the same comparison: high-priority p90 TTFT ≤ theirs, Jain's index
/// (fair-share normalised) ≥ theirs, goodput ≥ theirs; and no kvroute-flow request without an
/// answer past the TTL + slack (on any seed). A side not run is "not measured".
pub fn verdict(workload: &str, runs: &[Vec<(String, RunReport)>]) -> Verdict {
    let mut checks = Vec::new();
    for base in [Policy::Kvroute, Policy::RoundRobin] {
        checks.push(ratio_check(
            runs,
            "high-priority p90 TTFT",
            base,
            true,
            &|o| o.high.ttft_ms.p90,
        ));
        checks.push(ratio_check(runs, "Jain's index", base, false, &|o| {
            o.jain_fair_share
        }));
        checks.push(ratio_check(runs, "goodput", base, false, &|o| {
            Some(o.goodput as f64)
        }));
    }
    let late = by_seed(runs, Policy::KvrouteFlow.label(), &|o| {
        Some(o.late_answers as f64)
    });
    let late_total = (!late.is_empty()).then(|| late.values().sum::<f64>());
    checks.push(Check {
        what: format!(
            "kvroute-flow requests unanswered after the TTL + {ANSWER_SLACK_S} s (all seeds)"
        ),
        value: late_total,
        per_seed: Spread::of(&late.values().copied().collect::<Vec<_>>()),
        target: "= 0".to_owned(),
        met: late_total.map(|n| n == 0.0),
    });
    Verdict::of(workload, checks)
}

/// One run's overload figures, one row per policy.
pub fn render_run(rows: &[(String, RunReport)]) -> String {
    let mut table = Table::new(&[
        "policy",
        "hi p50 s",
        "hi p90 s",
        "lo p90 s",
        "completed",
        "failed",
        "goodput",
        "Jain fair",
        "Jain dem",
        "longest wait s",
        "late",
    ])
    .left(1);
    let secs = |v: Option<f64>| v.map_or("-".to_owned(), |ms| format!("{:.1}", ms / 1000.0));
    let idx = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    let mut any = false;
    for (label, r) in rows {
        let Some(o) = &r.overload else { continue };
        any = true;
        table.row([
            label.clone(),
            secs(o.high.ttft_ms.p50),
            secs(o.high.ttft_ms.p90),
            secs(o.low.ttft_ms.p90),
            format!("{}/{}", o.completed, o.sent),
            o.failures(),
            o.goodput.to_string(),
            idx(o.jain_fair_share),
            idx(o.jain_demand),
            o.longest_answer_s
                .map_or("-".to_owned(), |s| format!("{s:.1}")),
            o.late_answers.to_string(),
        ]);
    }
    if !any {
        return String::new();
    }
    let mut out = format!(
        "overload (TTFT from the client's send, simulated s; goodput = completed with TTFT ≤ {GOODPUT_TTFT_SLO_S} s; Jain over tenants' goodput / max-min fair share (fair) and / requests sent (dem); late = no status line within the TTL {FLOW_TTL_S} s + {ANSWER_SLACK_S} s):\n"
    );
    out.push_str(&table.text());
    for (label, r) in rows {
        if !r.gateway_flow.is_empty() {
            let c: Vec<String> = r
                .gateway_flow
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "{label} gateway: {}", c.join(", "));
        }
    }
    out
}

/// The overload table over the seeds: per policy the median [min–max] of each figure.
pub fn render_summary(summaries: &[OverloadSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== overload: median [min–max] over the seeds (TTFT from the client's send incl. the gateway's wait, simulated s; goodput = requests completed with TTFT ≤ {GOODPUT_TTFT_SLO_S} s; Jain = Jain's index over the tenants' goodput / their max-min fair share; late = requests with no status line within the TTL {FLOW_TTL_S} s + {ANSWER_SLACK_S} s, all seeds) =="
    );
    let mut table = Table::new(&[
        "policy",
        "hi p50 s",
        "hi p90 s",
        "lo p90 s",
        "completed",
        "429 timeout",
        "429 full",
        "other fail",
        "goodput",
        "Jain",
        "Jain/demand",
        "longest wait s",
        "late",
    ])
    .left(1);
    for s in summaries {
        table.row([
            s.label.clone(),
            s.high_ttft_p50_ms.render(1, 0.001),
            s.high_ttft_p90_ms.render(1, 0.001),
            s.low_ttft_p90_ms.render(1, 0.001),
            format!(
                "{} of {}",
                s.completed.render(0, 1.0),
                s.sent.render(0, 1.0)
            ),
            s.queue_timeout.render(0, 1.0),
            s.queue_full.render(0, 1.0),
            s.other_failures.render(0, 1.0),
            s.goodput.render(0, 1.0),
            s.jain_fair_share.render(3, 1.0),
            s.jain_demand.render(3, 1.0),
            s.longest_answer_s.render(1, 1.0),
            s.late_answers.to_string(),
        ]);
    }
    out.push_str(&table.text());
    for s in summaries.iter().filter(|s| !s.gateway_flow.is_empty()) {
        let c: Vec<String> = s
            .gateway_flow
            .iter()
            .map(|(k, v)| format!("{k} {}", v.render(0, 1.0)))
            .collect();
        let _ = writeln!(out, "{} gateway counters: {}", s.label, c.join(", "));
    }
    out
}

#[cfg(test)]
mod tests;
