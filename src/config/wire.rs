//! The configuration's wire form: the JSON given as the Wasm filter's `configuration`, as serde
//! reads it. Parsing is strict (`deny_unknown_fields`) because a typo in a routing config should
//! fail loudly at load time, not silently route by defaults. Nothing here is used to route: the
//! runtime form (`super::Config`) is compiled from it, with every check made once.

use serde::Deserialize;

pub use crate::common::{BlockMode, NoEndpointPolicy, OverloadGuard, Role};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    #[serde(default)]
    pub role: Role,
    /// Static members, `ip:port`.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Or: an Envoy cluster whose members are read from the admin API.
    #[serde(default)]
    pub cluster: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct BlockConfig {
    pub mode: BlockMode,
    pub tokens_per_block: u32,
    pub chars_per_token: u32,
    /// tiktoken encoding name, used when `mode` is `tiktoken`.
    pub encoding: String,
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            mode: BlockMode::Chars,
            tokens_per_block: 16,
            chars_per_token: 4,
            encoding: "cl100k_base".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct WireConfig {
    pub pools: Vec<PoolConfig>,
    /// An ORIGINAL_DST cluster honouring `x-gateway-destination-endpoint`, used to reach any pod.
    pub poll_cluster: String,
    /// A static cluster pointing at Envoy's admin address, for pools given as `cluster`.
    pub admin_cluster: Option<String>,
    pub poll_interval_ms: u64,
    pub poll_timeout_ms: u64,
    /// Metrics older than this are stale: the pod is still routed, on the gateway's own view of its
    /// work (see `crate::health`).
    pub stale_after_ms: u64,
    /// How long kvroute remembers which pod stored a Responses API answer, for the requests that
    /// name it (`crate::stored_responses`).
    pub stored_response_ttl_ms: u64,
    /// How often cluster membership is re-read from the admin API.
    pub discovery_interval_ms: u64,
    /// How often each pod's `/v1/models` (aliases, LoRA adapters) is re-read; a new pod's is read
    /// at once.
    pub models_poll_interval_ms: u64,
    pub block: BlockConfig,
    /// The TTFT prediction the pods are ranked by (prior costs, tie band).
    pub prediction: crate::scheduler::predict::PredictionConfig,
    /// LoRA adapters: what loading one a pod lacks costs (`crate::adapters`).
    pub adapters: crate::adapters::AdapterConfig,
    /// KV tiers beyond the GPU every pod keeps, fastest first (`crate::affinity::tiers`); empty:
    /// the GPU only.
    pub kv_tiers: Vec<crate::affinity::tiers::KvTier>,
    pub overload_guard: OverloadGuard,
    /// Among pods whose predictions tie, only those within this many requests of the least loaded
    /// one are equal candidates for rendezvous hashing.
    pub rendezvous_load_slack: f64,
    /// Prefix-index capacity per pod, in blocks, when the pod does not report `num_gpu_blocks`.
    pub default_pod_capacity_blocks: u32,
    /// Upper bound on per-pod index capacity, whatever the pod reports: bounds memory and shared data.
    pub max_pod_capacity_blocks: u32,
    /// Upper bound on the whole index, in blocks (every pod's capacity together): each VM keeps a
    /// copy, so this bounds a VM's memory in a large pool (each pod then tracks its share).
    pub max_index_blocks: u32,
    /// How many hosts `x-gateway-destination-endpoint` carries (primary + fallbacks).
    pub max_endpoints_in_header: usize,
    pub on_no_endpoint: NoEndpointPolicy,
    /// Adds `x-kvroute-debug` to responses (chosen pod, matched prefix, scores): to every
    /// response, or only to trusted requests carrying a token (`super::debug`).
    pub debug_header: super::debug::DebugHeaderWire,
    /// Time every filter callback into the `kvroute_phase_*_microseconds` histograms (two clock
    /// reads per callback): where the filter's cost goes inside Envoy.
    pub phase_timing: bool,
    /// Inference bodies larger than this are refused with 413 (kvroute reads a body whole to route
    /// it and to remove what a client must not set).
    pub max_body_bytes: usize,
    /// What parsing one body may hold (the rendered prompt and the buffers that put it in order);
    /// a routable body that needs more is refused with 413 `parse_budget_exceeded`. Absent: as
    /// much as `max_body_bytes` (an ordinary body's prompt is smaller than the body).
    pub max_parse_bytes: Option<usize>,
    /// A path prefix the inference paths may carry (`/openai`: `/openai/v1/chat/completions` is
    /// routed as chat); empty for none. The unprefixed paths are routed either way.
    pub api_path_prefix: String,
    /// Leave a client's `kv_transfer_params` in its body (only for trusted internal clients that
    /// run their own P/D protocol); otherwise kvroute removes it from every body it reads.
    pub trust_client_kv_transfer_params: bool,
    /// Pass on an inference body kvroute's strict JSON parse refuses (`NaN`, a byte order mark,
    /// UTF-16, nesting past 127, a lone surrogate: Python's `json` reads them), its
    /// `kv_transfer_params` taken out by a lenient scan; otherwise such a body is refused with
    /// 400 `unparseable_body`.
    pub passthrough_unparseable_bodies: bool,
    /// A lease not renewed for this long is taken over by another worker.
    pub leader_lease_ms: u64,
    /// Set only in the `envoy.bootstrap.wasm` singleton's configuration: it then always leads.
    pub singleton: bool,
    /// The pods' API key (vLLM, SGLang and llama.cpp `--api-key`), sent as `Authorization: Bearer
    /// <key>` on the leader's `/metrics` and `/v1/models` calls. Or `pod_api_key_env`: the name
    /// of an environment variable of the Wasm VM holding it (Envoy's
    /// `vm_config.environment_variables`), so the key need not sit in the plugin configuration.
    pub pod_api_key: Option<String>,
    pub pod_api_key_env: Option<String>,
    /// Prefill/decode disaggregation, used when a pool has the `decode` or `both` role.
    pub pd: crate::pd::PdConfig,
    /// Other gateway replicas in front of the same pods, told where this one placed prefixes
    /// (`crate::peers`).
    pub peers: crate::peers::PeersConfig,
    pub session: crate::scheduler::session::SessionConfig,
    pub shedding: crate::scheduler::saturation::SheddingConfig,
    /// Holding requests at the gateway while every pod is full (see `crate::admission`).
    pub flow_control: crate::admission::FlowControlConfig,
    pub slo: crate::scheduler::slo::SloConfig,
    /// Passive health: when pods whose requests fail are ejected (see `crate::health`).
    pub health: crate::health::HealthConfig,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            pools: Vec::new(),
            poll_cluster: "kvroute_poll".to_string(),
            admin_cluster: None,
            poll_interval_ms: 200,
            poll_timeout_ms: 1000,
            stale_after_ms: 2000,
            stored_response_ttl_ms: 24 * 3600 * 1000,
            discovery_interval_ms: 2000,
            models_poll_interval_ms: 10_000,
            block: BlockConfig::default(),
            prediction: Default::default(),
            adapters: Default::default(),
            kv_tiers: Vec::new(),
            overload_guard: OverloadGuard::default(),
            rendezvous_load_slack: 2.0,
            default_pod_capacity_blocks: 16384,
            max_pod_capacity_blocks: 65536,
            // 64 pods at the default 16,384 blocks: what the index could hold before pools of more
            // than 64 pods were allowed (~133 bytes a block, about 140 MB per VM at most).
            max_index_blocks: 1 << 20,
            max_endpoints_in_header: 3,
            on_no_endpoint: NoEndpointPolicy::Reject,
            debug_header: Default::default(),
            phase_timing: false,
            max_body_bytes: 8 * 1024 * 1024,
            max_parse_bytes: None,
            api_path_prefix: String::new(),
            trust_client_kv_transfer_params: false,
            passthrough_unparseable_bodies: false,
            leader_lease_ms: 1500,
            singleton: false,
            pod_api_key: None,
            pod_api_key_env: None,
            pd: crate::pd::PdConfig::default(),
            peers: Default::default(),
            session: Default::default(),
            shedding: Default::default(),
            flow_control: Default::default(),
            slo: Default::default(),
            health: Default::default(),
        }
    }
}
