//! kvsim: starts N simulated vLLM/SGLang pods on loopback and prints their addresses.
//!
//! Contract with the harness and the benchmark: exactly one line on stdout,
//! `{"pods":["127.0.0.1:PORT",...],"profile":"NAME","profile_source":"..."}`, once every pod is
//! listening; logs go to stderr; the process serves until it is killed (SIGTERM / SIGINT end it
//! cleanly, SIGKILL works too).

use std::io::Write as _;
use std::net::IpAddr;

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, FromArgMatches as _, Parser};
use kvsim::{
    parse_link_gbps, parse_lora_module, profile, spawn_pods, EngineKind, LoraModule, Role,
    SimConfig,
};

#[derive(Debug, Parser)]
#[command(name = "kvsim", about = "vLLM-compatible LLM model-server simulator")]
struct Args {
    /// Number of pods to start.
    #[arg(long)]
    pods: usize,
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, value_enum, default_value = "aggregated")]
    role: Role,
    #[arg(long, value_enum, default_value = "vllm")]
    engine: EngineKind,
    /// Served model names (vLLM's --served-model-name): aliases of one model sharing one KV
    /// cache, space- or comma-separated. The first labels the metrics.
    #[arg(
        long = "model",
        alias = "served-model-name",
        num_args = 1..,
        value_delimiter = ',',
        default_value = "sim-model"
    )]
    models: Vec<String>,
    /// LoRA adapters as vLLM's --lora-modules: `name=path` or `{"name":..,"path":..}`, space-
    /// separated. Each is a model name with its own KV cache, listed in /v1/models with the first
    /// served name as parent.
    #[arg(long, num_args = 1.., value_parser = parse_lora_module)]
    lora_modules: Vec<LoraModule>,
    /// vLLM's --max-loras: distinct adapters one step runs, and adapters the GPU holds.
    #[arg(long, default_value_t = 1)]
    max_loras: usize,
    /// Simulated milliseconds to load an adapter that is not in a GPU slot (the step waits).
    #[arg(long, default_value_t = kvsim::DEFAULT_LORA_LOAD_MS)]
    lora_load_ms: f64,
    /// Engine profile: step-time fit, per-request overheads and KV capacity (list below).
    #[arg(long, default_value = "seed-demo", value_parser = profile_name)]
    profile: String,
    /// Wall seconds per simulated second (0.05 = everything 20x faster).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Running-sequence cap (default: the profile's).
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// KV blocks per pod (default: the profile's).
    #[arg(long)]
    num_gpu_blocks: Option<usize>,
    /// Tokens per KV block (default: the profile's, 16).
    #[arg(long)]
    block_size: Option<usize>,
    #[arg(long, default_value_t = 40.0)]
    prefill_overhead_ms: f64,
    #[arg(long, default_value_t = 400.0)]
    prefill_us_per_token: f64,
    #[arg(long, default_value_t = 15.0)]
    decode_base_ms: f64,
    #[arg(long, default_value_t = 500.0)]
    decode_us_per_seq: f64,
    #[arg(long, default_value_t = 20.0)]
    kv_transfer_us_per_token: f64,
    /// Token budget per step (default: the profile's). seed-demo: prefill tokens only, 0 = whole
    /// prefills; fitted profiles: vLLM's max_num_batched_tokens, shared with decodes.
    #[arg(long, alias = "max-num-batched-tokens")]
    chunked_prefill_tokens: Option<usize>,
    /// Per-pod speed factors (step time is divided by it; 0.5 = half as fast): one for all pods
    /// or one per pod, e.g. 1,1,1,0.5.
    #[arg(long, value_delimiter = ',')]
    pod_speed: Vec<f64>,
    /// KV link into each decode pod, shared by its concurrent pulls: Gb/s, `nvlink` (3600) or
    /// `100g` (100). Fitted profiles default to 100g; seed-demo keeps its per-token cost.
    #[arg(long, value_parser = parse_link_gbps)]
    kv_link_gbps: Option<f64>,
    /// Pods' places as REGION/ZONE/SUB_ZONE (Envoy's locality), one for all pods or one per pod,
    /// e.g. eu/a,eu/b. A prefill pod reports its own with the KV it holds.
    #[arg(long, value_delimiter = ',')]
    locality: Vec<String>,
    /// KV link bandwidth by the closest level the pulling and the prefilling pod share, Gb/s:
    /// sub_zone=400,zone=100,region=25,remote=5 (needs a fitted profile).
    #[arg(long, value_parser = kvsim::LinkLevels::parse)]
    kv_link_levels: Option<kvsim::LinkLevels>,
    /// Simulated seconds a prefill pod holds KV no decoder has pulled (vLLM's
    /// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480).
    #[arg(long, default_value_t = kvsim::NIXL_ABORT_TIMEOUT_S)]
    kv_hold_timeout_s: f64,
    /// Host-memory KV tier per pod, in blocks (vLLM's native CPU offloading connector; 0 = none):
    /// every full prompt block the GPU holds is written through to it (LRU), and a prompt whose
    /// blocks the GPU lost but host memory holds loads them instead of computing them.
    #[arg(long, default_value_t = 0)]
    cpu_offload_blocks: usize,
    /// Host tier <-> GPU bandwidth in Gb/s, each way, shared by concurrent loads (400 = the ~50
    /// GB/s DMA vLLM's blog measured on H100). KV bytes per token: the profile's, or 131072
    /// (Llama-3.1-8B fp16) for seed-demo.
    #[arg(long, default_value_t = kvsim::DEFAULT_CPU_OFFLOAD_GBPS)]
    cpu_offload_gbps: f64,
    /// vLLM's --api-key: `/v1/*` requests without `Authorization: Bearer <key>` get 401.
    #[arg(long)]
    api_key: Option<String>,
    /// vLLM's --root-path behind a proxy that keeps it: every route is also served under it.
    #[arg(long)]
    root_path: Option<String>,
    /// Longest prompt + completion accepted (vLLM's max_model_len).
    #[arg(long, default_value_t = 131_072)]
    max_model_len: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn profile_name(s: &str) -> Result<String, String> {
    match profile::find(s) {
        Some(p) => Ok(p.name.to_string()),
        None => Err(format!("known profiles: {}", profile::names().join(", "))),
    }
}

impl Args {
    fn config(self) -> SimConfig {
        let p = profile::find(&self.profile).unwrap_or_else(profile::default_profile);
        let base = SimConfig {
            kv_link_gbps: self.kv_link_gbps,
            ..SimConfig::default()
        }
        .with_profile(p);
        SimConfig {
            host: self.host,
            role: self.role,
            engine: self.engine,
            models: self
                .models
                .into_iter()
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect(),
            lora_modules: self.lora_modules,
            max_loras: self.max_loras,
            lora_load_ms: self.lora_load_ms,
            time_scale: self.time_scale,
            max_num_seqs: self.max_num_seqs.unwrap_or(base.max_num_seqs),
            num_gpu_blocks: self.num_gpu_blocks.unwrap_or(base.num_gpu_blocks),
            block_size: self.block_size.unwrap_or(base.block_size),
            prefill_overhead_ms: self.prefill_overhead_ms,
            prefill_us_per_token: self.prefill_us_per_token,
            decode_base_ms: self.decode_base_ms,
            decode_us_per_seq: self.decode_us_per_seq,
            kv_transfer_us_per_token: self.kv_transfer_us_per_token,
            chunked_prefill_tokens: self
                .chunked_prefill_tokens
                .unwrap_or(base.chunked_prefill_tokens),
            max_model_len: self.max_model_len,
            seed: self.seed,
            pod_speed: self.pod_speed,
            locality: self.locality,
            kv_link_levels: self.kv_link_levels,
            kv_hold_timeout_s: self.kv_hold_timeout_s,
            api_key: self.api_key,
            root_path: self.root_path,
            cpu_offload_blocks: self.cpu_offload_blocks,
            cpu_offload_gbps: self.cpu_offload_gbps,
            ..base
        }
    }
}

fn profiles_help() -> String {
    let mut help = String::from("Profiles (--profile):\n");
    for p in profile::PROFILES {
        help.push_str(&format!("  {}\n", p.describe()));
    }
    help
}

#[tokio::main]
async fn main() -> Result<()> {
    let matches = Args::command().after_help(profiles_help()).get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let n = args.pods;
    let cfg = args.config();
    let pods = spawn_pods(cfg.clone(), n).await?;
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.to_string()).collect();
    let line = serde_json::json!({
        "pods": addrs,
        "profile": cfg.profile.name,
        "profile_source": cfg.describe(),
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").context("writing the pod list")?;
        out.flush().context("flushing the pod list")?;
    }
    eprintln!(
        "kvsim: {n} {} pod(s), engine {}, models {:?}, time scale {}, profile {}, {} blocks of {}, \
         budget {}, max {} seqs",
        cfg.role.as_str(),
        cfg.engine.as_str(),
        cfg.models,
        cfg.time_scale,
        cfg.describe(),
        cfg.num_gpu_blocks,
        cfg.block_size,
        cfg.chunked_prefill_tokens,
        cfg.max_num_seqs,
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("kvsim: shutting down");
    drop(pods);
    Ok(())
}
