//! Bytes and answers that used to abort a kvroute VM, through the real Envoy: every
//! byte 0x80–0xFF in each request header kvroute reads and in one it does not; a pod whose
//! `/metrics` answer Envoy ends itself (a TCP reset mid-answer, a page past the async client's
//! buffer); an inline prefill pod that resets; a pod reporting an impossible `cached_tokens`. A
//! VM that aborts shows as a 503 to the client, a `panicked` line in Envoy's log and a new VM in
//! Envoy's `wasm.envoy.wasm.runtime.v8.created`.
//!
//! The hostile pods are a small TCP server here ([`HostilePod`]): kvsim speaks HTTP through a
//! server library that cannot cut an answer between its headers and its body.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Envoy's count of Wasm VMs it created: one per worker and the main thread at start, one more
/// each time it replaces a VM that aborted.
const VMS_CREATED: &str = "wasm.envoy.wasm.runtime.v8.created";

async fn vms_created(envoy: &Envoy) -> u64 {
    envoy
        .labelled_stats()
        .await
        .ok()
        .and_then(|s| s.get(VMS_CREATED).copied())
        .unwrap_or(0)
}

/// No VM aborted since `before` VMs had been created.
async fn assert_no_vm_aborted(envoy: &Envoy, before: u64) {
    let log = envoy.log();
    assert!(
        !log.contains("panicked at"),
        "a VM panicked; envoy log:\n{log}"
    );
    assert_eq!(
        vms_created(envoy).await,
        before,
        "Envoy replaced a VM; envoy log:\n{log}"
    );
}

/// What a [`HostilePod`] answers on `/metrics`.
#[derive(Clone, Copy, PartialEq)]
enum MetricsAnswer {
    /// A vLLM page: an idle pod serving `sim-model`.
    Good,
    /// The page's headers and half its body, then a TCP reset.
    ResetMidAnswer,
    /// A 48 MiB page (a valid one, padded with comments).
    Oversize,
    /// A good page whose response headers carry every byte 0x80–0xFF ([`HIGH_BYTE_HEADERS`]).
    HighBytesInHeaders,
}

/// What a [`HostilePod`] answers on an inference `POST`.
#[derive(Clone, Copy, PartialEq)]
enum InferenceAnswer {
    /// A 200's headers, then a TCP reset.
    ResetMidAnswer,
    /// A chat completion whose `usage` claims 10^18 cached tokens of a 651-token prompt.
    AbsurdCachedTokens,
    /// An ordinary chat completion whose response headers carry every byte 0x80–0xFF.
    HighBytesInHeaders,
}

/// Response headers that are not UTF-8 (HTTP allows obs-text): every byte 0x80–0xFF in one value,
/// and two in `server`. Sent on every answer of a pod whose answers are `HighBytesInHeaders`,
/// `/v1/models` included.
fn high_byte_headers() -> Vec<u8> {
    let mut h = b"x-pod-note: a".to_vec();
    h.extend(0x80u8..=0xFF);
    h.extend_from_slice(b"z\r\nserver: \xff\xfe\r\n");
    h
}

const ABSURD_CACHED: u64 = 1_000_000_000_000_000_000;

const OVERSIZE_BYTES: usize = 48 << 20;

fn vllm_page() -> String {
    let l = format!("model_name=\"{MODEL}\"");
    format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{l}}} 0.0\n\
         vllm:num_requests_running{{{l}}} 0.0\nvllm:kv_cache_usage_perc{{{l}}} 0.0\n"
    )
}

/// A pod that speaks just enough HTTP/1.1 for kvroute's polls and requests, and answers as told.
struct HostilePod {
    addr: String,
    /// Requests received, by method and path (`GET /metrics`).
    hits: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostilePod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostilePod {
    async fn start(metrics: MetricsAnswer, inference: InferenceAnswer) -> HostilePod {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hits: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counted = hits.clone();
        let oversize = Arc::new(oversize_page());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (hits, oversize) = (counted.clone(), oversize.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, metrics, inference, &hits, &oversize).await;
                });
            }
        });
        HostilePod { addr, hits, task }
    }

    fn hits(&self, request: &str) -> u64 {
        self.hits.lock().unwrap().get(request).copied().unwrap_or(0)
    }
}

fn oversize_page() -> Vec<u8> {
    let mut page = vllm_page().into_bytes();
    let filler = b"# padding padding padding padding padding padding padding padding\n";
    while page.len() < OVERSIZE_BYTES {
        page.extend_from_slice(filler);
    }
    page
}

/// One connection: requests read and answered until the peer closes or the answer is a reset.
async fn serve(
    mut stream: TcpStream,
    metrics: MetricsAnswer,
    inference: InferenceAnswer,
    hits: &Mutex<HashMap<String, u64>>,
    oversize: &[u8],
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 65536];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..head_end + length);
        let mut first = head.split_whitespace();
        let method = first.next().unwrap_or_default().to_string();
        let path = first.next().unwrap_or_default().to_string();
        *hits
            .lock()
            .unwrap()
            .entry(format!("{method} {path}"))
            .or_default() += 1;
        let high_bytes = metrics == MetricsAnswer::HighBytesInHeaders
            || inference == InferenceAnswer::HighBytesInHeaders;
        let reply = |content_type: &str, body: &[u8]| {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n",
                body.len()
            )
            .into_bytes();
            if high_bytes {
                r.extend_from_slice(&high_byte_headers());
            }
            r.extend_from_slice(b"\r\n");
            r.extend_from_slice(body);
            r
        };
        match (method.as_str(), path.as_str()) {
            ("GET", "/metrics") => match metrics {
                MetricsAnswer::Good | MetricsAnswer::HighBytesInHeaders => {
                    stream
                        .write_all(&reply("text/plain", vllm_page().as_bytes()))
                        .await?
                }
                MetricsAnswer::Oversize => stream.write_all(&reply("text/plain", oversize)).await?,
                MetricsAnswer::ResetMidAnswer => {
                    let whole = reply("text/plain", vllm_page().as_bytes());
                    return reset_after(stream, &whole[..whole.len() - 20]).await;
                }
            },
            ("GET", "/v1/models") => {
                let models = json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]});
                stream
                    .write_all(&reply("application/json", models.to_string().as_bytes()))
                    .await?
            }
            ("POST", _) => match inference {
                InferenceAnswer::ResetMidAnswer => {
                    let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n{\"id\":";
                    return reset_after(stream, head).await;
                }
                InferenceAnswer::HighBytesInHeaders => {
                    let body = json!({
                        "id": "chatcmpl-high-bytes", "object": "chat.completion", "model": MODEL,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}
                    });
                    stream
                        .write_all(&reply("application/json", body.to_string().as_bytes()))
                        .await?
                }
                InferenceAnswer::AbsurdCachedTokens => {
                    let body = json!({
                        "id": "chatcmpl-hostile", "object": "chat.completion", "model": MODEL,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 651, "completion_tokens": 1, "total_tokens": 652,
                                  "prompt_tokens_details": {"cached_tokens": ABSURD_CACHED}}
                    });
                    stream
                        .write_all(&reply("application/json", body.to_string().as_bytes()))
                        .await?
                }
            },
            _ => {
                stream
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await?
            }
        }
    }
}

/// Writes `bytes`, then ends the connection with a TCP reset (SO_LINGER 0), not a FIN.
async fn reset_after(mut stream: TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await?;
    // Envoy has read what was written before the reset arrives.
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Deprecated for blocking the thread on drop with a positive linger; a zero one resets at once.
    #[allow(deprecated)]
    stream.set_linger(Some(Duration::ZERO))?;
    drop(stream);
    Ok(())
}

/// Sends `GET`/`POST`s with header `name` set to each byte 0x80–0xFF (between ASCII letters);
/// returns the statuses that were not 200, with the byte.
async fn every_high_byte(
    client: &reqwest::Client,
    envoy: &Envoy,
    name: &str,
    get_path: Option<&str>,
) -> Vec<(u8, u16)> {
    let body = chat("hostile bytes", "hello", 1, false).to_string();
    let mut bad = Vec::new();
    for byte in 0x80..=0xFFu8 {
        let value = reqwest::header::HeaderValue::from_bytes(&[b'a', byte, b'z']).unwrap();
        let request = match get_path {
            Some(path) => client.get(envoy.url(path)),
            None => client
                .post(envoy.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body.clone()),
        };
        let status = request
            .header(name, value)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        if status != 200 {
            bad.push((byte, status));
        }
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_high_byte_in_every_header_kvroute_reads_is_served_and_no_vm_aborts() {
    let (_sim, envoy) = stack(2, &[], json!({})).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let before = vms_created(&envoy).await;
    assert!(before >= 2, "{VMS_CREATED} read {before}");
    let routed_before = envoy.stat("wasmcustom.kvroute.requests_routed_total").await;

    // The hint headers (session, priority, SLOs), the routing headers kvroute owns and strips,
    // the peer token, and two it does not read on an inference request.
    let read_on_posts = [
        "x-session-id",
        "x-kvroute-priority",
        "x-slo-ttft-ms",
        "x-slo-tpot-ms",
        "x-gateway-destination-endpoint",
        "x-prefiller-host-port",
        "x-kvroute-debug",
        "x-envoy-upstream-rq-per-try-timeout-ms",
        "x-kvroute-peer-token",
        "authorization",
        "user-agent",
    ];
    let mut failures = Vec::new();
    for name in read_on_posts {
        for (byte, status) in every_high_byte(&client, &envoy, name, None).await {
            failures.push(format!("POST {name}: a\\x{byte:02x}z → {status}"));
        }
    }
    // A GET kvroute does not route (the pod's health path), and its model list, which kvroute
    // answers itself.
    for path in ["/health", "/v1/models"] {
        for (byte, status) in every_high_byte(&client, &envoy, "user-agent", Some(path)).await {
            failures.push(format!("GET {path} user-agent: a\\x{byte:02x}z → {status}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} requests not answered 200, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(8)]
    );
    assert_no_vm_aborted(&envoy, before).await;
    // Every POST was routed by kvroute (none passed through a VM that lost its configuration).
    let routed = envoy.stat("wasmcustom.kvroute.requests_routed_total").await - routed_before;
    assert_eq!(routed, 128 * read_on_posts.len() as u64);

    // A session id that is not UTF-8 is no session: routed on prefix and load, not pinned.
    let r = post(
        &fresh_client(),
        &envoy.url("/v1/chat/completions"),
        &chat("hostile bytes", "again", 1, false),
        &[("x-session-id", "user-1")],
    )
    .await;
    assert_eq!(r.debug_field("reason").as_deref(), Some("session"), "{r:?}");
    let value = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
    let latin1 = client
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-session-id", value)
        .body(chat("hostile bytes", "again", 1, false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(latin1.status(), 200);
    let reason = latin1
        .headers()
        .get("x-kvroute-debug")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains("reason=") && !reason.contains("reason=session"),
        "{reason}"
    );
}

/// Envoy and kvroute with its test defaults in front of `pods` alone.
async fn envoy_in_front_of(pods: &[String]) -> Envoy {
    let options = EnvoyOptions::new(pods, Lb::OverrideHost, Some(plugin_config(pods, json!({}))));
    Envoy::start(&options).await.unwrap()
}

/// Two kvsim pods and `hostile` in one pool; the leader polls all of them every 50 ms.
async fn stack_with(hostile: &[&HostilePod], extra: Value) -> (Sim, Envoy) {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let mut pods = sim.pods.clone();
    pods.extend(hostile.iter().map(|h| h.addr.clone()));
    let envoy = Envoy::start(&EnvoyOptions::new(
        &pods,
        Lb::OverrideHost,
        Some(plugin_config(&pods, extra)),
    ))
    .await
    .unwrap();
    (sim, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_envoy_ends_with_a_reset_or_an_overflow_leave_the_leader_routing() {
    let reset = HostilePod::start(
        MetricsAnswer::ResetMidAnswer,
        InferenceAnswer::ResetMidAnswer,
    )
    .await;
    let oversize =
        HostilePod::start(MetricsAnswer::Oversize, InferenceAnswer::ResetMidAnswer).await;
    let (sim, envoy) = stack_with(&[&reset, &oversize], json!({})).await;
    // The two simulated pods are healthy; the hostile ones never are.
    wait_healthy(&envoy, 2).await;
    let before = vms_created(&envoy).await;
    let leaders = envoy.stat("wasmcustom.kvroute.leader_changes_total").await;

    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let r = post(&client, &url, &chat("polls", "hello", 1, false), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.pod.as_ref().is_some_and(|p| sim.pods.contains(p)),
            "{r:?}"
        );
        served += 1;
    }
    assert!(served > 0);
    println!(
        "{served} requests served in 3 s beside {} reset and {} oversize polls",
        reset.hits("GET /metrics"),
        oversize.hits("GET /metrics")
    );
    // Both kinds of poll reached kvroute's answer callback many times.
    let (cut, overflowed) = (reset.hits("GET /metrics"), oversize.hits("GET /metrics"));
    assert!(
        cut >= 5 && overflowed >= 2,
        "polls: {cut} reset, {overflowed} oversize"
    );
    assert_no_vm_aborted(&envoy, before).await;
    assert_eq!(
        envoy.stat("wasmcustom.kvroute.leader_changes_total").await,
        leaders,
        "the leader changed; envoy log:\n{}",
        envoy.log()
    );
    assert_eq!(envoy.stat("wasmcustom.kvroute.pods_healthy").await, 2);
    assert!(envoy.stat("wasmcustom.kvroute.poll_failures_total").await >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_prefill_pod_that_resets_is_answered_decode_only_at_once() {
    let prefill = HostilePod::start(MetricsAnswer::Good, InferenceAnswer::ResetMidAnswer).await;
    let decode = Sim::start(2, &["--time-scale", TIME_SCALE, "--role", "decode"]).unwrap();
    let settings = json!({
        "pools": [
            {"name": "prefill", "role": "prefill", "endpoints": [prefill.addr]},
            {"name": "decode", "role": "decode", "endpoints": decode.pods}
        ],
        "pd": {"mode": "inline", "prefill_timeout_ms": 20000}
    });
    let envoy = Envoy::start(&EnvoyOptions::new(
        &decode.pods,
        Lb::OverrideHost,
        Some(plugin_config(&decode.pods, settings)),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 3).await;
    let before = vms_created(&envoy).await;

    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    for i in 0..3 {
        // Long and new each time: worth a prefill pod.
        let system = system_prompt(&format!("reset-prefill-{i}-"), 3000);
        let started = Instant::now();
        let r = post(&client, &url, &chat(&system, "hello", 4, false), &[]).await;
        let took = started.elapsed();
        println!("prefill pod reset: answered decode-only in {took:?}");
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(decode.pods.contains(r.pod.as_ref().unwrap()), "{r:?}");
        assert_eq!(
            r.debug_field("pd").as_deref(),
            Some("disaggregated"),
            "{r:?}"
        );
        // Well inside the call's 20 s timeout: the reset ends the wait, not a timer.
        assert!(took < Duration::from_secs(5), "answered after {took:?}");
    }
    assert_eq!(prefill.hits("POST /v1/chat/completions"), 3);
    assert_no_vm_aborted(&envoy, before).await;
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.pd.prefill_failures_total")
            .await,
        3
    );
    wait_for(Duration::from_secs(2), "decode-only counted", || async {
        envoy.stat("wasmcustom.kvroute.pd.decode_only_total").await == 3
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reporting_impossible_cached_tokens_moves_no_counter() {
    let liar = HostilePod::start(MetricsAnswer::Good, InferenceAnswer::AbsurdCachedTokens).await;
    let pods = vec![liar.addr.clone()];
    let envoy = envoy_in_front_of(&pods).await;
    wait_healthy(&envoy, 1).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt("liar-", 400);
    // The first request teaches the index the prompt; the next two are expected to hit it, so
    // kvroute reads their `usage` (it reads none where it expected nothing cached).
    for _ in 0..3 {
        let r = post(&client, &url, &chat(&system, "hello", 1, false), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
            ABSURD_CACHED,
            "the client gets the pod's answer untouched"
        );
        // Every worker VM adopts what the leader learned (its tick is 25 ms).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The old module added 10^18 per answer here.
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.cache.reported_tokens_total")
            .await,
        0
    );
    let counted = wait_for(
        Duration::from_secs(2),
        "implausible reports counted",
        || async {
            envoy
                .stat("wasmcustom.kvroute.pod.reported_implausible_total")
                .await
                == 2
        },
    )
    .await;
    if let Err(e) = counted {
        panic!("{e}; stats: {:?}", envoy.stats().await);
    }
    assert_eq!(
        envoy
            .stat_where(
                "wasmcustom.kvroute.pod.reported_implausible_total",
                "pod",
                &liar.addr
            )
            .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_that_are_not_utf8_abort_no_vm() {
    // Every answer of this pod (its /metrics and /v1/models to the leader's polls, its inference
    // responses to clients) carries every byte 0x80–0xFF in its headers.
    let pod = HostilePod::start(
        MetricsAnswer::HighBytesInHeaders,
        InferenceAnswer::HighBytesInHeaders,
    )
    .await;
    let pods = vec![pod.addr.clone()];
    let envoy = envoy_in_front_of(&pods).await;
    // Healthy: the leader read its /metrics answer through those headers.
    wait_healthy(&envoy, 1).await;
    let before = vms_created(&envoy).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    for i in 0..20 {
        let stream = i % 2 == 0;
        let r = post(&client, &url, &chat("high-bytes", "hello", 1, stream), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        // kvroute routed it and wrote its debug header beside the pod's.
        assert_eq!(
            r.debug_field("pod").as_deref(),
            Some(pod.addr.as_str()),
            "{r:?}"
        );
    }
    // The bytes reached the client as the pod sent them: Envoy passed them through kvroute.
    let answer = client
        .post(&url)
        .json(&chat("high-bytes", "hello", 1, false))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let note = answer
        .headers()
        .get("x-pod-note")
        .map(|v| v.as_bytes().to_vec());
    let mut sent = b"a".to_vec();
    sent.extend(0x80u8..=0xFF);
    sent.push(b'z');
    assert_eq!(note, Some(sent));
    assert!(pod.hits("GET /metrics") >= 2 && pod.hits("GET /v1/models") >= 1);
    assert_eq!(pod.hits("POST /v1/chat/completions"), 21);
    assert_no_vm_aborted(&envoy, before).await;
    assert_eq!(envoy.stat("wasmcustom.kvroute.pods_healthy").await, 1);
}
