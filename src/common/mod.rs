//! The vocabulary every configuration section and component shares: pod roles, header names,
//! how prompts are cut into blocks, credentials, and the error a section's check returns. A leaf:
//! it imports nothing of the crate, so any component may take its own section (`crate::pd`'s
//! `PdConfig`, `crate::health`'s `HealthConfig`, …) without importing the whole configuration
//! (`crate::config`, which assembles the sections and sits above them).

mod header_name;

pub use header_name::HeaderName;

use serde::Deserialize;
use std::fmt;

/// The role a pool plays in prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill and decode on the same pod.
    #[default]
    Aggregated,
    Prefill,
    Decode,
    /// Elastic P/D: a pod that prefills for others, decodes what others prefilled, or serves a
    /// request whole (vLLM's `kv_role: kv_both`). kvroute chooses per request which pod plays
    /// which part (`crate::pd`), so the prefill/decode ratio follows the traffic.
    Both,
}

impl Role {
    /// Whether a pod of this role decodes requests another pod prefilled.
    pub fn decodes_remote_prefills(self) -> bool {
        matches!(self, Role::Decode | Role::Both)
    }
}

/// How the prompt is cut into blocks for prefix matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NoEndpointPolicy {
    /// Answer 503 with a JSON error body.
    #[default]
    Reject,
    /// Let the cluster's own load balancer choose.
    Passthrough,
}

/// The overload guard of the picker (see `crate::scheduler` picker): a pod at the engine's cap on
/// running requests whose queue (requests not yet started) is this far above the shortest
/// candidate queue is ranked behind the others (the SGLang router's `balance_abs_threshold` /
/// `balance_rel_threshold` shape). Where no cap is known (configured or learned) it never fires:
/// below the cap a queue is prefill work, which the prediction prices.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct OverloadGuard {
    pub abs_gap: f64,
    pub rel_gap: f64,
    /// The engine's cap on requests running at once (vLLM's `--max-num-seqs`, SGLang's
    /// `--max-running-requests`, llama.cpp's `--parallel`), which no engine exports. A pod with
    /// that many requests is guarded by its queue: that queue waits for decodes, which the
    /// prediction does not see. Unset, each pod's cap is learned from its polls
    /// (`crate::pod::seats`), and until they show one the guard is off for it.
    pub max_running: Option<u32>,
}

impl OverloadGuard {
    /// The seat cap a pod is taken to have: `max_running` where configured, else what its polls
    /// showed (`learned`, `crate::pod::seats`).
    pub fn seats(&self, learned: Option<u32>) -> Option<u32> {
        self.max_running.or(learned)
    }
}

impl Default for OverloadGuard {
    fn default() -> Self {
        OverloadGuard {
            abs_gap: 8.0,
            rel_gap: 1.5,
            max_running: None,
        }
    }
}

/// How prompts are cut into blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Blocking {
    pub tokens_per_block: u32,
    /// Bytes per token, for chars-mode blocks and for estimating a prompt's tokens.
    pub chars_per_token: u32,
    pub scheme: BlockScheme,
}

impl Blocking {
    /// Bytes per block in chars mode.
    pub fn bytes(&self) -> usize {
        (self.tokens_per_block as usize) * (self.chars_per_token as usize)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockScheme {
    /// Blocks of `tokens_per_block × chars_per_token` bytes: cheap, tokenizer-free.
    Chars,
    /// Blocks of `tokens_per_block` real tokens (only in a build with the tiktoken tables).
    #[cfg(feature = "tiktoken")]
    Tiktoken(Encoding),
}

/// The tiktoken encodings kvroute carries.
#[cfg(feature = "tiktoken")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Cl100kBase,
    O200kBase,
}

#[cfg(feature = "tiktoken")]
impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::O200kBase => "o200k_base",
        }
    }
}

/// A credential: compared and cloned like a string, never printed (a configuration logged with
/// `{:?}` shows `Secret(…)`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(crate) String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this secret, in a time that depends on the lengths only: a client
    /// timing its guesses learns nothing of how many leading bytes it got right.
    pub fn matches(&self, candidate: &str) -> bool {
        same_secret(&self.0, candidate)
    }
}

/// Whether `candidate` equals `secret`, in a time that depends on the lengths only (see
/// [`Secret::matches`]); for tokens kept as plain strings (the replicas' `peers.token`).
pub fn same_secret(secret: &str, candidate: &str) -> bool {
    let (secret, candidate) = (secret.as_bytes(), candidate.as_bytes());
    let mut difference = secret.len() ^ candidate.len();
    for i in 0..secret.len().max(candidate.len()) {
        let a = secret.get(i).copied().unwrap_or(0);
        let b = candidate.get(i).copied().unwrap_or(0);
        difference |= usize::from(a ^ b);
    }
    std::hint::black_box(difference) == 0
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// The pod-count ceiling of one kvroute instance (all pools together). The prefix index keeps one
/// 64-bit mask per block and group of 64 pods that hold it, so this bounds the groups a lookup
/// walks; the leader polls every pod each interval, and `examples/scale_cost.rs` measures what
/// 8, 64 and 512 pods cost per tick and per request.
pub const MAX_PODS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    /// The value at `field` (its path, e.g. `pools[0].name`) is wrong because of `reason`.
    pub fn at(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
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

pub(crate) fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::at(field, reason)
}
/// A number that must be finite and at least `min`.
pub(crate) fn at_least(field: &str, value: f64, min: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= min {
        Ok(())
    } else {
        Err(err(field, format!("must be a finite number ≥ {min}")))
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
