//! Helpers shared by the real-Envoy integration tests: request bodies, sending through Envoy and
//! reading what came back (pod, debug header, SSE chunks), and the pods' `/sim/stats`.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub const MODEL: &str = "sim-model";
/// Simulator speed in tests: 20× real time.
pub const TIME_SCALE: &str = "0.05";

/// A client that opens a new connection per request, so requests spread over Envoy's workers.
pub fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A long system prompt made of `words` distinct words for tenant `tag`.
pub fn system_prompt(tag: &str, words: usize) -> String {
    (0..words)
        .map(|i| format!("{tag}{}", i % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn chat(system: &str, user: &str, max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream
    });
    if stream {
        // vLLM rejects stream_options on a non-streaming request.
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub pod: Option<String>,
    pub debug: Option<String>,
    pub body: String,
    pub ttft: Duration,
}

impl Reply {
    /// A field of the `x-kvroute-debug` header (`pod`, `reason`, `matched_blocks`, `vm`, …).
    pub fn debug_field(&self, key: &str) -> Option<String> {
        self.debug.as_ref()?.split("; ").find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| v.to_string())
        })
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// POSTs a JSON body and reads the whole answer; `ttft` is the time to the first body bytes.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Reply {
    post_raw(client, url, body.to_string().into_bytes(), headers).await
}

pub async fn post_raw(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Reply {
    let start = Instant::now();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (pod, debug) = (header("x-kvsim-pod"), header("x-kvroute-debug"));
    let mut bytes = Vec::new();
    let mut ttft = Duration::ZERO;
    while let Some(chunk) = resp.chunk().await.unwrap_or(None) {
        if bytes.is_empty() {
            ttft = start.elapsed();
        }
        bytes.extend_from_slice(&chunk);
    }
    Reply {
        status,
        pod,
        debug,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        ttft,
    }
}

/// The `data:` payloads of an SSE body.
pub fn sse_events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

pub async fn sim_stats(pod: &str) -> Value {
    reqwest::get(format!("http://{pod}/sim/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn sim_fault(pod: &str, fault: Value) {
    let r = reqwest::Client::new()
        .post(format!("http://{pod}/sim/fault"))
        .json(&fault)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "fault on {pod}: {}", r.status());
}

/// Saturates pods directly (not through Envoy): `per_pod` long requests to each, then waits until
/// at least `waiting` of them wait on every pod (with `--max-num-seqs 1`: one runs, the rest
/// wait). The handles answer each filler's status.
pub async fn saturate(
    pods: &[String],
    per_pod: usize,
    waiting: u64,
) -> Vec<tokio::task::JoinHandle<u16>> {
    let fillers = pods
        .iter()
        .flat_map(|pod| (0..per_pod).map(move |i| (pod.clone(), i)))
        .map(|(pod, i)| {
            let body = chat(&format!("filler {i} for {pod}"), "go", 1000, false);
            tokio::spawn(async move {
                let url = format!("http://{pod}/v1/chat/completions");
                post(&fresh_client(), &url, &body, &[]).await.status
            })
        })
        .collect();
    for pod in pods {
        harness::wait_for(Duration::from_secs(10), "queued fillers", || async {
            sim_stats(pod).await["waiting"].as_u64().unwrap_or(0) >= waiting
        })
        .await
        .unwrap();
    }
    fillers
}

/// Waits until the plugin's leader reports `n` healthy pods.
pub async fn wait_healthy(envoy: &harness::Envoy, n: u64) {
    let ok = harness::wait_for(Duration::from_secs(20), "healthy pods", || async {
        envoy.stat("wasmcustom.kvroute.pods_healthy").await == n
    })
    .await;
    if let Err(e) = ok {
        panic!("{e}; envoy log:\n{}", envoy.log());
    }
}

/// `pods` simulated pods (with extra kvsim arguments) behind Envoy (2 workers) with kvroute
/// (`extra` merged into the test plugin configuration), ready: every pod polled healthy.
pub async fn stack(pods: usize, sim_args: &[&str], extra: Value) -> (harness::Sim, harness::Envoy) {
    use harness::{plugin_config, Envoy, EnvoyOptions, Lb, Sim};
    let mut args = vec!["--time-scale", TIME_SCALE];
    args.extend_from_slice(sim_args);
    let sim = Sim::start(pods, &args).unwrap();
    let options = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(&sim.pods, extra)),
    );
    let envoy = Envoy::start(&options).await.unwrap();
    wait_healthy(&envoy, pods as u64).await;
    // Healthy counts stale pods too, and before its first poll a pod is stale with no figures and
    // no model names (so any model routes to it): ready means every pod's first poll is in.
    let polled = harness::wait_for(Duration::from_secs(20), "first polls", || async {
        envoy.stat("wasmcustom.kvroute.pods_stale").await == 0
    })
    .await;
    if let Err(e) = polled {
        panic!("{e}; envoy log:\n{}", envoy.log());
    }
    // Every worker VM adopts the leader's table on its next tick (25 ms).
    tokio::time::sleep(Duration::from_millis(100)).await;
    (sim, envoy)
}

/// An HTTP/1.0 exchange over a raw connection to `listener` (`ip:port`), as ApacheBench speaks it:
/// no chunked encoding, the connection closes at the end. `host`: send a Host header. Returns the
/// status line, the headers (lower-case names) and the body.
pub async fn http10(
    listener: &str,
    path: &str,
    body: &Value,
    host: bool,
) -> (String, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut request = format!("POST {path} HTTP/1.0\r\n");
    if host {
        request.push_str("Host: gateway\r\n");
    }
    request.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let mut stream = tokio::net::TcpStream::connect(listener).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes an HTTP/1.0 connection")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// The VM ids that logged becoming the leader, in order.
pub fn leaders_in(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split("kvroute: VM ").nth(1))
        .filter(|rest| rest.contains(" is the leader"))
        .filter_map(|rest| rest.split_whitespace().next().map(str::to_string))
        .collect()
}
