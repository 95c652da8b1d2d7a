//! Behavioural tests of kvsim, in-process through the library, at a small time scale.
//!
//! Timing assertions compare quantities that differ by an order of magnitude in the model, so they
//! hold on a loaded two-core machine.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kvsim::{
    parse_lora_module, spawn_pod, spawn_pods, EngineKind, Faults, PodHandle, Role, SimConfig,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;

fn config(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// `n` distinct short words: exactly `n` simulator tokens.
fn prompt(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn post(url: &str, body: Value) -> reqwest::Response {
    client()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("request")
}

async fn get_text(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body")
}

async fn stats(pod: &PodHandle) -> Value {
    serde_json::from_str(&get_text(&format!("{}/sim/stats", pod.url())).await).expect("stats json")
}

/// First sample of a metric family (any labels).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

struct Streamed {
    content_type: String,
    pod_header: String,
    /// `data:` payloads in order (including `[DONE]`).
    events: Vec<String>,
    /// Arrival time of each chunk that carried generated text.
    token_times: Vec<Duration>,
}

impl Streamed {
    fn ttft(&self) -> Duration {
        self.token_times[0]
    }

    fn max_gap(&self) -> Duration {
        self.token_times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    fn json_events(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
            .collect()
    }

    fn usage(&self) -> Option<Value> {
        self.json_events()
            .into_iter()
            .find(|e| e["usage"].is_object())
            .map(|e| e["usage"].clone())
    }
}

/// Streams a request and timestamps its chunks; `trigger` fires after that many text chunks.
async fn stream(
    url: &str,
    body: Value,
    headers: &[(&str, &str)],
    mut trigger: Option<(usize, oneshot::Sender<()>)>,
) -> Streamed {
    let start = Instant::now();
    let mut req = client().post(url).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    assert_eq!(resp.status(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let content_type = header("content-type");
    let pod_header = header("x-kvsim-pod");
    let mut chunks = resp.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut token_times = Vec::new();
    while let Some(chunk) = chunks.next().await {
        buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf8"));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event
                .trim_end()
                .strip_prefix("data: ")
                .expect("SSE data line")
                .to_string();
            if data != "[DONE]" {
                let v: Value = serde_json::from_str(&data).expect("chunk is JSON");
                let text = v["choices"][0]["text"]
                    .as_str()
                    .or(v["choices"][0]["delta"]["content"].as_str())
                    .unwrap_or_default();
                if !text.is_empty() {
                    token_times.push(start.elapsed());
                    if trigger
                        .as_ref()
                        .is_some_and(|(n, _)| token_times.len() == *n)
                    {
                        if let Some((_, tx)) = trigger.take() {
                            let _ = tx.send(());
                        }
                    }
                }
            }
            events.push(data);
        }
    }
    Streamed {
        content_type,
        pod_header,
        events,
        token_times,
    }
}

fn completions(pod: &PodHandle) -> String {
    format!("{}/v1/completions", pod.url())
}

/// The cached tokens `pod` reports for an 800-word prompt tagged `tag` (one output token).
async fn cached_of_800(pod: &PodHandle, tag: &str) -> u64 {
    let body = json!({"prompt": prompt(tag, 800), "max_tokens": 1});
    let r: Value = post(&completions(pod), body)
        .await
        .json()
        .await
        .expect("json");
    r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached")
}

fn chat(pod: &PodHandle) -> String {
    format!("{}/v1/chat/completions", pod.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_long_prompt_hits_the_cache_and_cuts_ttft() {
    let scale = 0.05;
    let pod = spawn_pod(config(scale)).await.expect("pod");
    let body = json!({
        "prompt": prompt("a", 7500), "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let first = stream(&completions(&pod), body.clone(), &[], None).await;
    let second = stream(&completions(&pod), body, &[], None).await;

    let u1 = first.usage().expect("usage");
    let u2 = second.usage().expect("usage");
    assert_eq!(u1["prompt_tokens"], 7500);
    assert_eq!(u1["prompt_tokens_details"]["cached_tokens"], 0);
    // Whole blocks only, and never the last prompt token: 7499 / 16 = 468 blocks.
    assert_eq!(u2["prompt_tokens_details"]["cached_tokens"], 468 * 16);
    // 3.04 s vs ~0.05 s simulated (plus a few ms of HTTP and JSON work in a debug build).
    assert!(
        second.ttft() * 3 < first.ttft(),
        "cached TTFT {:?} vs uncached {:?}",
        second.ttft(),
        first.ttft()
    );
    assert!(first.ttft() >= Duration::from_secs_f64(3.0 * scale));

    let m = get_text(&format!("{}/metrics", pod.url())).await;
    assert_eq!(metric(&m, "vllm:prefix_cache_queries_total"), Some(15000.0));
    assert_eq!(metric(&m, "vllm:prefix_cache_hits_total"), Some(7488.0));
    assert_eq!(
        metric(&m, "vllm:time_to_first_token_seconds_count"),
        Some(2.0)
    );
    // Simulated seconds are recorded, not wall seconds: the uncached TTFT (3.04 s) lands above 2.5 s.
    assert_eq!(
        m.lines()
            .find(|l| l.starts_with("vllm:time_to_first_token_seconds_bucket")
                && l.contains("le=\"2.5\""))
            .and_then(|l| l.rsplit(' ').next()),
        Some("1.0")
    );
    let s = stats(&pod).await;
    assert_eq!(s["cached_tokens_total"], 7488);
    assert_eq!(s["prompt_tokens_total"], 15000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_cache_forgets_old_prefixes() {
    let pod = spawn_pod(SimConfig {
        num_gpu_blocks: 120,
        ..config(0.01)
    })
    .await
    .expect("pod");
    let ask = |tag: &'static str| cached_of_800(&pod, tag);
    assert_eq!(ask("a").await, 0);
    assert_eq!(ask("a").await, 784);
    for tag in ["b", "c", "d"] {
        assert_eq!(ask(tag).await, 0);
    }
    assert_eq!(ask("a").await, 0, "evicted by three newer 50-block prompts");
    assert_eq!(ask("a").await, 784);
}

/// vLLM's native CPU offloading: a prompt the small GPU cache has forgotten is still in host memory,
/// loaded instead of computed and reported as cached; without the tier it is computed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tier_keeps_prefixes_the_gpu_forgot() {
    for host_blocks in [0, 1000] {
        let pod = spawn_pod(SimConfig {
            num_gpu_blocks: 120,
            cpu_offload_blocks: host_blocks,
            ..config(0.01)
        })
        .await
        .expect("pod");
        let ask = |tag: &'static str| cached_of_800(&pod, tag);
        assert_eq!(ask("a").await, 0);
        for tag in ["b", "c", "d"] {
            assert_eq!(ask(tag).await, 0);
        }
        let m = get_text(&format!("{}/metrics", pod.url())).await;
        let s = stats(&pod).await;
        if host_blocks == 0 {
            assert_eq!(ask("a").await, 0, "evicted, and no host tier");
            let m = get_text(&format!("{}/metrics", pod.url())).await;
            assert_eq!(metric(&m, "vllm:external_prefix_cache_hits_total"), None);
            assert_eq!(metric(&m, "vllm:kv_offload_total_bytes_total"), None);
            assert!(s.get("host_hit_tokens_total").is_none());
            continue;
        }
        // Written through as computed: 4 prompts of 50 full blocks, 16 tokens × 128 KiB each.
        let block_bytes = 16.0 * 131_072.0;
        let stored = |m: &str| {
            m.lines()
                .find(|l| {
                    l.starts_with("vllm:kv_offload_total_bytes_total")
                        && l.contains("transfer_type=\"GPU_to_CPU\"")
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
        };
        assert_eq!(stored(&m), Some(200.0 * block_bytes));
        assert_eq!(s["host_hit_tokens_total"], 0);
        assert_eq!(s["host_cached_blocks"], 200);
        // The GPU lost a; host memory has its 49 blocks before the last token.
        assert_eq!(ask("a").await, 784);
        let m = get_text(&format!("{}/metrics", pod.url())).await;
        assert_eq!(
            metric(&m, "vllm:external_prefix_cache_hits_total"),
            Some(784.0)
        );
        assert_eq!(
            metric(&m, "vllm:external_prefix_cache_queries_total"),
            Some(5.0 * 800.0)
        );
        assert_eq!(
            metric(&m, "vllm:kv_offload_total_bytes_total"),
            Some(784.0 * 131_072.0),
            "CPU_to_GPU first"
        );
        assert_eq!(
            metric(&m, "vllm:prefix_cache_hits_total"),
            Some(0.0),
            "GPU hits only"
        );
        assert_eq!(stats(&pod).await["host_hit_tokens_total"], 784);
        // A reset empties both tiers.
        pod.reset().await;
        assert_eq!(stats(&pod).await["host_cached_blocks"], 0);
        assert_eq!(ask("b").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_and_running_metrics_follow_load() {
    let pod = spawn_pod(SimConfig {
        max_num_seqs: 2,
        ..config(0.05)
    })
    .await
    .expect("pod");
    let url = completions(&pod);
    let metrics_url = format!("{}/metrics", pod.url());

    let mut requests = Vec::new();
    for i in 0..6 {
        let url = url.clone();
        requests.push(tokio::spawn(async move {
            post(
                &url,
                json!({"prompt": prompt(&format!("r{i}x"), 200), "max_tokens": 60}),
            )
            .await
            .status()
        }));
    }
    let (mut max_waiting, mut max_running, mut max_usage) = (0.0f64, 0.0f64, 0.0f64);
    while !requests.iter().all(|r| r.is_finished()) {
        let m = get_text(&metrics_url).await;
        max_waiting = max_waiting.max(metric(&m, "vllm:num_requests_waiting").expect("waiting"));
        max_running = max_running.max(metric(&m, "vllm:num_requests_running").expect("running"));
        max_usage = max_usage.max(metric(&m, "vllm:kv_cache_usage_perc").expect("usage"));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for r in requests {
        assert_eq!(r.await.expect("task"), 200);
    }
    assert!(max_waiting >= 1.0, "waiting never rose: {max_waiting}");
    // Arrivals join the batch at the next step boundary, so up to all six can be seen waiting.
    assert!(max_waiting <= 6.0);
    assert_eq!(max_running, 2.0, "running is capped by max_num_seqs");
    assert!(max_usage > 0.0);

    let m = get_text(&metrics_url).await;
    assert_eq!(metric(&m, "vllm:num_requests_waiting"), Some(0.0));
    assert_eq!(metric(&m, "vllm:num_requests_running"), Some(0.0));
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), Some(0.0));
    assert_eq!(metric(&m, "vllm:generation_tokens_total"), Some(360.0));
    assert!(m.contains("vllm:request_success_total{model_name=\"sim-model\",engine=\"0\",finished_reason=\"length\"} 6.0"));
    // The process collector's samples carry no labels, as prometheus_client renders them.
    for line in m
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("process_"))
    {
        assert!(
            line.contains("model_name=\"sim-model\""),
            "unlabelled sample: {line}"
        );
    }
    let started = metric(&m, "process_start_time_seconds").expect("the process's start");
    assert!(started > 1.7e9, "{started}");
    assert!(m.contains("# TYPE vllm:inter_token_latency_seconds histogram"));
    assert!(m.contains("vllm:cache_config_info{"));
    assert!(m.contains("block_size=\"16\""));
    assert!(m.contains("num_gpu_blocks=\"4096\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_capacity_limits_admission() {
    // 64 blocks hold one 600-token prompt (38 blocks) but not two.
    let pod = spawn_pod(SimConfig {
        num_gpu_blocks: 64,
        ..config(0.05)
    })
    .await
    .expect("pod");
    let url = completions(&pod);
    let mut requests = Vec::new();
    for i in 0..3 {
        let url = url.clone();
        requests.push(tokio::spawn(async move {
            post(
                &url,
                json!({"prompt": prompt(&format!("k{i}x"), 600), "max_tokens": 30}),
            )
            .await
            .status()
        }));
    }
    let (mut max_running, mut max_waiting) = (0.0f64, 0.0f64);
    while !requests.iter().all(|r| r.is_finished()) {
        let m = get_text(&format!("{}/metrics", pod.url())).await;
        max_running = max_running.max(metric(&m, "vllm:num_requests_running").expect("running"));
        max_waiting = max_waiting.max(metric(&m, "vllm:num_requests_waiting").expect("waiting"));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for r in requests {
        assert_eq!(r.await.expect("task"), 200);
    }
    assert_eq!(max_running, 1.0);
    assert!(max_waiting >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_shapes_match_openai_and_vllm() {
    let pod = spawn_pod(config(0.02)).await.expect("pod");

    // Streaming chat with usage.
    let s = stream(
        &chat(&pod),
        json!({
            "model": "sim-model", "max_tokens": 5, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            ],
        }),
        &[],
        None,
    )
    .await;
    assert_eq!(s.content_type, "text/event-stream");
    assert_eq!(s.pod_header, pod.addr.to_string());
    assert_eq!(s.events.last().map(String::as_str), Some("[DONE]"));
    let events = s.json_events();
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(s.token_times.len(), 5, "one chunk per token");
    for e in &events {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["model"], "sim-model");
        assert!(e["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")));
    }
    let last = events.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 5);
    assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );

    // Streaming completion without usage: no usage chunk.
    let s = stream(
        &completions(&pod),
        json!({"prompt": "one two three", "max_tokens": 3, "stream": true}),
        &[],
        None,
    )
    .await;
    assert!(s.usage().is_none());
    assert_eq!(s.token_times.len(), 3);
    assert_eq!(s.json_events()[0]["object"], "text_completion");

    // Non-streaming completion.
    let resp = post(
        &completions(&pod),
        json!({"prompt": ["one two ", "three"], "max_tokens": 4, "ignore_eos": true}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("x-kvsim-pod")
            .and_then(|v| v.to_str().ok()),
        Some(pod.addr.to_string().as_str())
    );
    let r: Value = resp.json().await.expect("json");
    assert_eq!(r["object"], "text_completion");
    assert!(r["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
    assert!(r["created"].is_u64());
    assert_eq!(r["model"], "sim-model");
    assert_eq!(r["choices"][0]["text"], "the quick brown fox");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    // A list of prompts is a batch: a choice each, usage over both.
    assert_eq!(r["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(r["choices"][1]["index"], 1);
    assert_eq!(r["usage"]["prompt_tokens"], 3);
    assert_eq!(r["usage"]["completion_tokens"], 8);
    assert_eq!(r["usage"]["total_tokens"], 11);
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Non-streaming chat; `max_completion_tokens` and `tools` honoured.
    let r: Value = post(
        &chat(&pod),
        json!({
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        }),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["message"]["content"], "the quick");
    assert_eq!(r["usage"]["completion_tokens"], 2);
    assert!(r["usage"]["prompt_tokens"].as_u64().expect("prompt tokens") > 10);

    let models: Value =
        serde_json::from_str(&get_text(&format!("{}/v1/models", pod.url())).await).expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "sim-model");
    let health = client()
        .get(format!("{}/health", pod.url()))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    assert!(health.text().await.expect("body").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_models_and_sglang_names() {
    let pod = spawn_pod(SimConfig {
        models: vec!["m1".into(), "m2".into()],
        engine: EngineKind::Sglang,
        ..config(0.01)
    })
    .await
    .expect("pod");
    for model in ["m1", "m2"] {
        let r = post(
            &completions(&pod),
            json!({"model": model, "prompt": "x y", "max_tokens": 1}),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    let r = post(&completions(&pod), json!({"model": "m3", "prompt": "x"})).await;
    assert_eq!(r.status(), 404);

    // Aliases share one cache; cache salts seed the hash chain: no sharing across them.
    let cached = |body: Value| {
        let url = completions(&pod);
        async move {
            let r: Value = post(&url, body).await.json().await.expect("json");
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached")
        }
    };
    let text = prompt("salt", 100);
    assert_eq!(
        cached(json!({"model": "m1", "prompt": text, "max_tokens": 1})).await,
        0
    );
    assert_eq!(
        cached(json!({"model": "m1", "prompt": text, "max_tokens": 1})).await,
        96
    );
    assert_eq!(
        cached(json!({"model": "m2", "prompt": text, "max_tokens": 1})).await,
        96,
        "m2 is another name for m1's model"
    );
    let salted = json!({"model": "m1", "prompt": text, "max_tokens": 1, "cache_salt": "tenant-a"});
    assert_eq!(cached(salted.clone()).await, 0);
    assert_eq!(cached(salted).await, 96);
    let m = get_text(&format!("{}/metrics", pod.url())).await;
    for name in [
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:time_to_first_token_seconds_count",
    ] {
        assert!(metric(&m, name).is_some(), "missing {name}");
    }
    assert!(m.contains(
        "sglang:cache_config_info{model_name=\"m1\",num_pages=\"4096\",page_size=\"16\"} 1.0"
    ));
    assert!(!m.contains("vllm:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_adapters_are_listed_served_and_cached_apart_as_vllm_does() {
    let pod = spawn_pod(SimConfig {
        models: vec!["base".into(), "base-alias".into()],
        lora_modules: vec![
            parse_lora_module("sql-lora=/adapters/sql").unwrap(),
            parse_lora_module(r#"{"name": "chat-lora", "path": "/adapters/chat"}"#).unwrap(),
        ],
        ..config(0.01)
    })
    .await
    .expect("pod");
    assert!(parse_lora_module("no-path").is_err());
    let models: Value =
        serde_json::from_str(&get_text(&format!("{}/v1/models", pod.url())).await).expect("json");
    let cards: Vec<(String, Value, Value, Value)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["root"].clone(),
                c["parent"].clone(),
                c["max_model_len"].clone(),
            )
        })
        .collect();
    assert_eq!(
        cards,
        vec![
            ("base".into(), json!("base"), Value::Null, json!(131072)),
            (
                "base-alias".into(),
                json!("base"),
                Value::Null,
                json!(131072)
            ),
            (
                "sql-lora".into(),
                json!("/adapters/sql"),
                json!("base"),
                Value::Null
            ),
            (
                "chat-lora".into(),
                json!("/adapters/chat"),
                json!("base"),
                Value::Null
            ),
        ]
    );
    let cached = |model: &'static str| {
        let url = completions(&pod);
        let body = json!({"model": model, "prompt": prompt("lora", 100), "max_tokens": 1});
        async move {
            let r: Value = post(&url, body).await.json().await.expect("json");
            assert_eq!(r["model"], json!(model), "answers as the name asked for");
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached")
        }
    };
    assert_eq!(cached("base").await, 0);
    assert_eq!(cached("base-alias").await, 96, "an alias shares the cache");
    assert_eq!(cached("sql-lora").await, 0, "an adapter has its own");
    assert_eq!(cached("sql-lora").await, 96);
    assert_eq!(cached("chat-lora").await, 0);
    let r = post(
        &completions(&pod),
        json!({"model": "other-lora", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    // vllm:lora_requests_info: a label set per change, the newest (largest stamp) current.
    let m = get_text(&format!("{}/metrics", pod.url())).await;
    let sets: Vec<(String, f64)> = m
        .lines()
        .filter(|l| l.starts_with("vllm:lora_requests_info{"))
        .map(|l| {
            let running = l.split("running_lora_adapters=\"").nth(1).unwrap();
            let running = running.split('"').next().unwrap().to_string();
            (running, l.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    let newest = sets.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(newest.0, "", "nothing in flight now: {sets:?}");
    assert!(m.contains("max_lora=\"1\""), "vLLM's default --max-loras");
    // While a stream for an adapter runs, the newest set names it running; a request for the
    // other adapter waits (one slot) and is named waiting. The stream lasts ~3 s of wall time
    // (20,000 tokens at this time scale), so the window in which both show outlasts the polls
    // below on a loaded machine (with 400 tokens it was ~12 ms, and `make test` missed it once).
    let url = completions(&pod);
    let running = tokio::spawn(async move {
        post(
            &url,
            json!({"model": "chat-lora", "prompt": "x", "max_tokens": 20000, "stream": true}),
        )
        .await
        .text()
        .await
    });
    let url = completions(&pod);
    let waiting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        post(
            &url,
            json!({"model": "sql-lora", "prompt": "y", "max_tokens": 1}),
        )
        .await
        .text()
        .await
    });
    let metrics_url = format!("{}/metrics", pod.url());
    let mut seen = false;
    for _ in 0..100 {
        let m = get_text(&metrics_url).await;
        let newest = m
            .lines()
            .filter(|l| l.starts_with("vllm:lora_requests_info{"))
            .max_by(|a, b| {
                let v = |l: &str| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
                v(a).total_cmp(&v(b))
            })
            .unwrap()
            .to_string();
        if newest.contains("running_lora_adapters=\"chat-lora\"")
            && newest.contains("waiting_lora_adapters=\"sql-lora\"")
        {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen, "the running and the waiting adapter never showed");
    running.abort();
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_and_prompt_lists_answer_every_choice_as_vllm_does() {
    let pod = spawn_pod(config(0.01)).await.expect("pod");
    // A batch of two prompts (3 and 2 tokens), two choices each: choice p * n + j.
    let r: Value = post(
        &completions(&pod),
        json!({"prompt": ["alpha beta gamma", "delta epsilon"], "n": 2, "max_tokens": 3}),
    )
    .await
    .json()
    .await
    .expect("json");
    let choices = r["choices"].as_array().expect("choices");
    let indices: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, vec![0, 1, 2, 3]);
    assert!(choices.iter().all(|c| c["text"] == "the quick brown"));
    assert_eq!(
        r["usage"]["prompt_tokens"], 6,
        "each prompt once (3 + 3 tokens): {r}"
    );
    assert_eq!(r["usage"]["completion_tokens"], 12);
    assert_eq!(r["usage"]["total_tokens"], 18);
    // Chat: n choices of one conversation.
    let r: Value = post(
        &chat(&pod),
        json!({"messages": [{"role": "user", "content": "hi there"}], "n": 3, "max_tokens": 2}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(r["choices"].as_array().unwrap().len(), 3);
    assert_eq!(r["choices"][2]["index"], 2);
    assert_eq!(r["choices"][2]["message"]["content"], "the quick");
    assert_eq!(r["usage"]["completion_tokens"], 6);
    let one: Value = post(
        &chat(&pod),
        json!({"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(r["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    // Streamed: every choice's tokens, then one usage over all of them.
    let body = post(
        &completions(&pod),
        json!({"prompt": ["one two", "three four"], "n": 2, "max_tokens": 3, "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await
    .text()
    .await
    .expect("body");
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    let mut tokens = [0; 4];
    for e in &events {
        for c in e["choices"].as_array().unwrap() {
            tokens[c["index"].as_u64().unwrap() as usize] += 1;
        }
    }
    assert_eq!(tokens, [3, 3, 3, 3], "{body}");
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 4);
    assert_eq!(usage["completion_tokens"], 12);
    assert!(body.ends_with("data: [DONE]\n\n"));
    let r = post(&completions(&pod), json!({"prompt": "x", "n": 0})).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_vllm_errors() {
    let pod = spawn_pod(config(0.01)).await.expect("pod");
    let raw = client()
        .post(completions(&pod))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(raw.status(), 400);
    let e: Value = raw.json().await.expect("json");
    assert_eq!(e["object"], "error");
    assert_eq!(e["type"], "BadRequestError");
    assert_eq!(e["code"], 400);
    assert!(e["param"].is_null());

    for (url, body) in [
        (completions(&pod), json!({"max_tokens": 3})),
        (
            completions(&pod),
            json!({"prompt": "x", "max_tokens": "many"}),
        ),
        (chat(&pod), json!({"messages": "hello"})),
        (
            chat(&pod),
            json!({"messages": [{"role": "user", "content": 5}]}),
        ),
        (
            completions(&pod),
            json!({"prompt": "x", "max_tokens": 200_000}),
        ),
    ] {
        let r = post(&url, body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
    }

    let r = post(&completions(&pod), json!({"model": "gpt-9", "prompt": "x"})).await;
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["type"], "NotFoundError");
    assert_eq!(e["code"], 404);
    assert_eq!(e["message"], "The model `gpt-9` does not exist.");

    let s = stats(&pod).await;
    assert_eq!(s["requests_total"], 7);
    assert_eq!(s["requests_failed"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_fail_stall_refuse_and_garble() {
    let pods = spawn_pods(config(0.01), 2).await.expect("pods");
    let (pod, sibling) = (&pods[0], &pods[1]);
    let fault = |faults: Value| {
        let url = format!("{}/sim/fault", pod.url());
        async move {
            let r = post(&url, faults).await;
            assert_eq!(r.status(), 200);
        }
    };
    let ok_body = json!({"prompt": "x y z", "max_tokens": 1});

    fault(json!({"fail_ratio": 1.0})).await;
    let r = post(&completions(pod), ok_body.clone()).await;
    assert_eq!(r.status(), 500);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["type"], "InternalServerError");

    fault(json!({"stall_ms": 150})).await;
    let t = Instant::now();
    assert_eq!(post(&completions(pod), ok_body.clone()).await.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(150));

    fault(json!({"garbage_metrics": true})).await;
    let m = get_text(&format!("{}/metrics", pod.url())).await;
    assert!(!m.contains("# HELP"));
    assert_eq!(metric(&m, "vllm:num_requests_waiting"), None);

    // Refuse: connections fail, even on a client with a pooled connection.
    let pooled = client();
    assert_eq!(
        pooled
            .post(completions(pod))
            .json(&ok_body)
            .send()
            .await
            .expect("warm")
            .status(),
        200
    );
    fault(json!({"refuse": true})).await;
    let err = pooled
        .post(completions(pod))
        .json(&ok_body)
        .send()
        .await
        .expect_err("pooled connection must fail");
    assert!(err.is_request() || err.is_connect(), "{err:?}");
    let err = client()
        .post(completions(pod))
        .json(&ok_body)
        .send()
        .await
        .expect_err("new connection must fail");
    assert!(err.is_connect(), "{err:?}");
    // Only a sibling (or the library handle) can clear it.
    let r = post(
        &format!("{}/sim/fault", sibling.url()),
        json!({"pod": pod.addr.to_string()}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(post(&completions(pod), ok_body.clone()).await.status(), 200);

    // A timed refuse clears itself; the handle API works too.
    fault(json!({"refuse": true, "refuse_ms": 100})).await;
    assert!(client()
        .get(format!("{}/health", pod.url()))
        .send()
        .await
        .is_err());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(post(&completions(pod), ok_body.clone()).await.status(), 200);
    pod.set_faults(Faults {
        refuse: true,
        ..Faults::default()
    })
    .await;
    assert!(client()
        .get(format!("{}/health", pod.url()))
        .send()
        .await
        .is_err());
    pod.reset().await;
    assert_eq!(post(&completions(pod), ok_body.clone()).await.status(), 200);

    // Reset clears faults and the prefix cache.
    fault(json!({"fail_ratio": 1.0})).await;
    let long = json!({"prompt": prompt("f", 100), "max_tokens": 1});
    let r = post(&format!("{}/sim/reset", pod.url()), json!({})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(post(&completions(pod), long.clone()).await.status(), 200);
    let r: Value = post(&completions(pod), long.clone())
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    assert_eq!(
        client()
            .post(format!("{}/sim/reset", pod.url()))
            .send()
            .await
            .expect("reset")
            .status(),
        200
    );
    let r: Value = post(&completions(pod), long)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let r = post(
        &format!("{}/sim/fault", pod.url()),
        json!({"fail_ratio": 2}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let r = post(
        &format!("{}/sim/fault", pod.url()),
        json!({"refuse_everything": true}),
    )
    .await;
    assert_eq!(r.status(), 400);
}

/// Asks `pod` to prefill `text` for a remote decoder (NixlConnector's `do_remote_decode`).
async fn prefill_for_remote_decode(pod: &PodHandle, text: &str) -> Value {
    post(
        &completions(pod),
        json!({
            "prompt": text, "max_tokens": 50, "stream": false,
            "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null},
        }),
    )
    .await
    .json()
    .await
    .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_pods_prefill_for_each_other_decode_each_others_prefills_and_serve_whole() {
    let scale = 0.05;
    let both = || SimConfig {
        role: Role::Both,
        ..config(scale)
    };
    let a = spawn_pod(both()).await.expect("pod a");
    let b = spawn_pod(both()).await.expect("pod b");
    let text = prompt("e", 3000);
    let leg = prefill_for_remote_decode(&a, &text).await;
    assert_eq!(
        leg["usage"]["completion_tokens"], 1,
        "a prefill for b: one token"
    );
    let kv = leg["kv_transfer_params"].clone();
    assert_eq!(kv["do_remote_prefill"], true);
    let decoded: Value = post(
        &completions(&b),
        json!({"prompt": text, "max_tokens": 7, "kv_transfer_params": kv}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(decoded["usage"]["completion_tokens"], 7);
    assert!(decoded["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(2900));
    assert_eq!(stats(&b).await["disaggregated_decodes"], 1);
    // Without kv_transfer_params a `both` pod serves the request whole.
    let whole: Value = post(
        &completions(&b),
        json!({"prompt": prompt("w", 500), "max_tokens": 9}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(whole["usage"]["completion_tokens"], 9);
    assert_eq!(stats(&a).await["prefills_for_remote_decode"], 1);
    assert_eq!(stats(&b).await["prefills_for_remote_decode"], 0);
    assert_eq!(stats(&a).await["role"], "both");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_and_decode_pods_speak_kv_transfer_params() {
    let scale = 0.05;
    let prefill = spawn_pod(SimConfig {
        role: Role::Prefill,
        ..config(scale)
    })
    .await
    .expect("prefill pod");
    let decode = spawn_pod(SimConfig {
        role: Role::Decode,
        ..config(scale)
    })
    .await
    .expect("decode pod");
    let text = prompt("p", 7500);

    let r = prefill_for_remote_decode(&prefill, &text).await;
    assert_eq!(
        r["usage"]["completion_tokens"], 1,
        "a remote-decode prefill makes one token"
    );
    let kv = r["kv_transfer_params"].clone();
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["do_remote_decode"], false);
    assert_eq!(kv["remote_engine_id"], prefill.addr.to_string());
    assert_eq!(kv["remote_host"], "127.0.0.1");
    assert_eq!(kv["remote_port"], prefill.addr.port());
    assert_eq!(kv["tp_size"], 1);
    assert_eq!(kv["remote_block_ids"].as_array().map(Vec::len), Some(469));
    assert_eq!(stats(&prefill).await["prefills_for_remote_decode"], 1);

    // The decode pod pulls the KV instead of computing it.
    let disagg = stream(
        &completions(&decode),
        json!({"prompt": text, "max_tokens": 5, "stream": true,
               "stream_options": {"include_usage": true}, "kv_transfer_params": kv}),
        &[],
        None,
    )
    .await;
    let full = stream(
        &completions(&decode),
        json!({"prompt": prompt("q", 7500), "max_tokens": 5, "stream": true}),
        &[],
        None,
    )
    .await;
    // ~0.17 s (transfer of 7499 tokens + one step) vs 3.04 s simulated; the wall-clock check leaves
    // room for HTTP and JSON overhead, the pod's own histogram checks the simulated values exactly.
    assert!(
        disagg.ttft() * 3 < full.ttft(),
        "disaggregated TTFT {:?} vs full prefill {:?}",
        disagg.ttft(),
        full.ttft()
    );
    assert_eq!(
        disagg.usage().expect("usage")["prompt_tokens_details"]["cached_tokens"],
        7499
    );
    let m = get_text(&format!("{}/metrics", decode.url())).await;
    let ttft_at_most = |le: &str| {
        m.lines()
            .find(|l| {
                l.starts_with("vllm:time_to_first_token_seconds_bucket")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .expect("bucket")
    };
    assert_eq!(ttft_at_most("0.1"), 0.0);
    assert_eq!(
        ttft_at_most("0.25"),
        1.0,
        "transfer 0.15 s + one decode step"
    );
    assert_eq!(ttft_at_most("2.5"), 1.0, "the full prefill took over 3 s");
    let s = stats(&decode).await;
    assert_eq!(s["disaggregated_decodes"], 1);
    assert_eq!(s["transferred_tokens_total"], 7499);
    assert_eq!(
        s["cached_tokens_total"], 0,
        "transferred KV is not a local cache hit"
    );
    assert_eq!(s["last_kv_transfer_params"], kv);

    // The transferred blocks are now in the decode pod's own cache.
    let r: Value = post(
        &completions(&decode),
        json!({"prompt": text, "max_tokens": 1}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 7488);

    // An aggregated pod ignores kv_transfer_params.
    let agg = spawn_pod(config(scale)).await.expect("pod");
    let r: Value = post(
        &completions(&agg),
        json!({"prompt": "a b", "max_tokens": 3, "kv_transfer_params": {"do_remote_decode": true}}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(r["usage"]["completion_tokens"], 3);
    assert!(r["kv_transfer_params"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_header_prefills_on_the_named_pod() {
    let prefill = spawn_pod(SimConfig {
        role: Role::Prefill,
        ..config(0.02)
    })
    .await
    .expect("prefill pod");
    let decode = spawn_pod(SimConfig {
        role: Role::Decode,
        ..config(0.02)
    })
    .await
    .expect("decode pod");
    let prefiller = prefill.addr.to_string();
    let s = stream(
        &chat(&decode),
        json!({
            "messages": [{"role": "user", "content": prompt("s", 2000)}],
            "max_completion_tokens": 4, "stream": true, "stream_options": {"include_usage": true},
        }),
        &[
            ("x-prefiller-host-port", prefiller.as_str()),
            ("x-gateway-destination-endpoint", "127.0.0.1:1"),
        ],
        None,
    )
    .await;
    assert_eq!(s.token_times.len(), 4);
    let cached = s.usage().expect("usage")["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert!(cached > 1900, "KV came from the prefill pod: {cached}");

    let d = stats(&decode).await;
    assert_eq!(d["sidecar_prefills"], 1);
    assert_eq!(d["disaggregated_decodes"], 1);
    assert_eq!(d["seen_headers"]["x-prefiller-host-port"], 1);
    assert_eq!(d["seen_headers"]["x-gateway-destination-endpoint"], 1);
    assert_eq!(d["last_kv_transfer_params"]["remote_engine_id"], prefiller);
    let p = stats(&prefill).await;
    assert_eq!(p["prefills_for_remote_decode"], 1);
    assert_eq!(p["requests_total"], 1);
    assert_eq!(p["generation_tokens_total"], 1);
    assert_eq!(p["last_kv_transfer_params"]["do_remote_decode"], true);

    // A dead prefiller: the decode pod falls back to a full local prefill.
    let r = client()
        .post(completions(&decode))
        .header("x-prefiller-host-port", "127.0.0.1:1")
        .json(&json!({"prompt": prompt("t", 100), "max_tokens": 2}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let r: Value = r.json().await.expect("json");
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(stats(&decode).await["sidecar_prefill_failures"], 1);
}

/// Max inter-token gap of a 200-token stream, optionally with a 7,500-token prompt arriving after its
/// tenth token.
async fn stream_gap(pod: &PodHandle, tag: &str, interfere: bool) -> Duration {
    let (tx, rx) = oneshot::channel();
    let url = completions(pod);
    let long = tokio::spawn(async move {
        if interfere && rx.await.is_ok() {
            let r = post(
                &url,
                json!({"prompt": prompt("long", 7500), "max_tokens": 1}),
            )
            .await;
            assert_eq!(r.status(), 200);
        }
    });
    let s = stream(
        &completions(pod),
        json!({"prompt": prompt(tag, 50), "max_tokens": 200, "stream": true}),
        &[],
        Some((10, tx)),
    )
    .await;
    long.await.expect("interfering request");
    s.max_gap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prefill_stalls_running_streams() {
    let scale = 0.05;
    let pod = spawn_pod(config(scale)).await.expect("pod");
    let quiet = stream_gap(&pod, "q", false).await;
    let stalled = stream_gap(&pod, "s", true).await;
    // The stalled step lasts 40 ms + 3 s of prefill + one decode: ~153 ms of wall time here.
    assert!(
        stalled > Duration::from_secs_f64(2.5 * scale),
        "max gap with interference {stalled:?}"
    );
    assert!(
        stalled > quiet * 4,
        "quiet {quiet:?} vs stalled {stalled:?}"
    );
    let m = get_text(&format!("{}/metrics", pod.url())).await;
    let itl_over = |le: &str| {
        let line = m
            .lines()
            .find(|l| {
                l.starts_with("vllm:inter_token_latency_seconds_bucket")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .expect("bucket");
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .expect("value")
    };
    assert_eq!(
        itl_over("+Inf") - itl_over("2.5"),
        1.0,
        "one simulated >2.5 s gap"
    );

    // With chunked prefill the same prompt stalls each step by at most one chunk.
    let chunked = spawn_pod(SimConfig {
        chunked_prefill_tokens: 512,
        ..config(scale)
    })
    .await
    .expect("pod");
    let gap = stream_gap(&chunked, "c", true).await;
    assert!(gap * 3 < stalled, "chunked {gap:?} vs whole {stalled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_pod() {
    let pod = spawn_pod(config(0.01)).await.expect("pod");
    let url = format!("{}/health", pod.url());
    assert_eq!(
        client().get(&url).send().await.expect("health").status(),
        200
    );
    pod.shutdown().await;
    assert!(client().get(&url).send().await.is_err());
}
