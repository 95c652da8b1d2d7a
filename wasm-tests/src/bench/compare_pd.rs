//! `kvbench compare-pd` (what `make bench-pd` runs): the same number of simulated GPUs served as
//! aggregated pods or split into prefill and decode pools, kvroute routing both, the same seeded
//! workload through each, one table per scenario with the P/D-vs-aggregated ratios.
//!
//! Two scenarios, each with its published claim as the target:
//!
//! * **interference** ([`WorkloadKind::Interference`]): long streaming decodes with long uncached
//!   prompts arriving among them. On an aggregated pod every prefill step delays the next token of
//!   every stream running there; with P/D the long prompts are prefilled on prefill pods and the
//!   decode pods only decode. Target: P99 inter-token latency of the streams ≥ 5× lower with P/D.
//! * **agent** ([`WorkloadKind::Agent`], ≈45 input tokens per output token) at a load that saturates
//!   the aggregated pods. Target: p50 TTFT ≥ 2× lower and ≥ 30% more requests completed in the same
//!   time with P/D.
//!
//! Topology A is N aggregated pods (one `kvsim` process) in Envoy's pool cluster; topology B is a
//! `kvsim --role prefill` process and a `kvsim --role decode` process, with only the decode pods in
//! Envoy's pool cluster and both pools in kvroute's configuration (`pd.mode` sidecar or inline). Every
//! pod of both topologies runs the same engine settings, and every topology gets fresh pods and a
//! fresh Envoy, as in [`compare`](super::compare).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use std::sync::Arc;

use super::compare::{
    bench_plugin_extra, check_envoy_installed, run_after_warmup_with, StackOptions,
};
use super::driver::DriveOptions;
use super::report::{render_table, RunReport, Summary};
use super::routing::{ClientRouter, PdSplit};
use super::workload::{InterferenceParams, Load, WorkloadKind, WorkloadSpec};
use crate::harness::{self, plugin_config, Envoy, EnvoyOptions, Lb, Sim};

/// How kvroute carries out a disaggregated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PdMode {
    /// `x-prefiller-host-port` to the decode pod, whose (simulated) llm-d sidecar calls the prefiller.
    Sidecar,
    /// kvroute calls the prefill pod itself and forwards its `kv_transfer_params`.
    Inline,
}

impl PdMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PdMode::Sidecar => "sidecar",
            PdMode::Inline => "inline",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "sidecar" => Ok(PdMode::Sidecar),
            "inline" => Ok(PdMode::Inline),
            other => bail!("unknown P/D mode {other:?} (sidecar, inline)"),
        }
    }
}

/// What the simulated GPUs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Topology {
    /// Every pod prefills and decodes.
    Aggregated { pods: usize },
    /// The same aggregated pods behind Envoy's own round-robin, no kvroute: standard Kubernetes
    /// balancing, the baseline published P/D gains are measured against.
    AggregatedRoundRobin { pods: usize },
    /// `prefill` prefill pods and `decode` decode pods.
    Disaggregated {
        prefill: usize,
        decode: usize,
        mode: PdMode,
    },
    /// The round-robin P/D baseline: the same pools behind a plain Envoy (`override_host`, no
    /// kvroute); the client round-robins the prefill pod and the decode pod and splits requests as
    /// `split` says (see [`routing`](super::routing)).
    RoundRobinPd {
        prefill: usize,
        decode: usize,
        split: PdSplit,
    },
}

impl Topology {
    /// Simulated GPUs (pods).
    pub fn gpus(self) -> usize {
        match self {
            Topology::Aggregated { pods } | Topology::AggregatedRoundRobin { pods } => pods,
            Topology::Disaggregated {
                prefill, decode, ..
            }
            | Topology::RoundRobinPd {
                prefill, decode, ..
            } => prefill + decode,
        }
    }

    /// The row label: `aggregated 4`, `P/D sidecar 2P+2D`.
    pub fn label(self) -> String {
        match self {
            Topology::Aggregated { pods } => format!("aggregated {pods}"),
            Topology::AggregatedRoundRobin { pods } => format!("aggregated {pods} round-robin"),
            Topology::Disaggregated {
                prefill,
                decode,
                mode,
            } => format!("P/D {} {prefill}P+{decode}D", mode.as_str()),
            Topology::RoundRobinPd {
                prefill,
                decode,
                split,
            } => format!("round-robin P/D {} {prefill}P+{decode}D", split.label()),
        }
    }

    pub fn is_aggregated(self) -> bool {
        matches!(self, Topology::Aggregated { .. })
    }

    /// kvroute's own P/D (sidecar or inline).
    pub fn is_kvroute_pd(self) -> bool {
        matches!(self, Topology::Disaggregated { .. })
    }

    /// The client-side round-robin P/D baseline.
    pub fn is_round_robin_pd(self) -> bool {
        matches!(self, Topology::RoundRobinPd { .. })
    }

    /// Aggregated pods behind Envoy's round-robin.
    pub fn is_aggregated_round_robin(self) -> bool {
        matches!(self, Topology::AggregatedRoundRobin { .. })
    }
}

/// How the stacks of a comparison are started.
#[derive(Clone, Debug)]
pub struct PdStackOptions {
    /// `kvsim` arguments given to every pod of every topology (`--time-scale` and `--role` are added).
    pub sim_args: Vec<String>,
    pub time_scale: f64,
    /// Merged into the plugin configuration (after the pools and `pd`).
    pub plugin_extra: Value,
    /// Envoy worker threads.
    pub workers: usize,
    pub ready_timeout: Duration,
}

impl Default for PdStackOptions {
    fn default() -> Self {
        Self {
            sim_args: Vec::new(),
            time_scale: 1.0,
            plugin_extra: bench_plugin_extra(),
            workers: 2,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// Envoy with kvroute in front of one topology's simulated pods. Dropping it kills Envoy, then the
/// simulators.
pub struct PdStack {
    pub envoy: Envoy,
    pub sims: Vec<Sim>,
    /// The pods in Envoy's pool cluster (aggregated or decode pods).
    pub pool: Vec<String>,
    /// The prefill pods (empty when aggregated).
    pub prefill: Vec<String>,
    pub topology: Topology,
}

impl PdStack {
    /// Starts fresh pods for `topology` and Envoy with kvroute (`opts.plugin_extra`, then
    /// `row_extra`, merged into its configuration), and waits until kvroute sees every pod (both
    /// pools) healthy.
    pub async fn start(
        topology: Topology,
        opts: &PdStackOptions,
        row_extra: &Value,
    ) -> Result<PdStack> {
        check_envoy_installed()?;
        let scale = opts.time_scale.to_string();
        let sim = |n: usize, role: &str| -> Result<Sim> {
            let mut args: Vec<&str> = vec!["--time-scale", &scale, "--role", role];
            args.extend(opts.sim_args.iter().map(String::as_str));
            Sim::start(n, &args).with_context(|| format!("starting {n} {role} pods (kvsim)"))
        };
        if let Topology::RoundRobinPd {
            prefill, decode, ..
        } = topology
        {
            anyhow::ensure!(
                prefill >= 1 && decode >= 1,
                "need at least one prefill and one decode pod"
            );
            let p = sim(prefill, "prefill")?;
            let d = sim(decode, "decode")?;
            // Both pools in Envoy's cluster: override_host only picks hosts the cluster has.
            let hosts: Vec<String> = p.pods.iter().chain(&d.pods).cloned().collect();
            let mut eo = EnvoyOptions::new(&hosts, Lb::OverrideHost, None);
            eo.concurrency = opts.workers;
            let envoy = Envoy::start(&eo)
                .await
                .with_context(|| format!("starting Envoy for {}", topology.label()))?;
            let (pool, pre) = (d.pods.clone(), p.pods.clone());
            return Ok(PdStack {
                envoy,
                sims: vec![p, d],
                pool,
                prefill: pre,
                topology,
            });
        }
        if let Topology::AggregatedRoundRobin { pods } = topology {
            anyhow::ensure!(pods >= 1, "need at least one pod");
            let s = sim(pods, "aggregated")?;
            let mut eo = EnvoyOptions::new(&s.pods, Lb::RoundRobin, None);
            eo.concurrency = opts.workers;
            let envoy = Envoy::start(&eo)
                .await
                .with_context(|| format!("starting Envoy for {}", topology.label()))?;
            let pool = s.pods.clone();
            return Ok(PdStack {
                envoy,
                sims: vec![s],
                pool,
                prefill: Vec::new(),
                topology,
            });
        }
        harness::wasm_path()?;
        let (sims, pool, prefill, mut extra) = match topology {
            Topology::Aggregated { pods } => {
                anyhow::ensure!(pods >= 1, "need at least one pod");
                let s = sim(pods, "aggregated")?;
                let pool = s.pods.clone();
                (vec![s], pool, Vec::new(), serde_json::Map::new())
            }
            Topology::Disaggregated {
                prefill,
                decode,
                mode,
            } => {
                anyhow::ensure!(
                    prefill >= 1 && decode >= 1,
                    "need at least one prefill and one decode pod"
                );
                let p = sim(prefill, "prefill")?;
                let d = sim(decode, "decode")?;
                let mut extra = serde_json::Map::new();
                extra.insert(
                    "pools".to_owned(),
                    json!([
                        {"name": "prefill", "role": "prefill", "endpoints": p.pods},
                        {"name": "decode", "role": "decode", "endpoints": d.pods}
                    ]),
                );
                extra.insert("pd".to_owned(), json!({"mode": mode.as_str()}));
                let (pool, pre) = (d.pods.clone(), p.pods.clone());
                (vec![p, d], pool, pre, extra)
            }
            Topology::RoundRobinPd { .. } | Topology::AggregatedRoundRobin { .. } => {
                bail!("handled above")
            }
        };
        for more in [&opts.plugin_extra, row_extra] {
            let Value::Object(more) = more.clone() else {
                continue;
            };
            for (k, v) in more {
                // Objects (`pd`, `weights`) are merged field by field; `pd` only matters with P/D.
                match (extra.get_mut(&k), v) {
                    (Some(Value::Object(base)), Value::Object(v)) => base.extend(v),
                    (_, v) if k == "pd" && topology.is_aggregated() => drop(v),
                    (_, v) => {
                        extra.insert(k, v);
                    }
                }
            }
        }
        let config = plugin_config(&pool, Value::Object(extra));
        let mut eo = EnvoyOptions::new(&pool, Lb::OverrideHost, Some(config));
        eo.concurrency = opts.workers;
        let envoy = Envoy::start(&eo)
            .await
            .with_context(|| format!("starting Envoy for {}", topology.label()))?;
        let stack = PdStack {
            envoy,
            sims,
            pool,
            prefill,
            topology,
        };
        let ready = StackOptions {
            ready_timeout: opts.ready_timeout,
            require_healthy: true,
            ..StackOptions::default()
        };
        super::compare::wait_kvroute_healthy(&stack.envoy, topology.gpus() as u64, &ready).await?;
        Ok(stack)
    }

    /// Every pod: the prefill pods, then the pool's.
    pub fn all_pods(&self) -> Vec<String> {
        self.prefill.iter().chain(&self.pool).cloned().collect()
    }

    pub fn url(&self) -> String {
        self.envoy.url("")
    }
}

/// One row of a scenario: a topology, and for a control row, the kvroute settings it changes.
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    pub topology: Topology,
    /// A control row's name (`tie band 0.2`); `None` for kvroute as configured for every row.
    pub variant: Option<String>,
    /// kvroute configuration fields this row adds (objects merged field by field).
    pub plugin_extra: Value,
}

impl Setup {
    /// `topology` with the benchmark's kvroute settings.
    pub fn plain(topology: Topology) -> Self {
        Self {
            topology,
            variant: None,
            plugin_extra: Value::Null,
        }
    }

    /// The row label: the topology's, plus the variant's name.
    pub fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{} ({v})", self.topology.label()),
            None => self.topology.label(),
        }
    }

    /// The baseline every P/D row is judged against: aggregated, no variant.
    pub fn is_baseline(&self) -> bool {
        self.topology.is_aggregated() && self.variant.is_none()
    }

    /// An aggregated row with other kvroute settings, reported as a second baseline.
    pub fn is_control(&self) -> bool {
        self.topology.is_aggregated() && self.variant.is_some()
    }
}

/// One scenario: a workload, its warm-up and the rows it compares.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    /// `interference` or `agent`; also the output files' stem (`pd-<name>`).
    pub name: String,
    pub spec: WorkloadSpec,
    pub warmup_s: f64,
    pub setups: Vec<Setup>,
}

/// Figures of one run beyond [`RunReport`]'s: per request class, and what finished in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Simulated seconds from the end of the warm-up to the end of the sending window.
    pub window_s: f64,
    /// Requests started after the warm-up that finished successfully within the window.
    pub completed_in_window: usize,
    /// The same per simulated second of the window.
    pub completed_per_s: f64,
    /// Output tokens of those requests per simulated second of the window.
    pub output_tokens_per_s: f64,
    /// TTFT of every successful request.
    pub ttft_ms: Summary,
    /// Inter-token latencies of every successful request, pooled.
    pub itl_ms: Summary,
    /// Interference only: the streaming decodes' inter-token latencies, pooled.
    pub stream_itl_ms: Option<Summary>,
    /// Interference only: the streaming decodes' TTFT.
    pub stream_ttft_ms: Option<Summary>,
    /// Interference only: the long prompts' TTFT.
    pub long_ttft_ms: Option<Summary>,
    /// Interference only: the long prompts' end-to-end latency.
    pub long_e2e_ms: Option<Summary>,
}

impl Figures {
    /// From a report built with `keep_records` (records in simulated seconds, after the warm-up).
    pub fn of(report: &RunReport, spec: &WorkloadSpec, warmup_s: f64) -> Self {
        let window_s = (spec.duration_s - warmup_s).max(0.0);
        let ok: Vec<_> = report.records.iter().filter(|r| r.sent && r.ok).collect();
        let in_window: Vec<_> = ok
            .iter()
            .filter(|r| r.e2e_s.is_some_and(|e| r.start_s + e <= window_s))
            .collect();
        let per_s = |n: f64| if window_s > 0.0 { n / window_s } else { 0.0 };
        let ms = |s: f64| s * 1000.0;
        let ttft = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .filter_map(|r| r.ttft_s)
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let itl = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .flat_map(|r| r.itl_s.iter().copied())
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let e2e = |f: &dyn Fn(&str) -> bool| {
            let v: Vec<f64> = ok
                .iter()
                .filter(|r| f(&r.session))
                .filter_map(|r| r.e2e_s)
                .map(ms)
                .collect();
            Summary::of(&v)
        };
        let all = |_: &str| true;
        let interference = matches!(spec.workload, WorkloadKind::Interference(_));
        let stream = |s: &str| InterferenceParams::is_stream_session(s);
        let long = |s: &str| InterferenceParams::is_long_session(s);
        Figures {
            window_s,
            completed_in_window: in_window.len(),
            completed_per_s: per_s(in_window.len() as f64),
            output_tokens_per_s: per_s(in_window.iter().map(|r| r.output_tokens as f64).sum()),
            ttft_ms: ttft(&all),
            itl_ms: itl(&all),
            stream_itl_ms: interference.then(|| itl(&stream)),
            stream_ttft_ms: interference.then(|| ttft(&stream)),
            long_ttft_ms: interference.then(|| ttft(&long)),
            long_e2e_ms: interference.then(|| e2e(&long)),
        }
    }
}

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
        let mut kvroute_stats: BTreeMap<String, u64> = crate::harness::kvroute_summary(
            &stack.envoy.labelled_stats().await.unwrap_or_default(),
        )
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
    out
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "-".to_owned(),
    }
}

/// Left-aligned first columns, right-aligned numbers, a rule under the head.
fn grid(head: &[&str], body: &[Vec<String>], left: usize) -> String {
    let mut cells: Vec<Vec<String>> = vec![head.iter().map(|s| (*s).to_owned()).collect()];
    cells.extend(body.iter().cloned());
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
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
    out
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
    out.push_str(&grid(&head, &body, 1));
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
    grid(&head, &body, 3)
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
        super::compare::describe(&scenario.spec, scenario.warmup_s)
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

/// `aggregated` pods against `prefill` + `decode` pods, once per P/D mode.
pub fn setups(aggregated: usize, prefill: usize, decode: usize, modes: &[PdMode]) -> Vec<Setup> {
    let mut out = vec![Setup::plain(Topology::Aggregated { pods: aggregated })];
    out.extend(modes.iter().map(|&mode| {
        Setup::plain(Topology::Disaggregated {
            prefill,
            decode,
            mode,
        })
    }));
    out
}

/// The round-robin P/D baselines on `prefill` + `decode` pods: every request split, and only
/// prompts over [`PdSplit::SELECTIVE_THRESHOLD`] words.
pub fn round_robin_baselines(prefill: usize, decode: usize) -> Vec<Setup> {
    [
        PdSplit::Always,
        PdSplit::Selective {
            threshold_tokens: PdSplit::SELECTIVE_THRESHOLD,
        },
    ]
    .into_iter()
    .map(|split| {
        Setup::plain(Topology::RoundRobinPd {
            prefill,
            decode,
            split,
        })
    })
    .collect()
}

/// The agent scenario's control row: the aggregated pods with kvroute's tie band widened from 5% to
/// 20% of the best prediction (more requests decided by rendezvous among near-equal pods). It shows
/// how much the aggregated baseline depends on that one knob.
pub fn wide_tie_band_control(pods: usize) -> Setup {
    Setup {
        topology: Topology::Aggregated { pods },
        variant: Some("tie band 0.2".to_owned()),
        plugin_extra: json!({"prediction": {"tie_band": 0.2}}),
    }
}

/// A spec with the load given and everything else from `WorkloadSpec::new`.
pub fn scenario_spec(
    workload: WorkloadKind,
    load: Load,
    duration_s: f64,
    seed: u64,
) -> WorkloadSpec {
    let mut spec = WorkloadSpec::new(workload, load);
    spec.duration_s = duration_s;
    spec.seed = seed;
    spec
}

/// Engine settings of every pod of every topology in `make bench-pd`: chunked prefill on with a
/// 2,048-token budget per step (vLLM V1's default for its OpenAI server on GPUs under 70 GB and on
/// A100s; 8,192 on H100-class GPUs), so a long prefill runs as ~0.9 s chunks that the running decodes
/// of its pod ride along with; and 32,768 KV blocks of 16 tokens (524,288 tokens, eight times
/// kvsim's default; an 80 GB GPU's KV space for an 8B model), so that in every topology the agent
/// scenario's 24 sessions (~9,000 tokens each on average) fit both in the prefix caches and,
/// running, in the KV memory of the single decode pod of 2P+1D. With 8,192 blocks they did not: the decode pod
/// found 31% of its prompt tokens cached (83% with 32,768) and P/D completed 10–20% fewer requests
/// than aggregated (about as many with 32,768), a result about memory sizing, not disaggregation.
/// Everything else is kvsim's latency model as it is (40 ms + 0.4 ms per prefilled token per step,
/// 15 ms + 0.5 ms per decoding sequence per step, 20 µs per token of KV pulled by a decode pod,
/// `max_num_seqs` 32).
pub const DEFAULT_SIM_ARGS: &str = "--chunked-prefill-tokens 2048 --num-gpu-blocks 32768";
/// Interference: arrivals per simulated second (streams 2/s, long prompts 0.5/s with the default
/// 20% share of [`InterferenceParams`]): about 36 streams running (9 per aggregated pod, 18 per decode pod), and long prompts
/// keeping the aggregated pods ~45% busy prefilling, so that more than 1% of the streams' tokens
/// come out of a step that also ran a prefill chunk.
pub const INTERFERENCE_RATE: f64 = 2.5;
/// Interference: simulated seconds of arrivals (~105 long prompts and ~420 streams measured).
pub const INTERFERENCE_DURATION: f64 = 240.0;
/// Interference: the first stream lifetimes, while the number of running streams ramps up.
pub const INTERFERENCE_WARMUP: f64 = 30.0;
/// Agent: sessions in progress at once (one per closed-loop client).
pub const AGENT_SESSIONS: usize = 24;
/// Agent: 24 requests in flight, where 3 aggregated pods are saturated (their throughput no longer
/// grows with more in flight).
pub const AGENT_LOAD: Load = Load::Closed { concurrency: 24 };
pub const AGENT_DURATION: f64 = 300.0;
/// Agent: the cold start (every session's first, uncached prompt) is not measured.
pub const AGENT_WARMUP: f64 = 60.0;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::driver::RequestRecord;

    fn record(
        session: &str,
        start_s: f64,
        ttft_s: f64,
        itl_s: &[f64],
        e2e_s: f64,
    ) -> RequestRecord {
        RequestRecord {
            session: session.to_owned(),
            start_s,
            ttft_s: Some(ttft_s),
            itl_s: itl_s.to_vec(),
            e2e_s: Some(e2e_s),
            output_tokens: itl_s.len() as u64 + 1,
            status: Some(200),
            ok: true,
            sent: true,
            ..RequestRecord::default()
        }
    }

    fn interference_spec() -> WorkloadSpec {
        let mut spec = scenario_spec(
            WorkloadKind::Interference(InterferenceParams::default()),
            Load::Open { rate: 1.0 },
            100.0,
            1,
        );
        spec.keep_records = true;
        spec
    }

    fn row(setup: Setup, records: &[RequestRecord]) -> PdRow {
        let spec = interference_spec();
        let report = RunReport::build(&spec, 1.0, 100.0, records, Vec::new());
        PdRow {
            label: setup.label(),
            figures: Figures::of(&report, &spec, 20.0),
            setup,
            kvroute_stats: BTreeMap::new(),
            pod_counters: BTreeMap::new(),
            report,
        }
    }

    #[test]
    fn figures_split_streams_from_long_prompts_and_count_the_window() {
        let records = [
            record("stream-0", 0.0, 0.2, &[0.02, 0.9, 0.02], 1.0),
            record("stream-3", 70.0, 0.3, &[0.03], 20.0),
            record("long-1", 5.0, 4.0, &[0.02], 4.1),
            RequestRecord {
                ok: false,
                ..record("long-2", 1.0, 9.0, &[], 9.0)
            },
        ];
        let r = row(Setup::plain(Topology::Aggregated { pods: 4 }), &records);
        let f = &r.figures;
        assert_eq!(f.window_s, 80.0);
        // stream-3 ends at 90 s, after the 80 s window; the failed request never counts.
        assert_eq!(f.completed_in_window, 2);
        let s = f.stream_itl_ms.unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.p50, Some(25.0));
        assert_eq!(f.long_ttft_ms.unwrap().count, 1);
        assert_eq!(f.long_ttft_ms.unwrap().p50, Some(4000.0));
        assert_eq!(f.stream_ttft_ms.unwrap().count, 2);
        assert_eq!(f.ttft_ms.count, 3);
    }

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
}
