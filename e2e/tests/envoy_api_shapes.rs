//! More request shapes routed by prefix through real Envoy: an Anthropic Messages
//! conversation (`/v1/messages`, as vLLM serves it) stays on the pod that served its first turn,
//! whose reported `cache_read_input_tokens` confirm the hit and which kvroute reads as it reads
//! OpenAI's `cached_tokens`; the same conversation sent as chat finds the same prefix; another
//! system prompt is not drawn to that pod; SGLang's `/generate` is routed by its text's prefix,
//! vLLM's `/inference/v1/generate` by its token ids'; a path under the configured
//! `api_path_prefix` is routed like the plain one.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const REPORTED: &str = "wasmcustom.kvroute.cache.reported_tokens_total";

/// The events of a server-sent event stream, as (event name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).ok()?))
        })
        .collect()
}

/// (cached, prompt) tokens of a Messages answer: its `usage`, or streamed, the usage of its
/// `message_delta` event (vLLM's `message_start` does not carry the cache fields yet).
fn anthropic_usage(r: &Reply, stream: bool) -> (u64, u64) {
    let usage = if stream {
        let events = events(&r.body);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"), "{}", r.body);
        assert_eq!(names.last(), Some(&"message_stop"), "{}", r.body);
        assert!(names.contains(&"content_block_delta"), "{}", r.body);
        events
            .into_iter()
            .find(|(n, _)| n == "message_delta")
            .map(|(_, d)| d["usage"].clone())
            .unwrap_or_else(|| panic!("no message_delta in {}", r.body))
    } else {
        let message = r.json();
        assert_eq!(message["type"], "message", "{}", r.body);
        message["usage"].clone()
    };
    let read = usage["cache_read_input_tokens"]
        .as_u64()
        .expect("cache_read_input_tokens");
    let uncached = usage["input_tokens"].as_u64().expect("input_tokens");
    let written = usage["cache_creation_input_tokens"].as_u64().unwrap_or(0);
    (read, uncached + read + written)
}

/// Waits until kvroute's count of reported cached tokens reaches `total`, and checks it stops there.
async fn expect_reported(envoy: &harness::Envoy, total: u64) {
    let reached = harness::wait_for(Duration::from_secs(5), REPORTED, || async {
        envoy.stat(REPORTED).await >= total
    })
    .await;
    assert!(
        reached.is_ok(),
        "{REPORTED} = {}, expected {total}",
        envoy.stat(REPORTED).await
    );
    assert_eq!(envoy.stat(REPORTED).await, total);
}

fn tools() -> Value {
    json!([{"name": "read_file", "description": "Reads a file of the repository",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_conversation_stays_on_the_pod_that_served_its_first_turn() {
    let (sim, envoy) = stack(3, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/messages");
    let system = system_prompt("agent-", 400);
    let system_blocks = json!([{"type": "text", "text": system}]);
    let mut messages = vec![json!({"role": "user", "content": "the tests fail; find out why"})];
    let body = |messages: &[Value], stream: bool| {
        json!({"model": MODEL, "max_tokens": 2, "system": system_blocks, "tools": tools(),
            "messages": messages, "stream": stream})
    };
    let first = post(&client, &url, &body(&messages, false), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let (cached, prompt) = anthropic_usage(&first, false);
    assert!(cached * 4 < prompt, "a cold pod: {cached}/{prompt}");
    let holder = first.pod.clone().expect("pod");
    let mut reported = cached;
    expect_reported(&envoy, reported).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Three more turns, each extending the conversation with a tool call and its result: each
    // goes to the pod holding it, which reads most of the prompt from its cache.
    for (turn, stream) in [(2, false), (3, true), (4, false)] {
        let call = format!("toolu_{turn}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": call, "name": "read_file", "input": {"path": format!("src/{turn}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call, "content": [{"type": "text", "text": "fn main() {}"}]},
            {"type": "text", "text": "go on"}]}));
        let r = post(&client, &url, &body(&messages, stream), &[]).await;
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        assert_eq!(r.pod.as_deref(), Some(holder.as_str()), "turn {turn}");
        assert_eq!(
            r.debug_field("reason").as_deref(),
            Some("prefix"),
            "turn {turn}"
        );
        let (cached, prompt) = anthropic_usage(&r, stream);
        println!("turn {turn} (stream {stream}): {cached}/{prompt} tokens cached on {holder}");
        assert!(cached * 10 > prompt * 8, "turn {turn}: {cached}/{prompt}");
        reported += cached;
        expect_reported(&envoy, reported).await;
    }
    // The same conversation through the chat API, as vLLM converts it: the same prompt, so the
    // same pod and its cache.
    let chat_messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "the tests fail; find out why"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "toolu_2", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\": \"src/2.rs\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "fn main() {}"},
        {"role": "user", "content": "go on and tell me more"},
    ]);
    let chat_tools = json!([{"type": "function", "function": {"name": "read_file",
        "description": "Reads a file of the repository", "parameters": tools()[0]["input_schema"]}}]);
    let r = post(
        &client,
        &envoy.url("/v1/chat/completions"),
        &json!({"model": MODEL, "max_tokens": 2, "tools": chat_tools, "messages": chat_messages}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.pod.as_deref(),
        Some(holder.as_str()),
        "chat after messages"
    );
    assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"));
    let usage = &r.json()["usage"];
    let (cached, prompt) = (
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        usage["prompt_tokens"].as_u64().unwrap(),
    );
    println!("chat: {cached}/{prompt} tokens cached on {holder}");
    assert!(cached * 10 > prompt * 7, "chat: {cached}/{prompt}");
    // Another agent (its own system prompt, no tools) matches nothing: it is placed by load, and
    // its pod reads nothing from its cache. (With the same tools it would share their blocks,
    // which lead the prompt, and rightly so.)
    let other = json!({"model": MODEL, "max_tokens": 2,
        "system": system_prompt("reviewer-", 400),
        "messages": [{"role": "user", "content": "the tests fail; find out why"}]});
    let r = post(&client, &url, &other, &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let matched = r.debug_field("matched_blocks").expect("debug header");
    assert!(matched.starts_with("0/"), "{matched}");
    assert_ne!(r.debug_field("reason").as_deref(), Some("prefix"));
    let (cached, prompt) = anthropic_usage(&r, false);
    assert!(
        cached * 4 < prompt,
        "another system prompt: {cached}/{prompt}"
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_generate_is_routed_by_its_texts_prefix() {
    let (sim, envoy) = stack(3, &["--engine", "sglang"], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/generate");
    let system = system_prompt("sglang-", 400);
    let generate = |question: &str, stream: bool| {
        json!({"text": format!("{system}\nQ: {question}\nA:"),
            "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "stream": stream})
    };
    let meta_of = |r: &Reply, stream: bool| -> Value {
        if stream {
            let last = r
                .body
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .rfind(|d| *d != "[DONE]")
                .unwrap_or_else(|| panic!("no data line in {}", r.body));
            assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
            serde_json::from_str::<Value>(last).unwrap()["meta_info"].clone()
        } else {
            r.json()["meta_info"].clone()
        }
    };
    let first = post(&client, &url, &generate("what is a block?", false), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.pod.clone().expect("pod");
    let meta = meta_of(&first, false);
    assert!(meta["cached_tokens"].as_u64().unwrap() * 4 < meta["prompt_tokens"].as_u64().unwrap());
    let mut reported = meta["cached_tokens"].as_u64().unwrap();
    expect_reported(&envoy, reported).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (question, stream) in [("what is a page?", false), ("what is a radix tree?", true)] {
        let r = post(&client, &url, &generate(question, stream), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.pod.as_deref(), Some(holder.as_str()), "{question}");
        assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"));
        let meta = meta_of(&r, stream);
        let (cached, prompt) = (
            meta["cached_tokens"].as_u64().unwrap(),
            meta["prompt_tokens"].as_u64().unwrap(),
        );
        println!("/generate (stream {stream}): {cached}/{prompt} tokens cached on {holder}");
        assert!(cached * 10 > prompt * 8, "{cached}/{prompt}");
        reported += cached;
        expect_reported(&envoy, reported).await;
    }
    // Another text shares no block with it.
    let other =
        json!({"text": system_prompt("other-", 400), "sampling_params": {"max_new_tokens": 2}});
    let r = post(&client, &url, &other, &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.debug_field("matched_blocks").unwrap().starts_with("0/"));
    assert_ne!(r.debug_field("reason").as_deref(), Some("prefix"));
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_token_generate_is_routed_by_its_token_ids() {
    let (sim, envoy) = stack(3, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/inference/v1/generate");
    let shared: Vec<u64> = (1000..1600).collect();
    let request = |tail: &[u64]| {
        let ids: Vec<u64> = shared.iter().chain(tail).copied().collect();
        json!({"token_ids": ids, "sampling_params": {"max_tokens": 2}, "stream": false})
    };
    let first = post(&client, &url, &request(&[7, 8]), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["choices"][0]["token_ids"], json!([0, 1]));
    let holder = first.pod.clone().expect("pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = post(&client, &url, &request(&[9]), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.pod.as_deref(), Some(holder.as_str()));
    assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"));
    let other: Vec<u64> = (5000..5600).collect();
    let r = post(
        &client,
        &url,
        &json!({"token_ids": other, "sampling_params": {"max_tokens": 2}}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.debug_field("matched_blocks").unwrap().starts_with("0/"));
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_under_the_configured_prefix_is_routed() {
    let (sim, envoy) = stack(
        3,
        &["--root-path", "/openai"],
        json!({"api_path_prefix": "/openai"}),
    )
    .await;
    let client = fresh_client();
    let system = system_prompt("prefixed-", 400);
    let first = post(
        &client,
        &envoy.url("/openai/v1/chat/completions"),
        &chat(&system, "first question", 2, false),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.debug.is_some(),
        "routed by kvroute, not passed through"
    );
    let holder = first.pod.clone().expect("pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The same prefix, through the prefixed and the plain path: both find the holder.
    for path in ["/openai/v1/chat/completions", "/v1/chat/completions"] {
        let r = post(
            &client,
            &envoy.url(path),
            &chat(&system, "second question", 2, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(r.pod.as_deref(), Some(holder.as_str()), "{path}");
        assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"), "{path}");
    }
    // A path the prefix does not make an inference path passes through untouched.
    let r = post(
        &client,
        &envoy.url("/openaiv1/chat/completions"),
        &chat(&system, "q", 2, false),
        &[],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.debug.is_none(), "not routed by kvroute");
    drop(sim);
}
