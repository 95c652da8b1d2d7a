//! `kvbench overhead`: kvroute's own cost per request and its memory.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use wasm_tests::bench::overhead::{self, OverheadOptions, PromptKind};

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PromptKindArg {
    /// The same 16 KB system prompt with a short varying question: kvroute finds a prefix hit
    Repeat,
    /// A new prompt on every request: kvroute's prefix index grows to its bounds
    Fresh,
}

/// Figures are wall-clock microseconds, not simulated time. Defaults are what `make bench-overhead`
/// reports.
#[derive(Args, Debug)]
pub(crate) struct OverheadArgs {
    /// Simulated pods (one kvsim process), shared by both Envoys
    #[arg(long, default_value_t = OverheadOptions::default().pods)]
    pub(crate) pods: usize,
    /// Envoy workers, the same in both Envoys
    #[arg(long, default_value_t = OverheadOptions::default().workers)]
    pub(crate) workers: usize,
    /// Measured request pairs (one to each Envoy) per prompt kind
    #[arg(long, default_value_t = OverheadOptions::default().requests)]
    pub(crate) requests: usize,
    /// Pairs sent before each kind's measured ones, not measured
    #[arg(long, default_value_t = OverheadOptions::default().warmup)]
    pub(crate) warmup: usize,
    /// Prompt kinds, measured in this order
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["repeat", "fresh"])]
    pub(crate) kinds: Vec<PromptKindArg>,
    /// Bytes of prompt text per request (system prompt + question)
    #[arg(long, default_value_t = OverheadOptions::default().prompt_bytes)]
    pub(crate) prompt_bytes: usize,
    /// The simulator's time scale (the default pods have no latency at all anyway)
    #[arg(long, default_value_t = OverheadOptions::default().time_scale)]
    pub(crate) time_scale: f64,
    /// kvsim arguments, space-separated (default: every latency parameter 0, the pods answer at once)
    #[arg(long, default_value = overhead::DEFAULT_SIM_ARGS, allow_hyphen_values = true)]
    pub(crate) sim_args: String,
    /// Bootstrap resamples for the 95% interval of the difference of medians
    #[arg(long, default_value_t = OverheadOptions::default().bootstrap)]
    pub(crate) bootstrap: usize,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Requests per Envoy in the closed-loop throughput phase (0 = skip it)
    #[arg(long, default_value_t = OverheadOptions::default().throughput_requests)]
    pub(crate) throughput_requests: usize,
    /// Requests in flight in the throughput phase
    #[arg(long, default_value_t = OverheadOptions::default().concurrency)]
    pub(crate) concurrency: usize,
    /// kvroute configuration fields (JSON object) merged into its defaults, e.g. '{"block": {"mode": "tiktoken"}}'
    #[arg(long, value_name = "JSON")]
    pub(crate) plugin_extra: Option<String>,
    /// Include every latency sample in the JSON
    #[arg(long)]
    pub(crate) records: bool,
    /// Seconds without requests over which both Envoys' background CPU is measured (0 = skip)
    #[arg(long, default_value_t = OverheadOptions::default().idle_s)]
    pub(crate) idle: f64,
    /// Write DIR/overhead.json and DIR/overhead.txt
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

pub(crate) async fn overhead_main(args: &OverheadArgs) -> anyhow::Result<()> {
    let plugin_extra = match &args.plugin_extra {
        Some(text) => serde_json::from_str(text).context("--plugin-extra is not JSON")?,
        None => serde_json::json!({}),
    };
    let opts = OverheadOptions {
        pods: args.pods,
        workers: args.workers,
        time_scale: args.time_scale,
        sim_args: split_args(&args.sim_args),
        kinds: args
            .kinds
            .iter()
            .map(|k| match k {
                PromptKindArg::Repeat => PromptKind::Repeat,
                PromptKindArg::Fresh => PromptKind::Fresh,
            })
            .collect(),
        requests: args.requests,
        warmup: args.warmup,
        prompt_bytes: args.prompt_bytes,
        bootstrap: args.bootstrap,
        seed: args.seed,
        throughput_requests: args.throughput_requests,
        concurrency: args.concurrency,
        plugin_extra,
        keep_samples: args.records,
        idle_s: args.idle,
    };
    opts.validate()?;
    let report = overhead::run(&opts).await?;
    println!();
    print!("{}", overhead::render_text(&report));
    if let Some(dir) = &args.out {
        overhead::write_outputs(dir, &report)?;
        eprintln!(
            "wrote {0}/overhead.json and {0}/overhead.txt",
            dir.display()
        );
    }
    Ok(())
}
