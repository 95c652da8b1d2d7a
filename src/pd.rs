//! Prefill/decode disaggregation: whether a request gets a prefill pod in front of its decode pod.
//!
//! The decode pod is chosen first, exactly as an aggregated pod would be (predicted time to first
//! token, among decode and aggregated pods). Then the split is decided by cost, not by a threshold
//! (see `crate::router::Router::plan`):
//!
//! * **local** — the decode pod prefills the tokens it does not hold: its predicted TTFT, plus the
//!   harm to its streams: every sequence decoding there stalls for the prefill's length (on an idle
//!   decode pod, the next request it takes waits behind it: at least one).
//! * **split** — the best prefill pod's predicted TTFT (its queue and compute for the tokens *it*
//!   does not hold). Its cost model is learned from the split requests' own first bytes, so the KV
//!   transfer and the decode pod's first step are in it; the decode pod's streams are not stalled
//!   (the pull is asynchronous, as NIXL's reads are).
//!
//! The cheaper wins. So a short or mostly cached prompt stays local (the stall is short), a long one
//! beside running streams goes to a prefill pod, a long agent context that only the decode pod holds
//! stays there (a prefill pod would recompute it all), and a backed-up prefill pool sends prefills
//! back to decode pods with spare time while an idle one takes them: the rate matching that a fixed
//! threshold (the previous design: 512 uncached tokens scaled by the pools' queue ratio) only
//! approximated.
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
    /// Inline mode: how long the prefill call may take before the request falls back to decode-only.
    pub prefill_timeout_ms: u64,
    /// What a split costs beyond the prefill itself, before any split request was observed: the
    /// second request, the KV transfer's setup, the decode pod's first step. Added to the prior of
    /// prefill pods' cost models only; their fits learn the real figure from split requests' first
    /// bytes, transfer included.
    pub split_overhead_ms: f64,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            mode: PdMode::Sidecar,
            prefill_timeout_ms: 60_000,
            split_overhead_ms: 20.0,
        }
    }
}

impl PdConfig {
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.prefill_timeout_ms == 0 {
            return Err(("pd.prefill_timeout_ms", "must be positive"));
        }
        if !(self.split_overhead_ms.is_finite() && self.split_overhead_ms >= 0.0) {
            return Err(("pd.split_overhead_ms", "must be a finite number ≥ 0"));
        }
        Ok(())
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

/// The cost of prefilling on the decode pod: its predicted TTFT plus the stall it imposes on the
/// streams decoding there (at least one: the next request it takes waits too), in milliseconds.
pub fn local_cost_ms(ttft_ms: f64, prefill_ms: f64, decoding: f64) -> f64 {
    ttft_ms + decoding.max(1.0) * prefill_ms.max(0.0)
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
    fn validation_names_the_field() {
        let c = PdConfig {
            prefill_timeout_ms: 0,
            ..PdConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "pd.prefill_timeout_ms");
    }

    #[test]
    fn local_cost_counts_every_stalled_stream_and_at_least_one() {
        assert_eq!(local_cost_ms(100.0, 80.0, 0.0), 180.0);
        assert_eq!(local_cost_ms(100.0, 80.0, 10.0), 900.0);
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
