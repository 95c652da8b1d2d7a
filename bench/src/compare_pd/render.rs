//! A scenario as text and files: what was run, the P/D table, the verdicts, the standard table and
//! the counters (`pd-<scenario>.txt`, also printed), and the same rows and verdicts as JSON
//! (`pd-<scenario>.json`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::run::PdRow;
use super::scenario::{Scenario, Setup};
use super::stack::PdStackOptions;
use super::verdict::{verdicts, Verdict};
use crate::report::{render_table, RunReport};
use crate::table::Table;
use crate::workload::WorkloadKind;

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "-".to_owned(),
    }
}

/// The head and rows as a table: the first `left` columns left-aligned, the numbers right-aligned.
fn grid(head: &[&str], body: Vec<Vec<String>>, left: usize) -> String {
    let mut table = Table::new(head).left(left);
    for row in body {
        table.row(row);
    }
    table.text()
}

/// The scenario's own table: one row per topology, the figures its targets are about.
pub fn render_pd_table(scenario: &Scenario, rows: &[PdRow]) -> String {
    let interference = matches!(scenario.spec.workload, WorkloadKind::Interference(_));
    let mut head = vec![
        "topology",
        "GPUs",
        "sent",
        "ok%",
        "done",
        "done/s",
        "out tok/s",
    ];
    if interference {
        head.extend([
            "stream ITL p50",
            "p90",
            "p99",
            "stream TTFT p50",
            "long TTFT p50",
            "p99",
        ]);
    } else {
        head.extend(["TTFT p50", "p90", "p99", "ITL p50", "p99"]);
    }
    head.extend(["P/D split", "decode-only"]);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let f = &r.figures;
            let mut cells = vec![
                r.label.clone(),
                r.setup.topology.gpus().to_string(),
                r.report.requests.to_string(),
                num(r.report.success_rate.map(|s| s * 100.0), 1),
                f.completed_in_window.to_string(),
                num(Some(f.completed_per_s), 2),
                num(Some(f.output_tokens_per_s), 0),
            ];
            if interference {
                let s = f.stream_itl_ms.unwrap_or_default();
                cells.extend([
                    num(s.p50, 1),
                    num(s.p90, 1),
                    num(s.p99, 1),
                    num(f.stream_ttft_ms.and_then(|x| x.p50), 0),
                    num(f.long_ttft_ms.and_then(|x| x.p50), 0),
                    num(f.long_ttft_ms.and_then(|x| x.p99), 0),
                ]);
            } else {
                cells.extend([
                    num(f.ttft_ms.p50, 0),
                    num(f.ttft_ms.p90, 0),
                    num(f.ttft_ms.p99, 0),
                    num(f.itl_ms.p50, 1),
                    num(f.itl_ms.p99, 1),
                ]);
            }
            let stat = |k: &str| r.kvroute_stats.get(k).copied();
            let pd = |k: &str| {
                if r.setup.topology.is_aggregated() {
                    "-".to_owned()
                } else {
                    stat(k).unwrap_or(0).to_string()
                }
            };
            if r.setup.topology.is_round_robin_pd() {
                cells.push(pd("client.split"));
                cells.push(format!(
                    "{}",
                    stat("client.decode_only").unwrap_or(0)
                        + stat("client.prefill_failures").unwrap_or(0)
                ));
            } else {
                cells.push(pd("kvroute.pd.disaggregated_total"));
                cells.push(pd("kvroute.pd.decode_only_total"));
            }
            cells
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Figures in SIMULATED time (time scale {}). Latencies in ms over successful requests started after the warm-up; \
         done = of those, finished within the {:.0} s window; P/D split / decode-only = kvroute's decisions (whole run).",
        rows.first().map_or(1.0, |r| r.report.time_scale),
        rows.first().map_or(0.0, |r| r.figures.window_s)
    );
    out.push_str(&grid(&head, body, 1));
    out
}

/// The verdicts as a table.
pub fn render_verdicts(verdicts: &[Verdict]) -> String {
    let head = [
        "P/D row",
        "against",
        "metric",
        "against value",
        "row value",
        "result",
        "target",
        "",
    ];
    let body: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.row.clone(),
                v.against.clone(),
                v.metric.clone(),
                num(v.aggregated, 1),
                num(v.pd, 1),
                v.reads.clone(),
                v.target.clone().unwrap_or_else(|| "(reported)".to_owned()),
                match v.met {
                    Some(true) => "MET".to_owned(),
                    Some(false) => "NOT MET".to_owned(),
                    None => String::new(),
                },
            ]
        })
        .collect();
    grid(&head, body, 3)
}

/// What the scenario ran: rows, engine and kvroute settings, workload, load.
pub fn describe_scenario(scenario: &Scenario, opts: &PdStackOptions) -> String {
    let topologies: Vec<String> = scenario.setups.iter().map(Setup::label).collect();
    let engine = if opts.sim_args.is_empty() {
        "kvsim defaults".to_owned()
    } else {
        format!("kvsim defaults with {}", opts.sim_args.join(" "))
    };
    format!(
        "== {} == {} (same seeded workload on each)\nevery pod: {engine}; kvroute: defaults with {}\n{}",
        scenario.name,
        topologies.join(" vs "),
        opts.plugin_extra,
        crate::compare::describe(&scenario.spec, scenario.warmup_s)
    )
}

/// Per-row kvroute and pod counters, one line each.
fn render_counters(rows: &[PdRow]) -> String {
    let mut out = String::new();
    for r in rows {
        let stat = |k: &str| r.kvroute_stats.get(k).copied().unwrap_or(0);
        let mut line = if r.setup.topology.is_round_robin_pd() {
            format!(
                "{}: client routed {} (split {}, decode-only {}, prefill failures {})",
                r.label,
                stat("client.routed"),
                stat("client.split"),
                stat("client.decode_only"),
                stat("client.prefill_failures"),
            )
        } else {
            format!(
                "{}: kvroute routed {} (prefix hit {}, load {}), no endpoint {}, passthrough {}",
                r.label,
                stat("kvroute.requests_routed_total"),
                stat("kvroute.requests_routed_total{reason=\"prefix_hit\"}"),
                stat("kvroute.requests_routed_total{reason=\"load\"}"),
                stat("kvroute.no_endpoint_total"),
                stat("kvroute.passthrough_total"),
            )
        };
        if r.setup.topology.is_kvroute_pd() {
            let _ = write!(
                line,
                "; pd: disaggregated {}, decode-only {}, prefill failures {}, rejected {}",
                stat("kvroute.pd.disaggregated_total"),
                stat("kvroute.pd.decode_only_total"),
                stat("kvroute.pd.prefill_failures_total"),
                stat("kvroute.pd.prefill_rejected_total"),
            );
        }
        if r.setup.variant.is_some() {
            let _ = write!(
                line,
                "; kvroute settings changed for this row: {}",
                r.setup.plugin_extra
            );
        }
        let _ = writeln!(out, "{line}");
        for (role, c) in &r.pod_counters {
            let g = |k: &str| c.get(k).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "  {role} pods ({}): requests {}, failed {}, prompt tokens {}, cached {}, transferred {}, \
                 disaggregated decodes {}, prefills for remote decode {}, sidecar prefills {}",
                g("pods"),
                g("requests_total"),
                g("requests_failed"),
                g("prompt_tokens_total"),
                g("cached_tokens_total"),
                g("transferred_tokens_total"),
                g("disaggregated_decodes"),
                g("prefills_for_remote_decode"),
                g("sidecar_prefills"),
            );
        }
    }
    out
}

/// The full text of one scenario: what was run, the P/D table, the verdicts, the standard table
/// and the counters.
pub fn render_scenario(scenario: &Scenario, opts: &PdStackOptions, rows: &[PdRow]) -> String {
    let mut text = describe_scenario(scenario, opts);
    text.push('\n');
    text.push_str(&render_pd_table(scenario, rows));
    text.push('\n');
    text.push_str(&render_verdicts(&verdicts(scenario, rows)));
    text.push('\n');
    let labelled: Vec<(String, RunReport)> = rows
        .iter()
        .map(|r| (r.label.clone(), r.report.clone()))
        .collect();
    text.push_str(&render_table(&labelled));
    text.push_str(&render_counters(rows));
    text
}

/// Writes `DIR/pd-<scenario>.json` (scenario, engine and kvroute settings, rows, verdicts) and
/// `DIR/pd-<scenario>.txt` (the text of [`render_scenario`]).
pub fn write_scenario(
    dir: &Path,
    scenario: &Scenario,
    opts: &PdStackOptions,
    rows: &[PdRow],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = format!("pd-{}", scenario.name);
    let json_path = dir.join(format!("{stem}.json"));
    let doc = json!({
        "scenario": scenario,
        "sim_args": opts.sim_args,
        "time_scale": opts.time_scale,
        "kvroute_settings": opts.plugin_extra,
        "rows": rows,
        "verdicts": verdicts(scenario, rows),
    });
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join(format!("{stem}.txt"));
    std::fs::write(&txt_path, render_scenario(scenario, opts, rows))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    Ok(())
}
