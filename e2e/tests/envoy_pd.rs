//! Prefill/decode disaggregation through real Envoy, in both modes: long uncached prompts go
//! through a prefill pod and a decode pod, short or cached ones to a decode pod alone, a dead
//! prefill pod costs no client request, and a client cannot name its own prefiller.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::{json, Value};
use std::time::Duration;

struct PdStack {
    prefill: Sim,
    decode: Sim,
    envoy: Envoy,
}

async fn pd_stack(mode: &str) -> PdStack {
    pd_stack_with(mode, &[], json!({})).await
}

/// [`pd_stack`] with extra kvsim arguments for every pod and extra plugin settings.
async fn pd_stack_with(mode: &str, sim_args: &[&str], extra: Value) -> PdStack {
    let args = |role: &'static str| {
        let mut a = vec!["--time-scale", TIME_SCALE, "--role", role];
        a.extend_from_slice(sim_args);
        a
    };
    let prefill = Sim::start(2, &args("prefill")).unwrap();
    let decode = Sim::start(2, &args("decode")).unwrap();
    let mut settings = json!({
        "pools": [
            {"name": "prefill", "role": "prefill", "endpoints": prefill.pods},
            {"name": "decode", "role": "decode", "endpoints": decode.pods}
        ],
        "pd": {"mode": mode, "prefill_timeout_ms": 5000}
    });
    if let (Some(s), Value::Object(e)) = (settings.as_object_mut(), extra) {
        s.extend(e);
    }
    let config = plugin_config(&decode.pods, settings);
    // The pool cluster holds the decode pods: requests go there; prefill pods are reached by the
    // decode pod's sidecar or by kvroute's own call.
    let envoy = Envoy::start(&EnvoyOptions::new(
        &decode.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 4).await;
    PdStack {
        prefill,
        decode,
        envoy,
    }
}

async fn sum_stat(pods: &[String], field: &str) -> u64 {
    let mut total = 0;
    for p in pods {
        total += sim_stats(p).await[field].as_u64().unwrap_or(0);
    }
    total
}

async fn long_and_short_prompts_take_their_paths(mode: &str) {
    let s = pd_stack(mode).await;
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    let system = system_prompt(&format!("pd-{mode}-"), 3000);

    let long = post(&client, &url, &chat(&system, "first", 8, true), &[]).await;
    assert_eq!(long.status, 200, "{}", long.body);
    assert_eq!(
        sse_events(&long.body).last().map(String::as_str),
        Some("[DONE]"),
        "streams intact"
    );
    assert_eq!(
        long.debug_field("pd").as_deref(),
        Some("disaggregated"),
        "{:?}",
        long.debug
    );
    let prefill_pod = long.debug_field("prefill").unwrap();
    assert!(s.prefill.pods.contains(&prefill_pod));
    let decode_pod = long.pod.clone().unwrap();
    assert!(s.decode.pods.contains(&decode_pod));
    assert_eq!(
        sim_stats(&prefill_pod).await["prefills_for_remote_decode"],
        1
    );
    let decoded = sim_stats(&decode_pod).await;
    assert_eq!(decoded["disaggregated_decodes"], 1, "{decoded}");
    assert_eq!(
        decoded["last_kv_transfer_params"]["remote_host"], "127.0.0.1",
        "{decoded}"
    );
    if mode == "sidecar" {
        assert_eq!(
            decoded["sidecar_prefills"], 1,
            "the decode pod's sidecar called the prefiller"
        );
    }

    // The same prompt again: the decode pod now holds it, so it needs no prefill pod.
    let cached = post(&client, &url, &chat(&system, "second", 8, false), &[]).await;
    assert_eq!(cached.status, 200);
    assert_eq!(cached.pod.as_deref(), Some(decode_pod.as_str()));
    assert_eq!(
        cached.debug_field("pd").as_deref(),
        Some("decode_only"),
        "{:?}",
        cached.debug
    );
    assert!(
        cached.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // A short prompt goes to a decode pod alone, even when the client names a prefiller.
    let before = sum_stat(&s.prefill.pods, "prefills_for_remote_decode").await;
    let short = post(
        &client,
        &url,
        &chat("Be brief.", "hi", 4, false),
        &[("x-prefiller-host-port", prefill_pod.as_str())],
    )
    .await;
    assert_eq!(short.status, 200, "{}", short.body);
    assert_eq!(short.debug_field("pd").as_deref(), Some("decode_only"));
    assert_eq!(
        sum_stat(&s.prefill.pods, "prefills_for_remote_decode").await,
        before
    );
    let spoof_seen: u64 = sum_stat(&s.decode.pods, "sidecar_prefills").await;
    let expected_sidecar = if mode == "sidecar" { 1 } else { 0 };
    assert_eq!(
        spoof_seen, expected_sidecar,
        "the client's x-prefiller-host-port never reached a pod"
    );
    let counter = s
        .envoy
        .stat("wasmcustom.kvroute.pd.disaggregated_total")
        .await;
    assert_eq!(counter, 1);
    assert!(
        s.envoy
            .stat("wasmcustom.kvroute.pd.decode_only_total")
            .await
            >= 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_long_prompts_prefill_elsewhere_short_ones_do_not() {
    long_and_short_prompts_take_their_paths("sidecar").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_long_prompts_prefill_elsewhere_short_ones_do_not() {
    long_and_short_prompts_take_their_paths("inline").await;
}

async fn a_dead_prefill_pool_costs_no_request(mode: &str) {
    let mut s = pd_stack(mode).await;
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    s.prefill.proc.kill();
    // At once (kvroute still believes the prefill pods are healthy) and after staleness.
    for i in 0..12 {
        let system = system_prompt(&format!("dead-{mode}-{i}-"), 2000);
        let r = post(&client, &url, &chat(&system, "q", 4, false), &[]).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert!(s.decode.pods.contains(&r.pod.clone().unwrap()));
        if i == 5 {
            tokio::time::sleep(Duration::from_millis(1200)).await;
        }
    }
    let last = post(
        &client,
        &url,
        &chat(&system_prompt("dead-last-", 2000), "q", 4, false),
        &[],
    )
    .await;
    assert_eq!(
        last.debug_field("pd").as_deref(),
        Some("decode_only_no_prefill_pod"),
        "{:?}",
        last.debug
    );
    if mode == "inline" {
        assert!(
            s.envoy
                .stat("wasmcustom.kvroute.pd.prefill_failures_total")
                .await
                >= 1
        );
    } else {
        assert!(sum_stat(&s.decode.pods, "sidecar_prefill_failures").await >= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_survives_a_dead_prefill_pool() {
    a_dead_prefill_pool_costs_no_request("sidecar").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_falls_back_to_decode_only_when_prefill_dies() {
    a_dead_prefill_pool_costs_no_request("inline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_returns_a_prefill_pods_4xx_as_is() {
    let s = pd_stack("inline").await;
    let client = fresh_client();
    // Longer than the simulator's max_model_len: the prefill pod refuses it with vLLM's 400.
    let huge: Value = chat(&system_prompt("huge-", 140_000), "q", 4, false);
    let r = post(&client, &s.envoy.url("/v1/chat/completions"), &huge, &[]).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["type"], "BadRequestError", "{}", r.body);
    wait_for(Duration::from_secs(5), "the rejection counted", || async {
        s.envoy
            .stat("wasmcustom.kvroute.pd.prefill_rejected_total")
            .await
            == 1
    })
    .await
    .unwrap();
    drop(s.decode);
}

/// A prefill pod answering 429 (too busy, as a rate-limiting proxy in front of it would) says
/// nothing of the request: it is served decode-only, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_serves_decode_only_when_a_prefill_pod_is_too_busy() {
    let s = pd_stack("inline").await;
    let client = fresh_client();
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({"fail_ratio": 1.0, "fail_status": 429})).await;
    }
    for i in 0..4 {
        let system = system_prompt(&format!("busy-prefill-{i}-"), 2000);
        let r = post(
            &client,
            &s.envoy.url("/v1/chat/completions"),
            &chat(&system, "q", 4, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert!(s.decode.pods.contains(&r.pod.clone().unwrap()));
    }
    assert!(
        sum_stat(&s.prefill.pods, "requests_failed").await >= 1,
        "the prefill pods were asked"
    );
    assert_eq!(
        s.envoy
            .stat("wasmcustom.kvroute.pd.prefill_rejected_total")
            .await,
        0
    );
}

/// Pods behind an API key (vLLM's `--api-key`): a client with the key gets its split request
/// served, the prefill call carrying the client's key; the leader's own calls carry the pool's
/// configured key (no pod ever refuses them); a client without the key is refused by the decode
/// pod itself, and the prefill pod's 401 to kvroute's call is counted as the pod's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_carries_the_clients_api_key_to_the_prefill_pod() {
    const KEY: &str = "sk-pool-secret";
    let s = pd_stack_with(
        "inline",
        &["--api-key", KEY],
        json!({"pod_api_key": KEY, "models_poll_interval_ms": 500}),
    )
    .await;
    let all: Vec<String> = s
        .prefill
        .pods
        .iter()
        .chain(&s.decode.pods)
        .cloned()
        .collect();
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    let bearer = format!("Bearer {KEY}");
    let keyed = [("authorization", bearer.as_str())];
    let long = post(
        &client,
        &url,
        &chat(&system_prompt("keyed-", 3000), "first", 8, true),
        &keyed,
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
        sum_stat(&s.prefill.pods, "prefills_for_remote_decode").await,
        1
    );
    // Let the leader read every pod's model list with its own key at least once more.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        sum_stat(&all, "unauthorized_total").await,
        0,
        "neither the prefill call nor the leader's polls were refused"
    );
    assert_eq!(
        s.envoy
            .stat("wasmcustom.kvroute.pd.prefill_unauthorized_total")
            .await,
        0
    );

    // Without the key: the prefill pod refuses kvroute's call (counted as its refusal, not the
    // client's), and the decode pod, judging the client's own credentials, answers 401.
    let unkeyed = post(
        &client,
        &url,
        &chat(&system_prompt("unkeyed-", 3000), "first", 8, false),
        &[],
    )
    .await;
    assert_eq!(unkeyed.status, 401, "{}", unkeyed.body);
    assert_eq!(unkeyed.json()["error"], "Unauthorized", "{}", unkeyed.body);
    wait_for(
        Duration::from_secs(5),
        "the prefill pod's 401 counted",
        || async {
            s.envoy
                .stat("wasmcustom.kvroute.pd.prefill_unauthorized_total")
                .await
                == 1
        },
    )
    .await
    .unwrap();
    assert_eq!(
        s.envoy
            .stat("wasmcustom.kvroute.pd.prefill_rejected_total")
            .await,
        0
    );
    assert_eq!(sum_stat(&s.prefill.pods, "unauthorized_total").await, 1);
    assert_eq!(sum_stat(&s.decode.pods, "unauthorized_total").await, 1);
}

/// A client's own KV handle (a host and port the decode pod would pull from) never reaches a
/// pod: on a decode-only request nothing is pulled, on a split one the handle is kvroute's.
async fn a_client_kv_handle_never_reaches_a_pod(mode: &str) {
    let s = pd_stack(mode).await;
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    let spoofed = json!({"do_remote_prefill": true, "remote_host": "10.1.2.3", "remote_port": 22,
                         "remote_engine_id": "evil", "remote_block_ids": [1, 2, 3]});
    let before = sum_stat(&s.decode.pods, "disaggregated_decodes").await;
    let mut short = chat("Be brief.", "hi", 4, false);
    short["kv_transfer_params"] = spoofed.clone();
    let r = post(&client, &url, &short, &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.debug_field("pd").as_deref(), Some("decode_only"));
    let decode_pod = r.pod.clone().unwrap();
    assert_eq!(
        sum_stat(&s.decode.pods, "disaggregated_decodes").await,
        before,
        "no KV pulled on the client's word"
    );
    assert!(
        !sim_stats(&decode_pod).await["last_kv_transfer_params"]
            .to_string()
            .contains("10.1.2.3"),
        "the decode pod never saw the client's handle"
    );
    let mut long = chat(
        &system_prompt(&format!("kvspoof-{mode}-"), 3000),
        "q",
        4,
        false,
    );
    long["kv_transfer_params"] = spoofed;
    let r = post(&client, &url, &long, &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.debug_field("pd").as_deref(), Some("disaggregated"));
    let seen = sim_stats(&r.pod.unwrap()).await["last_kv_transfer_params"].to_string();
    assert!(
        !seen.contains("10.1.2.3") && !seen.contains("evil"),
        "{seen}"
    );
    assert_eq!(
        s.envoy
            .stat("wasmcustom.kvroute.spoofed_kv_transfer_params_removed_total")
            .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_never_forwards_a_client_kv_handle() {
    a_client_kv_handle_never_reaches_a_pod("sidecar").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_never_forwards_a_client_kv_handle() {
    a_client_kv_handle_never_reaches_a_pod("inline").await;
}
