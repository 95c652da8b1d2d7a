//! The protocol surface through real Envoy: what a pod refuses teaches the index
//! nothing; conversations differing only in a tool call share only what precedes it, in kvroute's
//! index as in the pod's cache; requests for a pod's aliases and LoRA adapters route (as its `/v1/models` and metrics
//! report them) and unknown names are refused; HTTP/1.0 clients are served; a metrics scrape of
//! the gateway is refused with where to scrape instead; a Responses API conversation keeps its
//! prefix on the pod that holds it.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

/// The routing VM's `matched_blocks` (m, n) for a request, and the cached tokens the pod reported.
fn matched_and_cached(r: &Reply) -> ((u64, u64), u64) {
    assert_eq!(r.status, 200, "{}", r.body);
    let field = r.debug_field("matched_blocks").expect("debug header");
    let (m, n) = field.split_once('/').expect("m/n");
    let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("usage");
    ((m.parse().unwrap(), n.parse().unwrap()), cached)
}

async fn wait_for_stat(envoy: &harness::Envoy, name: &str, at_least: u64) {
    let ok = harness::wait_for(Duration::from_secs(10), name, || async {
        envoy.stat(name).await >= at_least
    })
    .await;
    if let Err(e) = ok {
        panic!("{e}: {name} = {}", envoy.stat(name).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_pod_refuses_teaches_the_index_nothing() {
    // Passive health would eject a pod after these 500s; this test is about the index alone.
    let (sim, envoy) = stack(
        2,
        &[],
        json!({"health": {"consecutive_failures": 1000, "max_failure_ratio": 1.0}}),
    )
    .await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    // Refused by the pod with vLLM's 400 (kvroute does not validate parameters): max_tokens 0.
    let refused: Vec<String> = (0..4)
        .map(|i| system_prompt(&format!("refused{i}-"), 600))
        .collect();
    for prompt in &refused {
        let mut invalid = chat(prompt, "q", 4, false);
        invalid["max_tokens"] = json!(0);
        let r = post(&client, &url, &invalid, &[]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.pod.is_some() && r.debug.is_some(), "routed to a pod");
    }
    // A pod failing with a 500 (not retried): the same.
    let failed: Vec<String> = (0..2)
        .map(|i| system_prompt(&format!("failed{i}-"), 600))
        .collect();
    for pod in &sim.pods {
        sim_fault(pod, json!({"fail_ratio": 1.0})).await;
    }
    for prompt in &failed {
        let r = post(&client, &url, &chat(prompt, "q", 4, false), &[]).await;
        assert_eq!(r.status, 500, "{}", r.body);
    }
    for pod in &sim.pods {
        sim_fault(pod, json!({})).await;
    }
    // One per pod that held a refused request's blocks: 6, or more where Envoy retried a 500 on
    // the other pod (the blocks move there, then are withdrawn from it too).
    wait_for_stat(
        &envoy,
        "wasmcustom.kvroute.cache.observations_withdrawn_total",
        6,
    )
    .await;
    // The leader publishes within a tick (25 ms); each worker applies the page on its next request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let withdrawn = envoy
        .stat("wasmcustom.kvroute.cache.observations_withdrawn_total")
        .await;
    for prompt in refused.iter().chain(&failed) {
        // A new connection each: the requests land on both workers' VMs.
        let r = post(&client, &url, &chat(prompt, "q", 4, false), &[]).await;
        let ((m, n), cached) = matched_and_cached(&r);
        assert!(n > 50, "{n} blocks");
        assert_eq!(cached, 0, "the pod never computed the refused prompt");
        assert_eq!(
            m, 0,
            "the index believed {m}/{n} blocks cached: {:?}",
            r.debug
        );
    }
    // Accepted requests are learned as before: every worker finds them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (i, prompt) in refused.iter().chain(&failed).enumerate() {
        let r = post(&client, &url, &chat(prompt, "q", 4, false), &[]).await;
        let ((m, n), cached) = matched_and_cached(&r);
        assert_eq!(m, n, "request {i}: {:?}", r.debug);
        assert!(cached > 0, "request {i}: the pod holds it");
    }
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.cache.observations_withdrawn_total")
            .await,
        withdrawn,
        "accepted requests withdraw nothing"
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_and_lora_adapters_route_and_unknown_names_are_refused() {
    let (sim, envoy) = stack(
        2,
        &[
            "--served-model-name",
            "sim-model,sim-alias",
            "--lora-modules",
            "sql-lora=/adapters/sql",
            "chat-lora=/adapters/chat",
        ],
        json!({}),
    )
    .await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let ask = |model: &'static str, prompt: String| {
        let mut body = chat(&prompt, "q", 4, false);
        body["model"] = json!(model);
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, &body, &[]).await }
    };
    // The leader reads the model lists on its first round; until then only the metrics' label
    // (the first served name) is known.
    harness::wait_for(Duration::from_secs(10), "adapters known", || async {
        ask("chat-lora", "probe".into()).await.status == 200
    })
    .await
    .unwrap();
    for model in ["sim-model", "sim-alias", "sql-lora", "chat-lora"] {
        for i in 0..4 {
            let r = ask(model, format!("{model} request {i}")).await;
            assert_eq!(r.status, 200, "{model}: {}", r.body);
            assert!(
                r.debug.is_some(),
                "{model}: routed by kvroute, not passed through"
            );
            assert_eq!(r.json()["model"], json!(model));
        }
    }
    // The gateway's own model list: every name the pods serve, as vLLM lists them.
    let models: serde_json::Value = reqwest::get(envoy.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cards: Vec<(String, serde_json::Value)> = models["data"]
        .as_array()
        .expect("a model list")
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), c["parent"].clone()))
        .collect();
    assert_eq!(
        cards,
        vec![
            ("sim-model".to_string(), serde_json::Value::Null),
            ("sim-alias".to_string(), serde_json::Value::Null),
            ("sql-lora".to_string(), json!("sim-model")),
            ("chat-lora".to_string(), json!("sim-model")),
        ],
        "{models}"
    );
    let card = fresh_client()
        .get(envoy.url("/v1/models/chat-lora"))
        .send()
        .await
        .unwrap();
    assert_eq!(card.status(), 200);
    assert!(
        card.headers().get("x-kvsim-pod").is_none(),
        "kvroute's answer"
    );
    let missing = fresh_client()
        .get(envoy.url("/v1/models/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    for model in ["no-such-lora", "sim-model-2"] {
        let r = ask(model, "x".into()).await;
        assert_eq!(r.status, 404, "{model}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "unknown_model", "{}", r.body);
        assert!(r.pod.is_none(), "refused by kvroute, no pod asked");
    }
    // An alias's requests find the base model's cached prefix; an adapter's do not.
    let prompt = system_prompt("lora-cache-", 600);
    let first = ask("sim-model", prompt.clone()).await;
    assert_eq!(first.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let alias = ask("sim-alias", prompt.clone()).await;
    let ((m, n), cached) = matched_and_cached(&alias);
    assert_eq!(
        m, n,
        "the alias shares the base's blocks: {:?}",
        alias.debug
    );
    assert_eq!(alias.pod, first.pod);
    assert!(cached > 500, "and the pod agrees: {cached} tokens cached");
    let adapter = ask("sql-lora", prompt.clone()).await;
    let ((m, _), cached) = matched_and_cached(&adapter);
    assert_eq!(
        (m, cached),
        (0, 0),
        "an adapter has its own cache: {:?}",
        adapter.debug
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_clients_are_served_and_a_metrics_scrape_is_refused() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let prompt = system_prompt("http10-", 300);
    for host in [true, false] {
        let (status, headers, body) = http10(
            &envoy.listener,
            "/v1/chat/completions",
            &chat(&prompt, "q", 3, false),
            host,
        )
        .await;
        assert!(
            status.contains(" 200 "),
            "Host header {host}: {status}\n{body}"
        );
        assert!(
            headers.iter().any(|(k, _)| k == "x-kvroute-debug"),
            "routed by kvroute: {headers:?}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
        assert_eq!(v["usage"]["completion_tokens"], 3);
    }
    // A stream over HTTP/1.0: no chunked encoding, the end of the connection ends it.
    let (status, _, body) = http10(
        &envoy.listener,
        "/v1/chat/completions",
        &chat(&prompt, "stream", 5, true),
        true,
    )
    .await;
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert_eq!(
        sse_events(&body)
            .iter()
            .filter(|e| e.contains("\"delta\""))
            .count(),
        6
    );

    // GET /metrics through the gateway: refused, never one random pod's page.
    let r = fresh_client()
        .get(envoy.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().get("x-kvsim-pod").is_none(), "no pod answered");
    assert_eq!(
        r.headers()
            .get("x-kvroute-error")
            .and_then(|v| v.to_str().ok()),
        Some("metrics_not_proxied")
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/stats/prometheus"));
    // kvroute's own stats are on the admin interface, in Prometheus form.
    let admin = reqwest::get(format!("http://{}/stats/prometheus", envoy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        admin.contains("kvroute_requests_routed"),
        "kvroute's stats on the admin API"
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_fallback_served_after_the_primarys_503_is_learned_for_the_fallback() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    // A prefix learned on one pod, the primary of what follows.
    let prompt = system_prompt("retried-", 600);
    let primary = {
        let r = post(&client, &url, &chat(&prompt, "warm", 2, false), &[]).await;
        assert_eq!(r.status, 200);
        r.pod.clone().unwrap()
    };
    let fallback = sim.pods.iter().find(|p| **p != primary).unwrap().clone();
    // A longer conversation on the same prefix follows it to `primary`, which now refuses with a
    // 503: Envoy's retry takes it to the fallback named in x-gateway-destination-endpoint.
    sim_fault(&primary, json!({"fail_ratio": 1.0, "fail_status": 503})).await;
    let longer = system_prompt("retried-", 1200);
    let r = post(&client, &url, &chat(&longer, "q", 2, false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.debug_field("pod").as_deref(),
        Some(primary.as_str()),
        "routed to the holder"
    );
    assert_eq!(
        r.pod.as_deref(),
        Some(fallback.as_str()),
        "served by the fallback"
    );
    sim_fault(&primary, json!({})).await;
    assert!(envoy.stat("cluster.pool.upstream_rq_retry").await >= 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The index now puts the longer conversation on the fallback, which holds it.
    let again = post(&client, &url, &chat(&longer, "q", 2, false), &[]).await;
    let ((m, n), cached) = matched_and_cached(&again);
    assert_eq!(
        again.pod.as_deref(),
        Some(fallback.as_str()),
        "{:?}",
        again.debug
    );
    assert_eq!(m, n, "{:?}", again.debug);
    assert!(cached > 1000, "the fallback holds it: {cached}");
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_differing_in_a_tool_call_share_only_what_precedes_it() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let conversation = |city: &str| {
        json!({"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "system", "content": system_prompt("agent-", 400)},
            {"role": "user", "content": "what should I wear tomorrow?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": format!("{{\"city\":\"{city}\"}}")}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": system_prompt("forecast-", 300)},
        ]})
    };
    let first = post(&client, &url, &conversation("Paris"), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for city in ["Lyon", "Nice"] {
        let r = post(&client, &url, &conversation(city), &[]).await;
        let ((m, n), cached) = matched_and_cached(&r);
        let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
        let (index_share, pod_share) = (m as f64 / n as f64, cached as f64 / prompt as f64);
        println!(
            "{city}: kvroute matched {m}/{n} blocks, the pod had {cached}/{prompt} tokens cached"
        );
        assert!(
            m < n,
            "{city}: the tool call's arguments part the conversations"
        );
        assert!(
            (index_share - pod_share).abs() < 0.1,
            "{city}: the index expected {index_share:.2} of the prompt cached, the pod had {pod_share:.2}"
        );
    }
    drop(sim);
}

/// The `response.completed` event of a streamed Responses answer.
fn completed_response(body: &str) -> serde_json::Value {
    body.split("\n\n")
        .find_map(|event| {
            let mut lines = event.lines();
            (lines.next()? == "event: response.completed")
                .then(|| serde_json::from_str(lines.next()?.strip_prefix("data: ")?).ok())?
        })
        .unwrap_or_else(|| panic!("no response.completed event in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_api_conversation_keeps_its_prefix_on_the_pod_that_holds_it() {
    let (sim, envoy) = stack(3, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/responses");
    let instructions = system_prompt("responses-", 400);
    let mut input = vec![json!({"role": "user", "content": [
        {"type": "input_text", "text": "what should I wear tomorrow?"}]})];
    let first = post(
        &client,
        &url,
        &json!({"model": MODEL, "instructions": instructions, "input": input, "max_output_tokens": 2}),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["object"], "response");
    let holder = first.pod.clone().expect("pod");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The next turns extend the conversation with a tool call and its answer: kvroute sends them
    // to the pod holding the conversation, which reports the shared part cached, streamed or not.
    input.push(
        json!({"type": "function_call", "call_id": "c1", "name": "weather",
        "arguments": "{\"city\":\"Paris\"}"}),
    );
    input.push(json!({"type": "function_call_output", "call_id": "c1", "output": "rain"}));
    for stream in [false, true] {
        let body = json!({"model": MODEL, "instructions": instructions, "input": input,
            "max_output_tokens": 2, "stream": stream});
        let r = post(&client, &url, &body, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.pod.as_deref(), Some(holder.as_str()), "stream {stream}");
        assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"));
        let response = if stream {
            completed_response(&r.body)["response"].clone()
        } else {
            r.json()
        };
        let usage = &response["usage"];
        let (cached, prompt) = (
            usage["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
            usage["input_tokens"].as_u64().unwrap(),
        );
        println!("stream {stream}: {cached}/{prompt} input tokens cached on {holder}");
        assert!(cached * 2 > prompt, "stream {stream}: {cached}/{prompt}");
        input.push(json!({"role": "assistant", "content": "noted"}));
        input.push(json!({"role": "user", "content": "and the day after?"}));
    }
    drop(sim);
}
