//! Judging the P/D rows: each kvroute P/D row against the aggregated baseline, against each control
//! row and against Envoy's round-robin on the same aggregated pods (where published P/D gains were
//! measured, so the published targets apply there), and against the round-robin P/D baselines on
//! the same pools. A latency is judged as aggregated / P/D, a count as P/D / aggregated − 1.

use serde::Serialize;

use super::run::PdRow;
use super::scenario::Scenario;
use crate::report::Summary;
use crate::workload::WorkloadKind;

/// A P/D row against an aggregated row on one metric, and whether it met its target.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The P/D row.
    pub row: String,
    /// The aggregated row it is compared with (the baseline, or a control).
    pub against: String,
    /// What is compared, e.g. `P99 ITL of the streaming decodes (ms)`.
    pub metric: String,
    pub aggregated: Option<f64>,
    pub pd: Option<f64>,
    /// The figure judged: aggregated / P/D for latencies, P/D / aggregated − 1 for counts.
    pub value: Option<f64>,
    /// How the value reads, e.g. `9.1× lower with P/D`.
    pub reads: String,
    /// The target (`≥ 5× lower`), or `None` for a figure only reported.
    pub target: Option<String>,
    pub met: Option<bool>,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// Which rows a verdict compares.
struct Pair<'a> {
    row: &'a str,
    against: &'a str,
}

impl Pair<'_> {
    /// A latency, lower is better: the value is aggregated / P/D.
    fn lower(
        &self,
        metric: &str,
        agg: Option<f64>,
        pd: Option<f64>,
        target: Option<f64>,
    ) -> Verdict {
        let value = ratio(agg, pd);
        Verdict {
            row: self.row.to_owned(),
            against: self.against.to_owned(),
            metric: metric.to_owned(),
            aggregated: agg,
            pd,
            value,
            reads: value.map_or("-".to_owned(), |v| {
                if v >= 1.0 {
                    format!("{v:.1}× lower with P/D")
                } else {
                    format!("{:.1}× higher with P/D", 1.0 / v)
                }
            }),
            target: target.map(|t| format!("≥ {t}× lower")),
            met: target.map(|t| value.is_some_and(|v| v >= t)),
        }
    }

    /// A count, more is better: the value is P/D / aggregated − 1.
    fn more(&self, metric: &str, agg: f64, pd: f64, target: Option<f64>) -> Verdict {
        let value = ratio(Some(pd), Some(agg)).map(|r| r - 1.0);
        Verdict {
            row: self.row.to_owned(),
            against: self.against.to_owned(),
            metric: metric.to_owned(),
            aggregated: Some(agg),
            pd: Some(pd),
            value,
            reads: value.map_or("-".to_owned(), |v| format!("{:+.0}% with P/D", v * 100.0)),
            target: target.map(|t| format!("≥ +{:.0}%", t * 100.0)),
            met: target.map(|t| value.is_some_and(|v| v >= t)),
        }
    }
}

/// The scenario's targets, and a few figures only reported, for every P/D row against the
/// baseline (aggregated, kvroute as configured for every row) and against each control row.
pub fn verdicts(scenario: &Scenario, rows: &[PdRow]) -> Vec<Verdict> {
    let p99 = |s: Option<Summary>| s.and_then(|s| s.p99);
    let p50 = |s: Option<Summary>| s.and_then(|s| s.p50);
    // Against kvroute's own aggregated routing the agent targets are "report, and complete no fewer";
    // against Envoy's round-robin on the same aggregated pods (where published P/D gains were
    // measured) they are 2× lower p50 TTFT and 30% more completed requests.
    let aggregated = rows
        .iter()
        .filter(|r| r.setup.is_baseline())
        .take(1)
        .chain(rows.iter().filter(|r| r.setup.is_control()))
        .map(|r| (r, None, Some(0.0)))
        .chain(
            rows.iter()
                .filter(|r| r.setup.topology.is_aggregated_round_robin())
                .map(|r| (r, Some(2.0), Some(0.3))),
        );
    let mut out = Vec::new();
    for (agg, ttft_target, completed_target) in aggregated {
        let a = &agg.figures;
        for row in rows.iter().filter(|r| r.setup.topology.is_kvroute_pd()) {
            let p = &row.figures;
            let pair = Pair {
                row: &row.label,
                against: &agg.label,
            };
            match scenario.spec.workload {
                WorkloadKind::Interference(_) => {
                    out.push(pair.lower(
                        "P99 ITL of the streaming decodes (ms)",
                        p99(a.stream_itl_ms),
                        p99(p.stream_itl_ms),
                        Some(5.0),
                    ));
                    out.push(pair.lower(
                        "P50 ITL of the streaming decodes (ms)",
                        p50(a.stream_itl_ms),
                        p50(p.stream_itl_ms),
                        None,
                    ));
                    out.push(pair.lower(
                        "p50 TTFT of the streaming decodes (ms)",
                        p50(a.stream_ttft_ms),
                        p50(p.stream_ttft_ms),
                        None,
                    ));
                    out.push(pair.lower(
                        "p50 TTFT of the long prompts (ms)",
                        p50(a.long_ttft_ms),
                        p50(p.long_ttft_ms),
                        None,
                    ));
                    out.push(pair.lower(
                        "p99 TTFT of the long prompts (ms)",
                        p99(a.long_ttft_ms),
                        p99(p.long_ttft_ms),
                        None,
                    ));
                }
                _ => {
                    out.push(pair.lower(
                        "p50 TTFT (ms)",
                        a.ttft_ms.p50,
                        p.ttft_ms.p50,
                        ttft_target,
                    ));
                    out.push(pair.more(
                        "requests completed in the window",
                        a.completed_in_window as f64,
                        p.completed_in_window as f64,
                        completed_target,
                    ));
                    out.push(pair.lower("p99 TTFT (ms)", a.ttft_ms.p99, p.ttft_ms.p99, None));
                    out.push(pair.lower("P99 ITL (ms)", a.itl_ms.p99, p.itl_ms.p99, None));
                }
            }
        }
    }
    // kvroute's P/D against the round-robin P/D baselines on the same pools.
    for base in rows.iter().filter(|r| r.setup.topology.is_round_robin_pd()) {
        for row in rows.iter().filter(|r| r.setup.topology.is_kvroute_pd()) {
            let (b, k) = (&base.figures, &row.figures);
            let p90 = ratio(b.ttft_ms.p90, k.ttft_ms.p90);
            out.push(Verdict {
                row: row.label.clone(),
                against: base.label.clone(),
                metric: "p90 TTFT (ms)".to_owned(),
                aggregated: b.ttft_ms.p90,
                pd: k.ttft_ms.p90,
                value: p90,
                reads: p90.map_or("-".to_owned(), |v| {
                    if v >= 1.0 {
                        format!("{v:.2}× lower with kvroute")
                    } else {
                        format!("{:.2}× higher with kvroute", 1.0 / v)
                    }
                }),
                target: Some("≤ baseline".to_owned()),
                met: p90.map(|v| v >= 1.0),
            });
            let (bd, kd) = (b.completed_in_window as f64, k.completed_in_window as f64);
            let more = ratio(Some(kd), Some(bd)).map(|r| r - 1.0);
            out.push(Verdict {
                row: row.label.clone(),
                against: base.label.clone(),
                metric: "requests completed in the window".to_owned(),
                aggregated: Some(bd),
                pd: Some(kd),
                value: more,
                reads: more.map_or("-".to_owned(), |v| {
                    format!("{:+.1}% with kvroute", v * 100.0)
                }),
                target: Some("≥ baseline".to_owned()),
                met: Some(kd >= bd),
            });
        }
    }
    // The elastic pool against the fixed split of the same mode on the same number of pods: p90
    // TTFT ≤ 0.8× the fixed split's (its streams' objective is judged above, against aggregated).
    for elastic in rows.iter() {
        let Some(mode) = elastic.setup.topology.elastic_mode() else {
            continue;
        };
        let fixed = rows.iter().filter(|r| {
            matches!(r.setup.topology, super::Topology::Disaggregated { mode: m, .. } if m == mode)
                && r.setup.variant.is_none()
        });
        for fixed in fixed {
            let (f, e) = (fixed.figures.ttft_ms.p90, elastic.figures.ttft_ms.p90);
            let value = ratio(f, e);
            out.push(Verdict {
                row: elastic.label.clone(),
                against: fixed.label.clone(),
                metric: "p90 TTFT (ms)".to_owned(),
                aggregated: f,
                pd: e,
                value,
                reads: value.map_or("-".to_owned(), |v| {
                    format!("{:.2}× the fixed split's", 1.0 / v)
                }),
                target: Some("≤ 0.8× the fixed split's".to_owned()),
                met: value.map(|v| v >= 1.25),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::render::render_verdicts;
    use super::super::scenario::{wide_tie_band_control, Setup};
    use super::super::test_support::{interference_spec, record, row};
    use super::super::topology::{PdMode, Topology};
    use super::*;

    #[test]
    fn verdicts_judge_every_pd_row_against_the_baseline_and_the_controls() {
        let agg = row(
            Setup::plain(Topology::Aggregated { pods: 4 }),
            &[record("stream-0", 0.0, 0.2, &[0.9; 10], 10.0)],
        );
        let pd = row(
            Setup::plain(Topology::Disaggregated {
                prefill: 2,
                decode: 2,
                mode: PdMode::Sidecar,
            }),
            &[record("stream-0", 0.0, 0.2, &[0.1; 10], 2.0)],
        );
        let control = row(
            wide_tie_band_control(4),
            &[record("stream-0", 0.0, 0.2, &[0.3; 10], 4.0)],
        );
        assert_eq!(control.label, "aggregated 4 (tie band 0.2)");
        assert_eq!(pd.label, "P/D sidecar 2P+2D");
        let scenario = Scenario {
            name: "interference".to_owned(),
            spec: interference_spec(),
            warmup_s: 20.0,
            setups: vec![agg.setup.clone(), pd.setup.clone(), control.setup.clone()],
        };
        let v = verdicts(&scenario, &[agg, pd, control]);
        let itl: Vec<&Verdict> = v
            .iter()
            .filter(|v| v.metric.starts_with("P99 ITL"))
            .collect();
        assert_eq!(itl.len(), 2);
        assert_eq!(itl[0].against, "aggregated 4");
        assert!((itl[0].value.unwrap() - 9.0).abs() < 1e-9);
        assert_eq!(itl[0].met, Some(true));
        assert_eq!(itl[1].against, "aggregated 4 (tie band 0.2)");
        assert_eq!(itl[1].met, Some(false), "3× is short of 5×");
        let text = render_verdicts(&v);
        assert!(text.contains("9.0× lower with P/D"), "{text}");
        assert!(text.contains("NOT MET"), "{text}");
    }

    #[test]
    fn an_elastic_pool_is_judged_against_the_fixed_split_of_its_mode() {
        let first_tokens = |ttft: f64| -> Vec<_> {
            (0..20)
                .map(|i| record(&format!("stream-{i}"), 0.0, ttft, &[0.05; 4], 2.0))
                .collect()
        };
        let fixed = |mode| {
            row(
                Setup::plain(Topology::Disaggregated {
                    prefill: 2,
                    decode: 2,
                    mode,
                }),
                &first_tokens(1.0),
            )
        };
        let elastic = row(
            Setup::plain(Topology::Elastic {
                pods: 4,
                mode: PdMode::Inline,
            }),
            &first_tokens(0.7),
        );
        assert_eq!(elastic.label, "elastic P/D inline 4×both");
        let scenario = Scenario {
            name: "interference".to_owned(),
            spec: interference_spec(),
            warmup_s: 0.0,
            setups: Vec::new(),
        };
        let rows = [fixed(PdMode::Sidecar), fixed(PdMode::Inline), elastic];
        let v = verdicts(&scenario, &rows);
        let judged: Vec<&Verdict> = v
            .iter()
            .filter(|v| v.row.starts_with("elastic") && v.against.starts_with("P/D"))
            .collect();
        assert_eq!(judged.len(), 1, "only the inline split: {judged:?}");
        assert_eq!(judged[0].against, "P/D inline 2P+2D");
        assert_eq!(judged[0].met, Some(true), "{:?}", judged[0]);
        assert!(judged[0].reads.starts_with("0.70×"), "{}", judged[0].reads);
    }
}
