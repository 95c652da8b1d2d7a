//! Inline mode: kvroute itself asks the prefill pod for the KV and hands the decode pod its handle.
//!
//! The prefill request is the client's own, asked for one token, not streamed, with the
//! NixlConnector's "prefill for a remote decoder" parameters; the answer's `kv_transfer_params`
//! are written into the client's body for the decode pod. What the answer means for the request:
//! a 4xx is the request's own fault and goes back to the client as is, but for 401/403 (kvroute's
//! call lacked a credential) and 429 (the prefill pod is busy, which says nothing of the request);
//! anything else without a KV handle (a failure, a timeout: the host answers 503/504) falls back to
//! decode-only.

use crate::headers::DESTINATION;
use crate::health::Verdict;
use crate::port::HttpCall;
use crate::protocol::body::{edit, Change};
use serde_json::Value;

/// kvroute's own KV handle request: "prefill for a remote decoder".
const PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The body sent to the prefill pod (inline mode): the client's request (a JSON object the
/// request parser accepted), asked for one token, non-streaming, with the NixlConnector's
/// "prefill for a remote decoder" parameters. Every other member is the client's, byte for byte.
pub fn prefill_body(original: &[u8]) -> Vec<u8> {
    edit(
        original,
        &[
            ("max_tokens", Change::Set("1")),
            ("max_completion_tokens", Change::SetIfPresent("1")),
            ("stream", Change::Set("false")),
            ("stream_options", Change::Remove),
            ("kv_transfer_params", Change::Set(PREFILL_PARAMS)),
        ],
    )
    .unwrap_or_default()
}

/// The `kv_transfer_params` object of a prefill pod's answer, if it has one.
pub fn transfer_params(prefill_response: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(prefill_response).ok()?;
    v.get("kv_transfer_params")
        .filter(|p| p.is_object())
        .cloned()
}

/// The client's body with the prefill's `kv_transfer_params` written in, for the decode pod.
pub fn decode_body(original: &[u8], params: &Value) -> Vec<u8> {
    let params = params.to_string();
    edit(original, &[("kv_transfer_params", Change::Set(&params))]).unwrap_or_default()
}

/// The call that asks `prefill_addr` to prefill (through the ORIGINAL_DST cluster `cluster`),
/// carrying the client's `forwarded` headers (`pd.forward_headers`: its API key, its trace).
pub fn prefill_call(
    cluster: &str,
    path: &str,
    prefill_addr: &str,
    original: &[u8],
    forwarded: &[(String, String)],
    timeout_ms: u64,
) -> HttpCall {
    let mut headers = vec![
        ("content-type".into(), "application/json".to_string()),
        (DESTINATION.into(), prefill_addr.to_string()),
    ];
    headers.extend(
        forwarded
            .iter()
            .map(|(name, value)| (name.clone().into(), value.clone())),
    );
    HttpCall {
        cluster: cluster.to_string(),
        method: "POST",
        path: path.to_string(),
        authority: prefill_addr.to_string(),
        headers,
        body: Some(prefill_body(original)),
        timeout_ms,
    }
}

/// What a prefill pod's answer means for the client's request.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Send this body (the client's, with the KV handle) to the decode pod.
    Decode(Vec<u8>),
    /// The request was refused (4xx): the client gets the prefill pod's answer.
    Refused { status: u32, body: Vec<u8> },
    /// The prefill pod refused kvroute's call (401/403): a credential the pool wants did not
    /// reach it, which is the deployment's fault, not the client's. The decode pod prefills by
    /// itself and judges the client's own credentials.
    Unauthorized,
    /// No KV to hand over (the prefill pod failed, timed out or was too busy): the decode pod
    /// prefills by itself.
    Fallback,
}

/// What a prefill pod's answer to kvroute's call says of the pod, for passive health
/// (`crate::health`), by the decode leg's rules: a handle is served; a failure, a reset or a
/// timeout (the host answers 503/504, or no status at all) or a 200 without a handle is failed; a
/// 4xx refusing the request is served (the pod judged it); 429 (back-pressure) and 401/403 (the
/// deployment's credentials) say nothing of the pod.
pub fn leg_verdict(status: u32, body: &[u8]) -> Option<Verdict> {
    match status {
        401 | 403 | 429 => None,
        200 if transfer_params(body).is_some() => Some(Verdict::Served),
        400..=499 => Some(Verdict::Served),
        _ => Some(Verdict::Failed),
    }
}

pub fn answer(status: u32, body: &[u8], original: &[u8]) -> Answer {
    if status == 401 || status == 403 {
        return Answer::Unauthorized;
    }
    if (400..500).contains(&status) && status != 429 {
        return Answer::Refused {
            status,
            body: body.to_vec(),
        };
    }
    match (status, transfer_params(body)) {
        (200, Some(params)) => Answer::Decode(decode_body(original, &params)),
        _ => Answer::Fallback,
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_follow_the_nixl_protocol() {
        let original = br#"{"model":"m","prompt":"p","max_tokens":100,"max_completion_tokens":100,"stream":true,"stream_options":{"include_usage":true}}"#;
        let p: Value = serde_json::from_slice(&prefill_body(original)).unwrap();
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["max_completion_tokens"], 1);
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["remote_block_ids"], Value::Null);
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600}}"#;
        let params = transfer_params(answer).unwrap();
        let d: Value = serde_json::from_slice(&decode_body(original, &params)).unwrap();
        assert_eq!(
            d["max_tokens"], 100,
            "the decode request is the client's own"
        );
        assert_eq!(d["stream"], true);
        assert_eq!(d["kv_transfer_params"]["remote_block_ids"], json!([1, 2]));
        assert_eq!(transfer_params(b"{\"choices\":[]}"), None);
        assert_eq!(transfer_params(b"garbage"), None);
    }

    #[test]
    fn a_prefill_leg_is_judged_by_the_decode_legs_rules() {
        let ok = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[3]}}"#;
        assert_eq!(leg_verdict(200, ok), Some(Verdict::Served));
        assert_eq!(leg_verdict(200, b"{}"), Some(Verdict::Failed), "no handle");
        assert_eq!(leg_verdict(500, b""), Some(Verdict::Failed));
        assert_eq!(leg_verdict(504, b""), Some(Verdict::Failed), "timed out");
        assert_eq!(leg_verdict(0, b""), Some(Verdict::Failed), "reset");
        assert_eq!(leg_verdict(400, b"too long"), Some(Verdict::Served));
        assert_eq!(leg_verdict(429, b""), None);
        assert_eq!(leg_verdict(401, b""), None);
    }

    #[test]
    fn answers_decide_the_request() {
        let original: &[u8] = br#"{"model":"m","prompt":"p","max_tokens":9}"#;
        let ok = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[3]}}"#;
        let Answer::Decode(body) = answer(200, ok, original) else {
            panic!()
        };
        let d: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(d["kv_transfer_params"]["remote_block_ids"], json!([3]));
        assert_eq!(
            answer(400, b"bad", original),
            Answer::Refused {
                status: 400,
                body: b"bad".to_vec()
            }
        );
        assert_eq!(answer(504, b"", original), Answer::Fallback, "timed out");
        assert_eq!(
            answer(429, b"busy", original),
            Answer::Fallback,
            "a busy prefill pod: the decode pod serves the request"
        );
        assert_eq!(answer(200, b"{}", original), Answer::Fallback, "no handle");
        assert_eq!(answer(401, b"no key", original), Answer::Unauthorized);
        assert_eq!(answer(403, b"", original), Answer::Unauthorized);
        let forwarded = [
            ("authorization".to_string(), "Bearer sk-client".to_string()),
            ("traceparent".to_string(), "00-ab-cd-01".to_string()),
        ];
        let call = prefill_call(
            "kvroute_poll",
            "/v1/completions",
            "10.0.0.7:8000",
            original,
            &forwarded,
            500,
        );
        assert_eq!(call.authority, "10.0.0.7:8000");
        assert_eq!(call.timeout_ms, 500);
        let has = |name: &str, value: &str| {
            call.headers
                .iter()
                .any(|(n, v)| n.as_ref() == name && v == value)
        };
        assert!(has(DESTINATION, "10.0.0.7:8000"));
        assert!(has("authorization", "Bearer sk-client"));
        assert!(has("traceparent", "00-ab-cd-01"));
    }
}
