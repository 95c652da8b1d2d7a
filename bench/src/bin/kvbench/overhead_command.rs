//! `kvbench overhead`: kvroute's own cost per request and its memory.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use kvbench::overhead::{self, BlockMode, OverheadOptions, PromptKind};
use kvbench::peers::PeerPolicy;

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
    /// Runs of the hop phase (0 = none): the pod called directly, both Envoys and each of --peers, in front of the same pods
    #[arg(long, default_value_t = OverheadOptions::default().hop_runs)]
    pub(crate) hop_runs: usize,
    /// Peer routers timed in the hop phase, comma-separated (sglang-router, smg, vllm-router, or a `-rr` one for its round-robin; `none`); `make peers` installs them
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub(crate) peers: Vec<String>,
    /// Bytes of prompt text per request in the hop phase, a list measured in this order
    #[arg(long, value_delimiter = ',', default_values = ["256", "16384", "225280"])]
    pub(crate) hop_prompt_bytes: Vec<usize>,
    /// Measured sequential requests per hop, per run and size
    #[arg(long, default_value_t = OverheadOptions::default().hop_requests)]
    pub(crate) hop_requests: usize,
    /// Sequential requests per hop before those, per run and size, not measured
    #[arg(long, default_value_t = OverheadOptions::default().hop_warmup)]
    pub(crate) hop_warmup: usize,
    /// Seconds each hop is loaded (--concurrency connections) per run and size (0 = no loads)
    #[arg(long, default_value_t = OverheadOptions::default().hop_load_s)]
    pub(crate) hop_load_seconds: f64,
    /// Pairs of the queue phase: request B held by flow control behind request A on one pod; what
    /// holding adds to B beyond the wait for room (0 = skip).
    #[arg(long, default_value_t = OverheadOptions::default().held_pairs)]
    pub(crate) held_pairs: usize,
    /// Write DIR/overhead.json and DIR/overhead.txt
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

/// The peer routers of `--peers`: labels of [`PeerPolicy`], `none` or nothing for none.
fn peer_policies(names: &[String]) -> anyhow::Result<Vec<PeerPolicy>> {
    names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty() && *n != "none")
        .map(|n| {
            PeerPolicy::from_label(n).with_context(|| {
                let known: Vec<&str> = PeerPolicy::ALL.iter().map(|p| p.label()).collect();
                format!("--peers: unknown router {n:?} ({})", known.join(", "))
            })
        })
        .collect()
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
        hop_runs: args.hop_runs,
        peers: peer_policies(&args.peers)?,
        hop_sizes: args.hop_prompt_bytes.clone(),
        hop_requests: args.hop_requests,
        hop_warmup: args.hop_warmup,
        hop_load_s: args.hop_load_seconds,
        held_pairs: args.held_pairs,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_named_by_label_and_none_names_none() {
        let names = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        let labels = |v: Vec<PeerPolicy>| v.into_iter().map(PeerPolicy::label).collect::<Vec<_>>();
        assert_eq!(
            labels(peer_policies(&names("sglang-router,smg, vllm-router-rr")).expect("known")),
            ["sglang-router", "smg", "vllm-router-rr"]
        );
        assert!(peer_policies(&names("none")).expect("none").is_empty());
        assert!(peer_policies(&names("")).expect("empty").is_empty());
        let e = peer_policies(&names("smg,nginx")).expect_err("unknown");
        assert!(format!("{e:#}").contains("\"nginx\""), "{e:#}");
    }
}
