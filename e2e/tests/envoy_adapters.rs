//! LoRA adapters through real Envoy (`crate::adapters`): two simulated vLLM pods serving one
//! adapter with one GPU slot each and a load of 2 simulated seconds. One at a time, every request
//! for the adapter goes to the pod that loaded it, whichever of Envoy's workers routes it (the
//! other pod would load it first); unpriced, the same requests spread over both pods. A burst that
//! queues more than a load's worth of work on the holder loads the adapter on the other pod too.

mod common;

use common::*;
use serde_json::json;
use std::collections::BTreeMap;

/// Simulated milliseconds per adapter load (`--lora-load-ms`), and the same in wall milliseconds
/// at the tests' time scale, which is what kvroute observes and is configured with.
const LOAD_SIM_MS: &str = "2000";
const LOAD_WALL_MS: f64 = 100.0;

async fn adapter_stack(price_loads: bool) -> (harness::Sim, harness::Envoy) {
    let (sim, envoy) = stack(
        2,
        &[
            "--lora-modules",
            "sql-lora=/adapters/sql",
            "--max-loras",
            "1",
            "--lora-load-ms",
            LOAD_SIM_MS,
        ],
        json!({"adapters": {"price_loads": price_loads, "load_ms": LOAD_WALL_MS}}),
    )
    .await;
    // The leader reads the model lists on its first round; until then the adapter is unknown
    // and refused. The probe that passes loads it on a pod: the holder of what follows.
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    harness::wait_for(std::time::Duration::from_secs(10), "adapter known", || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = post(&client, &url, &adapter_chat("probe-", 50), &[]).await;
            r.status == 200 && r.debug.is_some()
        }
    })
    .await
    .unwrap();
    (sim, envoy)
}

fn adapter_chat(tag: &str, tokens: usize) -> serde_json::Value {
    let mut body = chat(&system_prompt(tag, tokens), "q", 2, false);
    body["model"] = json!("sql-lora");
    body
}

/// Sends `n` adapter requests one at a time; returns how many each pod served and each reply's
/// `adapter_load_ms` (the chosen pod's predicted load).
async fn one_at_a_time(
    envoy: &harness::Envoy,
    tag: &str,
    n: usize,
) -> (BTreeMap<String, usize>, Vec<String>) {
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let mut served = BTreeMap::new();
    let mut loads = Vec::new();
    for i in 0..n {
        let r = post(
            &client,
            &url,
            &adapter_chat(&format!("{tag}-{i}-"), 200),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["model"], json!("sql-lora"));
        *served
            .entry(r.pod.clone().expect("a pod answered"))
            .or_default() += 1;
        loads.push(r.debug_field("adapter_load_ms").unwrap_or_default());
    }
    (served, loads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_stays_on_the_pod_that_loaded_it_until_its_queue_outweighs_a_load() {
    let (_sim, envoy) = adapter_stack(true).await;
    let (served, loads) = one_at_a_time(&envoy, "sequential", 16).await;
    assert_eq!(served.len(), 1, "one pod served them all: {served:?}");
    assert!(
        loads.iter().skip(1).all(|l| l == "0.0"),
        "after the first, the chosen pod held the adapter: {loads:?}"
    );
    let holder = served.keys().next().cloned().unwrap_or_default();
    // A burst of long prompts: the holder's queue grows past a load, and the other pod loads it.
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let burst = (0..12).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            post(
                &client,
                &url,
                &adapter_chat(&format!("burst-{i}-"), 3000),
                &[],
            )
            .await
        }
    });
    let replies = futures::future::join_all(burst).await;
    let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
        *by_pod.entry(r.pod.clone().unwrap_or_default()).or_default() += 1;
    }
    assert_eq!(
        by_pod.len(),
        2,
        "the burst spread to a second pod: {by_pod:?}"
    );
    assert!(
        by_pod.get(&holder).copied().unwrap_or(0) >= 2,
        "the holder kept some: {by_pod:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpriced_the_same_requests_spread_over_both_pods() {
    let (_sim, envoy) = adapter_stack(false).await;
    let (served, _) = one_at_a_time(&envoy, "sequential", 16).await;
    assert_eq!(
        served.len(),
        2,
        "both pods served (each loading the adapter): {served:?}"
    );
}
