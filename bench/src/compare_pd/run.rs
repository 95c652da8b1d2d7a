//! Running a scenario: each row on its own fresh stack, the same seeded spec through each (the
//! client routing the round-robin P/D baseline itself), then kvroute's stats and each pod role's
//! `/sim/stats` counters read before the stack is dropped, and the records reduced to [`Figures`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::figures::Figures;
use super::scenario::{Scenario, Setup};
use super::stack::{PdStack, PdStackOptions};
use super::topology::Topology;
use crate::compare::run_after_warmup_with;
use crate::driver::DriveOptions;
use crate::report::RunReport;
use crate::routing::ClientRouter;

/// One row's run of a scenario.
#[derive(Clone, Debug, Serialize)]
pub struct PdRow {
    pub label: String,
    pub setup: Setup,
    pub figures: Figures,
    /// kvroute's `wasmcustom.kvroute.*` stats at the end of the run (whole run, warm-up included).
    pub kvroute_stats: BTreeMap<String, u64>,
    /// Each pod's `/sim/stats` counters at the end of the run (whole run), by role.
    pub pod_counters: BTreeMap<String, BTreeMap<String, u64>>,
    /// The standard report (without per-request records).
    pub report: RunReport,
}

/// The `/sim/stats` counters summed over each role's pods.
const POD_COUNTERS: [&str; 8] = [
    "requests_total",
    "requests_failed",
    "prompt_tokens_total",
    "cached_tokens_total",
    "transferred_tokens_total",
    "disaggregated_decodes",
    "prefills_for_remote_decode",
    "sidecar_prefills",
];

async fn pod_counters(pods: &[String]) -> BTreeMap<String, BTreeMap<String, u64>> {
    let client = reqwest::Client::builder().no_proxy().build();
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let Ok(client) = client else {
        return out;
    };
    for pod in pods {
        let stats: Option<Value> = async {
            client
                .get(format!("http://{pod}/sim/stats"))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()
        }
        .await;
        let Some(stats) = stats else { continue };
        let role = stats
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned();
        let sums = out.entry(role).or_default();
        *sums.entry("pods".to_owned()).or_insert(0) += 1;
        for key in POD_COUNTERS {
            let v = stats.get(key).and_then(Value::as_u64).unwrap_or(0);
            *sums.entry(key.to_owned()).or_insert(0) += v;
        }
    }
    out
}

/// Runs one scenario: each topology on fresh pods and a fresh Envoy, the same spec through each.
pub async fn run_scenario(scenario: &Scenario, opts: &PdStackOptions) -> Result<Vec<PdRow>> {
    let mut spec = scenario.spec.clone();
    spec.validate()?;
    anyhow::ensure!(
        scenario.warmup_s >= 0.0 && scenario.warmup_s < spec.duration_s,
        "{}: warm-up ({} s) must be >= 0 and shorter than the duration ({} s)",
        scenario.name,
        scenario.warmup_s,
        spec.duration_s
    );
    // The per-class figures need the records; they are dropped from the report afterwards.
    let keep = spec.keep_records;
    spec.keep_records = true;
    let n = scenario.setups.len();
    let mut rows = Vec::with_capacity(n);
    for (i, setup) in scenario.setups.iter().enumerate() {
        let t0 = Instant::now();
        let topology = setup.topology;
        let label = setup.label();
        eprintln!(
            "[{}/{n}] {} — {label}: starting {} pods and Envoy…",
            i + 1,
            scenario.name,
            topology.gpus()
        );
        let stack = PdStack::start(topology, opts, &setup.plugin_extra).await?;
        eprintln!(
            "[{}/{n}] {} — {label}: ready in {:.1} s; sending for {} s simulated ({:.1} s wall) and draining…",
            i + 1,
            scenario.name,
            t0.elapsed().as_secs_f64(),
            spec.duration_s,
            spec.duration_s * opts.time_scale
        );
        let pods = stack.all_pods();
        let drive = DriveOptions {
            router: match topology {
                Topology::RoundRobinPd { split, .. } => {
                    // As generous as a request's own timeout.
                    let timeout = Duration::from_secs_f64(
                        (spec.request_timeout_s * opts.time_scale).clamp(1.0, 3600.0),
                    );
                    Some(Arc::new(ClientRouter::pd_round_robin(
                        stack.prefill.clone(),
                        stack.pool.clone(),
                        split,
                        timeout,
                    )))
                }
                _ => None,
            },
            other_gateways: Vec::new(),
            ..DriveOptions::default()
        };
        let mut report = run_after_warmup_with(
            &stack.url(),
            &pods,
            &spec,
            opts.time_scale,
            scenario.warmup_s,
            &drive,
        )
        .await
        .with_context(|| format!("running {} on {label}", scenario.name))?;
        let mut kvroute_stats: BTreeMap<String, u64> =
            harness::kvroute_summary(&stack.envoy.labelled_stats().await.unwrap_or_default())
                .into_iter()
                .map(|(k, v)| (k.trim_start_matches("wasmcustom.").to_owned(), v))
                .collect();
        if let Some(router) = &drive.router {
            for (k, v) in router.counters().snapshot() {
                kvroute_stats.insert(format!("client.{k}"), v);
            }
        }
        let counters = pod_counters(&pods).await;
        drop(stack);
        let figures = Figures::of(&report, &spec, scenario.warmup_s);
        if !keep {
            report.records = Vec::new();
        }
        report.spec.keep_records = keep;
        eprintln!(
            "[{}/{n}] {} — {label}: {} requests measured, {} ok, {} completed in the window, {:.1} s wall in all",
            i + 1,
            scenario.name,
            report.requests,
            report.ok,
            figures.completed_in_window,
            t0.elapsed().as_secs_f64()
        );
        rows.push(PdRow {
            label,
            setup: setup.clone(),
            figures,
            kvroute_stats,
            pod_counters: counters,
            report,
        });
    }
    Ok(rows)
}
