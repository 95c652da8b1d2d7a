//! `POST /sim/probe`: a test control that answers, for one prompt, what this pod truly holds and how
//! long the prompt would wait for its first token if it arrived now. kvbench's perfect-knowledge
//! policy asks every pod and sends the request to the earliest first token; no router could know
//! this much, which is what makes it a bound.
//!
//! The body is either an inference request body (chat when it has `messages`, else completions),
//! tokenised and hashed exactly as the inference endpoints would, or
//! `{"prompt_tokens": n, "block_hashes": [..], "max_tokens": m}` with the pod's own hashes. The
//! answer is [`ProbeEstimate`](super::engine::probe::ProbeEstimate) plus the pod's id.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::http::error;
use super::pod::Pod;
use super::request::{parse, BadRequest, Endpoint};
use super::tokens::block_hashes;

pub(crate) async fn sim_probe(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!("invalid probe request: {e}"),
            )
        }
    };
    let (prompt_tokens, hashes, max_tokens) = if let Some(h) = value.get("block_hashes") {
        let hashes: Vec<u64> = h
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let n = |k: &str| value.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let prompt = n("prompt_tokens").unwrap_or(hashes.len() * pod.cfg.block_size);
        (prompt, hashes, n("max_tokens").unwrap_or(1))
    } else {
        let endpoint = if value.get("messages").is_some() {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        let req = match parse(endpoint, &body) {
            Ok(r) => r,
            Err(BadRequest(msg)) => return error(StatusCode::BAD_REQUEST, "BadRequestError", &msg),
        };
        let model = match pod.cfg.resolve_model(req.model.as_deref()) {
            Ok(served) => served.cache_key,
            Err(message) => return error(StatusCode::NOT_FOUND, "NotFoundError", &message),
        };
        // The same hash seed as the inference endpoints.
        let seed = match &req.cache_salt {
            Some(salt) => format!("{model}\u{0}{salt}"),
            None => model,
        };
        let hashes = block_hashes(&seed, &req.tokens, pod.cfg.block_size);
        (req.tokens.len(), hashes, req.max_tokens)
    };
    let estimate = pod.engine.probe(prompt_tokens, &hashes, max_tokens);
    let mut answer = serde_json::to_value(&estimate).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut answer {
        map.insert("pod".to_owned(), Value::String(pod.id.clone()));
    }
    Json(answer).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};

    use crate::{spawn_pod, SimConfig};

    fn words(n: usize, tag: &str) -> String {
        (0..n)
            .map(|i| format!("{tag}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn chat(system: &str, max_tokens: u32) -> Value {
        json!({"model": "sim-model", "max_tokens": max_tokens,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    }

    async fn probe(client: &reqwest::Client, url: &str, body: &Value) -> Value {
        let resp = client
            .post(format!("{url}/sim/probe"))
            .json(body)
            .send()
            .await
            .expect("probe");
        assert!(resp.status().is_success(), "{}", resp.status());
        resp.json().await.expect("json")
    }

    #[tokio::test]
    async fn a_probe_tells_the_cache_the_queue_and_the_first_token() {
        let cfg = SimConfig {
            time_scale: 0.1,
            ..SimConfig::default()
        };
        let per_token_ms = cfg.prefill_us_per_token / 1e3;
        let overhead_ms = cfg.prefill_overhead_ms;
        let pod = spawn_pod(cfg).await.expect("pod");
        let url = pod.url();
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let body = chat(&words(1000, "a"), 4);

        // Idle, nothing cached: one whole prefill.
        let cold = probe(&client, &url, &body).await;
        let prompt = cold["prompt_tokens"].as_f64().expect("n");
        assert!(prompt > 1000.0, "{cold}");
        assert_eq!(cold["cached_tokens"], 0);
        assert_eq!(cold["running"], 0);
        assert_eq!(cold["queued_prefill_tokens"], 0);
        assert_eq!(cold["added_wait_ms"], 0.0, "nobody to delay");
        let est = cold["estimated_ttft_ms"].as_f64().expect("ms");
        assert!(
            (est - (overhead_ms + per_token_ms * prompt)).abs() < 1.0,
            "{est} for {prompt} tokens"
        );
        assert_eq!(cold["pod"], pod.addr.to_string());

        // Served once, the prompt is cached: the estimate is a short step.
        let resp = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("request");
        assert!(resp.status().is_success());
        let warm = probe(&client, &url, &body).await;
        assert!(
            warm["cached_tokens"].as_f64().expect("n") > 0.9 * prompt,
            "{warm}"
        );
        assert!(
            warm["estimated_ttft_ms"].as_f64().expect("ms") < 100.0,
            "{warm}"
        );

        // Behind a long prefill in progress, the same prompt waits for it.
        let long = chat(&words(5000, "b"), 2);
        let busy = {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                client
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&long)
                    .send()
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        let behind = probe(&client, &url, &body).await;
        assert_eq!(behind["running"], 1, "{behind}");
        assert!(
            behind["queued_prefill_tokens"].as_f64().expect("n") > 5000.0,
            "{behind}"
        );
        let wait = behind["estimated_ttft_ms"].as_f64().expect("ms");
        assert!(
            wait > 100.0 + warm["estimated_ttft_ms"].as_f64().expect("ms"),
            "{behind}"
        );
        assert!(
            wait < overhead_ms + per_token_ms * 5100.0 + 200.0,
            "{behind}"
        );
        let _ = busy.await;

        // Block hashes instead of a body; a bad body is a 400.
        let by_hash = probe(
            &client,
            &url,
            &json!({"prompt_tokens": 64, "block_hashes": [1, 2, 3, 4], "max_tokens": 1}),
        )
        .await;
        assert_eq!(by_hash["cached_tokens"], 0);
        let bad = client
            .post(format!("{url}/sim/probe"))
            .body("nope")
            .send()
            .await
            .expect("probe");
        assert_eq!(bad.status().as_u16(), 400);
    }
}
