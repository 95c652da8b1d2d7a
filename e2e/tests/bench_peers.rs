//! `make bench-peers` in small: the simulator answers what the peer routers ask a vLLM server for
//! (`/version` at registration, `/tokenize` per request), and one peer (vllm-router, installed by
//! `make peers`) runs in front of fresh simulated pods with its cache-aware policy and its
//! round-robin, through the same comparison code as the full benchmark. Skips, saying why, when the
//! router is not installed.

mod common;

use std::time::Duration;

use common::*;
use harness::Sim;
use kvbench::compare::{compare, Policy, StackOptions};
use kvbench::peers::{PeerPolicy, PeerRouter, PeerStack};
use kvbench::{Load, MultiTenantParams, WorkloadKind, WorkloadSpec};
use serde_json::{json, Value};

async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client.post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_pod_answers_version_and_tokenize_and_an_sglang_pod_does_not() {
    let vllm = Sim::start(1, &["--time-scale", TIME_SCALE]).unwrap();
    let sglang = Sim::start(1, &["--time-scale", TIME_SCALE, "--engine", "sglang"]).unwrap();
    let client = fresh_client();
    let pod = &vllm.pods[0];

    let v: Value = client
        .get(format!("http://{pod}/version"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        v["version"].as_str().is_some_and(|s| s.starts_with("0.")),
        "{v}"
    );

    // Chat messages tokenise exactly as the chat request would be counted.
    let body = chat("You are terse.", "two words", 4, false);
    let (status, t) = post_json(&client, &format!("http://{pod}/tokenize"), &body).await;
    assert_eq!(status, 200, "{t}");
    let (_, done) = post_json(&client, &format!("http://{pod}/v1/chat/completions"), &body).await;
    let counted = done["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(t["count"].as_u64(), Some(counted), "{t}");
    let tokens = t["tokens"].as_array().unwrap();
    assert_eq!(tokens.len() as u64, counted);
    assert!(
        tokens
            .iter()
            .all(|x| x.as_u64().is_some_and(|x| x < 1 << 31)),
        "vocabulary ids fit 31 bits: {t}"
    );
    assert!(t["max_model_len"].as_u64().is_some());
    // A prompt: same words, same ids.
    let (_, a) = post_json(
        &client,
        &format!("http://{pod}/tokenize"),
        &json!({"model": MODEL, "prompt": "alpha beta alpha"}),
    )
    .await;
    assert_eq!(a["count"], 3);
    assert_eq!(a["tokens"][0], a["tokens"][2]);
    assert_ne!(a["tokens"][0], a["tokens"][1]);
    // vLLM's 400 for a bad body.
    let (status, e) = post_json(
        &client,
        &format!("http://{pod}/tokenize"),
        &json!({"prompt": ""}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["object"], "error");

    // SGLang serves neither.
    let other = &sglang.pods[0];
    let r = client
        .get(format!("http://{other}/version"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let (status, _) = post_json(&client, &format!("http://{other}/tokenize"), &body).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_router_routes_by_prefix_and_its_round_robin_does_not() {
    let peer = PeerRouter::VllmRouter;
    if let Err(e) = peer.check_installed() {
        eprintln!(
            "SKIP a_peer_router_routes_by_prefix_and_its_round_robin_does_not: {e} \
             (the wheels come from PyPI)"
        );
        return;
    }
    // The router process is stopped by PID when its stack drops.
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let pods = sim.pods.clone();
    let stack = PeerStack::start(PeerPolicy::new(peer, true), pods, vec![sim])
        .await
        .unwrap();
    let pid = stack.router.pid();
    let (status, body) = post_json(
        &fresh_client(),
        &format!("{}/v1/chat/completions", stack.url()),
        &chat("You are terse.", "hello", 3, false),
    )
    .await;
    assert_eq!(status, 200, "{body}\n{}", stack.log());
    drop(stack);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "router {pid} still running after its stack dropped"
    );

    // 24 tenants × 3,000 words on 4 pods, 2 requests/s for 40 simulated seconds (2 s of wall time
    // per policy): more prompts than stay cached on every pod at once under round-robin.
    let mut spec = WorkloadSpec::new(
        WorkloadKind::MultiTenant(MultiTenantParams {
            tenants: 24,
            ..MultiTenantParams::default()
        }),
        Load::Open { rate: 2.0 },
    );
    spec.duration_s = 40.0;
    spec.seed = 7;
    let opts = StackOptions {
        pods: 4,
        time_scale: 0.05,
        ..StackOptions::default()
    };
    let policies = [
        Policy::Peer(PeerPolicy::new(peer, true)),
        Policy::Peer(PeerPolicy::new(peer, false)),
    ];
    let rows = tokio::time::timeout(
        Duration::from_secs(120),
        compare(&policies, &spec, &opts, 0.0),
    )
    .await
    .expect("the comparison finished within 2 minutes")
    .unwrap();
    let (aware, rr) = (&rows[0].1, &rows[1].1);
    assert_eq!(rows[0].0, "vllm-router");
    assert_eq!(rows[1].0, "vllm-router-rr");
    for (label, r) in &rows {
        assert!(r.requests >= 60, "{label}: {} requests", r.requests);
        assert_eq!(r.ok, r.requests, "{label}: every request succeeds");
    }
    let (hit_aware, hit_rr) = (aware.cache_hit_ratio.unwrap(), rr.cache_hit_ratio.unwrap());
    assert!(
        hit_aware > hit_rr + 0.15,
        "prefix affinity keeps each tenant on one pod: cache-aware {hit_aware:.2} vs round-robin {hit_rr:.2}"
    );
}
