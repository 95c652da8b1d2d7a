//! kvroute's routing decision in Envoy's own access log, through real Envoy: each routed request's
//! line names the chosen pod (the pod that served it), the reason, the predicted TTFT, the cached
//! tokens expected (more than zero for a repeated prompt) and the P/D outcome, read from the
//! filter state the plugin sets (`%FILTER_STATE(wasm.kvroute_*:PLAIN)%`); the debug header goes
//! only to a request carrying the trusted token, and no trigger header reaches a pod.

mod common;

use common::*;
use harness::{
    envoy_config, plugin_config, repo_root, wait_for, wasm_path, Envoy, EnvoyOptions, Lb, Sim,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fields of each access-log line, as the shipped configurations log them.
fn log_format() -> Value {
    json!({
        "id": "%REQ(x-test-id)%",
        "pod": "%FILTER_STATE(wasm.kvroute_pod:PLAIN)%",
        "reason": "%FILTER_STATE(wasm.kvroute_reason:PLAIN)%",
        "predicted_ttft_ms": "%FILTER_STATE(wasm.kvroute_predicted_ttft_ms:PLAIN)%",
        "expected_cached_tokens": "%FILTER_STATE(wasm.kvroute_expected_cached_tokens:PLAIN)%",
        "pd": "%FILTER_STATE(wasm.kvroute_pd:PLAIN)%",
        "prefill_pod": "%FILTER_STATE(wasm.kvroute_prefill_pod:PLAIN)%",
        // Without `:PLAIN`, Envoy prints the state as a protobuf `BytesValue`, base64-encoded.
        "pod_unformatted": "%FILTER_STATE(wasm.kvroute_pod)%",
        "upstream_host": "%UPSTREAM_HOST%",
        "served_by": "%RESP(x-kvsim-pod)%",
        "trigger_upstream": "%REQ(x-kvroute-debug-token)%",
        "status": "%RESPONSE_CODE%"
    })
}

/// The access log `envoy/kvroute.yaml` ships (a text line to stdout), written to `path` instead,
/// each line led by `id=` and the request's `x-test-id`.
fn shipped_access_log(path: &Path) -> Value {
    let file = repo_root().join("envoy/kvroute.yaml");
    let config: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let hcm = &config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let mut log = hcm["access_log"][0].clone();
    let format = &mut log["typed_config"]["log_format"]["text_format_source"]["inline_string"];
    let shipped = format
        .as_str()
        .expect("envoy/kvroute.yaml ships an access-log format");
    assert!(
        shipped.contains("%FILTER_STATE(wasm.kvroute_pod:PLAIN)%"),
        "{shipped}"
    );
    *format = json!(format!("id=%REQ(x-test-id)% {shipped}"));
    log["name"] = json!("envoy.access_loggers.file");
    log["typed_config"]["@type"] =
        json!("type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog");
    log["typed_config"]["path"] = json!(path.display().to_string());
    log
}

/// Envoy with kvroute (`plugin`) in front of `pods`, logging every request to `access.log` (the
/// fields above, as JSON) and to `shipped.log` (the shipped format).
async fn logged_envoy(pods: &[String], plugin: String) -> (Envoy, PathBuf) {
    let options = EnvoyOptions::new(pods, Lb::OverrideHost, Some(plugin));
    let dir = harness::scratch_dir("decision-log").unwrap();
    let log = dir.join("access.log");
    let mut config = envoy_config(&options, &wasm_path().unwrap(), 0);
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["access_log"] = json!([{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": log.display().to_string(),
            "log_format": {"json_format": log_format()}}},
            shipped_access_log(&dir.join("shipped.log"))]);
    let envoy = Envoy::start_with_config(&config.to_string(), options.concurrency)
        .await
        .unwrap();
    (envoy, log)
}

/// The `key=value` fields of the shipped format's line for the request sent with `x-test-id: id`,
/// once Envoy has written it. Each file logger flushes on its own, so the JSON line being there
/// says nothing of this one (a CI-loaded run found it missing right after the JSON line).
async fn shipped_line_of(json_log: &Path, id: &str) -> std::collections::HashMap<String, String> {
    let path = json_log.with_file_name("shipped.log");
    let prefix = format!("id={id} ");
    let mut line = None;
    let written = wait_for(
        Duration::from_secs(10),
        "the shipped access-log line",
        || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .map(str::to_string);
            let done = line.is_some();
            async move { done }
        },
    )
    .await;
    let Some(line) = line else {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        panic!("no shipped line for {id} ({written:?}): {text}");
    };
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The access-log line of the request sent with `x-test-id: id`, once Envoy has written it.
async fn line_of(log: &Path, id: &str) -> Value {
    let mut found = Value::Null;
    let written = wait_for(Duration::from_secs(10), "the access-log line", || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["id"] == id)
            .unwrap_or(Value::Null);
        let done = !found.is_null();
        async move { done }
    })
    .await;
    if let Err(e) = written {
        panic!("{e}: {}", std::fs::read_to_string(log).unwrap_or_default());
    }
    found
}

/// The token a trusted client sends to get the debug header.
const TOKEN: &str = "trusted-operator-token-0123456789";
const TRIGGER: &str = "x-kvroute-debug-token";

fn trusted_only() -> Value {
    json!({"debug_header": {"trigger_header": TRIGGER, "token": TOKEN}})
}

fn text(line: &Value, field: &str) -> String {
    line[field]
        .as_str()
        .unwrap_or_else(|| panic!("`{field}` is not logged: {line}"))
        .to_string()
}

fn number(line: &Value, field: &str) -> f64 {
    text(line, field)
        .parse()
        .unwrap_or_else(|_| panic!("`{field}` is not a number: {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_routed_request_logs_the_pod_that_served_it_why_and_what_was_predicted() {
    let sim = Sim::start(3, &["--time-scale", TIME_SCALE]).unwrap();
    let (envoy, log) = logged_envoy(&sim.pods, plugin_config(&sim.pods, trusted_only())).await;
    wait_healthy(&envoy, 3).await;
    // Every worker VM adopts the leader's first complete table on its next tick.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt("logged-tenant-", 800);

    let first = post(
        &client,
        &url,
        &chat(&system, "q", 2, false),
        &[("x-test-id", "first")],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.debug, None, "no token, no debug header");
    let line = line_of(&log, "first").await;
    let served = first.pod.clone().unwrap();
    assert_eq!(text(&line, "pod"), served, "{line}");
    assert_eq!(text(&line, "upstream_host"), served, "{line}");
    assert_eq!(text(&line, "served_by"), served, "{line}");
    assert_eq!(text(&line, "reason"), "load", "nothing cached yet: {line}");
    assert!(number(&line, "predicted_ttft_ms") > 0.0, "{line}");
    assert_eq!(text(&line, "expected_cached_tokens"), "0", "{line}");
    assert_eq!(text(&line, "pd"), "none", "no decode pool: {line}");
    assert!(line["prefill_pod"].is_null(), "not split: {line}");
    assert_eq!(
        line["pod_unformatted"]["@type"], "type.googleapis.com/google.protobuf.BytesValue",
        "{line}"
    );

    // The same prompt from a trusted client: its holder, expected to be cached, and the debug
    // header agrees with the log line.
    let trusted = post(
        &client,
        &url,
        &chat(&system, "q", 2, false),
        &[("x-test-id", "trusted"), (TRIGGER, TOKEN)],
    )
    .await;
    assert_eq!(trusted.status, 200, "{}", trusted.body);
    let line = line_of(&log, "trusted").await;
    assert_eq!(trusted.pod.as_deref(), Some(served.as_str()));
    assert_eq!(text(&line, "pod"), served, "{line}");
    assert_eq!(text(&line, "upstream_host"), served, "{line}");
    assert_eq!(text(&line, "reason"), "prefix_hit", "{line}");
    let expected = number(&line, "expected_cached_tokens");
    let prompt = trusted.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(
        expected > 0.0 && expected <= prompt,
        "0 < {expected} <= the prompt's {prompt} tokens: {line}"
    );
    let reported = trusted.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(reported > 0, "the pod did hold it: {}", trusted.body);
    assert!(
        number(&line, "predicted_ttft_ms")
            < number(&line_of(&log, "first").await, "predicted_ttft_ms"),
        "a cached prompt is predicted faster"
    );
    let debug = trusted
        .debug
        .as_deref()
        .expect("the trusted client gets the debug header");
    assert_eq!(
        trusted.debug_field("pod").as_deref(),
        Some(served.as_str()),
        "{debug}"
    );
    assert_eq!(
        trusted.debug_field("predicted_ttft_ms").as_deref(),
        Some(text(&line, "predicted_ttft_ms").as_str()),
        "{debug}"
    );
    assert!(
        line["trigger_upstream"].is_null(),
        "the trigger was removed before forwarding: {line}"
    );
    // The shipped format says the same.
    let shipped = shipped_line_of(&log, "trusted").await;
    for (key, field) in [
        ("upstream", "upstream_host"),
        ("kvroute_pod", "pod"),
        ("kvroute_reason", "reason"),
        ("kvroute_predicted_ttft_ms", "predicted_ttft_ms"),
        ("kvroute_expected_cached_tokens", "expected_cached_tokens"),
        ("kvroute_pd", "pd"),
    ] {
        assert_eq!(
            shipped.get(key),
            Some(&text(&line, field)),
            "{key}: {shipped:?}"
        );
    }
    assert_eq!(
        shipped.get("kvroute_prefill_pod").map(String::as_str),
        Some("-")
    );
    assert_eq!(
        sim_stats(&served).await["requests_total"].as_u64(),
        Some(2),
        "both requests reached the pod the log names"
    );

    // A wrong token (and a prefix of the right one) gets nothing, and is removed all the same.
    for (id, token) in [
        ("wrong", "trusted-operator-token-0123456788"),
        ("prefix", &TOKEN[..20]),
    ] {
        let r = post(
            &client,
            &url,
            &chat(&system, "q", 2, false),
            &[("x-test-id", id), (TRIGGER, token)],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.debug, None, "{id}: no debug header without the token");
        let line = line_of(&log, id).await;
        assert!(line["trigger_upstream"].is_null(), "{line}");
        assert_eq!(text(&line, "pod"), r.pod.unwrap(), "{line}");
    }

    // A request kvroute does not route carries no decision (none left over from another).
    let other = post(
        &client,
        &envoy.url("/v1/embeddings"),
        &json!({"model": MODEL, "input": "x"}),
        &[("x-test-id", "passed-through")],
    )
    .await;
    let line = line_of(&log, "passed-through").await;
    assert!(
        line["pod"].is_null() && line["reason"].is_null(),
        "{} {line}",
        other.status
    );
    drop(sim);
}

/// A prefill and a decode pool (two pods each) behind a logged Envoy, P/D in `mode`.
async fn logged_pd_stack(mode: &str) -> (Sim, Sim, Envoy, PathBuf) {
    let args = |role: &'static str| vec!["--time-scale", TIME_SCALE, "--role", role];
    let prefill = Sim::start(2, &args("prefill")).unwrap();
    let decode = Sim::start(2, &args("decode")).unwrap();
    let settings = json!({
        "pools": [
            {"name": "prefill", "role": "prefill", "endpoints": prefill.pods},
            {"name": "decode", "role": "decode", "endpoints": decode.pods}
        ],
        "pd": {"mode": mode, "prefill_timeout_ms": 5000}
    });
    // Requests go to the decode pods; prefill pods are reached by kvroute's call or the sidecar.
    let (envoy, log) = logged_envoy(&decode.pods, plugin_config(&decode.pods, settings)).await;
    wait_healthy(&envoy, 4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (prefill, decode, envoy, log)
}

async fn the_pd_outcome_is_logged(mode: &str) {
    let (mut prefill, decode, envoy, log) = logged_pd_stack(mode).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt(&format!("logged-pd-{mode}-"), 3000);

    let long = post(
        &client,
        &url,
        &chat(&system, "first", 4, false),
        &[("x-test-id", "long")],
    )
    .await;
    assert_eq!(long.status, 200, "{}", long.body);
    let line = line_of(&log, "long").await;
    assert_eq!(text(&line, "pd"), format!("split_{mode}"), "{line}");
    let decode_pod = long.pod.clone().unwrap();
    assert_eq!(text(&line, "pod"), decode_pod, "{line}");
    assert_eq!(text(&line, "upstream_host"), decode_pod, "{line}");
    let prefill_pod = text(&line, "prefill_pod");
    assert!(prefill.pods.contains(&prefill_pod), "{line}");
    assert_eq!(
        sim_stats(&prefill_pod).await["prefills_for_remote_decode"],
        1,
        "the logged prefill pod made the prefill"
    );
    assert!(number(&line, "predicted_ttft_ms") > 0.0, "{line}");

    // Held by the decode pod now: no split.
    let cached = post(
        &client,
        &url,
        &chat(&system, "second", 4, false),
        &[("x-test-id", "cached")],
    )
    .await;
    assert_eq!(cached.status, 200, "{}", cached.body);
    let line = line_of(&log, "cached").await;
    assert_eq!(text(&line, "pd"), "decode_only", "{line}");
    assert_eq!(text(&line, "pod"), decode_pod, "{line}");
    assert!(number(&line, "expected_cached_tokens") > 0.0, "{line}");
    assert!(line["prefill_pod"].is_null(), "{line}");

    if mode == "inline" {
        // The prefill pool dies; kvroute still believes it healthy and splits, the call fails and
        // the decode pod prefills: the log says so.
        prefill.proc.kill();
        let fresh = system_prompt("logged-pd-after-", 3000);
        let r = post(
            &client,
            &url,
            &chat(&fresh, "q", 4, false),
            &[("x-test-id", "fallback")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let line = line_of(&log, "fallback").await;
        assert_eq!(text(&line, "pd"), "decode_only_fallback", "{line}");
        assert_eq!(text(&line, "pod"), r.pod.unwrap(), "{line}");
        assert!(
            decode.pods.contains(&text(&line, "upstream_host")),
            "{line}"
        );
    }
    drop(decode);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_split_its_prefill_pod_and_a_fallback_are_logged() {
    the_pd_outcome_is_logged("inline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_split_and_its_prefill_pod_are_logged() {
    the_pd_outcome_is_logged("sidecar").await;
}

/// The tracing tags that carry the decision (the README's example): each reads the filter state
/// the access log reads.
fn decision_tags() -> Value {
    let tag = |tag: &str, key: &str| json!({"tag": tag, "value": format!("%FILTER_STATE(wasm.{key}:PLAIN)%")});
    json!([
        tag("kvroute.pod", "kvroute_pod"),
        tag("kvroute.reason", "kvroute_reason"),
        tag("kvroute.predicted_ttft_ms", "kvroute_predicted_ttft_ms"),
        tag(
            "kvroute.expected_cached_tokens",
            "kvroute_expected_cached_tokens"
        ),
        tag("kvroute.pd", "kvroute_pd"),
    ])
}

/// A Zipkin collector on a free port: every span Envoy reports, as JSON.
async fn zipkin_collector() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::{routing::post, Json, Router};
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = Router::new().route(
        "/api/v2/spans",
        post(move |Json(batch): Json<Vec<Value>>| async move {
            kept.lock().unwrap().extend(batch);
            axum::http::StatusCode::ACCEPTED
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_requests_span_carries_the_decision_as_tags() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let (collector, spans) = zipkin_collector().await;
    let options = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(&sim.pods, json!({"debug_header": false}))),
    );
    let mut config = envoy_config(&options, &wasm_path().unwrap(), 0);
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["tracing"] = json!({
            "random_sampling": {"value": 100},
            "custom_tags": decision_tags(),
            "provider": {"name": "envoy.tracers.zipkin", "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
                "collector_cluster": "zipkin",
                "collector_endpoint": "/api/v2/spans",
                "collector_endpoint_version": "HTTP_JSON"}}});
    let (host, port) = collector.rsplit_once(':').unwrap();
    config["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "zipkin", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "zipkin", "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": host, "port_value": port.parse::<u16>().unwrap()}}}}]}]}}));
    // Each span is reported as soon as it ends (the default waits for 5 spans or 5 s).
    config["layered_runtime"] = json!({"layers": [{"name": "static", "static_layer": {
        "tracing.zipkin.min_flush_spans": 1}}]});
    let envoy = Envoy::start_with_config(&config.to_string(), options.concurrency)
        .await
        .unwrap();
    wait_healthy(&envoy, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let system = system_prompt("traced-", 600);
    let r = post(
        &fresh_client(),
        &envoy.url("/v1/chat/completions"),
        &chat(&system, "q", 2, false),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let served = r.pod.unwrap();
    let mut span = Value::Null;
    let reported = wait_for(Duration::from_secs(10), "the request's span", || {
        span = spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| s["tags"]["kvroute.pod"].is_string())
            .cloned()
            .unwrap_or(Value::Null);
        let done = !span.is_null();
        async move { done }
    })
    .await;
    if let Err(e) = reported {
        panic!("{e}: {:?}", spans.lock().unwrap());
    }
    let tags = &span["tags"];
    assert_eq!(tags["kvroute.pod"], served.as_str(), "{span}");
    assert_eq!(tags["kvroute.reason"], "load", "{span}");
    assert_eq!(tags["kvroute.expected_cached_tokens"], "0", "{span}");
    assert_eq!(tags["kvroute.pd"], "none", "{span}");
    let predicted: f64 = tags["kvroute.predicted_ttft_ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(predicted > 0.0, "{span}");
    drop(sim);
}
