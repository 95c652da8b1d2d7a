//! The plugin configuration, in two phases: the wire form (`wire`: the JSON as serde reads it,
//! strict about unknown fields) is compiled into the runtime form below, in which what was checked
//! cannot be wrong any more: header names are normalised [`HeaderName`]s, a feature that is off is
//! `None`, a pool has static members or a cluster (never both, never neither), and the tiktoken
//! block scheme exists only in a build that has a tokenizer. Every check names the field's path and
//! the reason (`ConfigError`); the host glue prints it in Envoy's log and rejects the configuration.
//! Each component checks its own section (`crate::pd`, `crate::health`, `crate::scheduler::*`).

pub mod debug;
pub mod wire;

#[cfg(feature = "tiktoken")]
pub use crate::common::Encoding;
pub use crate::common::{
    is_host_port, same_secret, BlockMode, BlockScheme, Blocking, ConfigError, HeaderName,
    NoEndpointPolicy, OverloadGuard, Role, Secret, MAX_PODS,
};

pub(crate) use crate::common::at_least;
use crate::common::err;
use wire::WireConfig;

/// A pool as routing sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    pub role: Role,
    pub members: Members,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Members {
    /// `ip:port` each.
    Static(Vec<String>),
    /// An Envoy cluster whose members are read from the admin API.
    Cluster(String),
}

/// The runtime configuration (see the module header); fields without a comment mean what their
/// wire field does (`wire::WireConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub pools: Vec<Pool>,
    pub poll_cluster: String,
    /// Present whenever a pool is given by cluster.
    pub admin_cluster: Option<String>,
    pub poll_interval_ms: u64,
    pub poll_timeout_ms: u64,
    pub stale_after_ms: u64,
    pub stored_response_ttl_ms: u64,
    pub discovery_interval_ms: u64,
    pub models_poll_interval_ms: u64,
    pub block: Blocking,
    pub prediction: crate::scheduler::predict::PredictionConfig,
    pub adapters: crate::adapters::AdapterConfig,
    pub kv_tiers: Vec<crate::affinity::tiers::KvTier>,
    pub overload_guard: OverloadGuard,
    pub rendezvous_load_slack: f64,
    pub default_pod_capacity_blocks: u32,
    pub max_pod_capacity_blocks: u32,
    pub max_index_blocks: u32,
    pub max_endpoints_in_header: usize,
    pub on_no_endpoint: NoEndpointPolicy,
    /// The debug line is built: for every request, or with `debug_trigger` only for requests
    /// carrying its token.
    pub debug_header: bool,
    pub debug_trigger: Option<debug::DebugTrigger>,
    pub phase_timing: bool,
    pub max_body_bytes: usize,
    /// The parse budget: `max_parse_bytes`, or `max_body_bytes` when not set.
    pub max_parse_bytes: usize,
    pub api_path_prefix: String,
    pub trust_client_kv_transfer_params: bool,
    pub passthrough_unparseable_bodies: bool,
    pub leader_lease_ms: u64,
    pub singleton: bool,
    /// `Authorization` for the leader's calls to pods (`pod_api_key` or `pod_api_key_env`).
    pub pod_authorization: Option<Secret>,
    pub pd: crate::pd::PdConfig,
    pub peers: crate::peers::PeersConfig,
    pub session: crate::scheduler::session::Session,
    pub shedding: crate::scheduler::saturation::Shedding,
    /// `None`: flow control is off.
    pub flow_control: Option<crate::admission::FlowControl>,
    pub slo: crate::scheduler::slo::SloHeaders,
    pub health: crate::health::HealthConfig,
}

/// `Bearer <key>` from `pod_api_key`, or from the VM's environment variable `pod_api_key_env`.
/// The polling section: a cluster to poll through, intervals and timeouts that fit each other.
fn check_polling(w: &WireConfig) -> Result<(), ConfigError> {
    if w.poll_cluster.trim().is_empty() {
        return Err(err("poll_cluster", "must name an ORIGINAL_DST cluster"));
    }
    if w.poll_interval_ms < 10 {
        return Err(err("poll_interval_ms", "must be at least 10"));
    }
    if w.models_poll_interval_ms < 100 {
        return Err(err("models_poll_interval_ms", "must be at least 100"));
    }
    if w.poll_timeout_ms == 0 {
        return Err(err("poll_timeout_ms", "must be positive"));
    }
    if w.stale_after_ms <= w.poll_interval_ms {
        return Err(err(
            "stale_after_ms",
            "must be larger than poll_interval_ms",
        ));
    }
    if w.leader_lease_ms <= w.poll_interval_ms {
        return Err(err(
            "leader_lease_ms",
            "must be larger than poll_interval_ms",
        ));
    }
    Ok(())
}

/// Sizes and bounds: pod and index capacities, endpoints in the header, body budgets.
fn check_sizes(w: &WireConfig) -> Result<(), ConfigError> {
    if w.default_pod_capacity_blocks == 0 {
        return Err(err("default_pod_capacity_blocks", "must be positive"));
    }
    if w.max_pod_capacity_blocks < w.default_pod_capacity_blocks {
        return Err(err(
            "max_pod_capacity_blocks",
            "must be at least default_pod_capacity_blocks",
        ));
    }
    if w.max_index_blocks == 0 {
        return Err(err("max_index_blocks", "must be positive"));
    }
    if w.max_endpoints_in_header == 0 || w.max_endpoints_in_header > 8 {
        return Err(err("max_endpoints_in_header", "must be in 1..=8"));
    }
    if w.max_body_bytes == 0 {
        return Err(err("max_body_bytes", "must be positive"));
    }
    if w.max_parse_bytes == Some(0) {
        return Err(err("max_parse_bytes", "must be positive"));
    }
    Ok(())
}

/// `api_path_prefix`: empty, or a path such as `/openai`.
fn check_api_path_prefix(prefix: &str) -> Result<(), ConfigError> {
    if !prefix.is_empty()
        && (!prefix.starts_with('/') || prefix.ends_with('/') || prefix.contains(['?', '#', ' ']))
    {
        return Err(err(
            "api_path_prefix",
            "must be empty or a path such as `/openai`: starting with `/`, not ending with one, without `?`, `#` or spaces",
        ));
    }
    Ok(())
}

fn compile_pod_authorization(w: &wire::WireConfig) -> Result<Option<Secret>, ConfigError> {
    let key = match (&w.pod_api_key, &w.pod_api_key_env) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::at(
                "pod_api_key_env",
                "set pod_api_key or pod_api_key_env, not both",
            ))
        }
        (Some(key), None) => key.clone(),
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            ConfigError::at(
                "pod_api_key_env",
                format!("the Wasm VM has no environment variable `{var}` (set it in vm_config.environment_variables)"),
            )
        })?,
        (None, None) => return Ok(None),
    };
    let key = key.trim();
    // A header value is visible ASCII: a key with a line break would split the request.
    if key.is_empty() || !key.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(ConfigError::at(
            "pod_api_key",
            "must be a non-empty key of visible ASCII characters",
        ));
    }
    Ok(Some(Secret(format!("Bearer {key}"))))
}

/// The JSON Schema (draft 2020-12) of the configuration, derived from the wire types with their
/// serde attributes (unknown fields refused, defaults, enum spellings) and doc comments, so it
/// cannot drift from what `Config::parse` reads. It checks shape only: the cross-field rules of
/// `Config::compile` (a pool has members or a cluster, a prefill pool needs a decode pool, …) stay
/// in the parser.
#[cfg(feature = "schema")]
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(WireConfig).to_value();
    if let Some(object) = schema.as_object_mut() {
        object.insert("title".into(), "kvroute configuration".into());
    }
    schema
}

/// By hand: `debug_header` is read by a hand-written deserializer (true/false or an object), which
/// no derive can describe. Mirrors `debug::TriggerWire`'s fields; a field added there and used in
/// a shipped configuration fails the schema test (e2e/tests/config_check.rs).
#[cfg(feature = "schema")]
impl schemars::JsonSchema for debug::DebugHeaderWire {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DebugHeader".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`x-kvroute-debug` on every response (`true`; only for a gateway no untrusted client reaches), on none (`false`), or only on requests carrying `trigger_header` with the token (`token`, or `token_env`: the Wasm VM's environment variable holding it).",
            "default": false,
            "anyOf": [
                {"type": "boolean"},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "trigger_header": {"type": "string", "default": debug::DEFAULT_TRIGGER_HEADER},
                        "token": {"type": ["string", "null"]},
                        "token_env": {"type": ["string", "null"]}
                    }
                }
            ]
        })
    }
}

impl Config {
    /// The sections the selection reads (`crate::scheduler::decide`).
    pub fn selection(&self) -> crate::scheduler::SelectionConfig<'_> {
        crate::scheduler::SelectionConfig {
            shedding: &self.shedding,
            flow_control: self.flow_control.as_ref(),
            overload_guard: &self.overload_guard,
            tie_band: self.prediction.tie_band,
            rendezvous_load_slack: self.rendezvous_load_slack,
            session_max_slowdown: self.session.max_slowdown,
            max_endpoints_in_header: self.max_endpoints_in_header,
        }
    }

    /// Parses the wire form and compiles it; an empty configuration means "all defaults, no pools"
    /// (pass-through).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = String::from_utf8_lossy(bytes);
        let wire: WireConfig = if text.trim().is_empty() {
            WireConfig::default()
        } else {
            serde_json::from_slice(bytes).map_err(|e| {
                // serde names unknown or mistyped fields in its message; keep it whole.
                err(field_from_serde(&e.to_string()), e.to_string())
            })?
        };
        Config::compile(&wire)
    }

    /// Checks the wire form and builds the runtime form.
    pub fn compile(w: &WireConfig) -> Result<Config, ConfigError> {
        let pools = compile_pools(w)?;
        let has = |role: Role| pools.iter().any(|p| p.role == role);
        if has(Role::Prefill) && !has(Role::Decode) && !has(Role::Both) {
            return Err(err(
                "pools",
                "a `prefill` pool needs a `decode` or `both` pool to hand its KV cache to",
            ));
        }
        w.pd.validate()?;
        w.peers.validate(w.admin_cluster.as_deref())?;
        w.prediction.validate()?;
        w.adapters.validate()?;
        crate::affinity::tiers::validate(&w.kv_tiers)?;
        w.health.validate()?;
        check_polling(w)?;
        at_least("overload_guard.abs_gap", w.overload_guard.abs_gap, 0.0)?;
        at_least("overload_guard.rel_gap", w.overload_guard.rel_gap, 1.0)?;
        at_least("rendezvous_load_slack", w.rendezvous_load_slack, 0.0)?;
        check_sizes(w)?;
        let (debug_header, debug_trigger) = debug::compile(&w.debug_header)?;
        check_api_path_prefix(&w.api_path_prefix)?;
        Ok(Config {
            pools,
            poll_cluster: w.poll_cluster.clone(),
            admin_cluster: w.admin_cluster.clone(),
            poll_interval_ms: w.poll_interval_ms,
            poll_timeout_ms: w.poll_timeout_ms,
            stale_after_ms: w.stale_after_ms,
            stored_response_ttl_ms: w.stored_response_ttl_ms,
            discovery_interval_ms: w.discovery_interval_ms,
            models_poll_interval_ms: w.models_poll_interval_ms,
            block: compile_blocking(&w.block)?,
            prediction: w.prediction.clone(),
            adapters: w.adapters.clone(),
            kv_tiers: w.kv_tiers.clone(),
            overload_guard: w.overload_guard.clone(),
            rendezvous_load_slack: w.rendezvous_load_slack,
            default_pod_capacity_blocks: w.default_pod_capacity_blocks,
            max_pod_capacity_blocks: w.max_pod_capacity_blocks,
            max_index_blocks: w.max_index_blocks,
            max_endpoints_in_header: w.max_endpoints_in_header,
            on_no_endpoint: w.on_no_endpoint,
            debug_header,
            debug_trigger,
            phase_timing: w.phase_timing,
            max_body_bytes: w.max_body_bytes,
            max_parse_bytes: w.max_parse_bytes.unwrap_or(w.max_body_bytes),
            api_path_prefix: w.api_path_prefix.clone(),
            trust_client_kv_transfer_params: w.trust_client_kv_transfer_params,
            passthrough_unparseable_bodies: w.passthrough_unparseable_bodies,
            leader_lease_ms: w.leader_lease_ms,
            singleton: w.singleton,
            pod_authorization: compile_pod_authorization(w)?,
            pd: w.pd.compiled(),
            peers: w.peers.clone(),
            session: w.session.compile()?,
            shedding: w.shedding.compile()?,
            flow_control: w.flow_control.compile()?,
            slo: w.slo.compile()?,
            health: w.health.clone(),
        })
    }

    /// The parse budget (see `max_parse_bytes`).
    pub fn parse_budget(&self) -> usize {
        self.max_parse_bytes
    }

    /// What the learned costs are configured with (see `crate::cost`).
    pub fn costs(&self) -> crate::cost::CostSettings {
        crate::cost::CostSettings {
            learning: self.prediction.learning(),
            split_overhead_ms: self.pd.split_overhead_ms,
        }
    }
}

/// The defaults, as an empty configuration gives them (tests and tools).
#[cfg(test)]
impl Default for Config {
    fn default() -> Self {
        Config::parse(b"").expect("the defaults compile")
    }
}

fn compile_pools(w: &WireConfig) -> Result<Vec<Pool>, ConfigError> {
    let mut pools: Vec<Pool> = Vec::new();
    let mut static_members = 0usize;
    for (i, pool) in w.pools.iter().enumerate() {
        let at = |f: &str| format!("pools[{i}].{f}");
        if pool.name.trim().is_empty() {
            return Err(err(at("name"), "must not be empty"));
        }
        if pools.iter().any(|p| p.name == pool.name) {
            return Err(err(
                at("name"),
                format!("duplicate pool name `{}`", pool.name),
            ));
        }
        let members = match (&pool.cluster, pool.endpoints.is_empty()) {
            (Some(_), false) => {
                return Err(err(at("endpoints"), "give either `endpoints` or `cluster`, not both"))
            }
            (None, true) => return Err(err(at("endpoints"), "a pool needs `endpoints` or `cluster`")),
            (Some(c), true) if c.trim().is_empty() => {
                return Err(err(at("cluster"), "must not be empty"))
            }
            (Some(_), true) if w.admin_cluster.is_none() => {
                return Err(err(
                    "admin_cluster",
                    "required when a pool is given by `cluster` (membership is read from the admin API)",
                ))
            }
            (Some(c), true) => Members::Cluster(c.clone()),
            (None, false) => {
                for (j, ep) in pool.endpoints.iter().enumerate() {
                    if !is_host_port(ep) {
                        return Err(err(
                            format!("pools[{i}].endpoints[{j}]"),
                            format!("`{ep}` is not `ip:port`"),
                        ));
                    }
                }
                static_members += pool.endpoints.len();
                Members::Static(pool.endpoints.clone())
            }
        };
        pools.push(Pool {
            name: pool.name.clone(),
            role: pool.role,
            members,
        });
    }
    if static_members > MAX_PODS {
        return Err(err(
            "pools",
            format!("at most {MAX_PODS} pods in all, got {static_members}"),
        ));
    }
    Ok(pools)
}

fn compile_blocking(b: &wire::BlockConfig) -> Result<Blocking, ConfigError> {
    if b.tokens_per_block == 0 || b.tokens_per_block > 1024 {
        return Err(err("block.tokens_per_block", "must be in 1..=1024"));
    }
    if b.chars_per_token == 0 || b.chars_per_token > 64 {
        return Err(err("block.chars_per_token", "must be in 1..=64"));
    }
    let scheme = match b.mode {
        BlockMode::Chars => BlockScheme::Chars,
        #[cfg(feature = "tiktoken")]
        BlockMode::Tiktoken => BlockScheme::Tiktoken(match b.encoding.as_str() {
            "cl100k_base" => Encoding::Cl100kBase,
            "o200k_base" => Encoding::O200kBase,
            _ => {
                return Err(err(
                    "block.encoding",
                    "must be `cl100k_base` or `o200k_base`",
                ))
            }
        }),
        #[cfg(not(feature = "tiktoken"))]
        BlockMode::Tiktoken => {
            return Err(err(
                "block.mode",
                "this build of kvroute has no tiktoken tables (kvroute-lite.wasm): use kvroute.wasm, or `chars`",
            ))
        }
    };
    Ok(Blocking {
        tokens_per_block: b.tokens_per_block,
        chars_per_token: b.chars_per_token,
        scheme,
    })
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
        assert_eq!(c.block.bytes(), 64);
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
            crate::cost::Coefficients::default().overhead_ms,
            "unset fields keep their defaults"
        );
        assert_eq!(c.block.scheme, BlockScheme::Tiktoken(Encoding::O200kBase));
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
    fn the_pods_api_key_is_checked_and_never_printed() {
        let c = Config::parse(br#"{"pod_api_key":"sk-pool-123"}"#).unwrap();
        let auth = c.pod_authorization.as_ref().unwrap();
        assert_eq!(auth.expose(), "Bearer sk-pool-123");
        assert!(!format!("{c:?}").contains("sk-pool-123"), "redacted");
        assert_eq!(Config::default().pod_authorization, None);
        assert_eq!(
            rejected(r#"{"pod_api_key":"a","pod_api_key_env":"B"}"#).field,
            "pod_api_key_env"
        );
        assert_eq!(
            rejected(r#"{"pod_api_key":"line\nbreak"}"#).field,
            "pod_api_key"
        );
        let missing = rejected(r#"{"pod_api_key_env":"KVROUTE_TEST_NO_SUCH_VARIABLE"}"#);
        assert_eq!(missing.field, "pod_api_key_env");
        assert!(
            missing.reason.contains("environment_variables"),
            "{missing}"
        );
        assert_eq!(
            rejected(r#"{"pd":{"forward_headers":["authorization","bad header"]}}"#).field,
            "pd.forward_headers[1]"
        );
        let c = Config::parse(br#"{"pd":{"forward_headers":["Authorization"]}}"#).unwrap();
        assert_eq!(c.pd.forward_headers, vec!["authorization".to_string()]);
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
        assert!(off.session.header.is_none() && off.shedding.priority_header.is_none());
        let mixed = Config::parse(br#"{"session":{"header":"X-Session-Id"}}"#).unwrap();
        assert_eq!(
            mixed.session.header.as_ref().map(HeaderName::as_str),
            Some("x-session-id")
        );
    }
}
