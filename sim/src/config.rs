//! The simulator's configuration: one struct whose `Default` is the CLI's defaults.
//!
//! The latency defaults (the `seed-demo` profile) are chosen so a ~7,500-token uncached prompt takes
//! about 3 s to its first token (40 ms + 7,500 × 0.4 ms) while the same prompt served from the prefix
//! cache takes well under one second, the gap a KV-cache-aware router exists to exploit. Other
//! profiles ([`super::profile`]) replace the step cost with a published fit of real vLLM.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

use super::profile::{self, Profile};

/// NVLink-class KV link: NVLink 4 on H100 SXM moves 900 GB/s in both directions together (NVIDIA
/// H100 Tensor Core GPU datasheet, "NVLink: 900GB/s"), 450 GB/s = 3,600 Gb/s each way.
pub const NVLINK_GBPS: f64 = 3600.0;
/// 100 Gb/s-class KV link: one 100 Gigabit Ethernet / RoCE port (IEEE 802.3 100GBASE line rate).
pub const ETH_100G_GBPS: f64 = 100.0;
/// vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` default (vllm/envs.py, 480 s): how long a prefill pod
/// keeps KV blocks a decoder has not read.
pub const NIXL_ABORT_TIMEOUT_S: f64 = 480.0;

/// `--kv-link-gbps` value: a number of Gb/s, `nvlink` or `100g`.
pub fn parse_link_gbps(s: &str) -> Result<f64, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "nvlink" => Ok(NVLINK_GBPS),
        "100g" | "100gbe" => Ok(ETH_100G_GBPS),
        other => match other.parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
            _ => Err(format!("expected Gb/s > 0, `nvlink` or `100g`, got {s:?}")),
        },
    }
}

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
    /// Both of the above, and serves a request without `kv_transfer_params` whole (vLLM's
    /// `kv_role: kv_both`, which elastic P/D pools run).
    Both,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
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

/// One `--lora-modules` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

/// vLLM's `--lora-modules` forms: `name=path`, or `{"name": .., "path": ..}`.
pub fn parse_lora_module(s: &str) -> Result<LoraModule, String> {
    let s = s.trim();
    let (name, path) = if s.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(s).map_err(|e| format!("invalid LoRA module JSON: {e}"))?;
        let field = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        (field("name"), field("path"))
    } else {
        match s.split_once('=') {
            Some((n, p)) => (Some(n.trim().to_string()), Some(p.trim().to_string())),
            None => (None, None),
        }
    };
    match (name, path) {
        (Some(name), Some(path)) if !name.is_empty() && !path.is_empty() => {
            Ok(LoraModule { name, path })
        }
        _ => Err(format!(
            "expected name=path or {{\"name\": .., \"path\": ..}}, got {s:?}"
        )),
    }
}

/// How a pod serves a request's `model`: the name it answers with and the KV cache it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAs {
    pub name: String,
    /// Seeds the prefix-cache hash chain: the first served name for every alias (one model, one
    /// cache), the adapter's own name for a LoRA adapter (vLLM keys cached blocks by adapter).
    pub cache_key: String,
    pub adapter: Option<String>,
}

/// KV link bandwidth by the closest level two pods share, as kvroute's `pd.topology.link_gbps`
/// names the levels (Gb/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkLevels {
    pub sub_zone: f64,
    pub zone: f64,
    pub region: f64,
    pub remote: f64,
}

impl LinkLevels {
    /// `sub_zone=400,zone=100,region=25,remote=5` (every level named once).
    pub fn parse(s: &str) -> Result<LinkLevels, String> {
        let mut found = [None; 4];
        for part in s.split(',') {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected LEVEL=GBPS"))?;
            let i = ["sub_zone", "zone", "region", "remote"]
                .iter()
                .position(|n| *n == name.trim())
                .ok_or_else(|| format!("{name:?}: levels are sub_zone, zone, region, remote"))?;
            let gbps: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{value:?} is not a number of Gb/s"))?;
            found[i] = Some(gbps);
        }
        match found {
            [Some(sub_zone), Some(zone), Some(region), Some(remote)] => Ok(LinkLevels {
                sub_zone,
                zone,
                region,
                remote,
            }),
            _ => Err("name every level: sub_zone, zone, region, remote".into()),
        }
    }

    /// The bandwidth between two places (`REGION/ZONE/SUB_ZONE`): the closest level both share;
    /// an unknown place is remote. A zone counts only within its region, a sub-zone only within
    /// its zone.
    pub fn between(&self, a: &str, b: &str) -> f64 {
        let parts = |s: &str| -> [String; 3] {
            let mut it = s.split('/').map(str::to_string);
            [
                it.next().unwrap_or_default(),
                it.next().unwrap_or_default(),
                it.next().unwrap_or_default(),
            ]
        };
        let (a, b) = (parts(a), parts(b));
        let same = |i: usize| !a[i].is_empty() && a[i] == b[i];
        let region = a[0] == b[0];
        match () {
            () if region && same(1) && same(2) => self.sub_zone,
            () if region && same(1) => self.zone,
            () if same(0) => self.region,
            () => self.remote,
        }
    }
}

/// Simulated time to read a LoRA adapter from disk onto the GPU: a rank-16 adapter on every
/// linear layer of a 7–8B model is about 80 MB, 30–40 ms from NVMe at 2–3 GB/s, plus reading the
/// safetensors and copying layer by layer before the prefill (vllm-project/vllm#31941; reports run
/// from ~10 ms from pinned host memory to 0.5–1 s with unpinned per-layer copies,
/// predibase/lorax#433).
pub const DEFAULT_LORA_LOAD_MS: f64 = 100.0;

/// Host-memory tier bandwidth (Gb/s), each way: the vLLM blog "KV offloading connector"
/// (<https://blog.vllm.ai/2026/01/08/kv-offloading-connector.html>) measures the native CPU
/// offloading connector's GPU↔CPU DMA at "up to about 50GB/s" one way on an H100: 400 Gb/s.
pub const DEFAULT_CPU_OFFLOAD_GBPS: f64 = 400.0;

/// KV bytes per token for a profile that does not know its own (seed-demo): Llama-3.1-8B in fp16,
/// 32 layers × 8 KV heads × 128 head dim × 2 (K and V) × 2 bytes = 131,072 B (128 KiB).
pub const FALLBACK_KV_BYTES_PER_TOKEN: usize = 131_072;

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address every pod binds (port chosen by the OS).
    pub host: IpAddr,
    pub role: Role,
    pub engine: EngineKind,
    /// Served model names (vLLM's `--served-model-name`): aliases of one model sharing one KV
    /// cache; the first one labels the metrics. Never empty after `validate`.
    pub models: Vec<String>,
    /// LoRA adapters (vLLM's `--lora-modules name=path`): each a name requests may use, with a KV
    /// cache of its own.
    pub lora_modules: Vec<LoraModule>,
    /// vLLM's `--max-loras` (default 1): distinct adapters one step runs, and GPU adapter slots.
    pub max_loras: usize,
    /// Simulated milliseconds to load an adapter not in a GPU slot; the step that loads it takes
    /// that much longer (see `crate::engine`).
    pub lora_load_ms: f64,
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
    /// Token budget per engine step. Seed model: prefill tokens only, 0 = each prefill runs whole in
    /// one step. Fitted profiles: vLLM's `max_num_batched_tokens`, shared by decodes and prefill
    /// chunks (0 = unlimited).
    pub chunked_prefill_tokens: usize,
    /// Longest prompt + completion accepted (vLLM's `max_model_len`); longer requests get a 400.
    pub max_model_len: usize,
    pub seed: u64,
    /// The engine's cost model (step time, per-request overheads, KV bytes per token).
    pub profile: &'static Profile,
    /// Per-pod speed factors, by pod index: a pod's step time is divided by its factor (0.5 = half as
    /// fast, an older GPU). Empty = every pod 1.0; one value applies to every pod.
    pub pod_speed: Vec<f64>,
    /// This pod's factor (set from `pod_speed` when a pod starts).
    pub speed: f64,
    /// KV link bandwidth into a decode pod (Gb/s), shared equally by its concurrent pulls; `None`
    /// = the seed model's fixed `kv_transfer_us_per_token` per request. Needs a profile that knows
    /// its KV bytes per token.
    pub kv_link_gbps: Option<f64>,
    /// Pods' places, by pod index, as `REGION/ZONE/SUB_ZONE` (Envoy's locality; trailing parts may
    /// be left out): one for all pods or one per pod. A prefill pod writes its own into the KV
    /// handle it returns (`kvsim_locality`: the simulator's record of where the KV sits, standing
    /// in for the network path, which no engine reports), so a decode pod knows the link it pulls
    /// over.
    pub locality: Vec<String>,
    /// This pod's place (set from `locality` when a pod starts).
    pub own_locality: String,
    /// Bandwidth by the closest level the pulling and the prefilling pod share (Gb/s): with it, a
    /// pull runs at its link's speed (shared with the decode pod's other pulls as `kv_link_gbps`
    /// is), and from a pod of unknown place at `remote`'s.
    pub kv_link_levels: Option<LinkLevels>,
    /// Simulated seconds a prefill pod keeps the KV blocks of a remote-decode request that no
    /// decoder has pulled.
    pub kv_hold_timeout_s: f64,
    /// vLLM's `--api-key`: every `/v1/*` request must carry `Authorization: Bearer <key>` or is
    /// answered 401 `{"error": "Unauthorized"}` (vLLM guards `/v1/*` only: `/metrics`, `/health`
    /// stay open).
    pub api_key: Option<String>,
    /// vLLM's `--root-path` behind a proxy that does not strip it: every route is served under
    /// this prefix too (`/openai/v1/chat/completions` as `/v1/chat/completions`).
    pub root_path: Option<String>,
    /// Host-memory KV tier (vLLM's native CPU offloading connector), in kvsim blocks; 0 = none.
    /// Write-through: every full prompt block that lands on the GPU is stored there too (an LRU of
    /// block hashes), and a request admitted with blocks beyond its GPU prefix hit that the tier
    /// holds loads them instead of computing them (see `crate::engine`).
    pub cpu_offload_blocks: usize,
    /// Host tier ↔ GPU bandwidth (Gb/s, each way), shared equally by concurrent loads;
    /// [`DEFAULT_CPU_OFFLOAD_GBPS`] unless set.
    pub cpu_offload_gbps: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            role: Role::Aggregated,
            engine: EngineKind::Vllm,
            models: vec!["sim-model".to_string()],
            lora_modules: Vec::new(),
            max_loras: 1,
            lora_load_ms: DEFAULT_LORA_LOAD_MS,
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
            profile: profile::default_profile(),
            pod_speed: Vec::new(),
            speed: 1.0,
            kv_link_gbps: None,
            locality: Vec::new(),
            own_locality: String::new(),
            kv_link_levels: None,
            kv_hold_timeout_s: NIXL_ABORT_TIMEOUT_S,
            api_key: None,
            root_path: None,
            cpu_offload_blocks: 0,
            cpu_offload_gbps: DEFAULT_CPU_OFFLOAD_GBPS,
        }
    }
}

impl SimConfig {
    /// The served name or adapter a request's `model` names (`None`: the first served name, as
    /// vLLM treats a missing `model`), or vLLM's 404 message.
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<ServedAs, String> {
        let base = self.models.first().cloned().unwrap_or_default();
        let Some(name) = requested else {
            return Ok(ServedAs {
                name: base.clone(),
                cache_key: base,
                adapter: None,
            });
        };
        if self.models.iter().any(|m| m == name) {
            return Ok(ServedAs {
                name: name.to_string(),
                cache_key: base,
                adapter: None,
            });
        }
        if self.lora_modules.iter().any(|l| l.name == name) {
            return Ok(ServedAs {
                name: name.to_string(),
                cache_key: format!("{base}\u{0}lora\u{0}{name}"),
                adapter: Some(name.to_string()),
            });
        }
        Err(format!("The model `{name}` does not exist."))
    }

    /// This configuration with `p`'s capacity, batching limits and cost model (a fitted profile's
    /// pods pull KV over a 100 Gb/s-class link unless one is set).
    pub fn with_profile(mut self, p: &'static Profile) -> Self {
        self.profile = p;
        self.num_gpu_blocks = p.num_gpu_blocks;
        self.block_size = p.block_size;
        self.max_num_seqs = p.max_num_seqs;
        if let Some(budget) = p.max_num_batched_tokens {
            self.chunked_prefill_tokens = budget;
        }
        if p.kv_bytes_per_token > 0 && self.kv_link_gbps.is_none() {
            self.kv_link_gbps = Some(ETH_100G_GBPS);
        }
        self
    }

    /// The configuration pod `index` runs with (its speed factor).
    pub fn for_pod(&self, index: usize) -> Self {
        let mut cfg = self.clone();
        cfg.speed = match self.pod_speed.as_slice() {
            [] => 1.0,
            [one] => *one,
            many => many.get(index).copied().unwrap_or(1.0),
        };
        cfg.own_locality = match self.locality.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            many => many.get(index).cloned().unwrap_or_default(),
        };
        cfg
    }

    /// The profile and its source in one line, for logs and benchmark tables.
    pub fn describe(&self) -> String {
        let mut line = self.profile.describe();
        if !self.pod_speed.is_empty() {
            let speeds: Vec<String> = self.pod_speed.iter().map(|s| format!("{s}")).collect();
            line.push_str(&format!("; pod speed {}", speeds.join(",")));
        }
        if let Some(gbps) = self.kv_link_gbps {
            line.push_str(&format!("; KV link {gbps} Gb/s shared per decode pod"));
        }
        if self.host_tier() {
            line.push_str(&format!(
                "; CPU offload {} blocks at {} Gb/s",
                self.cpu_offload_blocks, self.cpu_offload_gbps
            ));
        }
        line
    }

    /// Decodes take one token each from the step's budget (vLLM V1's `max_num_batched_tokens`).
    pub fn budget_counts_decodes(&self) -> bool {
        self.profile.max_num_batched_tokens.is_some()
    }

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
        for (i, lora) in self.lora_modules.iter().enumerate() {
            if self.models.contains(&lora.name)
                || self.lora_modules[..i].iter().any(|l| l.name == lora.name)
            {
                bail!("LoRA module name {:?} is already served", lora.name);
            }
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
        let speeds = self.pod_speed.iter().chain(std::iter::once(&self.speed));
        if speeds.clone().any(|s| !(s.is_finite() && *s > 0.0)) {
            bail!("pod speed factors must be positive numbers");
        }
        if let Some(levels) = &self.kv_link_levels {
            let all = [levels.sub_zone, levels.zone, levels.region, levels.remote];
            if all.iter().any(|g| !(g.is_finite() && *g > 0.0)) {
                bail!("KV link levels must be positive numbers of Gb/s");
            }
            if self.profile.kv_bytes_per_token == 0 || self.kv_link_gbps.is_none() {
                bail!(
                    "profile {} has no KV size per token; KV link levels need a fitted profile",
                    self.profile.name
                );
            }
        }
        if let Some(gbps) = self.kv_link_gbps {
            if !(gbps.is_finite() && gbps > 0.0) {
                bail!("KV link bandwidth must be a positive number of Gb/s");
            }
            if self.profile.kv_bytes_per_token == 0 {
                bail!(
                    "profile {} has no KV size per token; a KV link needs a fitted profile",
                    self.profile.name
                );
            }
        }
        if self.max_loras == 0 {
            bail!("--max-loras must be at least 1");
        }
        if !(self.lora_load_ms.is_finite() && self.lora_load_ms >= 0.0) {
            bail!("--lora-load-ms must be a non-negative number");
        }
        if !(self.kv_hold_timeout_s.is_finite() && self.kv_hold_timeout_s >= 0.0) {
            bail!("KV hold timeout must be a non-negative number of seconds");
        }
        if !(self.cpu_offload_gbps.is_finite() && self.cpu_offload_gbps > 0.0) {
            bail!("--cpu-offload-gbps must be a positive number of Gb/s");
        }
        Ok(())
    }

    /// Simulated time of one engine step holding `prefill_tokens` uncached prompt tokens and
    /// `decoding_seqs` decodes (one token each), divided by the pod's speed factor.
    pub fn step_time(&self, prefill_tokens: usize, decoding_seqs: usize) -> Duration {
        if prefill_tokens == 0 && decoding_seqs == 0 {
            return Duration::ZERO;
        }
        if let Some(us) = self.profile.step_us(prefill_tokens, decoding_seqs) {
            return Duration::from_secs_f64(us / 1e6 / self.speed);
        }
        let mut ms = 0.0;
        if prefill_tokens > 0 {
            ms +=
                self.prefill_overhead_ms + self.prefill_us_per_token * prefill_tokens as f64 / 1e3;
        }
        if decoding_seqs > 0 {
            ms += self.decode_base_ms + self.decode_us_per_seq * decoding_seqs as f64 / 1e3;
        }
        Duration::from_secs_f64(ms / 1e3 / self.speed)
    }

    /// Simulated time to pull `tokens` tokens of KV from a prefill pod at `source` (its
    /// `kvsim_locality`): over the level both share where `kv_link_levels` is set, else as
    /// [`SimConfig::transfer_time`].
    pub fn transfer_time_from(&self, tokens: usize, source: Option<&str>) -> Duration {
        match &self.kv_link_levels {
            Some(levels) => {
                let gbps = levels.between(&self.own_locality, source.unwrap_or(""));
                let bytes = (tokens * self.profile.kv_bytes_per_token) as f64;
                Duration::from_secs_f64(bytes * 8.0 / (gbps * 1e9))
            }
            None => self.transfer_time(tokens),
        }
    }

    /// Simulated time to pull `tokens` tokens of KV from a prefill pod with the link to itself
    /// (the seed model's per-token cost when no link is configured).
    pub fn transfer_time(&self, tokens: usize) -> Duration {
        match self.kv_link_gbps {
            Some(gbps) => {
                let bytes = (tokens * self.profile.kv_bytes_per_token) as f64;
                Duration::from_secs_f64(bytes * 8.0 / (gbps * 1e9))
            }
            None => Duration::from_secs_f64(self.kv_transfer_us_per_token * tokens as f64 / 1e6),
        }
    }

    /// Whether the pod has a host-memory KV tier (`cpu_offload_blocks` > 0).
    pub fn host_tier(&self) -> bool {
        self.cpu_offload_blocks > 0
    }

    /// KV bytes per token: the profile's, or [`FALLBACK_KV_BYTES_PER_TOKEN`] for a profile that
    /// does not know it.
    pub fn kv_bytes_per_token(&self) -> usize {
        match self.profile.kv_bytes_per_token {
            0 => FALLBACK_KV_BYTES_PER_TOKEN,
            n => n,
        }
    }

    /// Bytes of KV in one full block.
    pub fn kv_bytes_per_block(&self) -> u64 {
        (self.block_size * self.kv_bytes_per_token()) as u64
    }

    /// Simulated time to load `tokens` tokens of KV from the host tier with the bandwidth to
    /// itself: `tokens × KV bytes per token × 8 / (cpu_offload_gbps × 1e9)`.
    pub fn host_load_time(&self, tokens: usize) -> Duration {
        let bits = (tokens * self.kv_bytes_per_token()) as f64 * 8.0;
        Duration::from_secs_f64(bits / (self.cpu_offload_gbps * 1e9))
    }

    /// Simulated time from arrival to the scheduler's queue (α0 + α1 · input length).
    pub fn queueing_time(&self, prompt_tokens: usize) -> Duration {
        Duration::from_secs_f64(self.profile.queueing_us(prompt_tokens) / 1e6)
    }

    /// Simulated time to load an adapter into a GPU slot.
    pub fn lora_load_time(&self) -> Duration {
        Duration::from_secs_f64(self.lora_load_ms.max(0.0) / 1e3)
    }

    /// Simulated host time per output token (α2), added to each token's delivery.
    pub fn output_token_time(&self) -> Duration {
        Duration::from_secs_f64(self.profile.output_token_us() / 1e6)
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
        assert_eq!(cfg.profile.name, "seed-demo");
    }

    #[test]
    fn profiles_set_capacity_and_step_cost_and_speed_divides_it() {
        let p = profile::find("llama-3.1-8b-h100").expect("profile");
        let cfg = SimConfig::default().with_profile(p);
        assert_eq!(cfg.num_gpu_blocks, 29205);
        assert_eq!(cfg.chunked_prefill_tokens, 8192);
        assert!(cfg.budget_counts_decodes());
        // 5752.705191348184 + 17.25086436834028·100 + 5.999143920128404·3 µs
        let t = cfg.step_time(100, 3).as_secs_f64();
        assert!((t - 7_495.789_059_942_597e-6).abs() < 1e-9, "{t}");
        let slow = SimConfig {
            pod_speed: vec![1.0, 0.5],
            ..cfg.clone()
        };
        assert_eq!(slow.for_pod(0).step_time(100, 3), cfg.step_time(100, 3));
        let t = slow.for_pod(1).step_time(100, 3).as_secs_f64();
        assert!((t - 2.0 * 7_495.789_059_942_597e-6).abs() < 1e-9, "{t}");
        assert_eq!(slow.for_pod(7).speed, 1.0, "unlisted pods run at 1.0");
        assert_eq!(cfg.step_time(0, 0), Duration::ZERO);
        assert!(cfg.validate().is_ok());
        assert!(SimConfig {
            pod_speed: vec![0.0],
            ..cfg.clone()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn a_pull_runs_at_the_speed_of_the_level_both_pods_share() {
        let p = profile::find("llama-3.1-8b-h100").expect("profile");
        let levels = LinkLevels::parse("sub_zone=400,zone=100,region=25,remote=5").unwrap();
        let cfg = SimConfig {
            locality: vec!["eu/a/r1".into()],
            kv_link_levels: Some(levels),
            ..SimConfig::default()
        }
        .with_profile(p)
        .for_pod(0);
        assert!(cfg.validate().is_ok());
        // 1,000 tokens × 131,072 B × 8 bit: 1.048576 Gb.
        let ms = |source: Option<&str>| cfg.transfer_time_from(1000, source).as_secs_f64() * 1e3;
        assert!((ms(Some("eu/a/r1")) - 2.621_44).abs() < 1e-6);
        assert!((ms(Some("eu/a/r2")) - 10.485_76).abs() < 1e-6);
        assert!((ms(Some("eu/b")) - 41.943_04).abs() < 1e-6);
        assert!(
            (ms(Some("us/a/r1")) - 209.715_2).abs() < 1e-6,
            "a zone of another region"
        );
        assert!(
            (ms(None) - 209.715_2).abs() < 1e-6,
            "an unknown place is remote"
        );
        assert!(LinkLevels::parse("zone=100").is_err());
        assert!(LinkLevels::parse("rack=1,zone=1,region=1,remote=1").is_err());
        let seed = SimConfig {
            kv_link_levels: Some(levels),
            ..SimConfig::default()
        };
        assert!(
            seed.validate().is_err(),
            "seed-demo has no KV size per token"
        );
    }

    #[test]
    fn kv_link_time_is_bytes_over_bandwidth() {
        let p = profile::find("llama-3.1-8b-h100").expect("profile");
        let cfg = SimConfig::default().with_profile(p);
        assert_eq!(cfg.kv_link_gbps, Some(ETH_100G_GBPS));
        // 1,000 tokens × 131,072 B × 8 bit / 100e9 bit/s = 10.48576 ms
        let t = cfg.transfer_time(1000).as_secs_f64();
        assert!((t - 0.010_485_76).abs() < 1e-9, "{t}");
        let fast = SimConfig {
            kv_link_gbps: Some(NVLINK_GBPS),
            ..cfg
        };
        assert!((fast.transfer_time(1000).as_secs_f64() - 0.010_485_76 / 36.0).abs() < 1e-9);
        assert_eq!(parse_link_gbps("nvlink"), Ok(3600.0));
        assert_eq!(parse_link_gbps("100g"), Ok(100.0));
        assert_eq!(parse_link_gbps("400"), Ok(400.0));
        assert!(parse_link_gbps("-1").is_err());
        let seed = SimConfig {
            kv_link_gbps: Some(100.0),
            ..SimConfig::default()
        };
        assert!(
            seed.validate().is_err(),
            "seed-demo has no KV size per token"
        );
    }

    #[test]
    fn host_loads_are_kv_bytes_over_the_offload_bandwidth() {
        // seed-demo knows no KV size: Llama-3.1-8B fp16's 128 KiB per token stands in.
        let seed = SimConfig {
            cpu_offload_blocks: 100,
            ..SimConfig::default()
        };
        assert!(seed.validate().is_ok());
        assert_eq!(seed.kv_bytes_per_token(), FALLBACK_KV_BYTES_PER_TOKEN);
        assert_eq!(seed.kv_bytes_per_block(), 16 * 131_072);
        // 1,000 tokens × 131,072 B × 8 bit / 400e9 bit/s = 2.62144 ms
        let t = seed.host_load_time(1000).as_secs_f64();
        assert!((t - 0.002_621_44).abs() < 1e-12, "{t}");
        let p = profile::find("qwen2.5-7b-h100").expect("profile");
        let qwen = SimConfig::default().with_profile(p);
        assert_eq!(qwen.kv_bytes_per_token(), 57_344, "the profile's own");
        assert!(!qwen.host_tier(), "off by default");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let cfg = SimConfig {
                cpu_offload_gbps: bad,
                ..SimConfig::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
        }
    }
}
