//! The policy comparison behind `kvbench compare` (and the stacks `kvbench demo` / `up` run): for
//! each load-balancing policy, fresh simulated pods and a fresh Envoy, the same seeded workload
//! through it, then one table and kvroute's ratios against round-robin.
//!
//! Every policy gets new pods so that no run inherits another's warm prefix caches, and the same
//! [`WorkloadSpec`] (same seed) so that every run offers identical traffic. Fresh pods start with
//! empty caches, and that cold start (every tenant's first prefill, arriving at once) is an overload
//! burst whose length varies from run to run; so a comparison can leave the first `warmup` seconds
//! out of the figures: those requests are sent like the others, but latencies count only for requests
//! started after it, and the pods' counters are read at that moment instead of before the run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::{
    driver, metrics, render_json, render_table, run, Load, RunReport, WorkloadKind, WorkloadSpec,
};
use crate::harness::{self, plugin_config, Envoy, EnvoyOptions, Lb, Sim};

/// How Envoy chooses a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The kvroute plugin picks the pod (`override_host`, round-robin fallback).
    Kvroute,
    /// Envoy's own round-robin, no plugin.
    RoundRobin,
    /// Envoy's own least-request (power of two choices), no plugin.
    LeastRequest,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Kvroute, Policy::RoundRobin, Policy::LeastRequest];

    /// The row label: `kvroute`, `round-robin`, `least-request`.
    pub fn label(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute",
            Policy::RoundRobin => "round-robin",
            Policy::LeastRequest => "least-request",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Policy::ALL
            .into_iter()
            .find(|p| p.label() == name)
            .ok_or_else(|| anyhow!("unknown policy {name:?} (kvroute, round-robin, least-request)"))
    }

    pub fn lb(self) -> Lb {
        match self {
            Policy::Kvroute => Lb::OverrideHost,
            Policy::RoundRobin => Lb::RoundRobin,
            Policy::LeastRequest => Lb::LeastRequest,
        }
    }
}

/// The plugin settings of a benchmark run: polling fast enough for a 20× simulator, no debug header.
pub fn bench_plugin_extra() -> Value {
    json!({"poll_interval_ms": 100, "stale_after_ms": 1000, "debug_header": false})
}

/// How a [`Stack`] is started.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Pods to simulate (ignored when endpoints are given).
    pub pods: usize,
    /// Extra `kvsim` arguments (`--time-scale` is added from `time_scale`).
    pub sim_args: Vec<String>,
    pub time_scale: f64,
    /// Merged into the test-speed plugin configuration ([`plugin_config`]) for kvroute.
    pub plugin_extra: Value,
    /// Envoy worker threads.
    pub workers: usize,
    /// Inference listener port (0 = OS-chosen).
    pub listen_port: u16,
    /// Admin port (0 = OS-chosen).
    pub admin_port: u16,
    /// How long to wait for kvroute to see every pod healthy.
    pub ready_timeout: Duration,
    /// With kvroute, fail when the pods are not all healthy by then (else only warn).
    pub require_healthy: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            pods: 4,
            sim_args: Vec::new(),
            time_scale: 1.0,
            plugin_extra: bench_plugin_extra(),
            workers: 2,
            listen_port: 0,
            admin_port: 0,
            ready_timeout: Duration::from_secs(30),
            require_healthy: true,
        }
    }
}

/// Envoy with one policy in front of pods, and the simulator process if the pods are simulated.
/// Dropping it kills Envoy, then the simulator.
pub struct Stack {
    pub envoy: Envoy,
    pub sim: Option<Sim>,
    /// `ip:port` of each pod.
    pub pods: Vec<String>,
    pub policy: Policy,
    /// Pods kvroute reported healthy when the stack became ready (kvroute only).
    pub healthy: Option<u64>,
}

impl Stack {
    /// Starts `opts.pods` fresh simulated pods and Envoy with `policy` in front of them.
    pub async fn start_simulated(policy: Policy, opts: &StackOptions) -> Result<Stack> {
        anyhow::ensure!(opts.pods >= 1, "need at least one pod");
        // Fail on a missing Envoy or plugin before starting anything.
        check_envoy_installed()?;
        if policy == Policy::Kvroute {
            harness::wasm_path()?;
        }
        let scale = opts.time_scale.to_string();
        let mut args: Vec<&str> = vec!["--time-scale", &scale];
        args.extend(opts.sim_args.iter().map(String::as_str));
        let sim = Sim::start(opts.pods, &args).context("starting the simulated pods (kvsim)")?;
        let pods = sim.pods.clone();
        Self::start(policy, pods, Some(sim), opts).await
    }

    /// Starts Envoy with `policy` in front of `pods` (which `sim` serves, if given) and waits until
    /// it is ready: listening, and with kvroute, every pod seen healthy.
    pub async fn start(
        policy: Policy,
        pods: Vec<String>,
        sim: Option<Sim>,
        opts: &StackOptions,
    ) -> Result<Stack> {
        check_envoy_installed()?;
        let plugin =
            (policy == Policy::Kvroute).then(|| plugin_config(&pods, opts.plugin_extra.clone()));
        if plugin.is_some() {
            harness::wasm_path()?;
        }
        let mut eo = EnvoyOptions::new(&pods, policy.lb(), plugin);
        eo.concurrency = opts.workers;
        eo.listen_port = opts.listen_port;
        eo.admin_port = opts.admin_port;
        let envoy = Envoy::start(&eo)
            .await
            .with_context(|| format!("starting Envoy with {}", policy.label()))?;
        let mut stack = Stack {
            envoy,
            sim,
            pods,
            policy,
            healthy: None,
        };
        if policy == Policy::Kvroute {
            stack.healthy = Some(stack.wait_healthy(opts).await?);
        }
        Ok(stack)
    }

    /// Waits until kvroute reports every pod healthy; returns the last count seen.
    async fn wait_healthy(&self, opts: &StackOptions) -> Result<u64> {
        wait_kvroute_healthy(&self.envoy, self.pods.len() as u64, opts).await
    }

    /// Base URL of the inference listener.
    pub fn url(&self) -> String {
        self.envoy.url("")
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.envoy.admin)
    }
}

/// Waits until kvroute in `envoy` reports `want` pods healthy (every pool's pods count); returns the
/// last count seen. Past `opts.ready_timeout` it fails if `opts.require_healthy`, else returns.
pub async fn wait_kvroute_healthy(envoy: &Envoy, want: u64, opts: &StackOptions) -> Result<u64> {
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let n = envoy.stat("wasmcustom.kvroute.pods_healthy").await;
        if n == want {
            return Ok(n);
        }
        if Instant::now() > deadline {
            if opts.require_healthy {
                bail!(
                    "kvroute saw {n} of {want} pods healthy after {:?}; Envoy log:\n{}",
                    opts.ready_timeout,
                    log_tail(envoy, 30)
                );
            }
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails early, with the fix, when Envoy is missing.
pub fn check_envoy_installed() -> Result<()> {
    let bin = harness::envoy_bin().context("Envoy not installed: run `make tools`")?;
    if !bin.exists() {
        bail!(
            "Envoy not installed ({} missing): run `make tools`",
            bin.display()
        );
    }
    Ok(())
}

/// The last `n` lines of Envoy's log.
pub fn log_tail(envoy: &Envoy, n: usize) -> String {
    let log = envoy.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Wall-clock budget of one metrics scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`run`], except that requests started in the first `warmup_s` simulated seconds are left out of
/// the report and the pods' counters are read at `warmup_s` rather than before the run. With
/// `warmup_s` = 0 it is [`run`].
pub async fn run_after_warmup(
    target: &str,
    pods: &[String],
    spec: &WorkloadSpec,
    time_scale: f64,
    warmup_s: f64,
) -> Result<RunReport> {
    anyhow::ensure!(
        warmup_s.is_finite() && warmup_s >= 0.0,
        "warm-up must be >= 0"
    );
    if warmup_s == 0.0 {
        return run(target, pods, spec, time_scale).await;
    }
    anyhow::ensure!(
        warmup_s < spec.duration_s,
        "warm-up ({warmup_s} s) must be shorter than the duration ({} s)",
        spec.duration_s
    );
    spec.validate()?;
    let cut = warmup_s * time_scale;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let scrape = {
        let (client, pods) = (client.clone(), pods.to_vec());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(cut)).await;
            metrics::scrape_all(&client, &pods, SCRAPE_TIMEOUT).await
        })
    };
    let out = driver::drive(target, spec, time_scale).await?;
    let before = scrape.await.context("the warm-up scrape task failed")?;
    let after = metrics::scrape_all(&client, pods, SCRAPE_TIMEOUT).await;
    let records: Vec<driver::RequestRecord> = out
        .records
        .into_iter()
        .filter(|r| r.start_s >= cut)
        .map(|mut r| {
            r.start_s -= cut;
            r
        })
        .collect();
    let wall = (out.wall.as_secs_f64() - cut).max(0.0);
    Ok(RunReport::build(
        spec,
        time_scale,
        wall,
        &records,
        metrics::deltas(pods, before, after),
    ))
}

/// Runs `spec` once per policy, each on fresh pods and a fresh Envoy, and returns the labelled
/// reports in policy order; the first `warmup_s` simulated seconds are not measured (see
/// [`run_after_warmup`]). Progress goes to stderr.
pub async fn compare(
    policies: &[Policy],
    spec: &WorkloadSpec,
    opts: &StackOptions,
    warmup_s: f64,
) -> Result<Vec<(String, RunReport)>> {
    spec.validate()?;
    let mut rows = Vec::with_capacity(policies.len());
    for (i, &policy) in policies.iter().enumerate() {
        let t0 = Instant::now();
        eprintln!(
            "[{}/{}] {} — {}: starting {} pods and Envoy ({} workers)…",
            i + 1,
            policies.len(),
            spec.workload.name(),
            policy.label(),
            opts.pods,
            opts.workers
        );
        let stack = Stack::start_simulated(policy, opts).await?;
        eprintln!(
            "[{}/{}] {} — {}: ready in {:.1} s; sending for {} s simulated ({:.1} s wall) and draining…",
            i + 1,
            policies.len(),
            spec.workload.name(),
            policy.label(),
            t0.elapsed().as_secs_f64(),
            spec.duration_s,
            spec.duration_s * opts.time_scale
        );
        let report = run_after_warmup(&stack.url(), &stack.pods, spec, opts.time_scale, warmup_s)
            .await
            .with_context(|| format!("running {} with {}", spec.workload.name(), policy.label()))?;
        drop(stack);
        eprintln!(
            "[{}/{}] {} — {}: {} requests measured, {} ok, {:.1} s wall in all",
            i + 1,
            policies.len(),
            spec.workload.name(),
            policy.label(),
            report.requests,
            report.ok,
            t0.elapsed().as_secs_f64()
        );
        rows.push((policy.label().to_owned(), report));
    }
    Ok(rows)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), f)
}

/// A number without trailing zeros (at most three decimals).
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn fmt_ratio(v: Option<f64>) -> String {
    fmt_opt(v, |x| format!("{x:.2}"))
}

fn fmt_pct(v: Option<f64>) -> String {
    fmt_opt(v, |x| format!("{:.1}%", x * 100.0))
}

/// kvroute against round-robin: p90 TTFT, cache-hit ratio, throughput and success, each as both
/// values and their ratio (kvroute / round-robin). Empty when either run is missing.
pub fn render_ratios(rows: &[(String, RunReport)]) -> String {
    let find = |p: Policy| rows.iter().find(|(l, _)| l == p.label()).map(|(_, r)| r);
    let (Some(kv), Some(rr)) = (find(Policy::Kvroute), find(Policy::RoundRobin)) else {
        return String::new();
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvroute vs round-robin ({}, {}; ratio = kvroute / round-robin):",
        kv.workload, kv.load
    );
    let ms = |v: Option<f64>| fmt_opt(v, |x| format!("{x:.0} ms"));
    let p90 = ratio(kv.ttft_ms.p90, rr.ttft_ms.p90);
    let faster = p90
        .filter(|&r| r > 0.0)
        .map(|r| format!(" ({:.1}× lower)", 1.0 / r))
        .filter(|_| p90.is_some_and(|r| r < 1.0))
        .unwrap_or_default();
    let lines = [
        (
            "p90 TTFT",
            format!("{} vs {}", ms(kv.ttft_ms.p90), ms(rr.ttft_ms.p90)),
            format!("{}{faster}", fmt_ratio(p90)),
        ),
        (
            "cache-hit ratio",
            format!(
                "{} vs {}",
                fmt_pct(kv.cache_hit_ratio),
                fmt_pct(rr.cache_hit_ratio)
            ),
            fmt_ratio(ratio(kv.cache_hit_ratio, rr.cache_hit_ratio)),
        ),
        (
            "throughput",
            format!(
                "{:.1} vs {:.1} output tok/s ({:.2} vs {:.2} req/s)",
                kv.output_tokens_per_s,
                rr.output_tokens_per_s,
                kv.requests_per_s,
                rr.requests_per_s
            ),
            fmt_ratio(ratio(
                Some(kv.output_tokens_per_s),
                Some(rr.output_tokens_per_s),
            )),
        ),
        (
            "success rate",
            format!(
                "{} vs {} ({}/{} vs {}/{})",
                fmt_pct(kv.success_rate),
                fmt_pct(rr.success_rate),
                kv.ok,
                kv.requests,
                rr.ok,
                rr.requests
            ),
            fmt_ratio(ratio(kv.success_rate, rr.success_rate)),
        ),
    ];
    let w = lines.iter().map(|l| l.1.chars().count()).max().unwrap_or(0);
    for (name, values, r) in lines {
        let _ = writeln!(out, "  {name:<15}  {values:<w$}  ratio {r}");
    }
    out
}

/// One line saying what was run: the workload's shape, the load, the seed, the warm-up.
pub fn describe(spec: &WorkloadSpec, warmup_s: f64) -> String {
    let shape = match &spec.workload {
        WorkloadKind::MultiTenant(p) => format!(
            "{} tenants × {}-word system prompts, questions of {}–{} words, {}–{} output tokens{}",
            p.tenants,
            p.system_words,
            p.question_words.0,
            p.question_words.1,
            p.max_tokens.0,
            p.max_tokens.1,
            if p.zipf_s > 0.0 {
                format!(", Zipf {}", p.zipf_s)
            } else {
                String::new()
            }
        ),
        WorkloadKind::MultiTurn(p) => format!(
            "{} conversations × {} turns, {}-word system prompts, {}–{} output tokens",
            p.conversations, p.turns, p.system_words, p.max_tokens.0, p.max_tokens.1
        ),
        WorkloadKind::Agent(p) => format!(
            "{} sessions × {} steps, {}-word shared preamble + {}-word contexts, {}–{} output tokens",
            p.sessions,
            p.steps,
            p.preamble_words,
            p.context_words,
            p.max_tokens.0,
            p.max_tokens.1
        ),
        WorkloadKind::Interference(p) => {
            let split = match spec.load {
                Load::Open { rate } => format!(
                    " (streams at {}/s, long prompts at {}/s)",
                    trim(rate * (1.0 - p.long_share)),
                    trim(rate * p.long_share)
                ),
                Load::Closed { .. } => String::new(),
            };
            format!(
                "streaming decodes of {}–{}-word prompts and {}–{} output tokens, {:.0}% of arrivals \
                 long uncached prompts of {}–{} words and {}–{} output tokens{split}",
                p.stream_prompt_words.0,
                p.stream_prompt_words.1,
                p.stream_max_tokens.0,
                p.stream_max_tokens.1,
                p.long_share * 100.0,
                p.long_prompt_words.0,
                p.long_prompt_words.1,
                p.long_max_tokens.0,
                p.long_max_tokens.1
            )
        }
    };
    let load = match spec.load {
        Load::Open { rate } => format!("open loop at {rate}/s"),
        Load::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
    };
    let warmup = if warmup_s > 0.0 {
        format!(", the first {warmup_s} s not measured")
    } else {
        String::new()
    };
    format!(
        "{}: {shape}; {load} for {} s (simulated){warmup}; seed {}",
        spec.workload.name(),
        spec.duration_s,
        spec.seed
    )
}

/// The full text of one comparison: what was run, the table, then the ratios.
pub fn render_text(rows: &[(String, RunReport)], warmup_s: f64) -> String {
    let mut text = rows
        .first()
        .map(|(_, r)| describe(&r.spec, warmup_s) + "\n")
        .unwrap_or_default();
    text.push_str(&render_table(rows));
    let ratios = render_ratios(rows);
    if !ratios.is_empty() {
        text.push('\n');
        text.push_str(&ratios);
    }
    text
}

/// Writes `DIR/<workload>.json` (the reports, each with its `warmup_s`) and `DIR/<workload>.txt`
/// (the text of [`render_text`]).
pub fn write_outputs(
    dir: &Path,
    workload: &str,
    rows: &[(String, RunReport)],
    warmup_s: f64,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join(format!("{workload}.json"));
    let mut reports = render_json(rows);
    if let Value::Array(items) = &mut reports {
        for item in items {
            if let Value::Object(map) = item {
                map.insert("warmup_s".to_owned(), json!(warmup_s));
            }
        }
    }
    let json = serde_json::to_string_pretty(&reports)?;
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join(format!("{workload}.txt"));
    std::fs::write(&txt_path, render_text(rows, warmup_s))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    Ok(())
}
