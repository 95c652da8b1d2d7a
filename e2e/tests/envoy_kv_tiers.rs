//! KV tiers through real Envoy (`kv_tiers`, `crate::affinity::tiers`): simulated vLLM pods with a
//! small GPU cache and a host-memory tier behind it (kvsim's write-through CPU offloading). A
//! prompt pushed out of a pod's GPU by other traffic is still in its host memory: kvroute sends
//! the prompt back there rather than recompute it on an idle pod, and the pod loads it (reports
//! it cached); a pod holding it in its GPU wins over both.

mod common;

use common::*;
use serde_json::json;
use std::collections::BTreeMap;

/// A pod's GPU holds 200 blocks of 16 tokens (3,200); its host memory 8,000 (128,000 tokens).
const SIM_ARGS: [&str; 4] = ["--num-gpu-blocks", "200", "--cpu-offload-blocks", "8000"];

async fn tiered_stack(tiers: bool) -> (harness::Sim, harness::Envoy) {
    let kv_tiers = if tiers {
        json!([{"name": "host", "capacity_tokens": 128_000, "load_us_per_token": 2.6}])
    } else {
        json!([])
    };
    // Session pins hold whatever the prediction says (the test places prompts with them).
    let settings = json!({"kv_tiers": kv_tiers, "session": {"max_slowdown": 1_000_000.0}});
    stack(2, &SIM_ARGS, settings).await
}

/// Session keys that pin requests to each pod: `pod → key`.
async fn pins(envoy: &harness::Envoy) -> BTreeMap<String, String> {
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let mut found = BTreeMap::new();
    for i in 0..64 {
        let key = format!("pin-{i}");
        let body = chat(&system_prompt(&format!("probe-{i}-"), 20), "q", 1, false);
        let r = post(&client, &url, &body, &[("x-session-id", key.as_str())]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        found.entry(r.pod.expect("a pod answered")).or_insert(key);
        if found.len() == 2 {
            break;
        }
    }
    assert_eq!(found.len(), 2, "a session key for each pod: {found:?}");
    found
}

/// Sends `prompt` (pinned with `key` when given); returns (pod, cached tokens, debug header).
async fn ask(
    envoy: &harness::Envoy,
    prompt: &str,
    question: &str,
    key: Option<&str>,
) -> (String, u64, Option<String>) {
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let headers: Vec<(&str, &str)> = key.map(|k| ("x-session-id", k)).into_iter().collect();
    let r = post(&client, &url, &chat(prompt, question, 2, false), &headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (r.pod.clone().expect("a pod"), cached, r.debug)
}

/// Pushes what `key`'s pod holds out of its GPU: about 4 × its capacity of other prompts, pinned
/// there (500 words are about 1,500 kvsim tokens).
async fn age_out(envoy: &harness::Envoy, key: &str, tag: &str) {
    for i in 0..8 {
        ask(
            envoy,
            &system_prompt(&format!("{tag}-filler-{i}-"), 500),
            "q",
            Some(key),
        )
        .await;
    }
}

fn field(debug: &Option<String>, key: &str) -> Option<String> {
    debug.as_ref()?.split("; ").find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tier_hit_beats_recomputing_and_loses_to_a_gpu_hit() {
    let (_sim, envoy) = tiered_stack(true).await;
    let pins = pins(&envoy).await;
    let pods: Vec<&String> = pins.keys().collect();
    let (x, z) = (pods[0].clone(), pods[1].clone());
    let prompt = system_prompt("tiered-", 500);
    let (pod, _, _) = ask(&envoy, &prompt, "first", Some(&pins[&x])).await;
    assert_eq!(pod, x);
    age_out(&envoy, &pins[&x], "x1").await;
    // In x's host memory only; z holds none of it: x loads it, sooner than z recomputes it.
    let (pod, cached, debug) = ask(&envoy, &prompt, "second", None).await;
    assert_eq!(pod, x, "the warm pod: {debug:?}");
    let warm: f64 = field(&debug, "warm_load_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(warm > 0.0, "priced as a host-tier load: {debug:?}");
    assert!(
        cached >= 1000,
        "the pod loaded it rather than recompute: {cached}"
    );
    // Now z holds it in its GPU and x only in host memory again: z wins.
    let (pod, _, _) = ask(&envoy, &prompt, "third", Some(&pins[&z])).await;
    assert_eq!(pod, z);
    age_out(&envoy, &pins[&x], "x2").await;
    let (pod, cached, debug) = ask(&envoy, &prompt, "fourth", None).await;
    assert_eq!(pod, z, "the GPU hit: {debug:?}");
    assert!(cached >= 1000, "{cached}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_tier_the_gpu_only_index_forgets_the_prompt() {
    let (_sim, envoy) = tiered_stack(false).await;
    let pins = pins(&envoy).await;
    let x = pins.keys().next().cloned().unwrap_or_default();
    let prompt = system_prompt("untiered-", 500);
    ask(&envoy, &prompt, "first", Some(&pins[&x])).await;
    age_out(&envoy, &pins[&x], "x1").await;
    let (_, _, debug) = ask(&envoy, &prompt, "second", None).await;
    assert_eq!(
        field(&debug, "matched_blocks").and_then(|m| m.split('/').next().map(str::to_string)),
        Some("0".to_string()),
        "no pod holds it as far as kvroute knows: {debug:?}"
    );
    assert_eq!(field(&debug, "warm_load_ms"), None, "{debug:?}");
}
