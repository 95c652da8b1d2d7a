//! kvsim: starts N simulated vLLM/SGLang pods on loopback and prints their addresses.
//!
//! Contract with the harness and the benchmark: exactly one line on stdout,
//! `{"pods":["127.0.0.1:PORT",...]}`, once every pod is listening; logs go to stderr; the process
//! serves until it is killed (SIGTERM / SIGINT end it cleanly, SIGKILL works too).

use std::io::Write as _;
use std::net::IpAddr;

use anyhow::{Context as _, Result};
use clap::Parser;
use wasm_tests::sim::{spawn_pods, EngineKind, Role, SimConfig};

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
    /// Served model name; repeat the flag or give a comma-separated list for several.
    #[arg(long = "model", value_delimiter = ',', default_value = "sim-model")]
    models: Vec<String>,
    /// Wall seconds per simulated second (0.05 = everything 20x faster).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value_t = 32)]
    max_num_seqs: usize,
    #[arg(long, default_value_t = 4096)]
    num_gpu_blocks: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
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
    /// Prefill token budget per engine step (0 = whole prefill in one step).
    #[arg(long, default_value_t = 0)]
    chunked_prefill_tokens: usize,
    /// Longest prompt + completion accepted (vLLM's max_model_len).
    #[arg(long, default_value_t = 131_072)]
    max_model_len: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Args {
    fn config(self) -> SimConfig {
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
            time_scale: self.time_scale,
            max_num_seqs: self.max_num_seqs,
            num_gpu_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            prefill_overhead_ms: self.prefill_overhead_ms,
            prefill_us_per_token: self.prefill_us_per_token,
            decode_base_ms: self.decode_base_ms,
            decode_us_per_seq: self.decode_us_per_seq,
            kv_transfer_us_per_token: self.kv_transfer_us_per_token,
            chunked_prefill_tokens: self.chunked_prefill_tokens,
            max_model_len: self.max_model_len,
            seed: self.seed,
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.pods;
    let cfg = args.config();
    let pods = spawn_pods(cfg.clone(), n).await?;
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.to_string()).collect();
    let line = serde_json::json!({ "pods": addrs });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").context("writing the pod list")?;
        out.flush().context("flushing the pod list")?;
    }
    eprintln!(
        "kvsim: {n} {} pod(s), engine {}, models {:?}, time scale {}",
        cfg.role.as_str(),
        cfg.engine.as_str(),
        cfg.models,
        cfg.time_scale
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
