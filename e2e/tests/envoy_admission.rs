//! Session affinity and priority shedding through the real Envoy with kvroute.wasm: the session
//! header pins a conversation to one pod whatever its prompts, and when every pod is saturated a
//! negative-priority request gets a 429 at once while others are still routed.

mod common;

use common::*;
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_header_keeps_a_conversation_on_one_pod_whatever_its_prompts() {
    let (sim, envoy) = stack(4, &[], json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    let client = fresh_client();
    let mut alice = HashSet::new();
    for i in 0..12 {
        // Unrelated prompts: without the session, prefix and load would spread them.
        let system = system_prompt(&format!("topic{i}-"), 300);
        let r = post(
            &client,
            &url,
            &chat(&system, "next step", 1, false),
            &[("x-session-id", "alice")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.debug_field("reason").as_deref(),
            Some("session"),
            "{:?}",
            r.debug
        );
        alice.insert(r.pod.unwrap());
    }
    assert_eq!(alice.len(), 1, "alice stayed on one pod: {alice:?}");
    let mut sessions = HashSet::new();
    for i in 0..24 {
        let r = post(
            &client,
            &url,
            &chat(&system_prompt("shared-", 300), "hi", 1, false),
            &[("x-session-id", &format!("user-{i}"))],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        sessions.insert(r.pod.unwrap());
    }
    assert!(
        sessions.len() >= 3,
        "sessions spread over the pods: {sessions:?}"
    );
    assert!(
        envoy
            .stat_where(
                "wasmcustom.kvroute.requests_routed_total",
                "reason",
                "session"
            )
            .await
            >= 36
    );
    drop(sim);
}

async fn requests_total(sim: &harness::Sim) -> u64 {
    let mut total = 0;
    for pod in &sim.pods {
        total += sim_stats(pod).await["requests_total"].as_u64().unwrap_or(0);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_priority_is_shed_with_429_when_every_pod_is_saturated() {
    let (sim, envoy) = stack(2, &["--max-num-seqs", "1"], json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    let client = fresh_client();
    // A malformed priority is the client's mistake: a clear 400, nothing reaches a pod.
    let before = requests_total(&sim).await;
    let bad = post(
        &client,
        &url,
        &chat("hello", "q", 1, false),
        &[("x-kvroute-priority", "high")],
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("x-kvroute-priority"), "{}", bad.body);
    assert_eq!(envoy.stat("wasmcustom.kvroute.bad_priority_total").await, 1);
    // Not saturated yet: a sheddable request is routed like any other.
    let calm = post(
        &client,
        &url,
        &chat("hello", "q", 1, false),
        &[("x-kvroute-priority", "-1")],
    )
    .await;
    assert_eq!(calm.status, 200, "{}", calm.body);
    assert_eq!(requests_total(&sim).await, before + 1);
    // Saturate both pods directly (one running, seven waiting each; ~0.8 s wall per request).
    let base = requests_total(&sim).await;
    let fillers = saturate(&sim.pods, 8, 6).await;
    // Every filler has arrived (so none can be counted against the shed request below).
    harness::wait_for(Duration::from_secs(10), "all fillers arrived", || async {
        requests_total(&sim).await == base + 16
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // a few polls: kvroute sees the queues
    let before = requests_total(&sim).await;
    let shed = post(
        &client,
        &url,
        &chat("hello", "q", 1, false),
        &[("x-kvroute-priority", "-1")],
    )
    .await;
    let after = requests_total(&sim).await;
    assert_eq!(shed.status, 429, "{}", shed.body);
    assert_eq!(
        shed.json()["error"]["type"],
        "RateLimitError",
        "{}",
        shed.body
    );
    assert!(shed.body.contains("saturated"), "{}", shed.body);
    assert_eq!(after, before, "the shed request reached no pod");
    assert_eq!(envoy.stat("wasmcustom.kvroute.shed_total").await, 1);
    // Default and positive priorities are still routed (they queue behind the fillers).
    for priority in [None, Some("5")] {
        let headers: Vec<(&str, &str)> = priority
            .map(|p| ("x-kvroute-priority", p))
            .into_iter()
            .collect();
        let r = post(&client, &url, &chat("hello", "q", 1, false), &headers).await;
        assert_eq!(r.status, 200, "priority {priority:?}: {}", r.body);
    }
    for f in fillers {
        assert_eq!(f.await.unwrap(), 200);
    }
    drop(sim);
}
