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

/// The prefill leg's first-byte bound in the tests below (`health.first_byte_timeout_ms`); the
/// module's own `pd.prefill_timeout_ms` (60 s) is left as it ships.
const BOUND_MS: u64 = 1000;

/// A stack whose prefill leg is bounded by the health machinery's first-byte bound alone
/// (`pd.prefill_timeout_ms` at its default), with extra `health` settings.
async fn pd_stack_bounded(mode: &str, health: Value) -> PdStack {
    let mut h = json!({"first_byte_timeout_ms": BOUND_MS});
    if let (Some(h), Value::Object(extra)) = (h.as_object_mut(), health) {
        h.extend(extra);
    }
    pd_stack_with(mode, &[], json!({"pd": {"mode": mode}, "health": h})).await
}

/// One long prompt split through a healthy pool, so the test starts from splits that work.
async fn split_once(s: &PdStack, tag: &str, stream: bool) {
    let client = fresh_client();
    let before = sum_stat(&s.decode.pods, "disaggregated_decodes").await;
    let system = system_prompt(tag, 2000);
    let r = post(
        &client,
        &s.envoy.url("/v1/chat/completions"),
        &chat(&system, "q", 4, stream),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        sum_stat(&s.decode.pods, "disaggregated_decodes").await,
        before + 1,
        "the warm-up prompt was split: {:?}",
        r.debug
    );
}

/// Frozen prefill pods (every request to them stalls 15 s) hold no request much past the prefill
/// leg's first-byte bound: the leg gives up at the bound and the decode pod prefills by itself.
/// On ab4af28 inline waited for the 60 s call timeout (here: the 15 s stall), sidecar for the
/// sidecar's own timeout.
async fn a_frozen_prefill_pool_costs_about_the_first_byte_bound(mode: &str) {
    let s = pd_stack_bounded(mode, json!({})).await;
    split_once(&s, &format!("frozen-warm-{mode}-"), true).await;
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({"stall_ms": 15_000})).await;
    }
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    let mut took = Vec::new();
    for i in 0..4 {
        let system = system_prompt(&format!("frozen-{mode}-{i}-"), 2000);
        let started = std::time::Instant::now();
        let r = post(&client, &url, &chat(&system, "q", 4, true), &[]).await;
        let elapsed = started.elapsed();
        took.push(elapsed.as_millis());
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert!(s.decode.pods.contains(&r.pod.clone().unwrap()));
        assert!(
            elapsed < Duration::from_millis(BOUND_MS * 3),
            "request {i} took {elapsed:?} (bound {BOUND_MS} ms; all so far: {took:?} ms)"
        );
    }
    eprintln!("{mode}: frozen prefill pool, requests answered in {took:?} ms");
    let timeouts = s
        .envoy
        .stat("wasmcustom.kvroute.pd.prefill_timeouts_total")
        .await;
    assert!(timeouts >= 1, "prefill legs timed out: {timeouts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_a_frozen_prefill_pod_costs_about_the_first_byte_bound() {
    a_frozen_prefill_pool_costs_about_the_first_byte_bound("inline").await;
}

/// Sidecar mode: kvroute sends `x-prefiller-timeout-ms` (the bound), which kvsim's sidecar
/// honours (llm-d's does not: see docs/design/reliability.md), and stretches the decode
/// attempt's per-try timeout by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_a_frozen_prefill_pod_costs_about_the_first_byte_bound() {
    a_frozen_prefill_pool_costs_about_the_first_byte_bound("sidecar").await;
}

/// A prefill pod answering 500 to every leg is ejected by passive health like a decode pod and
/// gets few legs after (on ab4af28 it took about half of them, 13-14 of 24, and was never
/// ejected). Every request is still answered (decode-only where its leg failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_a_prefill_pod_failing_every_leg_is_ejected() {
    let s = pd_stack_bounded("inline", json!({"base_ejection_ms": 30_000})).await;
    let bad = s.prefill.pods[0].clone();
    sim_fault(&bad, json!({"fail_ratio": 1.0})).await;
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    for i in 0..24 {
        let system = system_prompt(&format!("failing-prefill-{i}-"), 2000);
        let r = post(&client, &url, &chat(&system, "q", 4, false), &[]).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
    }
    let legs = sim_stats(&bad).await["requests_failed"].as_u64().unwrap();
    let good = sim_stats(&s.prefill.pods[1]).await["prefills_for_remote_decode"]
        .as_u64()
        .unwrap();
    eprintln!("the failing prefill pod got {legs} of 24 legs, the healthy one {good}");
    assert!(
        legs <= 8,
        "the failing prefill pod got {legs} of 24 legs (the healthy one {good})"
    );
    assert!(
        s.envoy
            .stat("wasmcustom.kvroute.health.ejections_total")
            .await
            >= 1
    );
}

/// Long prompts sent one after another (200 ms apart) from now until three in a row are split
/// by cost (split, and no probe among them): how long that took, and the prompts sent, split and
/// probed on the way. Fails after `limit`.
async fn time_until_splits_by_cost(s: &PdStack, tag: &str, limit: Duration) -> Duration {
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    let from = std::time::Instant::now();
    let (mut sent, mut splits, mut probes, mut in_a_row) = (0, 0u64, 0u64, 0);
    let probes_total = || async { s.envoy.stat("wasmcustom.kvroute.pd.probes_total").await };
    loop {
        let before = sum_stat(&s.decode.pods, "disaggregated_decodes").await;
        let probes_before = probes_total().await;
        // Equal lengths: the prompt's size is not what changes the decision.
        let system = system_prompt(&format!("{tag}-{sent:04}-"), 2000);
        let r = post(&client, &url, &chat(&system, "q", 4, true), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        sent += 1;
        let split = sum_stat(&s.decode.pods, "disaggregated_decodes").await > before;
        let probed = probes_total().await > probes_before;
        splits += u64::from(split);
        probes += u64::from(probed);
        in_a_row = if split && !probed { in_a_row + 1 } else { 0 };
        if in_a_row == 3 {
            let took = from.elapsed();
            eprintln!("{tag}: splits by cost back after {took:?} ({sent} sent, {splits} split, {probes} probes)");
            return took;
        }
        assert!(
            from.elapsed() < limit,
            "{tag}: splits by cost not back within {limit:?} ({sent} sent, {splits} split, {probes} probes; last: {:?})",
            r.debug
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After a freeze of the prefill pool ends, long prompts are split again within a bounded time.
/// On ab4af28 the two requests that waited out the freeze taught the prefill role a TTFT of
/// seconds, and no long prompt was split for tens of seconds after; now their legs time out at
/// the bound and teach nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_splits_again_soon_after_a_prefill_freeze_ends() {
    let s = pd_stack_bounded("inline", json!({})).await;
    split_once(&s, "thaw-warm-", true).await;
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({"stall_ms": 4_000})).await;
    }
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    for i in 0..2 {
        let system = system_prompt(&format!("thaw-frozen-{i}-"), 2000);
        let r = post(&client, &url, &chat(&system, "q", 4, true), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({})).await;
    }
    let took = time_until_splits_by_cost(&s, "thawed", Duration::from_secs(15)).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A spell of slow but working prefills (each leg within its bound) legitimately teaches the
/// prefill role a long TTFT, and splits stop. Probes (one split per `pd.probe_interval_ms`, 2 s,
/// per VM while splits are predicted to lose) time the role again, and splits by cost come back.
/// On ab4af28 nothing is split while the estimate is pessimistic, so nothing corrects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_probes_bring_splits_back_after_slow_prefills() {
    // `pd.probe_interval_ms` at its default, so ab4af28 accepts the configuration.
    let s = pd_stack_with("inline", &[], json!({"pd": {"mode": "inline"}})).await;
    split_once(&s, "slow-warm-", true).await;
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({"stall_ms": 2_500})).await;
    }
    let client = fresh_client();
    let url = s.envoy.url("/v1/chat/completions");
    for i in 0..4 {
        let system = system_prompt(&format!("slow-{i}-"), 2000);
        let r = post(&client, &url, &chat(&system, "q", 4, true), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for pod in &s.prefill.pods {
        sim_fault(pod, json!({})).await;
    }
    time_until_splits_by_cost(&s, "healed", Duration::from_secs(30)).await;
}

/// Streams decode on both decode pods; a long prompt whose request sets a loose inter-token
/// objective (`x-slo-tpot-ms`) is prefilled on its decode pod, where its stall keeps those streams
/// within the objective, and a tight objective sends the same length of prompt to a prefill pod.
/// Each decision is counted with its reason. Before the objective was read, every stream's stall
/// counted, and both were split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_a_prompt_within_the_streams_objective_stays_on_its_decode_pod() {
    // No probe splits (`probe_interval_ms` 0): only the objective decides here.
    let pd = json!({"mode": "inline", "prefill_timeout_ms": 5000, "probe_interval_ms": 0});
    let s = pd_stack_with("inline", &[], json!({ "pd": pd })).await;
    let url = s.envoy.url("/v1/chat/completions");
    let mut streams = Vec::new();
    for i in 0..6 {
        let (client, url) = (fresh_client(), url.clone());
        let body = chat(&format!("stream {i}"), "tell a long story", 8000, true);
        streams.push(tokio::spawn(async move {
            post(&client, &url, &body, &[]).await
        }));
    }
    let decoding = || async { sum_stat(&s.decode.pods, "running").await };
    wait_for(
        Duration::from_secs(5),
        "streams running on the decode pods",
        || async { decoding().await >= 6 },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await; // a poll sees them
    let client = fresh_client();
    let loose = post(
        &client,
        &url,
        &chat(&system_prompt("objective-loose-", 2000), "q", 4, false),
        &[("x-slo-tpot-ms", "600000")],
    )
    .await;
    assert_eq!(loose.status, 200, "{}", loose.body);
    assert_eq!(
        loose.debug_field("pd").as_deref(),
        Some("decode_only"),
        "{:?}",
        loose.debug
    );
    assert_eq!(
        loose.debug_field("pd_reason").as_deref(),
        Some("within_objective")
    );
    assert_eq!(
        loose.debug_field("itl_objective_ms").as_deref(),
        Some("600000.0")
    );
    let tight = post(
        &client,
        &url,
        &chat(&system_prompt("objective-tight-", 2000), "q", 4, false),
        &[("x-slo-tpot-ms", "1")],
    )
    .await;
    assert_eq!(tight.status, 200, "{}", tight.body);
    assert_eq!(
        tight.debug_field("pd").as_deref(),
        Some("disaggregated"),
        "{:?}",
        tight.debug
    );
    assert_eq!(
        tight.debug_field("pd_reason").as_deref(),
        Some("streams_objective")
    );
    let counted = |name: &'static str, reason: &'static str| {
        let envoy = &s.envoy;
        async move {
            envoy
                .stat_where(&format!("wasmcustom.kvroute.pd.{name}"), "reason", reason)
                .await
        }
    };
    assert!(counted("decode_only_total", "within_objective").await >= 1);
    assert_eq!(counted("disaggregated_total", "streams_objective").await, 1);
    for stream in streams {
        stream.abort();
    }
}
