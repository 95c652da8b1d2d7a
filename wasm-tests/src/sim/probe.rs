//! `POST /sim/probe`: a test control that answers, for one prompt, what this pod truly holds and how
//! long the prompt would wait for its first token if it arrived now. kvbench's perfect-knowledge
//! policy asks every pod and sends the request to the earliest first token; no router could know
//! this much, which is what makes it a bound.
//!
//! The body is either an inference request body (chat when it has `messages`, else completions),
//! tokenised and hashed exactly as the inference endpoints would, or
//! `{"prompt_tokens": n, "block_hashes": [..], "max_tokens": m}` with the pod's own hashes. The
//! answer is [`ProbeEstimate`](super::engine::ProbeEstimate) plus the pod's id.

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
        let model = match &req.model {
            None => pod.cfg.models.first().cloned().unwrap_or_default(),
            Some(m) if pod.cfg.models.contains(m) => m.clone(),
            Some(m) => {
                return error(
                    StatusCode::NOT_FOUND,
                    "NotFoundError",
                    &format!("The model `{m}` does not exist."),
                )
            }
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
