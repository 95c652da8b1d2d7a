//! The filter-cost benchmark behind `kvbench overhead` (`make bench-overhead`): what kvroute adds to
//! a request, measured as DESIGN §7 asks, Envoy with kvroute against Envoy without it, in one run.
//!
//! One set of simulated pods answers at once (every kvsim latency parameter 0, so the engine never
//! sleeps), and two Envoys started by the harness sit in front of the same pods with the same
//! workers, the same pool cluster (`override_host`, round-robin fallback) and the same listener,
//! except that one runs the kvroute HTTP filter and the other does not. The run is a sweep: one
//! section per block scheme (chars, tiktoken), each with its own pods and pair of Envoys; in each,
//! for every prompt size (256 B, 16 KB, 256 KB by default) and prompt kind, a cell of paired
//! requests: chat completions (`max_tokens` 1, non-streaming), one request at a time over one
//! persistent connection per Envoy, alternating between the two Envoys and swapping which goes
//! first on every pair, so that drift and noise on the machine hit both arms alike. Two prompt
//! kinds: `repeat` (one system prompt for the whole size plus a short varying question: kvroute
//! finds a prefix hit) and `fresh` (a new prompt per request: kvroute's index grows to its
//! bounds). A cell stops at its pair count or its time limit, whichever comes first, so a 256 KB
//! prompt in tiktoken mode keeps the run bounded. The figures are client-side wall-clock
//! latencies, not simulated time: the difference of the two arms' medians is kvroute's cost per
//! request, given with a bootstrap 95% interval over the paired samples; kvroute's own timing of
//! its body phase (its `decision_microseconds` histogram) splits that cost in two. Each Envoy's
//! CPU time over the measured requests (every thread, from `/proc`, so kvroute's leader work on
//! another thread counts too) gives CPU per request. The throughput phase (per size, in the
//! sections that have it) loads each Envoy in turn with many connections for a fixed time, in
//! rounds, and gives requests per second and per Envoy CPU-second with their spread. Each Envoy's
//! `/stats` memory figures and RSS at the start of a section (at rest) and at its end (index full)
//! give kvroute's memory per VM.
//!
//! The files follow the run. `options` says what is run; `prompts` makes the seeded request
//! bodies; `conn` sends one of them over one persistent connection and times it; `phases` runs
//! the measured phases on the two Envoys (paired requests, fixed-time throughput, idle CPU);
//! `process` reads what `/proc` and Envoy's `/stats` say about each process (RSS, per-thread CPU,
//! memory); `decision` reads kvroute's body-phase histogram; `statistics` holds the paired median
//! difference and its bootstrap interval; `report` is the report's shape, `summary` its flat rows
//! and the targets, and `render` its text and files. [`run`] below starts the pods and both
//! Envoys of each section and calls the phases in order.
//!
//! After the sections, the queue phase (`held`): what flow control's queue path adds to a request
//! it holds and releases, beyond the wait for room.
//!
//! The first section also runs the hop phase (`hops`, rows and targets in `hop_summary`): what
//! each way of reaching the same pods adds over calling a pod directly, plain Envoy, Envoy with
//! kvroute and each peer router asked for (sglang-router, smg, vllm-router: `--peers`), sequential
//! latency and requests per CPU-second of the hop's processes under load, over several runs.
//!
//! This is one of the filter's cost instruments (`make bench-cost WHAT=overhead`); the others
//! (each callback's time, polling a large pool, the CPU split by kind of code, the core natively)
//! and the question each answers are listed in `docs/cost-instruments.md`.

mod chart;
mod conn;
mod decision;
mod held;
mod hop_summary;
mod hops;
mod options;
mod phases;
mod process;
mod prompts;
mod render;
mod report;
mod statistics;
mod summary;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::compare::{check_envoy_installed, wait_kvroute_healthy, StackOptions};
use conn::Conn;
use harness::{self, Envoy, EnvoyOptions, Lb, Sim};
use phases::{idle_cpu, measure_kind, throughput, Arms};
use prompts::Prompts;

pub use decision::DecisionSummary;
pub use hop_summary::{hop_rows, hop_targets, is_peer, HopRow};
pub use hops::{HopArm, HopReport, HopRun, DIRECT};
pub use options::{BlockMode, OverheadOptions, PromptKind, DEFAULT_SIM_ARGS, MAX_PROMPT_BYTES};
pub use process::{MemoryDiff, MemoryFigures};
pub use render::{render_text, write_outputs};
pub use report::{
    ArmReport, IdleCpu, KindReport, LoadArm, LoadRound, MemoryReport, OverheadReport,
    SectionReport, Spread, ThroughputReport,
};
pub use statistics::median_difference;
pub use summary::{
    LatencyRow, MemoryRow, SummaryTables, TargetCheck, ThroughputRow, ADDED_P50_LIMIT_US,
    TARGET_PROMPT_BYTES, THROUGHPUT_RATIO_MIN,
};

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

/// Envoy's own whole-body buffer filter, for the ablation that buffers in the plain arm too.
fn buffer_filter() -> Value {
    json!({"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": 16_777_216}})
}

/// Starts one Envoy of a pair: the harness's configuration, with stats flushed every half second (so
/// kvroute's histogram can be read per cell; both Envoys alike) and, in the buffering ablation,
/// Envoy's buffer filter in front of the router.
async fn start_envoy(
    opts: &OverheadOptions,
    pods: &[String],
    plugin: Option<String>,
    buffer: bool,
) -> Result<Envoy> {
    let mut eo = EnvoyOptions::new(pods, Lb::OverrideHost, plugin);
    eo.concurrency = opts.workers;
    let wasm = if eo.plugin_config.is_some() {
        harness::wasm_path()?
    } else {
        PathBuf::new()
    };
    let mut config = harness::envoy_config(&eo, &wasm, 0);
    config["stats_flush_interval"] =
        json!(format!("{:.3}s", decision::FLUSH_INTERVAL.as_secs_f64()));
    if buffer {
        let filters = config
            .pointer_mut(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )
            .and_then(Value::as_array_mut)
            .context("the harness's listener has no http_filters")?;
        filters.insert(0, buffer_filter());
    }
    Envoy::start_with_config(&config.to_string(), eo.concurrency).await
}

/// Client connections an Envoy accepted, per worker.
fn connections_per_worker(stats: &HashMap<String, u64>) -> BTreeMap<String, u64> {
    stats
        .iter()
        .filter(|(k, _)| k.starts_with("listener.") && k.ends_with(".downstream_cx_total"))
        .filter_map(|(k, v)| {
            let worker = k.split('.').find(|p| p.starts_with("worker_"))?;
            Some((worker.to_owned(), *v))
        })
        .collect()
}

/// One block scheme's section: its pods and pair of Envoys, every cell, the throughput phase.
async fn run_section(
    opts: &OverheadOptions,
    mode: BlockMode,
    with_hops: bool,
    envoy_version: &mut Option<String>,
) -> Result<SectionReport> {
    let t0 = Instant::now();
    let scale = opts.time_scale.to_string();
    let mut sim_args: Vec<&str> = vec!["--time-scale", &scale];
    sim_args.extend(opts.sim_args.iter().map(String::as_str));
    eprintln!(
        "overhead: {}: starting {} pods (kvsim {}) and two Envoys ({} workers each)…",
        mode.name(),
        opts.pods,
        sim_args.join(" "),
        opts.workers
    );
    let sim = Sim::start(opts.pods, &sim_args).context("starting the simulated pods (kvsim)")?;
    let pods = sim.pods.clone();
    let plugin_config = opts.plugin_config(&pods, mode);
    let kvroute = start_envoy(opts, &pods, Some(plugin_config.clone()), false)
        .await
        .with_context(|| format!("starting Envoy with kvroute ({} mode)", mode.name()))?;
    let plain = start_envoy(opts, &pods, None, opts.plain_buffer)
        .await
        .context("starting Envoy without kvroute")?;
    if options::routes(&plugin_config) {
        wait_kvroute_healthy(&kvroute, pods.len() as u64, &StackOptions::default()).await?;
    }
    let mut arms = Arms {
        kvroute_conn: Conn::new(&kvroute.listener),
        plain_conn: Conn::new(&plain.listener),
        sim_pid: sim.proc.pid(),
        kvroute,
        plain,
    };
    if envoy_version.is_none() {
        *envoy_version = self::envoy_version(&arms.plain).await;
    }
    let kvroute_start = MemoryFigures::read(&arms.kvroute).await?;
    let plain_start = MemoryFigures::read(&arms.plain).await?;
    let idle_cpu = if opts.idle_s > 0.0 {
        eprintln!(
            "overhead: {}: {} s without requests (background CPU)…",
            mode.name(),
            opts.idle_s
        );
        Some(idle_cpu(&arms, opts.idle_s).await)
    } else {
        None
    };

    let mut cells = Vec::new();
    let mut loads = Vec::new();
    for &size in &opts.prompt_sizes {
        let prompts = Prompts::new(opts.seed, size);
        for &kind in &opts.kinds {
            let c0 = Instant::now();
            let cell = measure_kind(&mut arms, &prompts, mode, kind, opts).await?;
            eprintln!(
                "overhead: {} {} B {}: {} warm-up + {} measured pairs in {:.1} s, added p50 {} µs",
                mode.name(),
                size,
                kind.name(),
                cell.warmup_pairs,
                cell.pairs,
                c0.elapsed().as_secs_f64(),
                cell.diff_p50_us
                    .map_or_else(|| "-".to_owned(), |d| format!("{d:+.1}"))
            );
            cells.push(cell);
        }
        if opts.throughput_in(mode) {
            eprintln!(
                "overhead: {} {} B throughput: {} rounds of {} s per Envoy, {} connections…",
                mode.name(),
                size,
                opts.throughput_rounds,
                opts.throughput_s,
                opts.concurrency
            );
            let t = throughput(&arms, &prompts, mode, opts).await;
            eprintln!(
                "overhead: {} {} B throughput: kvroute/plain {} (rounds {}–{})",
                mode.name(),
                size,
                t.ratio
                    .median
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
                t.ratio
                    .min
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
                t.ratio
                    .max
                    .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
            );
            loads.push(t);
        }
    }

    let kvroute_end = MemoryFigures::read(&arms.kvroute).await?;
    let plain_end = MemoryFigures::read(&arms.plain).await?;
    let kv_stats = arms.kvroute.stats().await?;
    let plain_stats = arms.plain.stats().await?;
    let connections = BTreeMap::from([
        (KVROUTE.to_owned(), connections_per_worker(&kv_stats)),
        (PLAIN.to_owned(), connections_per_worker(&plain_stats)),
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
    let hops = if with_hops && opts.hop_runs > 0 {
        Some(hops::hop_phase(&arms, &pods, opts).await?)
    } else {
        None
    };
    drop(arms);
    drop(sim);
    Ok(SectionReport {
        mode,
        plugin_config,
        pods,
        cells,
        throughput: loads,
        idle_cpu,
        connections,
        memory,
        hops,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// Runs the whole benchmark, one section per block scheme. Progress goes to stderr.
pub async fn run(opts: &OverheadOptions) -> Result<OverheadReport> {
    opts.validate()?;
    check_envoy_installed()?;
    harness::wasm_path()?;
    if opts.hop_runs > 0 {
        // Fail on a router that is not installed before the long run, not at its end.
        for p in &opts.peers {
            p.router.check_installed()?;
        }
    }
    let t0 = Instant::now();
    let mut envoy_version = None;
    let mut sections = Vec::new();
    for (i, &mode) in opts.modes.iter().enumerate() {
        sections.push(run_section(opts, mode, i == 0, &mut envoy_version).await?);
    }
    let held = if opts.held_pairs > 0 {
        Some(held::held_phase(opts).await?)
    } else {
        None
    };
    Ok(OverheadReport {
        held,
        wall_clock: true,
        envoy_version,
        options: opts.clone(),
        summary: SummaryTables::of(&sections),
        sections,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}
