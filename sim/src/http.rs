//! The pod's HTTP surface, shaped like vLLM's OpenAI server wherever a router or client can see it:
//! response and chunk shapes, `usage.prompt_tokens_details.cached_tokens`, error bodies
//! (`{"object":"error","message":..,"type":..,"param":null,"code":..}`), `/v1/models`, `/health`,
//! `/version` and `/tokenize` (vLLM only, as read by routers at start-up and per request),
//! `/metrics`, plus the `/sim/` control endpoints tests use.
//!
//! Streaming sends the first content chunk when the engine finishes the prefill (that is the time to
//! first token) and then one chunk per decode step, so a client measures TTFT and inter-token
//! latency exactly as it would against a GPU.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::config::{EngineKind, Role};
use super::engine::{Outcome, PullSource, SeqEvent, SeqSpec};
use super::metrics;
use super::pod::{prefiller_target, prefiller_timeout, pull_source, Faults, Pod};
use super::request::{parse, BadRequest, Endpoint, InferenceRequest};
use super::tokens::block_hashes;

/// Agent prompts can be long; vLLM does not cap bodies either.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Filler vocabulary for generated text: deterministic, one word per token.
const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "kv", "blocks",
    "stay", "warm", "in", "cache",
];

fn token_text(index: usize) -> String {
    let word = WORDS.get(index % WORDS.len()).copied().unwrap_or("tok");
    if index == 0 {
        word.to_string()
    } else {
        format!(" {word}")
    }
}

pub(crate) fn router(pod: Arc<Pod>) -> Router {
    let routes = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(retrieve_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/messages", post(messages))
        .route("/generate", post(generate))
        .route("/inference/v1/generate", post(token_generate))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize_prompt))
        .route("/metrics", get(metrics_text))
        .route("/sim/stats", get(sim_stats))
        .route("/sim/fault", post(sim_fault))
        .route("/sim/reset", post(sim_reset))
        .route("/sim/restart", post(sim_restart))
        .route("/sim/kv-pulled", post(sim_kv_pulled))
        .route("/sim/probe", post(super::probe::sim_probe));
    let routes = match pod.cfg.root_path.as_deref() {
        Some(root) if root.starts_with('/') && root.len() > 1 => {
            Router::new().nest(root, routes.clone()).merge(routes)
        }
        _ => routes,
    };
    routes
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(pod.clone(), pod_layer))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(pod)
}

/// Whether `body` names `transfer_param` in UTF-8 or UTF-16 (either order): a body a lenient
/// JSON reader could take a client's `kv_transfer_params` from (also where the key's last letter
/// is escaped, `kv_transfer_param\u0073`).
fn names_kv_transfer_params(body: &[u8]) -> bool {
    const NAME: &str = "transfer_param";
    let utf16 = |big: bool| -> Vec<u8> {
        NAME.encode_utf16()
            .flat_map(|u| {
                if big {
                    u.to_be_bytes()
                } else {
                    u.to_le_bytes()
                }
            })
            .collect()
    };
    [NAME.as_bytes().to_vec(), utf16(true), utf16(false)]
        .iter()
        .any(|needle| body.windows(needle.len()).any(|w| w == needle.as_slice()))
}

/// Stalls (fault), counts bodies naming a KV handle, and stamps every response with the pod's
/// address.
async fn pod_layer(State(pod): State<Arc<Pod>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    if names_kv_transfer_params(&bytes) {
        pod.count_body_naming_kv_transfer_params();
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    if let Some(key) = &pod.cfg.api_key {
        let presented = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if req.uri().path().starts_with("/v1/") && presented != Some(&format!("Bearer {key}")) {
            pod.count_unauthorized();
            // vLLM's answer (its `--api-key` middleware).
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": "Unauthorized"})),
            )
                .into_response();
        }
    }
    if !req.uri().path().starts_with("/sim/") {
        let stall = pod.faults().stall_ms;
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
    }
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&pod.id) {
        resp.headers_mut().insert("x-kvsim-pod", v);
    }
    resp
}

/// vLLM's error body.
pub(crate) fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({
        "object": "error",
        "message": message,
        "type": kind,
        "param": null,
        "code": status.as_u16(),
    });
    (status, Json(body)).into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response()
}

async fn completions(State(pod): State<Arc<Pod>>, headers: HeaderMap, body: Bytes) -> Response {
    inference(pod, Endpoint::Completions, headers, body).await
}

async fn chat_completions(
    State(pod): State<Arc<Pod>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    inference(pod, Endpoint::Chat, headers, body).await
}

async fn responses(State(pod): State<Arc<Pod>>, headers: HeaderMap, body: Bytes) -> Response {
    // A continuation runs on the conversation this pod stored; a pod without it answers 404.
    let body = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(mut obj)) if obj.contains_key("previous_response_id") => {
            if let Err(id) = pod.stored.continued(&mut obj) {
                pod.count_arrival(&headers);
                pod.count_failure();
                let message = super::responses::not_found_message(&id);
                return error(StatusCode::NOT_FOUND, "invalid_request_error", &message);
            }
            Bytes::from(Value::Object(obj).to_string())
        }
        _ => body,
    };
    inference(pod, Endpoint::Responses, headers, body).await
}

async fn retrieve_response(State(pod): State<Arc<Pod>>, Path(id): Path<String>) -> Response {
    stored_response(&pod, &id, false)
}

async fn cancel_response(State(pod): State<Arc<Pod>>, Path(id): Path<String>) -> Response {
    stored_response(&pod, &id, true)
}

fn stored_response(pod: &Pod, id: &str, cancel: bool) -> Response {
    match pod.stored.retrieve(
        id,
        pod.cfg.models.first().map_or("", String::as_str),
        cancel,
    ) {
        Some(object) => Json(object).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &super::responses::not_found_message(id),
        ),
    }
}

/// vLLM's Anthropic Messages API (SGLang has no such route).
async fn messages(State(pod): State<Arc<Pod>>, headers: HeaderMap, body: Bytes) -> Response {
    if pod.cfg.engine != EngineKind::Vllm {
        return not_found().await;
    }
    inference(pod, Endpoint::Messages, headers, body).await
}

/// SGLang's native `/generate` (vLLM has no such route).
async fn generate(State(pod): State<Arc<Pod>>, headers: HeaderMap, body: Bytes) -> Response {
    if pod.cfg.engine != EngineKind::Sglang {
        return not_found().await;
    }
    inference(pod, Endpoint::Generate, headers, body).await
}

/// vLLM's token-in `/inference/v1/generate` (SGLang has no such route).
async fn token_generate(State(pod): State<Arc<Pod>>, headers: HeaderMap, body: Bytes) -> Response {
    if pod.cfg.engine != EngineKind::Vllm {
        return not_found().await;
    }
    inference(pod, Endpoint::TokenGenerate, headers, body).await
}

async fn inference(pod: Arc<Pod>, endpoint: Endpoint, headers: HeaderMap, body: Bytes) -> Response {
    pod.count_arrival(&headers);
    let resp = serve(&pod, endpoint, &headers, &body).await;
    if !resp.status().is_success() {
        pod.count_failure();
    }
    resp
}

/// What the response writer needs to know about the request.
struct Meta {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    max_tokens: usize,
    include_usage: bool,
    report_kv: bool,
    /// Choices per prompt: a prompt is counted once in `usage` whatever its choices.
    n: usize,
}

async fn serve(pod: &Arc<Pod>, endpoint: Endpoint, headers: &HeaderMap, body: &[u8]) -> Response {
    let cfg_now = pod.config_now();
    let cfg = &*cfg_now;
    if pod.roll_failure() {
        let status = StatusCode::from_u16(pod.faults().fail_status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(
            status,
            "InternalServerError",
            "Simulated engine failure (kvsim fault injection)",
        );
    }
    let req = match parse(endpoint, body) {
        Ok(r) => r,
        Err(BadRequest(msg)) => return error(StatusCode::BAD_REQUEST, "BadRequestError", &msg),
    };
    let served = match cfg.resolve_model(req.model.as_deref()) {
        Ok(served) => served,
        Err(message) => return error(StatusCode::NOT_FOUND, "NotFoundError", &message),
    };
    for tokens in &req.batch {
        let prompt_tokens = tokens.len();
        let requested = prompt_tokens.saturating_add(req.max_tokens);
        if requested > cfg.max_model_len {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!(
                    "This model's maximum context length is {} tokens. However, you requested {} tokens \
                     ({} in the messages, {} in the completion). Please reduce the length of the \
                     messages or completion.",
                    cfg.max_model_len, requested, prompt_tokens, req.max_tokens
                ),
            );
        }
    }

    // The model's cache (one per base model, one per adapter) and the salt seed the hash chain,
    // as in vLLM: no sharing across adapters or tenants, full sharing across aliases.
    let hash_seed = match &req.cache_salt {
        Some(salt) => format!("{}\u{0}{salt}", served.cache_key),
        None => served.cache_key.clone(),
    };
    let (remote_tokens, report_kv, max_tokens, pull_source) =
        plan_disaggregation(pod, headers, &req).await;
    // One sequence per prompt and choice, as vLLM runs a batch and `n`: choice `p * n + j` is
    // prompt p's j-th. Only the first takes part in a P/D transfer.
    let mut sequences = Vec::with_capacity(req.batch.len() * req.n);
    let mut pull_source = pull_source;
    for tokens in &req.batch {
        let hashes = block_hashes(&hash_seed, tokens, cfg.block_size);
        for _ in 0..req.n {
            let first = sequences.is_empty();
            let spec = SeqSpec {
                prompt_tokens: tokens.len(),
                block_hashes: hashes.clone(),
                max_tokens,
                remote_tokens: if first { remote_tokens } else { 0 },
                report_block_ids: report_kv && first,
                pull_source: if first { pull_source.take() } else { None },
                adapter: served.adapter.clone(),
            };
            sequences.push(pod.engine.submit(spec));
        }
    }
    let prefix = match endpoint {
        Endpoint::Completions | Endpoint::Generate | Endpoint::TokenGenerate => "cmpl",
        Endpoint::Chat => "chatcmpl",
        Endpoint::Responses => "resp",
        Endpoint::Messages => "msg",
    };
    let meta = Meta {
        endpoint,
        id: pod.random_id(prefix),
        created: unix_now(),
        model: served.name,
        max_tokens,
        include_usage: req.include_usage,
        report_kv,
        n: req.n,
    };
    match endpoint {
        Endpoint::Responses => {
            if let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) {
                pod.stored.begin(&meta.id, &obj);
            }
            return responses_answer(pod, meta, sequences, req.stream).await;
        }
        Endpoint::Messages => return messages_answer(meta, sequences, req.stream).await,
        Endpoint::Generate => return generate_answer(meta, sequences, req.stream).await,
        Endpoint::TokenGenerate => {
            if req.stream {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequestError",
                    "kvsim does not stream /inference/v1/generate",
                );
            }
            return token_generate_answer(meta, sequences).await;
        }
        Endpoint::Completions | Endpoint::Chat => {}
    }
    if req.stream {
        stream_response(pod.clone(), meta, sequences)
    } else {
        full_response(pod, meta, sequences).await
    }
}

/// Decides how this request's prompt KV comes to be: computed here, pulled from a prefill pod
/// (sidecar header or `do_remote_prefill` on a decode pod), or computed here for a remote decoder
/// (`do_remote_decode` on a prefill pod). Returns (remote tokens, report KV handle, max tokens, the
/// prefill pod to tell when the pull is done).
async fn plan_disaggregation(
    pod: &Arc<Pod>,
    headers: &HeaderMap,
    req: &InferenceRequest,
) -> (usize, bool, usize, Option<PullSource>) {
    let bs = pod.cfg.block_size;
    if let Some(kv) = &req.kv_transfer {
        pod.counters().last_kv_transfer_params = kv.raw.clone();
    }
    if let Some(target) = prefiller_target(headers) {
        let path = match req.endpoint {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Generate => "/generate",
            Endpoint::TokenGenerate => "/inference/v1/generate",
        };
        let result = match target {
            Ok(target) => {
                let bound = prefiller_timeout(headers);
                pod.sidecar_prefill(&target, path, req, bound).await
            }
            Err(reason) => Err(anyhow::anyhow!("bad x-prefiller-host-port: {reason}")),
        };
        let mut c = pod.counters();
        return match result {
            Ok(kv) => {
                let blocks = kv.remote_block_ids.as_ref().map_or(0, Vec::len);
                c.sidecar_prefills += 1;
                c.disaggregated_decodes += 1;
                let source = pull_source(&kv);
                c.last_kv_transfer_params = kv.raw;
                (blocks * bs, false, req.max_tokens, source)
            }
            Err(e) => {
                // The sidecar contract: a failed prefill falls back to a local full prefill.
                eprintln!(
                    "kvsim {}: sidecar prefill failed, prefilling locally: {e:#}",
                    pod.id
                );
                c.sidecar_prefill_failures += 1;
                (0, false, req.max_tokens, None)
            }
        };
    }
    match (&req.kv_transfer, pod.cfg.role) {
        (Some(kv), Role::Decode | Role::Both) if kv.do_remote_prefill => match &kv.remote_block_ids
        {
            Some(ids) if !ids.is_empty() => {
                pod.counters().disaggregated_decodes += 1;
                (ids.len() * bs, false, req.max_tokens, pull_source(kv))
            }
            _ => (0, false, req.max_tokens, None),
        },
        (Some(kv), Role::Prefill | Role::Both) if kv.do_remote_decode => {
            pod.counters().prefills_for_remote_decode += 1;
            // A prefill for a remote decoder produces exactly one token.
            (0, true, 1, None)
        }
        _ => (0, false, req.max_tokens, None),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `usage` over a request's sequences (in choice order): each prompt's tokens and cached tokens
/// once (from its first choice), every choice's completion tokens.
fn usage(outcomes: &[&Outcome], n: usize) -> Value {
    let per_prompt = || outcomes.iter().step_by(n.max(1));
    let prompt: usize = per_prompt().map(|o| o.prompt_tokens).sum();
    let cached: usize = per_prompt().map(|o| o.cached_tokens).sum();
    let completion: usize = outcomes.iter().map(|o| o.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn kv_handle(pod: &Pod, meta: &Meta, o: &Outcome) -> Value {
    if !meta.report_kv {
        return Value::Null;
    }
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": pod.id,
        "remote_block_ids": o.block_ids,
        "remote_host": pod.addr.ip().to_string(),
        "remote_port": pod.addr.port(),
        "tp_size": 1,
        // The simulator's own record of where the KV sits (no engine reports it): what the
        // decode pod's pull is timed by (`SimConfig::kv_link_levels`).
        "kvsim_locality": pod.cfg.own_locality,
    })
}

/// One sequence's text and outcome, or `None` when the engine dropped it.
async fn collect(mut rx: mpsc::UnboundedReceiver<SeqEvent>) -> Option<(String, Outcome)> {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            SeqEvent::Token { index, .. } => text.push_str(&token_text(index)),
            SeqEvent::Finished(o) => return Some((text, o)),
        }
    }
    None
}

async fn full_response(
    pod: &Arc<Pod>,
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
) -> Response {
    let finished = futures::future::join_all(sequences.into_iter().map(collect)).await;
    let Some(finished) = finished.into_iter().collect::<Option<Vec<_>>>() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "The engine stopped before the request finished",
        );
    };
    let choices: Vec<Value> = finished
        .iter()
        .enumerate()
        .map(|(index, (text, _))| match meta.endpoint {
            Endpoint::Completions | Endpoint::Generate | Endpoint::TokenGenerate => json!({
                "index": index,
                "text": text,
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
                "prompt_logprobs": null,
            }),
            Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => json!({
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": null,
                    "tool_calls": [],
                    "reasoning_content": null,
                },
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
            }),
        })
        .collect();
    let outcomes: Vec<&Outcome> = finished.iter().map(|(_, o)| o).collect();
    let object = match meta.endpoint {
        Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => "chat.completion",
        _ => "text_completion",
    };
    let kv = match outcomes.first() {
        Some(first) => kv_handle(pod, &meta, first),
        None => Value::Null,
    };
    let body = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(&outcomes, meta.n),
        "prompt_logprobs": null,
        "kv_transfer_params": kv,
    });
    Json(body).into_response()
}

/// A `/v1/responses` answer (one choice): the `response` object, or its event stream.
async fn responses_answer(
    pod: &Arc<Pod>,
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
    stream: bool,
) -> Response {
    use super::responses::{event, message, response, usage};
    let Some(rx) = sequences.into_iter().next() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "no sequence",
        );
    };
    let (id, created, model) = (meta.id, meta.created, meta.model);
    if !stream {
        let Some((text, o)) = collect(rx).await else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "The engine stopped before the request finished",
            );
        };
        let u = usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens);
        pod.stored.complete(&id, &text);
        return Json(response(&id, created, &model, Some(&text), u)).into_response();
    }
    let pod = pod.clone();
    let events = async_stream::stream! {
        let mut rx = rx;
        let mut seq = 0;
        let mut next = || { seq += 1; seq - 1 };
        let started = response(&id, created, &model, None, Value::Null);
        yield Ok::<Bytes, std::io::Error>(event("response.created", next(), json!({"response": started})));
        yield Ok(event("response.in_progress", next(), json!({"response": started})));
        let item_id = format!("msg_{id}");
        yield Ok(event("response.output_item.added", next(),
            json!({"output_index": 0, "item": message(&id, None)})));
        yield Ok(event("response.content_part.added", next(), json!({"item_id": item_id,
            "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}})));
        let mut text = String::new();
        let mut outcome = None;
        while let Some(e) = rx.recv().await {
            match e {
                SeqEvent::Token { index, .. } => {
                    let delta = token_text(index);
                    text.push_str(&delta);
                    yield Ok(event("response.output_text.delta", next(), json!({"item_id": item_id,
                        "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []})));
                }
                SeqEvent::Finished(o) => { outcome = Some(o); break; }
            }
        }
        let Some(o) = outcome else {
            pod.count_failure();
            yield Ok(event("error", next(), json!({"code": "500",
                "message": "The engine stopped before the request finished", "param": null})));
            return;
        };
        yield Ok(event("response.output_text.done", next(), json!({"item_id": item_id,
            "output_index": 0, "content_index": 0, "text": text, "logprobs": []})));
        yield Ok(event("response.content_part.done", next(), json!({"item_id": item_id,
            "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": text, "annotations": []}})));
        yield Ok(event("response.output_item.done", next(),
            json!({"output_index": 0, "item": message(&id, Some(&text))})));
        let u = usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens);
        pod.stored.complete(&id, &text);
        yield Ok(event("response.completed", next(),
            json!({"response": response(&id, created, &model, Some(&text), u)})));
    };
    event_stream(events)
}

/// The engine stopped before a request finished.
fn engine_stopped() -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalServerError",
        "The engine stopped before the request finished",
    )
}

/// A `/v1/messages` answer (one choice): the `message` object, or its event stream.
async fn messages_answer(
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
    stream: bool,
) -> Response {
    use super::anthropic::{event, message, usage};
    let Some(rx) = sequences.into_iter().next() else {
        return engine_stopped();
    };
    let (id, model) = (meta.id, meta.model);
    if !stream {
        let Some((text, o)) = collect(rx).await else {
            return engine_stopped();
        };
        let u = usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens);
        return Json(message(&id, &model, Some(&text), u)).into_response();
    }
    let events = async_stream::stream! {
        let mut rx = rx;
        let mut outcome = None;
        let mut started = false;
        while let Some(e) = rx.recv().await {
            match e {
                SeqEvent::Token { index, prompt_tokens, .. } => {
                    if !started {
                        started = true;
                        // vLLM's first chunk does not carry the cache fields yet.
                        let u = json!({"input_tokens": prompt_tokens, "output_tokens": 0});
                        yield Ok::<Bytes, std::io::Error>(event("message_start",
                            json!({"message": message(&id, &model, None, u)})));
                        yield Ok(event("content_block_start",
                            json!({"index": 0, "content_block": {"type": "text", "text": ""}})));
                    }
                    yield Ok(event("content_block_delta", json!({"index": 0,
                        "delta": {"type": "text_delta", "text": token_text(index)}})));
                }
                SeqEvent::Finished(o) => { outcome = Some(o); break; }
            }
        }
        let Some(o) = outcome else {
            yield Ok(event("error", json!({"error": {"type": "internal_error",
                "message": "The engine stopped before the request finished"}})));
            return;
        };
        yield Ok(event("content_block_stop", json!({"index": 0})));
        yield Ok(event("message_delta", json!({
            "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
            "usage": usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens)})));
        yield Ok(event("message_stop", json!({})));
    };
    event_stream(events)
}

/// SGLang's `meta_info` for a sequence so far.
fn sglang_meta(id: &str, prompt: usize, cached: usize, completion: usize, done: bool) -> Value {
    json!({
        "id": id,
        "finish_reason": if done { json!({"type": "length", "length": completion}) } else { Value::Null },
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
    })
}

/// SGLang's `/generate` answer: `{text, output_ids, meta_info}` per prompt (a list for a batch of
/// `text`s), or streamed as `data:` lines each holding the text so far and its `meta_info`, then
/// `data: [DONE]`.
async fn generate_answer(
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
    stream: bool,
) -> Response {
    let id = meta.id;
    if !stream || sequences.len() != 1 {
        let batch = sequences.len() > 1;
        let finished = futures::future::join_all(sequences.into_iter().map(collect)).await;
        let Some(finished) = finished.into_iter().collect::<Option<Vec<_>>>() else {
            return engine_stopped();
        };
        let answers: Vec<Value> = finished
            .iter()
            .map(|(text, o)| json!({
                "text": text,
                "output_ids": (0..o.completion_tokens).collect::<Vec<_>>(),
                "meta_info": sglang_meta(&id, o.prompt_tokens, o.cached_tokens, o.completion_tokens, true),
            }))
            .collect();
        return match (batch, answers.into_iter().next()) {
            (false, Some(one)) => Json(one).into_response(),
            (_, first) => Json(json!(first.into_iter().collect::<Vec<_>>())).into_response(),
        };
    }
    let Some(rx) = sequences.into_iter().next() else {
        return engine_stopped();
    };
    let events = async_stream::stream! {
        let mut rx = rx;
        let mut text = String::new();
        let mut ids = Vec::new();
        let mut finished = false;
        while let Some(e) = rx.recv().await {
            match e {
                SeqEvent::Token { index, prompt_tokens, cached_tokens } => {
                    text.push_str(&token_text(index));
                    ids.push(index);
                    let meta = sglang_meta(&id, prompt_tokens, cached_tokens, index + 1, index + 1 >= meta.max_tokens);
                    yield Ok::<Bytes, std::io::Error>(sse(&json!({"text": text, "output_ids": ids, "meta_info": meta})));
                }
                SeqEvent::Finished(_) => { finished = true; break; }
            }
        }
        if !finished {
            yield Ok(sse(&json!({"error": {"message": "The engine stopped before the request finished"}})));
        }
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    };
    event_stream(events)
}

/// vLLM's `/inference/v1/generate` answer: the generated token ids per choice (no usage: the
/// token-in API reports none).
async fn token_generate_answer(
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
) -> Response {
    let finished = futures::future::join_all(sequences.into_iter().map(collect)).await;
    let Some(finished) = finished.into_iter().collect::<Option<Vec<_>>>() else {
        return engine_stopped();
    };
    let choices: Vec<Value> = finished
        .iter()
        .enumerate()
        .map(|(index, (_, o))| {
            json!({
                "index": index,
                "logprobs": null,
                "finish_reason": "length",
                "token_ids": (0..o.completion_tokens).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({
        "request_id": meta.id,
        "choices": choices,
        "prompt_logprobs": null,
        "kv_transfer_params": null,
    }))
    .into_response()
}

/// A 200 whose body is `events` as server-sent events.
fn event_stream<S>(events: S) -> Response
where
    S: futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "could not build the stream",
            )
        })
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn stream_response(
    pod: Arc<Pod>,
    meta: Meta,
    sequences: Vec<mpsc::UnboundedReceiver<SeqEvent>>,
) -> Response {
    let chunk_object = match meta.endpoint {
        Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => "chat.completion.chunk",
        _ => "text_completion",
    };
    let chunk = move |choices: Value| {
        json!({
            "id": meta.id,
            "object": chunk_object,
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
        })
    };
    let (endpoint, max_tokens, include_usage, n) =
        (meta.endpoint, meta.max_tokens, meta.include_usage, meta.n);
    let total = sequences.len();
    let die_mid_stream = pod.faults().die_mid_stream;
    // Every sequence's events, tagged with its choice index, as they come.
    let mut merged =
        futures::stream::select_all(sequences.into_iter().enumerate().map(|(choice, rx)| {
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |e| (choice, e))
        }));
    let events = async_stream::stream! {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; total];
        let mut done = 0;
        while let Some((choice, event)) = merged.next().await {
            match event {
                SeqEvent::Token { index, .. } => {
                    let finish = if index + 1 >= max_tokens { json!("length") } else { Value::Null };
                    let text = token_text(index);
                    let delta = match endpoint {
                        Endpoint::Completions | Endpoint::Generate | Endpoint::TokenGenerate => json!({
                            "index": choice, "text": text, "logprobs": null,
                            "finish_reason": finish, "stop_reason": null,
                        }),
                        Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => {
                            if index == 0 {
                                // vLLM opens each choice's stream with the role, then the content.
                                yield Ok::<Bytes, std::io::Error>(sse(&chunk(json!([{
                                    "index": choice, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": null, "finish_reason": null,
                                }]))));
                            }
                            json!({
                                "index": choice, "delta": {"content": text}, "logprobs": null,
                                "finish_reason": finish, "stop_reason": null,
                            })
                        }
                    };
                    yield Ok(sse(&chunk(json!([delta]))));
                    if die_mid_stream {
                        pod.count_failure();
                        // An error item makes hyper reset the connection: the client sees a
                        // stream cut short, as when an engine process is killed.
                        yield Err(std::io::Error::other("kvsim fault: the engine died mid-stream"));
                        break;
                    }
                }
                SeqEvent::Finished(o) => {
                    if let Some(slot) = outcomes.get_mut(choice) {
                        *slot = Some(o);
                    }
                    done += 1;
                    if done == total {
                        break;
                    }
                }
            }
        }
        if done < total {
            pod.count_failure();
            let err = json!({"object": "error", "message": "The engine stopped before the request finished",
                "type": "InternalServerError", "param": null, "code": 500});
            yield Ok(sse(&json!({"error": err})));
        } else if include_usage {
            let finished: Vec<&Outcome> = outcomes.iter().flatten().collect();
            let mut last = chunk(json!([]));
            if let Some(obj) = last.as_object_mut() {
                obj.insert("usage".into(), usage(&finished, n));
            }
            yield Ok(sse(&last));
        }
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    };
    event_stream(events)
}

/// vLLM's model list: one card per served name, all with the model's path as `root`, then one per
/// LoRA adapter with its path as `root` and the first served name as `parent` (the simulator has
/// no model path: the first served name stands for it).
async fn models(State(pod): State<Arc<Pod>>) -> Json<Value> {
    let cfg = pod.config_now();
    let owner = cfg.engine.as_str();
    let base = cfg.models.first().cloned().unwrap_or_default();
    let card = |id: &str, root: &str, parent: Value, max_model_len: Value| {
        json!({
            "id": id,
            "object": "model",
            "created": pod.created,
            "owned_by": owner,
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [],
        })
    };
    let mut data: Vec<Value> = cfg
        .models
        .iter()
        .map(|m| card(m, &base, Value::Null, json!(cfg.max_model_len)))
        .collect();
    data.extend(
        cfg.lora_modules
            .iter()
            .map(|l| card(&l.name, &l.path, json!(base), Value::Null)),
    );
    Json(json!({"object": "list", "data": data}))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// The vLLM release whose wire format kvsim follows (`vllm:kv_cache_usage_perc`, V1 metrics).
pub const VLLM_VERSION: &str = "0.11.0";

/// `/tokenize` answers token ids below this.
const VOCAB_IDS: u64 = 1 << 31;

/// vLLM's `GET /version`; routers (Shepherd Model Gateway) read it while registering a worker.
/// SGLang has no such route.
async fn version(State(pod): State<Arc<Pod>>) -> Response {
    if pod.cfg.engine != EngineKind::Vllm {
        return not_found().await;
    }
    Json(json!({ "version": VLLM_VERSION })).into_response()
}

/// vLLM's `POST /tokenize`: a `prompt` or chat `messages`, tokenised as a completion or chat request
/// would be (vllm-router's cache-aware policy asks for it per chat request). SGLang has no such route.
async fn tokenize_prompt(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    if pod.cfg.engine != EngineKind::Vllm {
        return not_found().await;
    }
    let is_chat = serde_json::from_slice::<Value>(&body)
        .ok()
        .is_some_and(|v| v.get("messages").is_some());
    let endpoint = if is_chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    match parse(endpoint, &body) {
        Ok(req) => Json(json!({
            "count": req.tokens.len(),
            "max_model_len": pod.cfg.max_model_len,
            // A real tokenizer's ids are vocabulary indices (routers read them as u32): the
            // simulator's 64-bit word hashes folded into 31 bits, equal words still equal.
            "tokens": req.tokens.iter().map(|t| t % VOCAB_IDS).collect::<Vec<u64>>(),
            "token_strs": null,
        }))
        .into_response(),
        Err(BadRequest(msg)) => error(StatusCode::BAD_REQUEST, "BadRequestError", &msg),
    }
}

const GARBAGE_METRICS: &str = "# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"sim-model\"} not-a-number\n\
vllm:kv_cache_usage_perc{ 0.5\n\
vllm:num_requests_running{model_name=\"sim-model\",} -1e400x\n\
<html><body><h1>502 Bad Gateway</h1></body></html>\n\
}}}}{{{{ \u{fffd}\u{fffd} garbage\n";

async fn metrics_text(State(pod): State<Arc<Pod>>) -> Response {
    let delay = pod.faults().metrics_delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let faults = pod.faults();
    let text = if faults.garbage_metrics {
        GARBAGE_METRICS.to_string()
    } else {
        let snapshot = pod.engine.snapshot();
        let cfg = pod.config_now();
        let mut text = metrics::render(&cfg, &snapshot);
        text.push_str(&pod.lora_metrics(&snapshot));
        if cfg.engine == crate::EngineKind::Vllm {
            text.push_str(&pod.process_metrics());
        }
        lie(text, &faults.metrics_lie)
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Rewrites the load gauges (queue, running, KV usage) of well-formed metrics text with a lie.
fn lie(text: String, how: &str) -> String {
    let value = match how {
        "nan" => "NaN",
        "negative" => "-7",
        "absurd" => "1e300",
        _ => return text,
    };
    const LOAD_GAUGES: [&str; 6] = [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
    ];
    text.lines()
        .map(|l| match l.rsplit_once(' ') {
            Some((series, _)) if LOAD_GAUGES.iter().any(|g| l.starts_with(g)) => {
                format!("{series} {value}")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

async fn sim_stats(State(pod): State<Arc<Pod>>) -> Json<Value> {
    Json(serde_json::to_value(pod.stats()).unwrap_or(Value::Null))
}

/// Body of `POST /sim/fault`: the complete fault set (omitted fields are healthy), optionally for a
/// sibling pod, optionally with `refuse` clearing itself after `refuse_ms`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    #[serde(default)]
    fail_ratio: f64,
    /// Status of the failed answers (4xx or 5xx; default 500).
    #[serde(default)]
    fail_status: u16,
    #[serde(default)]
    stall_ms: u64,
    #[serde(default)]
    refuse: bool,
    #[serde(default)]
    garbage_metrics: bool,
    #[serde(default)]
    metrics_delay_ms: u64,
    #[serde(default)]
    die_mid_stream: bool,
    #[serde(default)]
    metrics_lie: String,
    #[serde(default)]
    serve_models: Vec<String>,
    #[serde(default)]
    refuse_ms: Option<u64>,
    #[serde(default)]
    pod: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    #[serde(default)]
    pod: Option<String>,
}

/// Control replies close their connection, so a client's pooled connection never outlives a
/// `refuse` it just switched on.
fn control_reply(value: Value) -> Response {
    ([(header::CONNECTION, "close")], Json(value)).into_response()
}

async fn sim_fault(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    let req: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!("invalid fault request: {e}"),
            )
        }
    };
    if !["", "nan", "negative", "absurd"].contains(&req.metrics_lie.as_str()) {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "metrics_lie must be one of nan, negative, absurd",
        );
    }
    if !(0.0..=1.0).contains(&req.fail_ratio) {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "fail_ratio must be between 0 and 1",
        );
    }
    let Some(target) = pod.resolve(req.pod.as_deref()) else {
        return error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            "no such pod in this simulator process",
        );
    };
    if req.fail_status != 0 && !(400..=599).contains(&req.fail_status) {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "fail_status must be a 4xx or 5xx status",
        );
    }
    let faults = Faults {
        fail_ratio: req.fail_ratio,
        fail_status: req.fail_status,
        stall_ms: req.stall_ms,
        refuse: req.refuse,
        garbage_metrics: req.garbage_metrics,
        metrics_delay_ms: req.metrics_delay_ms,
        die_mid_stream: req.die_mid_stream,
        metrics_lie: req.metrics_lie,
        serve_models: req.serve_models,
    };
    target
        .apply_faults(faults.clone(), req.refuse_ms.map(Duration::from_millis))
        .await;
    control_reply(json!({"pod": target.id, "faults": faults}))
}

/// The pod a reset or restart addresses: this one (an empty body) or `{"pod": "ip:port"}`, a
/// sibling in this process; `what` names the request in its error.
fn addressed_pod(pod: &Arc<Pod>, body: &[u8], what: &str) -> Result<Arc<Pod>, Box<Response>> {
    let req: ResetRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ResetRequest::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            Box::new(error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!("invalid {what} request: {e}"),
            ))
        })?
    };
    pod.resolve(req.pod.as_deref()).ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            "no such pod in this simulator process",
        ))
    })
}

async fn sim_reset(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    let target = match addressed_pod(&pod, &body, "reset") {
        Ok(target) => target,
        Err(reply) => return *reply,
    };
    target.apply_faults(Faults::default(), None).await;
    target.engine.reset_cache();
    control_reply(json!({"pod": target.id, "reset": true}))
}

/// A restart of the addressed pod: see `Pod::restart`.
async fn sim_restart(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    let target = match addressed_pod(&pod, &body, "restart") {
        Ok(target) => target,
        Err(reply) => return *reply,
    };
    target.restart().await;
    control_reply(json!({"pod": target.id, "restarted": true}))
}

/// NIXL's read notification: a decode pod has pulled the KV this pod held under the first of
/// `remote_block_ids`, which it may now free. Body `{"first_block": N}`.
async fn sim_kv_pulled(State(pod): State<Arc<Pod>>, body: Bytes) -> Response {
    let first = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("first_block").and_then(Value::as_u64));
    let Some(first) = first else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "expected {\"first_block\": N}",
        );
    };
    let released = pod.engine.release_held(first);
    control_reply(json!({"pod": pod.id, "released": released}))
}
