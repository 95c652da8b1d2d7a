//! The benchmark's reference policies through real Envoy (no plugin, `override_host`): the
//! perfect-knowledge router sends a prompt to the pod that holds it and otherwise away from a busy
//! pod, and the round-robin P/D baseline prefills on a prefill pod and decodes on a decode pod with
//! the returned `kv_transfer_params` (or, selective, leaves short prompts to the decode pod).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use harness::{Envoy, EnvoyOptions, Lb, Sim};
use kvbench::compare::run_after_warmup_with;
use kvbench::driver::DriveOptions;
use kvbench::routing::{ClientRouter, OracleObjective, PdSplit, DESTINATION_HEADER};
use kvbench::{Load, MultiTenantParams, WorkloadKind, WorkloadSpec};
use serde_json::Value;

const SCALE: f64 = 0.05;

async fn plain_envoy(hosts: &[String]) -> Envoy {
    Envoy::start(&EnvoyOptions::new(hosts, Lb::OverrideHost, None))
        .await
        .unwrap()
}

fn destination(headers: &[(reqwest::header::HeaderName, reqwest::header::HeaderValue)]) -> String {
    headers
        .iter()
        .find(|(k, _)| k.as_str() == DESTINATION_HEADER)
        .and_then(|(_, v)| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perfect_knowledge_follows_the_cache_and_avoids_the_busy_pod() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let envoy = plain_envoy(&sim.pods).await;
    let client = fresh_client();
    let router = ClientRouter::oracle(sim.pods.clone(), SCALE, OracleObjective::OwnTtft);
    let path = "/v1/chat/completions";

    // Pod 1 holds a long prompt: the oracle sends it there, and Envoy honours the header.
    let held = chat(&system_prompt("held-", 4000), "q", 4, false);
    let r = post(
        &client,
        &format!("http://{}{path}", sim.pods[1]),
        &held,
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let body = serde_json::to_vec(&held).unwrap();
    let routed = router
        .route(&client, &envoy.url(""), path, &body, 4000)
        .await;
    assert!(routed.restart_clock, "probing is not the request's latency");
    assert!(routed.predicted_ttft_ms.is_some());
    assert_eq!(destination(&routed.headers), sim.pods[1]);
    drop(routed.hold);
    let mut rb = client.post(envoy.url(path)).json(&held);
    for (k, v) in &routed.headers {
        rb = rb.header(k, v);
    }
    let resp = rb.send().await.unwrap();
    assert_eq!(
        resp.headers()
            .get("x-kvsim-pod")
            .and_then(|v| v.to_str().ok()),
        Some(sim.pods[1].as_str())
    );
    let answer: Value = resp.json().await.unwrap();
    assert!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 3900
    );

    // Pod 1 busy with a long uncached prefill (36,000 tokens: ~720 ms of wall time): a new prompt
    // goes to idle pod 0.
    let busy = {
        let (client, url) = (client.clone(), format!("http://{}{path}", sim.pods[1]));
        let long = chat(&system_prompt("busy-", 12000), "q", 2, false);
        tokio::spawn(async move { client.post(url).json(&long).send().await })
    };
    // Probed once the pod's engine has it. A fixed sleep lost that race on a loaded machine, and so
    // did waiting for the pod's request count, which counts a request as its headers arrive,
    // before its body is read and queued: both pods then looked idle and the tie went to pod 1.
    harness::wait_for(
        Duration::from_secs(5),
        "the busy prompt in pod 1's engine",
        || async {
            let stats = sim_stats(&sim.pods[1]).await;
            stats["running"].as_u64().unwrap_or(0) + stats["waiting"].as_u64().unwrap_or(0) > 0
        },
    )
    .await
    .unwrap();
    let fresh = serde_json::to_vec(&chat(&system_prompt("fresh-", 500), "q", 4, false)).unwrap();
    let routed = router
        .route(&client, &envoy.url(""), path, &fresh, 500)
        .await;
    assert_eq!(destination(&routed.headers), sim.pods[0]);
    drop(routed.hold);
    let _ = busy.await;
    let fallbacks = router.counters().snapshot();
    assert!(fallbacks.contains(&("probe_fallbacks", 0)), "{fallbacks:?}");
}

fn tiny_spec(requests: usize) -> WorkloadSpec {
    let mut spec = WorkloadSpec::new(
        WorkloadKind::MultiTenant(MultiTenantParams {
            tenants: 2,
            system_words: 800,
            max_tokens: (4, 8),
            ..MultiTenantParams::default()
        }),
        Load::Closed { concurrency: 2 },
    );
    spec.max_requests = Some(requests);
    spec.duration_s = 60.0;
    spec
}

async fn role_sum(pods: &[String], field: &str) -> u64 {
    let mut n = 0;
    for p in pods {
        n += sim_stats(p).await[field].as_u64().unwrap_or(0);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_robin_pd_baseline_prefills_then_decodes_with_the_kv_handle() {
    let prefill = Sim::start(2, &["--time-scale", TIME_SCALE, "--role", "prefill"]).unwrap();
    let decode = Sim::start(1, &["--time-scale", TIME_SCALE, "--role", "decode"]).unwrap();
    let hosts: Vec<String> = prefill.pods.iter().chain(&decode.pods).cloned().collect();
    let envoy = plain_envoy(&hosts).await;

    // Always: every request is split, the prefill pods share them.
    let router = Arc::new(ClientRouter::pd_round_robin(
        prefill.pods.clone(),
        decode.pods.clone(),
        PdSplit::Always,
        Duration::from_secs(10),
    ));
    let drive = DriveOptions {
        router: Some(router.clone()),
        ..DriveOptions::default()
    };
    let r = run_after_warmup_with(&envoy.url(""), &hosts, &tiny_spec(6), SCALE, 0.0, &drive)
        .await
        .unwrap();
    assert_eq!(r.ok, 6, "{:?}", r.errors);
    assert!(r.pod_requests.keys().all(|p| decode.pods.contains(p)));
    assert_eq!(role_sum(&decode.pods, "disaggregated_decodes").await, 6);
    assert_eq!(
        role_sum(&prefill.pods, "prefills_for_remote_decode").await,
        6
    );
    for p in &prefill.pods {
        assert_eq!(sim_stats(p).await["prefills_for_remote_decode"], 3);
    }
    let c = router.counters().snapshot();
    assert!(c.contains(&("split", 6)), "{c:?}");

    // Selective above the prompts' length: nothing is split.
    let router = Arc::new(ClientRouter::pd_round_robin(
        prefill.pods.clone(),
        decode.pods.clone(),
        PdSplit::Selective {
            threshold_tokens: 10_000,
        },
        Duration::from_secs(10),
    ));
    let drive = DriveOptions {
        router: Some(router.clone()),
        ..DriveOptions::default()
    };
    let r = run_after_warmup_with(&envoy.url(""), &hosts, &tiny_spec(4), SCALE, 0.0, &drive)
        .await
        .unwrap();
    assert_eq!(r.ok, 4, "{:?}", r.errors);
    assert_eq!(role_sum(&decode.pods, "disaggregated_decodes").await, 6);
    let c = router.counters().snapshot();
    assert!(c.contains(&("decode_only", 4)), "{c:?}");
}
