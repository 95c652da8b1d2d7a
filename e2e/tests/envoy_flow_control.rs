//! Flow control through the real Envoy with kvroute.wasm: while every pod is full, requests wait
//! at the gateway (paused after their body) and are released in priority order to the pod that
//! frees first; the queue is bounded, a held request times out with a 429 and `Retry-After`, and
//! a client that gives up leaves the queue at once; a latency objective counts the hold. One
//! worker, so one queue sees every request, except in the two-worker test: each worker holds its
//! own requests, in one order.

mod common;

use common::*;
use harness::{plugin_config, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::json;
use std::time::{Duration, Instant};

const HELD: &str = "wasmcustom.kvroute.flow.held_total";
const RELEASED: &str = "wasmcustom.kvroute.flow.released_total";
const DROPPED: &str = "wasmcustom.kvroute.flow.dropped_total";

/// Two pods whose prefills take real time (`--time-scale 0.25`: a 1,000-word prompt's prefill
/// takes about half a second), one Envoy worker, and kvroute with `flow_control` as given.
async fn held_stack(flow_control: serde_json::Value) -> (Sim, Envoy) {
    let sim = Sim::start(2, &["--time-scale", "0.25"]).unwrap();
    let config = plugin_config(&sim.pods, json!({ "flow_control": flow_control }));
    let options = EnvoyOptions {
        concurrency: 1,
        ..EnvoyOptions::new(&sim.pods, Lb::OverrideHost, Some(config))
    };
    let envoy = Envoy::start(&options).await.unwrap();
    wait_healthy(&envoy, 2).await;
    (sim, envoy)
}

/// A streamed chat request of `words` distinct words, sent now on its own connection: its reply,
/// when its first byte came and when it ended.
type Sent = tokio::task::JoinHandle<(Reply, Instant, Instant)>;

fn spawn_chat(
    url: &str,
    tag: &str,
    words: usize,
    headers: &'static [(&'static str, &'static str)],
) -> Sent {
    let body = chat(&system_prompt(tag, words), "go", 2, true);
    let url = url.to_string();
    tokio::spawn(async move {
        let start = Instant::now();
        let reply = post(&fresh_client(), &url, &body, headers).await;
        let first_byte = start + reply.ttft;
        (reply, first_byte, Instant::now())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_holds_requests_and_releases_the_highest_priority_first_to_the_pod_that_frees_first(
) {
    let (_sim, envoy) =
        held_stack(json!({"enabled": true, "queue_depth": 1, "ttl_ms": 20000})).await;
    let url = envoy.url("/v1/chat/completions");
    // A short and a long prefill fill both pods (one unstarted request each).
    let short = spawn_chat(&url, "short-", 1000, &[]);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let long = spawn_chat(&url, "long-", 6000, &[]);
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Both pods full: these wait at the gateway, the ordinary one first, then a high one.
    let low = spawn_chat(&url, "low-", 200, &[]);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let high = spawn_chat(&url, "high-", 200, &[("x-kvroute-priority", "5")]);
    let (short, _, short_at) = short.await.unwrap();
    let (high, _, high_at) = high.await.unwrap();
    let (low, _, low_at) = low.await.unwrap();
    let (long, _, long_at) = long.await.unwrap();
    for r in [&short, &long, &low, &high] {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_ne!(short.pod, long.pod, "the two prefills took one pod each");
    assert_eq!(envoy.stat(HELD).await, 2, "both waited at the gateway");
    assert_eq!(envoy.stat(RELEASED).await, 2);
    // The short prefill's pod freed first: the high request went there first, then the ordinary
    // one, each as that pod freed again, while the long prefill still held the other pod.
    assert_eq!(high.pod, short.pod, "{:?}", high.debug);
    assert_eq!(low.pod, short.pod, "{:?}", low.debug);
    assert!(high_at < low_at, "priority first");
    assert!(short_at < high_at && low_at < long_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_bounded_times_out_with_retry_after_and_forgets_a_client_that_left() {
    let (_sim, envoy) = held_stack(json!({
        "enabled": true, "queue_depth": 1, "max_held": 3, "ttl_ms": 1500
    }))
    .await;
    let url = envoy.url("/v1/chat/completions");
    // Two long prefills (several seconds each) keep both pods full throughout.
    let fill = [
        spawn_chat(&url, "fill-a-", 9000, &[]),
        spawn_chat(&url, "fill-b-", 9000, &[]),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A client that gives up after 300 ms: its request leaves the queue with it.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = chat(&system_prompt("impatient-", 200), "go", 2, true);
    let gave_up = impatient.post(&url).json(&body).send().await;
    assert!(
        gave_up.is_err(),
        "held, so the client timed out: {gave_up:?}"
    );
    harness::wait_for(Duration::from_secs(2), "the queue drops it", || async {
        envoy.stat_where(DROPPED, "reason", "disconnected").await == 1
    })
    .await
    .unwrap();
    // A flood of eight: three are held (the bound), five answered 429 at once.
    let started = Instant::now();
    let flood: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            let body = chat(&system_prompt(&format!("flood-{i}-"), 200), "go", 2, true);
            tokio::spawn(async move {
                let r = fresh_client().post(&url).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let header = |name: &str| {
                    r.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let (code, retry) = (header("x-kvroute-error"), header("retry-after"));
                let text = r.text().await.unwrap();
                (status, code, retry, text, started.elapsed())
            })
        })
        .collect();
    let mut by_code = std::collections::BTreeMap::new();
    for answer in flood {
        let (status, code, retry, text, after) = answer.await.unwrap();
        assert_eq!(status, 429, "{text}");
        let code = code.unwrap_or_default();
        let bound = match code.as_str() {
            "queue_full" => Duration::from_millis(1000),
            "queue_timeout" => {
                assert_eq!(retry.as_deref(), Some("2"), "{text}");
                assert!(
                    after >= Duration::from_millis(1400),
                    "held its TTL: {after:?}"
                );
                Duration::from_millis(3000)
            }
            other => panic!("unexpected {other}: {text}"),
        };
        assert!(after < bound, "{code} answered after {after:?}");
        assert!(text.contains("RateLimitError"), "OpenAI-shaped: {text}");
        *by_code.entry(code).or_insert(0) += 1;
    }
    assert_eq!(
        by_code,
        [
            ("queue_full".to_string(), 5),
            ("queue_timeout".to_string(), 3)
        ]
        .into(),
    );
    assert_eq!(envoy.stat_where(DROPPED, "reason", "queue_full").await, 5);
    assert_eq!(
        envoy.stat_where(DROPPED, "reason", "queue_timeout").await,
        3
    );
    assert_eq!(envoy.stat(RELEASED).await, 0, "the pods never freed");
    for f in fill {
        assert_eq!(f.await.unwrap().0.status, 200);
    }
}

/// Each reply's VM (the debug header's `vm`) and when its first byte came; every one a 200.
async fn answers(handles: Vec<Sent>) -> Vec<(String, Instant)> {
    let mut out = Vec::new();
    for handle in handles {
        let (reply, first_byte, _) = handle.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        let vm = reply
            .debug_field("vm")
            .expect("the debug header names the VM");
        out.push((vm, first_byte));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_held_by_two_workers_are_released_in_one_priority_order() {
    // One pod, two Envoy workers: each worker holds the requests of the connections it accepted,
    // and the held board makes the whole Envoy's queue one order.
    let sim = Sim::start(1, &["--time-scale", "0.25"]).unwrap();
    let config = plugin_config(
        &sim.pods,
        json!({ "flow_control": {"enabled": true, "queue_depth": 1, "ttl_ms": 20000} }),
    );
    let options = EnvoyOptions {
        concurrency: 2,
        ..EnvoyOptions::new(&sim.pods, Lb::OverrideHost, Some(config))
    };
    let envoy = Envoy::start(&options).await.unwrap();
    wait_healthy(&envoy, 1).await;
    let url = envoy.url("/v1/chat/completions");
    // A long prefill fills the pod for about a second and a half.
    let fill = spawn_chat(&url, "fill-", 3000, &[]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Ten ordinary requests on ten connections (spread over both workers), then two urgent ones.
    let mut low = Vec::new();
    for i in 0..10 {
        low.push(spawn_chat(&url, &format!("low-{i}-"), 100, &[]));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    harness::wait_for(Duration::from_secs(3), "ten held", || async {
        envoy.stat(HELD).await == 10
    })
    .await
    .unwrap();
    let high: Vec<_> = (0..2)
        .map(|i| {
            spawn_chat(
                &url,
                &format!("high-{i}-"),
                100,
                &[("x-kvroute-priority", "5")],
            )
        })
        .collect();
    harness::wait_for(Duration::from_secs(3), "twelve held", || async {
        envoy.stat(HELD).await == 12
    })
    .await
    .unwrap();
    let (fill, _, _) = fill.await.unwrap();
    assert_eq!(fill.status, 200, "{}", fill.body);
    let high = answers(high).await;
    let low = answers(low).await;
    // The case this is about happened: an urgent request held by one worker while the other held
    // ordinary ones (twelve connections all on one worker: about 1 in 2,000).
    assert!(
        high.iter()
            .any(|(hv, _)| low.iter().any(|(lv, _)| lv != hv)),
        "every request was held by one worker: {high:?} {low:?}"
    );
    let last_high = high.iter().map(|(_, at)| *at).max().unwrap();
    let first_low = low.iter().map(|(_, at)| *at).min().unwrap();
    assert!(
        last_high < first_low,
        "an ordinary request went before an urgent one held by another worker: \
         high {high:?}, low {low:?}"
    );
    assert_eq!(envoy.stat(RELEASED).await, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_requests_first_token_objective_counts_its_hold() {
    const MISSED: &str = "wasmcustom.kvroute.slo.ttft_missed_total";
    let (_sim, envoy) =
        held_stack(json!({"enabled": true, "queue_depth": 1, "ttl_ms": 20000})).await;
    let url = envoy.url("/v1/chat/completions");
    // Two long prefills (about a second and a half each) fill both pods.
    let fill = [
        spawn_chat(&url, "fill-a-", 3000, &[]),
        spawn_chat(&url, "fill-b-", 3000, &[]),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Held until a pod frees, then prefilled in a tenth of a second: late for a 400 ms objective
    // counted from when the client sent it, on time for one of a minute.
    let tight = spawn_chat(&url, "tight-", 200, &[("x-slo-ttft-ms", "400")]);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let loose = spawn_chat(&url, "loose-", 200, &[("x-slo-ttft-ms", "60000")]);
    let sent = Instant::now();
    let (tight, tight_at, _) = tight.await.unwrap();
    let (loose, _, _) = loose.await.unwrap();
    for f in fill {
        assert_eq!(f.await.unwrap().0.status, 200);
    }
    assert_eq!((tight.status, loose.status), (200, 200), "{}", tight.body);
    assert_eq!(envoy.stat(HELD).await, 2, "both waited at the gateway");
    assert!(
        tight_at.duration_since(sent) > Duration::from_millis(400),
        "the hold alone outlasted the objective"
    );
    assert_eq!(
        envoy.stat(MISSED).await,
        1,
        "the tight objective missed, counted from the client's request, not from its release"
    );
}
