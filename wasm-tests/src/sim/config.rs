//! The simulator's configuration: one struct whose `Default` is the CLI's defaults.
//!
//! The latency defaults are chosen so a ~7,500-token uncached prompt takes about 3 s to its first
//! token (40 ms + 7,500 × 0.4 ms) while the same prompt served from the prefix cache takes well under
//! one second, the gap a KV-cache-aware router exists to exploit.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

/// Which part of a P/D-disaggregated deployment a pod plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode on the same pod; `kv_transfer_params` in a body are ignored.
    Aggregated,
    /// Honours `do_remote_decode`: prefill, one token, answer with `kv_transfer_params`.
    Prefill,
    /// Honours `do_remote_prefill`: loads the prompt's KV instead of computing it.
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// Whose metric names `/metrics` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address every pod binds (port chosen by the OS).
    pub host: IpAddr,
    pub role: Role,
    pub engine: EngineKind,
    /// Served model names; the first one labels the metrics. Never empty after `validate`.
    pub models: Vec<String>,
    /// Wall seconds per simulated second (0.05 = everything 20x faster).
    pub time_scale: f64,
    pub max_num_seqs: usize,
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub prefill_overhead_ms: f64,
    pub prefill_us_per_token: f64,
    pub decode_base_ms: f64,
    pub decode_us_per_seq: f64,
    pub kv_transfer_us_per_token: f64,
    /// Prefill token budget per engine step; 0 = each prefill runs whole in one step.
    pub chunked_prefill_tokens: usize,
    /// Longest prompt + completion accepted (vLLM's `max_model_len`); longer requests get a 400.
    pub max_model_len: usize,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            role: Role::Aggregated,
            engine: EngineKind::Vllm,
            models: vec!["sim-model".to_string()],
            time_scale: 1.0,
            max_num_seqs: 32,
            num_gpu_blocks: 4096,
            block_size: 16,
            prefill_overhead_ms: 40.0,
            prefill_us_per_token: 400.0,
            decode_base_ms: 15.0,
            decode_us_per_seq: 500.0,
            kv_transfer_us_per_token: 20.0,
            chunked_prefill_tokens: 0,
            max_model_len: 131_072,
            seed: 1,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<()> {
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            bail!(
                "time scale must be a positive number, got {}",
                self.time_scale
            );
        }
        if self.models.is_empty() || self.models.iter().any(|m| m.trim().is_empty()) {
            bail!("at least one non-empty model name is required");
        }
        if self.max_num_seqs == 0 || self.num_gpu_blocks == 0 || self.block_size == 0 {
            bail!("max-num-seqs, num-gpu-blocks and block-size must be at least 1");
        }
        let costs = [
            self.prefill_overhead_ms,
            self.prefill_us_per_token,
            self.decode_base_ms,
            self.decode_us_per_seq,
            self.kv_transfer_us_per_token,
        ];
        if costs.iter().any(|c| !(c.is_finite() && *c >= 0.0)) {
            bail!("latency parameters must be non-negative numbers");
        }
        Ok(())
    }

    /// Simulated time of one engine step.
    pub fn step_time(&self, prefill_tokens: usize, decoding_seqs: usize) -> Duration {
        let mut ms = 0.0;
        if prefill_tokens > 0 {
            ms +=
                self.prefill_overhead_ms + self.prefill_us_per_token * prefill_tokens as f64 / 1e3;
        }
        if decoding_seqs > 0 {
            ms += self.decode_base_ms + self.decode_us_per_seq * decoding_seqs as f64 / 1e3;
        }
        Duration::from_secs_f64(ms / 1e3)
    }

    /// Simulated time to pull `tokens` tokens of KV from a prefill pod.
    pub fn transfer_time(&self, tokens: usize) -> Duration {
        Duration::from_secs_f64(self.kv_transfer_us_per_token * tokens as f64 / 1e6)
    }

    /// Converts simulated time to wall time.
    pub fn to_wall(&self, sim: Duration) -> Duration {
        sim.mul_f64(self.time_scale)
    }

    /// Converts wall time to simulated seconds (what the metrics record).
    pub fn to_sim_secs(&self, wall: Duration) -> f64 {
        wall.as_secs_f64() / self.time_scale
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_give_three_second_ttft_for_long_prompt() {
        let cfg = SimConfig::default();
        let t = cfg.step_time(7500, 0).as_secs_f64();
        assert!((t - 3.04).abs() < 1e-9, "{t}");
        assert!(cfg.step_time(16, 0).as_secs_f64() < 0.1);
    }
}
