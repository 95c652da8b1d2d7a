//! Elastic P/D through real Envoy: one pool of `both` pods (vLLM's `kv_role: kv_both`), every pod
//! in Envoy's cluster, and kvroute choosing per request which pod prefills and which decodes. A
//! long prompt whose holder decodes many streams is prefilled by the pod without streams and
//! decoded by the holder; a short one is served whole where it lands.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::json;
use std::time::Duration;

async fn a_pod_without_streams_prefills_for_the_holder_beside_its_streams(mode: &str) {
    let pods = Sim::start(2, &["--time-scale", TIME_SCALE, "--role", "both"]).unwrap();
    // No probes: only the costs decide here.
    let settings = json!({
        "pools": [{"name": "elastic", "role": "both", "endpoints": pods.pods}],
        "pd": {"mode": mode, "prefill_timeout_ms": 5000, "probe_interval_ms": 0}
    });
    let config = plugin_config(&pods.pods, settings);
    let envoy = Envoy::start(&EnvoyOptions::new(
        &pods.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 2).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt(&format!("elastic-{mode}-"), 2000);
    let first = post(&client, &url, &chat(&system, "first", 4, false), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.pod.clone().unwrap();
    let other = pods.pods.iter().find(|p| **p != holder).unwrap().clone();

    // Twelve streams decode on the holder (sent to it directly, as another gateway would).
    let mut streams = Vec::new();
    for i in 0..12 {
        let (client, url) = (
            fresh_client(),
            format!("http://{holder}/v1/chat/completions"),
        );
        let body = chat(&format!("stream {i}"), "tell a long story", 8000, true);
        streams.push(tokio::spawn(async move {
            post(&client, &url, &body, &[]).await
        }));
    }
    wait_for(Duration::from_secs(5), "streams on the holder", || async {
        sim_stats(&holder).await["running"].as_u64() >= Some(12)
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await; // a poll sees them

    // The held prompt with a long new turn, under a tight inter-token objective: the holder
    // decodes (it holds most of it), the pod without streams prefills.
    let turn = system_prompt("new-turn-", 1500);
    let long = post(
        &client,
        &url,
        &chat(&system, &turn, 4, true),
        &[("x-slo-tpot-ms", "1")],
    )
    .await;
    assert_eq!(long.status, 200, "{}", long.body);
    assert_eq!(
        long.debug_field("pd").as_deref(),
        Some("disaggregated"),
        "{:?}",
        long.debug
    );
    assert_eq!(
        long.pod.as_deref(),
        Some(holder.as_str()),
        "{:?}",
        long.debug
    );
    assert_eq!(
        long.debug_field("prefill").as_deref(),
        Some(other.as_str()),
        "{:?}",
        long.debug
    );
    assert_eq!(sim_stats(&other).await["prefills_for_remote_decode"], 1);
    assert_eq!(sim_stats(&holder).await["disaggregated_decodes"], 1);
    assert_eq!(sim_stats(&holder).await["prefills_for_remote_decode"], 0);

    // A short prompt within a loose objective is served whole where it lands.
    let short = post(
        &client,
        &url,
        &chat("Be brief.", "hi", 4, false),
        &[("x-slo-tpot-ms", "600000")],
    )
    .await;
    assert_eq!(short.status, 200, "{}", short.body);
    assert_eq!(
        short.debug_field("pd").as_deref(),
        Some("decode_only"),
        "{:?}",
        short.debug
    );
    let role = envoy
        .stat_where(
            "wasmcustom.kvroute.pd.disaggregated_total",
            "reason",
            "streams_objective",
        )
        .await;
    assert_eq!(role, 1, "counted with its reason");
    for stream in streams {
        stream.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_elastic_pool_prefills_on_the_pod_without_streams() {
    a_pod_without_streams_prefills_for_the_holder_beside_its_streams("inline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_elastic_pool_prefills_on_the_pod_without_streams() {
    a_pod_without_streams_prefills_for_the_holder_beside_its_streams("sidecar").await;
}
