//! Real Envoy, the built plugin, simulated pods: traffic flows and streams back intact, routing
//! headers are the plugin's alone, and a bad configuration is refused with a clear message.

mod common;

use common::*;
use harness::{plugin_config, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_plain_answers_come_back_intact() {
    let (_sim, envoy) = stack(2, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");

    let streamed = post(
        &client,
        &url,
        &chat(&system_prompt("a", 300), "hi", 12, true),
        &[],
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    let events = sse_events(&streamed.body);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        streamed.body
    );
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("chunk {e:?}: {err}")))
        .collect();
    let content_chunks = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!(content_chunks, 12, "one chunk per generated token");
    let usage = chunks
        .iter()
        .rev()
        .find(|c| c["usage"].is_object())
        .expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 12);

    let plain = post(
        &client,
        &url,
        &chat(&system_prompt("a", 300), "hi", 5, false),
        &[],
    )
    .await;
    assert_eq!(plain.status, 200);
    let v = plain.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );

    // The model list: kvroute's own, the names the healthy pods serve.
    let models: serde_json::Value = client
        .get(envoy.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert!(envoy.stat("wasmcustom.kvroute.requests_routed_total").await >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_header_picks_the_pod_and_spoofed_headers_never_reach_one() {
    let (sim, envoy) = stack(3, &[], json!({})).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let mut pods_used = std::collections::HashSet::new();
    for i in 0..30 {
        let system = system_prompt(&format!("tenant{i}-"), 120);
        // The client names a pod of its own choosing; kvroute must overrule it.
        let spoofed = &sim.pods[i % 3];
        let r = post(
            &client,
            &url,
            &chat(&system, "q", 2, false),
            &[
                ("x-gateway-destination-endpoint", spoofed),
                ("x-prefiller-host-port", "127.0.0.1:1"),
            ],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let chosen = r.debug_field("pod").expect("debug header");
        assert_eq!(
            r.pod.as_deref(),
            Some(chosen.as_str()),
            "the pod kvroute chose served it"
        );
        pods_used.insert(chosen);
    }
    assert!(
        pods_used.len() >= 2,
        "distinct prompts went to several pods: {pods_used:?}"
    );
    for pod in &sim.pods {
        let stats = sim_stats(pod).await;
        assert_eq!(
            stats["seen_headers"]["x-prefiller-host-port"], 0,
            "{pod}: {stats}"
        );
    }
    // A request kvroute does not route still loses the spoofed header.
    let before: u64 = futures::future::join_all(sim.pods.iter().map(|p| sim_stats(p)))
        .await
        .iter()
        .map(|s| {
            s["seen_headers"]["x-gateway-destination-endpoint"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let r = client
        .post(envoy.url("/v1/completions"))
        .header("x-gateway-destination-endpoint", sim.pods[0].as_str())
        .body(format!(r#"{{"model":"{MODEL}"}}"#))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("x-kvsim-pod").is_some());
    assert_eq!(
        r.status(),
        400,
        "the model server answers a body without a prompt itself"
    );
    let after: u64 = futures::future::join_all(sim.pods.iter().map(|p| sim_stats(p)))
        .await
        .iter()
        .map(|s| {
            s["seen_headers"]["x-gateway-destination-endpoint"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(
        before, after,
        "the unrouted request reached its pod without the spoofed header"
    );
    assert!(
        envoy
            .stat("wasmcustom.kvroute.spoofed_headers_removed_total")
            .await
            >= 31
    );
    assert!(envoy.stat("wasmcustom.kvroute.passthrough_total").await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_dst_wiring_routes_too() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    // ORIGINAL_DST connects to exactly one address: no fallback list in the header.
    let config = plugin_config(&sim.pods, json!({"max_endpoints_in_header": 1}));
    let envoy = Envoy::start(&EnvoyOptions::new(&sim.pods, Lb::OriginalDst, Some(config)))
        .await
        .unwrap();
    wait_healthy(&envoy, 2).await;
    let client = fresh_client();
    for i in 0..6 {
        let r = post(&client, &envoy.url("/v1/completions"), &json!({"model": MODEL, "prompt": system_prompt(&format!("p{i}"), 100), "max_tokens": 2}), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.pod, r.debug_field("pod"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_configuration_is_refused_with_a_clear_message() {
    // Static bootstrap: Envoy refuses to start, exits with an error (no crash) naming the field.
    let mut opts = EnvoyOptions::new(
        &["127.0.0.1:9".to_string()],
        Lb::OverrideHost,
        Some(r#"{"pools":[{"name":"a","endpoints":["not-an-endpoint"]}]}"#.into()),
    );
    opts.failure_policy = "FAIL_RELOAD";
    let err = match Envoy::start(&opts).await {
        Ok(_) => panic!("envoy accepted an invalid plugin configuration"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("field `pools[0].endpoints[0]`: `not-an-endpoint` is not `ip:port`"),
        "{err}"
    );

    // Dynamic (xDS, as under Istio): the bad update is rejected and the old listener keeps serving.
    let sim = Sim::start(1, &["--time-scale", TIME_SCALE]).unwrap();
    let lds = harness::LdsEnvoy::start(&sim.pods, &plugin_config(&sim.pods, json!({})))
        .await
        .unwrap();
    wait_healthy(&lds.envoy, 1).await;
    let client = fresh_client();
    let ok = post(
        &client,
        &lds.envoy.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "hello", "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    lds.update(r#"{"pools":[{"name":"a","endpoints":["nope"]}]}"#)
        .unwrap();
    harness::wait_for(Duration::from_secs(20), "LDS update rejected", || async {
        lds.envoy.stat("listener_manager.lds.update_rejected").await >= 1
    })
    .await
    .unwrap();
    assert!(
        lds.envoy.log().contains("field `pools[0].endpoints[0]`"),
        "{}",
        lds.envoy.log()
    );
    let still = post(
        &client,
        &lds.envoy.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "hello", "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(still.status, 200, "the old configuration keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lite_build_routes_in_chars_mode_and_refuses_tiktoken_by_name() {
    let lite = harness::lite_wasm_path().unwrap();
    // The release module itself, not `$KVROUTE_WASM`.
    let full = lite.with_file_name("kvroute.wasm");
    let (lite_len, full_len) = (
        std::fs::metadata(&lite).unwrap().len(),
        std::fs::metadata(&full).unwrap().len(),
    );
    assert!(
        lite_len * 4 < full_len,
        "lite {lite_len} B, full {full_len} B"
    );
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let mut opts = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(&sim.pods, json!({}))),
    );
    opts.wasm = Some(lite.clone());
    let envoy = Envoy::start(&opts).await.unwrap();
    wait_healthy(&envoy, 2).await;
    let system = system_prompt("lite-", 400);
    let client = fresh_client();
    let first = post(
        &client,
        &envoy.url("/v1/chat/completions"),
        &chat(&system, "a", 1, false),
        &[],
    )
    .await;
    // The other worker learns the placement from the leader's next page (its tick): the second
    // request may be taken by either worker.
    harness::wait_for(
        Duration::from_secs(5),
        "the first placement published",
        || async { envoy.stat("wasmcustom.kvroute.index_entries").await > 0 },
    )
    .await
    .unwrap();
    let second = post(
        &client,
        &envoy.url("/v1/chat/completions"),
        &chat(&system, "b", 1, false),
        &[],
    )
    .await;
    assert_eq!((first.status, second.status), (200, 200), "{}", second.body);
    assert_eq!(
        second.debug_field("reason").as_deref(),
        Some("prefix"),
        "{:?}",
        second.debug
    );
    assert_eq!(second.pod, first.pod);
    drop(envoy);
    let mut opts = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(
            &sim.pods,
            json!({"block": {"mode": "tiktoken"}}),
        )),
    );
    opts.wasm = Some(lite);
    let err = match Envoy::start(&opts).await {
        Ok(_) => panic!("the lite build accepted tiktoken mode"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("field `block.mode`: this build of kvroute has no tiktoken"),
        "{err}"
    );
}

/// `phase_timing` fills one histogram per filter callback; without it they stay empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phase_timing_records_every_callback() {
    let sim = Sim::start(2, &["--time-scale", "0.01"]).unwrap();
    for (phase, recorded) in phase_histograms(&sim.pods, true).await {
        assert!(recorded, "phase_timing on: {phase} has no samples");
    }
    for (phase, recorded) in phase_histograms(&sim.pods, false).await {
        assert!(!recorded, "phase_timing off: {phase} has samples");
    }
}

/// Six requests through a fresh Envoy; per phase histogram, whether it has samples.
async fn phase_histograms(pods: &[String], timed: bool) -> [(&'static str, bool); 5] {
    let plugin = plugin_config(pods, json!({ "phase_timing": timed }));
    let options = EnvoyOptions::new(pods, Lb::OverrideHost, Some(plugin));
    let wasm = harness::wasm_path().unwrap();
    let mut config = harness::envoy_config(&options, &wasm, 0);
    // Histograms reach the admin page at a stats flush (5 s by default).
    config["stats_flush_interval"] = json!("0.2s");
    let envoy = Envoy::start_with_config(&config.to_string(), options.concurrency)
        .await
        .unwrap();
    wait_healthy(&envoy, 2).await;
    let url = envoy.url("/v1/chat/completions");
    for i in 0..6 {
        let body = chat(
            &system_prompt(&format!("phases{i}-"), 300),
            "hi",
            3,
            i % 2 == 0,
        );
        let r = post(&fresh_client(), &url, &body, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let page = reqwest::get(format!(
        "http://{}/stats?filter=kvroute.phase&histogram_buckets=none",
        envoy.admin
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    [
        "request_headers",
        "request_body",
        "response_headers",
        "response_body",
        "log",
    ]
    .map(|phase| {
        let name = format!("wasmcustom.kvroute.phase.{phase}_microseconds:");
        let line = page.lines().find(|l| l.starts_with(&name));
        // A histogram with samples prints its quantiles (this interval's, then cumulative), an
        // empty one "No recorded values".
        (phase, line.is_some_and(|l| l.contains("P50(")))
    })
}
