//! Prefill/decode disaggregation: whether a request gets a prefill pod in front of its decode pod.
//!
//! The decode pod is chosen first, exactly as an aggregated pod would be (prefix affinity + load,
//! among decode and aggregated pods). What the decode pod would still have to compute is the prompt
//! minus the blocks it already holds; only when that exceeds the threshold, and a healthy prefill
//! pod exists, is the prefill sent to a prefill pod (chosen by its own prefix match and queue). A
//! short or mostly cached prompt costs the decode pod little, and a transfer would cost more.
//!
//! A prefill pod that does not hold the prompt's prefix would recompute all of it: when it would
//! compute more than `max_prefill_work_ratio` times the tokens the decode pod has left (a long
//! agent context the decode pod holds but no prefill pod does), the decode pod prefills locally.
//!
//! The threshold adapts to the two pools' relative pressure, measured as the mean number of queued
//! (waiting) requests per pod: it is the configured base scaled by (1 + prefill queue) / (1 +
//! decode queue), within configured bounds. A saturated prefill pool raises it (keep more prefills
//! local), a backed-up decode pool lowers it. Queues, not running counts: a decode pod always runs
//! every stream it holds, a prefill pod only the prefills in progress, so running counts would make
//! the decode pool look busier by construction and pin the threshold at its floor.
//!
//! Execution, in either of two modes:
//! * `sidecar` — the llm-d contract: route to the decode pod with `x-prefiller-host-port`; the
//!   routing sidecar in the decode pod calls the prefiller, then its local decoder.
//! * `inline` — no sidecar: kvroute itself sends the request to the prefill pod with `max_tokens: 1`,
//!   `stream: false` and `kv_transfer_params.do_remote_decode = true`, copies the `kv_transfer_params`
//!   of its answer into the original body, and routes that to the decode pod.

use crate::config::Role;
use serde::Deserialize;
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PdMode {
    #[default]
    Sidecar,
    Inline,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PdConfig {
    pub mode: PdMode,
    /// Uncached prompt tokens above which a request is disaggregated, before adaptation.
    pub threshold_tokens: f64,
    pub min_threshold_tokens: f64,
    pub max_threshold_tokens: f64,
    /// Inline mode: how long the prefill call may take before the request falls back to decode-only.
    pub prefill_timeout_ms: u64,
    /// Disaggregate only if the prefill pod's uncached tokens are at most this multiple of the
    /// decode pod's.
    pub max_prefill_work_ratio: f64,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            mode: PdMode::Sidecar,
            threshold_tokens: 512.0,
            min_threshold_tokens: 128.0,
            max_threshold_tokens: 8192.0,
            prefill_timeout_ms: 60_000,
            max_prefill_work_ratio: 2.0,
        }
    }
}

impl PdConfig {
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        let finite_non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !finite_non_negative(self.min_threshold_tokens) {
            return Err(("pd.min_threshold_tokens", "must be a finite number ≥ 0"));
        }
        if !finite_non_negative(self.max_threshold_tokens)
            || self.max_threshold_tokens < self.min_threshold_tokens
        {
            return Err((
                "pd.max_threshold_tokens",
                "must be finite and ≥ pd.min_threshold_tokens",
            ));
        }
        if !finite_non_negative(self.threshold_tokens)
            || self.threshold_tokens < self.min_threshold_tokens
            || self.threshold_tokens > self.max_threshold_tokens
        {
            return Err((
                "pd.threshold_tokens",
                "must lie between the min and max thresholds",
            ));
        }
        if !self.max_prefill_work_ratio.is_finite() || self.max_prefill_work_ratio < 1.0 {
            return Err(("pd.max_prefill_work_ratio", "must be a finite number ≥ 1"));
        }
        if self.prefill_timeout_ms == 0 {
            return Err(("pd.prefill_timeout_ms", "must be positive"));
        }
        Ok(())
    }

    /// The threshold for the current pressure of the two pools (mean queued requests per pod).
    pub fn threshold(&self, prefill_queue: f64, decode_queue: f64) -> f64 {
        let ratio = (1.0 + prefill_queue.max(0.0)) / (1.0 + decode_queue.max(0.0));
        (self.threshold_tokens * ratio).clamp(self.min_threshold_tokens, self.max_threshold_tokens)
    }
}

/// Mean load per pod of a role among the given (role, load) pairs; 0 when the role has no pods.
pub fn mean_load(pods: &[(Role, f64)], role: Role) -> f64 {
    let loads: Vec<f64> = pods
        .iter()
        .filter(|(r, _)| *r == role)
        .map(|(_, l)| *l)
        .collect();
    if loads.is_empty() {
        0.0
    } else {
        loads.iter().sum::<f64>() / loads.len() as f64
    }
}

/// Prompt tokens the decode pod would still compute.
pub fn uncached_tokens(prompt_tokens: u64, matched_blocks: usize, tokens_per_block: u32) -> u64 {
    prompt_tokens.saturating_sub(matched_blocks as u64 * u64::from(tokens_per_block))
}

/// The body sent to the prefill pod (inline mode): the client's request, asked for one token,
/// non-streaming, with the NixlConnector's "prefill for a remote decoder" parameters.
pub fn prefill_body(original: &Map<String, Value>) -> Vec<u8> {
    let mut body = original.clone();
    body.insert("max_tokens".into(), json!(1));
    if body.contains_key("max_completion_tokens") {
        body.insert("max_completion_tokens".into(), json!(1));
    }
    body.insert("stream".into(), json!(false));
    body.remove("stream_options");
    body.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
    );
    serde_json::to_vec(&Value::Object(body)).unwrap_or_default()
}

/// The `kv_transfer_params` object of a prefill pod's answer, if it has one.
pub fn transfer_params(prefill_response: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(prefill_response).ok()?;
    v.get("kv_transfer_params")
        .filter(|p| p.is_object())
        .cloned()
}

/// The client's body with the prefill's `kv_transfer_params` written in, for the decode pod.
pub fn decode_body(original: &Map<String, Value>, params: Value) -> Vec<u8> {
    let mut body = original.clone();
    body.insert("kv_transfer_params".into(), params);
    serde_json::to_vec(&Value::Object(body)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_follows_pressure_within_bounds() {
        let c = PdConfig::default();
        assert_eq!(c.threshold(0.0, 0.0), 512.0);
        assert!(
            c.threshold(8.0, 0.0) > 512.0,
            "a busy prefill pool keeps more prefills local"
        );
        assert!(
            c.threshold(0.0, 8.0) < 512.0,
            "a busy decode pool sheds prefill work"
        );
        assert_eq!(c.threshold(1e9, 0.0), 8192.0);
        assert_eq!(c.threshold(0.0, 1e9), 128.0);
    }

    #[test]
    fn validation_names_the_field() {
        let c = PdConfig {
            threshold_tokens: 1e6,
            ..PdConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "pd.threshold_tokens");
        let c = PdConfig {
            prefill_timeout_ms: 0,
            ..PdConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "pd.prefill_timeout_ms");
    }

    #[test]
    fn uncached_tokens_and_mean_load() {
        assert_eq!(uncached_tokens(1000, 10, 16), 840);
        assert_eq!(uncached_tokens(100, 10, 16), 0);
        let pods = [
            (Role::Prefill, 4.0),
            (Role::Prefill, 2.0),
            (Role::Decode, 1.0),
        ];
        assert_eq!(mean_load(&pods, Role::Prefill), 3.0);
        assert_eq!(mean_load(&pods, Role::Aggregated), 0.0);
    }

    #[test]
    fn bodies_follow_the_nixl_protocol() {
        let original: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","prompt":"p","max_tokens":100,"max_completion_tokens":100,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        let p: Value = serde_json::from_slice(&prefill_body(&original)).unwrap();
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["max_completion_tokens"], 1);
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["remote_block_ids"], Value::Null);
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600}}"#;
        let params = transfer_params(answer).unwrap();
        let d: Value = serde_json::from_slice(&decode_body(&original, params)).unwrap();
        assert_eq!(
            d["max_tokens"], 100,
            "the decode request is the client's own"
        );
        assert_eq!(d["stream"], true);
        assert_eq!(d["kv_transfer_params"]["remote_block_ids"], json!([1, 2]));
        assert_eq!(transfer_params(b"{\"choices\":[]}"), None);
        assert_eq!(transfer_params(b"garbage"), None);
    }
}
