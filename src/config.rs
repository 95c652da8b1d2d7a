//! The plugin configuration: the JSON given as the Wasm filter's `configuration`.
//!
//! Parsing is strict (`deny_unknown_fields`) because a typo in a routing config should fail loudly
//! at load time, not silently route by defaults. Every error names the field and the reason; the host
//! glue prints it in Envoy's log and rejects the configuration.

use serde::Deserialize;
use std::fmt;

/// The role a pool plays in prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill and decode on the same pod.
    #[default]
    Aggregated,
    Prefill,
    Decode,
}

/// How the prompt is cut into blocks for prefix matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BlockMode {
    /// Blocks of `tokens_per_block × chars_per_token` bytes: cheap, tokenizer-free.
    #[default]
    Chars,
    /// Blocks of `tokens_per_block` real tokens from a tiktoken encoding (opt-in: ~16 MiB per VM).
    Tiktoken,
}

/// What to do when a request is routable but no pod passes the filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NoEndpointPolicy {
    /// Answer 503 with a JSON error body.
    #[default]
    Reject,
    /// Let the cluster's own load balancer choose.
    Passthrough,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
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

/// The overload guard of the picker (see `crate::scheduler` picker): a pod this far above the
/// least-loaded candidate, in requests, is ranked behind the others (the SGLang router's
/// `balance_abs_threshold` / `balance_rel_threshold` shape).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OverloadGuard {
    pub abs_gap: f64,
    pub rel_gap: f64,
}

impl Default for OverloadGuard {
    fn default() -> Self {
        OverloadGuard {
            abs_gap: 8.0,
            rel_gap: 1.5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
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
    /// How often cluster membership is re-read from the admin API.
    pub discovery_interval_ms: u64,
    /// How often each pod's `/v1/models` (aliases, LoRA adapters) is re-read; a new pod's is read
    /// at once.
    pub models_poll_interval_ms: u64,
    pub block: BlockConfig,
    /// The TTFT prediction the pods are ranked by (prior costs, tie band).
    pub prediction: crate::scheduler::predict::PredictionConfig,
    pub overload_guard: OverloadGuard,
    /// Among pods whose predictions tie, only those within this many requests of the least loaded
    /// one are equal candidates for rendezvous hashing.
    pub rendezvous_load_slack: f64,
    /// Prefix-index capacity per pod, in blocks, when the pod does not report `num_gpu_blocks`.
    pub default_pod_capacity_blocks: u32,
    /// Upper bound on per-pod index capacity, whatever the pod reports: bounds memory and shared data.
    pub max_pod_capacity_blocks: u32,
    /// How many hosts `x-gateway-destination-endpoint` carries (primary + fallbacks).
    pub max_endpoints_in_header: usize,
    pub on_no_endpoint: NoEndpointPolicy,
    /// Adds `x-kvroute-debug` to responses: chosen pod, matched prefix, scores.
    pub debug_header: bool,
    /// Inference bodies larger than this are refused with 413 (kvroute reads a body whole to route
    /// it and to remove what a client must not set).
    pub max_body_bytes: usize,
    /// Leave a client's `kv_transfer_params` in its body (only for trusted internal clients that
    /// run their own P/D protocol); otherwise kvroute removes it from every body it reads.
    pub trust_client_kv_transfer_params: bool,
    /// A lease not renewed for this long is taken over by another worker.
    pub leader_lease_ms: u64,
    /// Set only in the `envoy.bootstrap.wasm` singleton's configuration: it then always leads.
    pub singleton: bool,
    /// Prefill/decode disaggregation, used when a pool has the `decode` role.
    pub pd: crate::pd::PdConfig,
    pub session: crate::scheduler::session::SessionConfig,
    pub shedding: crate::scheduler::saturation::SheddingConfig,
    pub slo: crate::scheduler::slo::SloConfig,
    /// Passive health: when pods whose requests fail are ejected (see `crate::health`).
    pub health: crate::health::HealthConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pools: Vec::new(),
            poll_cluster: "kvroute_poll".to_string(),
            admin_cluster: None,
            poll_interval_ms: 200,
            poll_timeout_ms: 1000,
            stale_after_ms: 2000,
            discovery_interval_ms: 2000,
            models_poll_interval_ms: 10_000,
            block: BlockConfig::default(),
            prediction: Default::default(),
            overload_guard: OverloadGuard::default(),
            rendezvous_load_slack: 2.0,
            default_pod_capacity_blocks: 16384,
            max_pod_capacity_blocks: 65536,
            max_endpoints_in_header: 3,
            on_no_endpoint: NoEndpointPolicy::Reject,
            debug_header: false,
            max_body_bytes: 8 * 1024 * 1024,
            trust_client_kv_transfer_params: false,
            leader_lease_ms: 1500,
            singleton: false,
            pd: crate::pd::PdConfig::default(),
            session: Default::default(),
            shedding: Default::default(),
            slo: Default::default(),
            health: Default::default(),
        }
    }
}

/// The pod-count ceiling of one kvroute instance: the prefix index keeps a 64-bit pod mask per block.
pub const MAX_PODS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid kvroute configuration: field `{}`: {}",
            self.field, self.reason
        )
    }
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Parses and validates; an empty configuration means "all defaults, no pools" (pass-through).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let trimmed = String::from_utf8_lossy(bytes);
        if trimmed.trim().is_empty() {
            return Ok(Config::default());
        }
        let mut config: Config = serde_json::from_slice(bytes).map_err(|e| {
            // serde names unknown or mistyped fields in its message; keep it whole.
            err(field_from_serde(&e.to_string()), e.to_string())
        })?;
        // Envoy keeps header names lower-cased; `X-Session-Id` in a config means `x-session-id`.
        config.session.header.make_ascii_lowercase();
        config.shedding.priority_header.make_ascii_lowercase();
        config.slo.ttft_header.make_ascii_lowercase();
        config.slo.tpot_header.make_ascii_lowercase();
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut names = Vec::new();
        let mut static_members = 0usize;
        for (i, pool) in self.pools.iter().enumerate() {
            let at = |f: &str| format!("pools[{i}].{f}");
            if pool.name.trim().is_empty() {
                return Err(err(at("name"), "must not be empty"));
            }
            if names.contains(&pool.name) {
                return Err(err(
                    at("name"),
                    format!("duplicate pool name `{}`", pool.name),
                ));
            }
            names.push(pool.name.clone());
            match (&pool.cluster, pool.endpoints.is_empty()) {
                (Some(_), false) => {
                    return Err(err(at("endpoints"), "give either `endpoints` or `cluster`, not both"))
                }
                (None, true) => {
                    return Err(err(at("endpoints"), "a pool needs `endpoints` or `cluster`"))
                }
                (Some(c), true) if c.trim().is_empty() => {
                    return Err(err(at("cluster"), "must not be empty"))
                }
                (Some(_), true) if self.admin_cluster.is_none() => {
                    return Err(err(
                        "admin_cluster",
                        "required when a pool is given by `cluster` (membership is read from the admin API)",
                    ))
                }
                _ => {}
            }
            for (j, ep) in pool.endpoints.iter().enumerate() {
                if !is_host_port(ep) {
                    return Err(err(
                        format!("pools[{i}].endpoints[{j}]"),
                        format!("`{ep}` is not `ip:port`"),
                    ));
                }
            }
            static_members += pool.endpoints.len();
        }
        let has = |role: Role| self.pools.iter().any(|p| p.role == role);
        if has(Role::Prefill) && !has(Role::Decode) {
            return Err(err(
                "pools",
                "a `prefill` pool needs a `decode` pool to hand its KV cache to",
            ));
        }
        self.pd
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        self.session
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        self.slo
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        self.prediction
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        self.shedding
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        self.health
            .validate()
            .map_err(|(field, reason)| err(field, reason))?;
        if static_members > MAX_PODS {
            return Err(err(
                "pools",
                format!("at most {MAX_PODS} pods in all, got {static_members}"),
            ));
        }
        if self.poll_cluster.trim().is_empty() {
            return Err(err("poll_cluster", "must name an ORIGINAL_DST cluster"));
        }
        if self.poll_interval_ms < 10 {
            return Err(err("poll_interval_ms", "must be at least 10"));
        }
        if self.models_poll_interval_ms < 100 {
            return Err(err("models_poll_interval_ms", "must be at least 100"));
        }
        if self.poll_timeout_ms == 0 {
            return Err(err("poll_timeout_ms", "must be positive"));
        }
        if self.stale_after_ms <= self.poll_interval_ms {
            return Err(err(
                "stale_after_ms",
                "must be larger than poll_interval_ms",
            ));
        }
        if self.leader_lease_ms <= self.poll_interval_ms {
            return Err(err(
                "leader_lease_ms",
                "must be larger than poll_interval_ms",
            ));
        }
        if self.block.tokens_per_block == 0 || self.block.tokens_per_block > 1024 {
            return Err(err("block.tokens_per_block", "must be in 1..=1024"));
        }
        if self.block.chars_per_token == 0 || self.block.chars_per_token > 64 {
            return Err(err("block.chars_per_token", "must be in 1..=64"));
        }
        if self.block.mode == BlockMode::Tiktoken && !cfg!(feature = "tiktoken") {
            return Err(err(
                "block.mode",
                "this build of kvroute has no tiktoken tables (kvroute-lite.wasm): use kvroute.wasm, or `chars`",
            ));
        }
        if self.block.mode == BlockMode::Tiktoken
            && !matches!(self.block.encoding.as_str(), "cl100k_base" | "o200k_base")
        {
            return Err(err(
                "block.encoding",
                "must be `cl100k_base` or `o200k_base`",
            ));
        }
        if !self.overload_guard.abs_gap.is_finite() || self.overload_guard.abs_gap < 0.0 {
            return Err(err("overload_guard.abs_gap", "must be a finite number ≥ 0"));
        }
        if !self.overload_guard.rel_gap.is_finite() || self.overload_guard.rel_gap < 1.0 {
            return Err(err("overload_guard.rel_gap", "must be a finite number ≥ 1"));
        }
        if !self.rendezvous_load_slack.is_finite() || self.rendezvous_load_slack < 0.0 {
            return Err(err("rendezvous_load_slack", "must be a finite number ≥ 0"));
        }
        if self.default_pod_capacity_blocks == 0 {
            return Err(err("default_pod_capacity_blocks", "must be positive"));
        }
        if self.max_pod_capacity_blocks < self.default_pod_capacity_blocks {
            return Err(err(
                "max_pod_capacity_blocks",
                "must be at least default_pod_capacity_blocks",
            ));
        }
        if self.max_endpoints_in_header == 0 || self.max_endpoints_in_header > 8 {
            return Err(err("max_endpoints_in_header", "must be in 1..=8"));
        }
        if self.max_body_bytes == 0 {
            return Err(err("max_body_bytes", "must be positive"));
        }
        Ok(())
    }

    /// Bytes per block in chars mode.
    pub fn block_bytes(&self) -> usize {
        (self.block.tokens_per_block as usize) * (self.block.chars_per_token as usize)
    }
}

/// `ip:port` with a numeric port; the host part must not be empty.
pub fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(',')
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().map(|p| p > 0).unwrap_or(false)
        }
        None => false,
    }
}

/// serde_json says e.g. "unknown field `pols`, expected one of …": pull out the field's name.
fn field_from_serde(message: &str) -> String {
    message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field"))
        .unwrap_or("(document)")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_configuration_is_all_defaults() {
        let c = Config::parse(b"  ").unwrap();
        assert!(c.pools.is_empty());
        assert_eq!(c.block_bytes(), 64);
    }

    #[test]
    #[cfg(feature = "tiktoken")]
    fn a_full_configuration_parses() {
        let c = Config::parse(
            br#"{"pools":[{"name":"a","role":"decode","endpoints":["127.0.0.1:8000","10.0.0.2:9000"]},
                          {"name":"p","role":"prefill","cluster":"outbound|8000||p.svc"}],
                 "admin_cluster":"kvroute_admin","debug_header":true,
                 "prediction":{"prior":{"us_per_token":20}},"block":{"mode":"tiktoken","encoding":"o200k_base"}}"#,
        )
        .unwrap();
        assert_eq!(c.pools.len(), 2);
        assert_eq!(c.pools[1].role, Role::Prefill);
        assert_eq!(c.prediction.prior.us_per_token, 20.0);
        assert_eq!(
            c.prediction.prior.overhead_ms,
            crate::scheduler::cost::Coefficients::default().overhead_ms,
            "unset fields keep their defaults"
        );
        assert_eq!(c.block.mode, BlockMode::Tiktoken);
    }

    fn rejected(json: &str) -> ConfigError {
        Config::parse(json.as_bytes()).unwrap_err()
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = rejected(r#"{"pols":[]}"#);
        assert_eq!(e.field, "pols");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn malformed_json_is_rejected() {
        let e = rejected("{not json");
        assert_eq!(e.field, "(document)");
    }

    #[test]
    fn invalid_values_name_their_field() {
        assert_eq!(
            rejected(r#"{"pools":[{"name":"a","endpoints":["nope"]}]}"#).field,
            "pools[0].endpoints[0]"
        );
        assert_eq!(
            rejected(r#"{"pools":[{"name":"a"}]}"#).field,
            "pools[0].endpoints"
        );
        assert_eq!(
            rejected(r#"{"pools":[{"name":"a","cluster":"c"}]}"#).field,
            "admin_cluster"
        );
        assert_eq!(
            rejected(r#"{"pools":[{"name":"a","endpoints":["1.2.3.4:1"]},{"name":"a","endpoints":["1.2.3.4:2"]}]}"#)
                .field,
            "pools[1].name"
        );
        assert_eq!(
            rejected(r#"{"prediction":{"prior":{"us_per_token":-1}}}"#).field,
            "prediction.prior.us_per_token"
        );
        assert_eq!(
            rejected(r#"{"poll_interval_ms":5}"#).field,
            "poll_interval_ms"
        );
        assert_eq!(
            rejected(r#"{"stale_after_ms":100}"#).field,
            "stale_after_ms"
        );
        assert_eq!(
            rejected(r#"{"block":{"tokens_per_block":0}}"#).field,
            "block.tokens_per_block"
        );
        let tiktoken_field = if cfg!(feature = "tiktoken") {
            "block.encoding"
        } else {
            "block.mode" // a build without tiktoken refuses the mode before its encoding
        };
        assert_eq!(
            rejected(r#"{"block":{"mode":"tiktoken","encoding":"gpt2"}}"#).field,
            tiktoken_field
        );
        assert_eq!(
            rejected(r#"{"overload_guard":{"rel_gap":0.5}}"#).field,
            "overload_guard.rel_gap"
        );
        assert_eq!(
            rejected(r#"{"prediction":{"tie_band":2}}"#).field,
            "prediction.tie_band"
        );
        assert_eq!(
            rejected(r#"{"weights":{"prefix":3}}"#).field,
            "weights",
            "the weighted scorers are gone: a configuration that sets them is told so"
        );
    }

    #[test]
    fn host_port_syntax() {
        assert!(is_host_port("127.0.0.1:80"));
        assert!(is_host_port("[::1]:80"));
        assert!(!is_host_port("127.0.0.1"));
        assert!(!is_host_port("127.0.0.1:0"));
        assert!(!is_host_port("127.0.0.1:99999"));
        assert!(!is_host_port(":80"));
        assert!(!is_host_port("a,b:80"));
    }

    #[test]
    fn prefill_decode_settings_are_checked() {
        assert_eq!(
            rejected(r#"{"pools":[{"name":"p","role":"prefill","endpoints":["1.2.3.4:1"]}]}"#)
                .field,
            "pools"
        );
        assert_eq!(
            rejected(r#"{"pd":{"mode":"telepathy"}}"#).field,
            "(document)"
        );
        assert_eq!(
            rejected(r#"{"pd":{"prefill_timeout_ms":0}}"#).field,
            "pd.prefill_timeout_ms"
        );
        let c = Config::parse(
            br#"{"pools":[{"name":"p","role":"prefill","endpoints":["1.2.3.4:1"]},
                          {"name":"d","role":"decode","endpoints":["1.2.3.4:2"]}],
                 "pd":{"mode":"inline","split_overhead_ms":5}}"#,
        )
        .unwrap();
        assert_eq!(c.pd.mode, crate::pd::PdMode::Inline);
        assert_eq!(c.pd.split_overhead_ms, 5.0);
        assert_eq!(
            rejected(r#"{"pd":{"threshold_tokens":1000}}"#).field,
            "threshold_tokens",
            "the threshold is gone (decided by cost): a configuration that sets it is told so"
        );
    }

    #[test]
    fn session_and_shedding_settings_are_checked() {
        for (json, field) in [
            (r#"{"session":{"header":"x session"}}"#, "session.header"),
            (
                r#"{"shedding":{"priority_header":":path"}}"#,
                "shedding.priority_header",
            ),
            (r#"{"shedding":{"kv_cache":1.5}}"#, "shedding.kv_cache"),
            (r#"{"shedding":{"queue_depth":0}}"#, "shedding.queue_depth"),
            (r#"{"session":{"cookie":"x"}}"#, "cookie"),
        ] {
            assert_eq!(rejected(json).field, field, "{json}");
        }
        let off = Config::parse(br#"{"session":{"header":""},"shedding":{"priority_header":""}}"#)
            .unwrap();
        assert!(off.session.header.is_empty() && off.shedding.priority_header.is_empty());
        let mixed = Config::parse(br#"{"session":{"header":"X-Session-Id"}}"#).unwrap();
        assert_eq!(mixed.session.header, "x-session-id");
    }
}
