//! `kvbench overhead`: kvroute's own cost per request and its memory.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use kvbench::overhead::{self, BlockMode, OverheadOptions, PromptKind};

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PromptKindArg {
    /// The same system prompt with a short varying question: kvroute finds a prefix hit
    Repeat,
    /// A new prompt on every request: kvroute's prefix index grows to its bounds
    Fresh,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BlockModeArg {
    /// Blocks of characters, no tokenizer (kvroute's default)
    Chars,
    /// Blocks of real tokens (cl100k_base; needs the full kvroute.wasm)
    Tiktoken,
}

impl BlockModeArg {
    fn mode(self) -> BlockMode {
        match self {
            BlockModeArg::Chars => BlockMode::Chars,
            BlockModeArg::Tiktoken => BlockMode::Tiktoken,
        }
    }
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
    /// Block schemes, each with its own pods and pair of Envoys, in this order
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["chars", "tiktoken"])]
    pub(crate) modes: Vec<BlockModeArg>,
    /// Bytes of prompt text per request (system prompt + question), a list measured in this order
    #[arg(long, value_delimiter = ',', default_values = ["256", "16384", "262144"])]
    pub(crate) prompt_bytes: Vec<usize>,
    /// Prompt kinds, measured in this order for every size
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["repeat", "fresh"])]
    pub(crate) kinds: Vec<PromptKindArg>,
    /// Most measured request pairs (one to each Envoy) per (mode, size, kind)
    #[arg(long, default_value_t = OverheadOptions::default().requests)]
    pub(crate) requests: usize,
    /// Most pairs sent before each cell's measured ones, not measured
    #[arg(long, default_value_t = OverheadOptions::default().warmup)]
    pub(crate) warmup: usize,
    /// Seconds after which a cell stops adding measured pairs (its warm-up after a quarter of it; 0 = no limit)
    #[arg(long, default_value_t = OverheadOptions::default().cell_s)]
    pub(crate) cell_seconds: f64,
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
    /// Seconds each Envoy is loaded per throughput round (0 = no throughput phase)
    #[arg(long, default_value_t = OverheadOptions::default().throughput_s)]
    pub(crate) throughput_seconds: f64,
    /// Throughput rounds per prompt size (who goes first alternates)
    #[arg(long, default_value_t = OverheadOptions::default().throughput_rounds)]
    pub(crate) throughput_rounds: usize,
    /// Block schemes whose sections have the throughput phase
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["chars"])]
    pub(crate) throughput_modes: Vec<BlockModeArg>,
    /// Connections of the throughput phase, each with one request in flight
    #[arg(long, default_value_t = OverheadOptions::default().concurrency)]
    pub(crate) concurrency: usize,
    /// kvroute configuration fields (JSON object) merged into its defaults, e.g. '{"block": {"mode": "tiktoken"}}'
    #[arg(long, value_name = "JSON")]
    pub(crate) plugin_extra: Option<String>,
    /// Ablation: the Envoy without kvroute runs Envoy's buffer filter, so it buffers every body whole too
    #[arg(long)]
    pub(crate) plain_buffer: bool,
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
        modes: args.modes.iter().map(|m| m.mode()).collect(),
        prompt_sizes: args.prompt_bytes.clone(),
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
        cell_s: args.cell_seconds,
        bootstrap: args.bootstrap,
        seed: args.seed,
        throughput_s: args.throughput_seconds,
        throughput_rounds: args.throughput_rounds,
        throughput_modes: args.throughput_modes.iter().map(|m| m.mode()).collect(),
        concurrency: args.concurrency,
        plugin_extra,
        plain_buffer: args.plain_buffer,
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
