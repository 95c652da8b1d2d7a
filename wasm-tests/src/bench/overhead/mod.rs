//! The filter-cost benchmark behind `kvbench overhead` (`make bench-overhead`): what kvroute adds to
//! a request, measured as DESIGN §7 asks, Envoy with kvroute against Envoy without it, in one run.
//!
//! One set of simulated pods answers at once (every kvsim latency parameter 0, so the engine never
//! sleeps), and two Envoys started by the harness sit in front of the same pods with the same
//! workers, the same pool cluster (`override_host`, round-robin fallback) and the same listener,
//! except that one runs the kvroute HTTP filter (chars mode, default configuration otherwise) and
//! the other does not. Both receive the same sequence of chat completions (16 KB prompt,
//! `max_tokens` 1, non-streaming), one request at a time over one persistent connection per Envoy,
//! alternating between the two Envoys and swapping which goes first on every pair, so that drift
//! and noise on the machine hit both arms alike. Two prompt kinds: `repeat` (one system prompt for the whole run plus a short varying
//! question: kvroute finds a prefix hit) and `fresh` (a new prompt per request: kvroute's index
//! grows to its bounds). The figures are client-side wall-clock latencies, not simulated time: the
//! difference of the two arms' medians is kvroute's cost per request, given with a bootstrap 95%
//! interval over the paired samples. Each Envoy's CPU time over the measured requests (every thread,
//! from `/proc`, so kvroute's leader work on another thread counts too) gives a second figure: CPU
//! per request. An optional closed-loop phase gives requests per second, and each
//! Envoy's `/stats` memory figures (plus the process's RSS) taken at the start and at the end give
//! kvroute's memory across its VMs.
//!
//! The files follow the run. `options` says what is run; `prompts` makes the seeded request
//! bodies; `conn` sends one of them over one persistent connection and times it; `phases` runs
//! the measured phases on the two Envoys (paired requests, closed-loop throughput, idle CPU);
//! `process` reads what `/proc` and Envoy's `/stats` say about each Envoy process (RSS, per-thread
//! CPU, memory); `statistics` holds the paired median difference and its bootstrap interval;
//! `report` is the report's shape and `render` its text and files. [`run`] below starts the
//! pods and both Envoys and calls the phases in order.

mod conn;
mod options;
mod phases;
mod process;
mod prompts;
mod render;
mod report;
mod statistics;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::Value;

use super::compare::{check_envoy_installed, wait_kvroute_healthy, StackOptions};
use crate::harness::{self, Envoy, EnvoyOptions, Lb, Sim};
use conn::Conn;
use phases::{idle_cpu, measure_kind, throughput, Arms};
use prompts::Prompts;

pub use options::{OverheadOptions, PromptKind, DEFAULT_SIM_ARGS};
pub use process::{MemoryDiff, MemoryFigures};
pub use render::{render_text, write_outputs};
pub use report::{ArmReport, IdleCpu, KindReport, MemoryReport, OverheadReport, ThroughputReport};
pub use statistics::median_difference;

/// Label of the arm with the filter.
pub const KVROUTE: &str = "kvroute";
/// Label of the arm without it.
pub const PLAIN: &str = "plain";

async fn envoy_version(envoy: &Envoy) -> Option<String> {
    let v: Value = reqwest::get(format!("http://{}/server_info", envoy.admin))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let full = v.get("version")?.as_str()?;
    // `<sha>/<version>/<status>/<build type>/<ssl>`
    Some(full.split('/').nth(1).unwrap_or(full).to_owned())
}

/// Runs the whole benchmark. Progress goes to stderr.
pub async fn run(opts: &OverheadOptions) -> Result<OverheadReport> {
    opts.validate()?;
    check_envoy_installed()?;
    harness::wasm_path()?;
    let t0 = Instant::now();
    let scale = opts.time_scale.to_string();
    let mut sim_args: Vec<&str> = vec!["--time-scale", &scale];
    sim_args.extend(opts.sim_args.iter().map(String::as_str));
    eprintln!(
        "overhead: starting {} pods (kvsim {}) and two Envoys ({} workers each)…",
        opts.pods,
        sim_args.join(" "),
        opts.workers
    );
    let sim = Sim::start(opts.pods, &sim_args).context("starting the simulated pods (kvsim)")?;
    let pods = sim.pods.clone();
    let plugin_config = opts.plugin_config(&pods);
    let start_envoy = |plugin: Option<String>| {
        let mut eo = EnvoyOptions::new(&pods, Lb::OverrideHost, plugin);
        eo.concurrency = opts.workers;
        eo
    };
    let kvroute = Envoy::start(&start_envoy(Some(plugin_config.clone())))
        .await
        .context("starting Envoy with kvroute")?;
    let plain = Envoy::start(&start_envoy(None))
        .await
        .context("starting Envoy without kvroute")?;
    wait_kvroute_healthy(&kvroute, pods.len() as u64, &StackOptions::default()).await?;
    let mut arms = Arms {
        kvroute_conn: Conn::new(&kvroute.listener),
        plain_conn: Conn::new(&plain.listener),
        kvroute,
        plain,
    };
    let envoy_version = envoy_version(&arms.plain).await;
    let kvroute_start = MemoryFigures::read(&arms.kvroute).await?;
    let plain_start = MemoryFigures::read(&arms.plain).await?;
    let prompts = Prompts::new(opts.seed, opts.prompt_bytes);
    let idle_cpu = if opts.idle_s > 0.0 {
        eprintln!(
            "overhead: {} s without requests (background CPU)…",
            opts.idle_s
        );
        Some(idle_cpu(&arms, opts.idle_s).await)
    } else {
        None
    };

    let mut kinds = Vec::new();
    for &kind in &opts.kinds {
        eprintln!(
            "overhead: {}: {} warm-up + {} measured pairs, one request at a time…",
            kind.name(),
            opts.warmup,
            opts.requests
        );
        let k0 = Instant::now();
        let report = measure_kind(&mut arms, &prompts, kind, opts).await?;
        eprintln!(
            "overhead: {}: done in {:.1} s",
            kind.name(),
            k0.elapsed().as_secs_f64()
        );
        kinds.push(report);
    }
    let throughput = if opts.throughput_requests > 0 {
        eprintln!(
            "overhead: throughput: {} requests per arm, {} in flight…",
            opts.throughput_requests, opts.concurrency
        );
        Some(throughput(&arms, &prompts, opts).await)
    } else {
        None
    };

    let kvroute_end = MemoryFigures::read(&arms.kvroute).await?;
    let plain_end = MemoryFigures::read(&arms.plain).await?;
    let kv_stats = arms.kvroute.stats().await?;
    let plain_stats = arms.plain.stats().await?;
    let per_worker = |stats: &HashMap<String, u64>| -> BTreeMap<String, u64> {
        stats
            .iter()
            .filter(|(k, _)| k.starts_with("listener.") && k.ends_with(".downstream_cx_total"))
            .filter_map(|(k, v)| {
                let worker = k.split('.').find(|p| p.starts_with("worker_"))?;
                Some((worker.to_owned(), *v))
            })
            .collect()
    };
    let connections = BTreeMap::from([
        (KVROUTE.to_owned(), per_worker(&kv_stats)),
        (PLAIN.to_owned(), per_worker(&plain_stats)),
    ]);
    let memory = MemoryReport {
        workers: opts.workers,
        kvroute_vms: kv_stats.get("wasm.wasm_vm_count").copied().unwrap_or(0),
        plain_vms: plain_stats.get("wasm.wasm_vm_count").copied().unwrap_or(0),
        diff_start: MemoryDiff::of(&kvroute_start, &plain_start),
        diff_end: MemoryDiff::of(&kvroute_end, &plain_end),
        kvroute_start,
        plain_start,
        kvroute_end,
        plain_end,
        index_entries: kv_stats
            .get("wasmcustom.kvroute.index_entries")
            .copied()
            .unwrap_or(0),
    };
    drop(arms);
    drop(sim);
    Ok(OverheadReport {
        wall_clock: true,
        envoy_version,
        options: opts.clone(),
        plugin_config,
        pods,
        kinds,
        throughput,
        idle_cpu,
        connections,
        memory,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}
