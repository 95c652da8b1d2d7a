//! The fault matrix through real Envoy: one table of request-side cases (bad bodies of every
//! shape, size limits, `Expect: 100-continue`, spoofed owned headers and body fields, clients that
//! leave mid-body and mid-stream) and one of pod-side cases (refusing, failing, hanging, dying
//! mid-stream, lying metrics), all run against one Envoy + kvroute + four simulated pods. After
//! every case Envoy and each of its worker VMs must still answer a normal request with a 200, and
//! no VM may have been re-created (a plugin crash under `FAIL_RELOAD` creates a new VM). Each pod
//! case measures the client errors while healthy pods existed, how long kvroute took to notice
//! (the gauge named in the table) and how long it took to route to the pod again once the fault
//! cleared. The measured table is printed (`--nocapture`) and copied into docs/design/reliability.md.
//!
//! The leader case lives beside it: a configuration push replaces every VM under load; a new
//! leader takes over within the stated bound and no request fails.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, LdsEnvoy, Sim};
use kvbench::table::Table;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX_BODY: usize = 2 * 1024 * 1024;

/// What a request case sends.
enum Send {
    /// A POST to `/v1/chat/completions` with these bytes, headers, and a chunked body or not.
    Body {
        bytes: Vec<u8>,
        headers: Vec<(&'static str, String)>,
        chunked: bool,
    },
    /// `Expect: 100-continue` over a raw connection: the body follows Envoy's `100 Continue`.
    ExpectContinue,
    /// Headers announce a body; the client sends part of it and closes the connection.
    DisconnectMidBody,
    /// A long stream; the client reads its first chunk and closes.
    DisconnectMidStream,
}

/// What the answer must be.
#[derive(Clone, Copy)]
enum Expect {
    /// One of these statuses, with a JSON body.
    Status(&'static [u16]),
    /// 200, served by a pool pod that is also the one kvroute chose (the spoof was not followed).
    RoutedByKvroute,
    /// 200, and the pod that served it saw no `kv_transfer_params`.
    KvTransferParamsRemoved,
    /// The client left: nothing to read; the stack keeps serving and nobody is ejected.
    ClientGone,
}

struct RequestCase {
    name: &'static str,
    send: Send,
    expect: Expect,
}

fn chat_bytes(system: &str) -> Vec<u8> {
    chat(system, "q", 2, false).to_string().into_bytes()
}

fn request_cases() -> Vec<RequestCase> {
    let bad = |name, bytes: Vec<u8>| RequestCase {
        name,
        send: Send::Body {
            bytes,
            headers: vec![],
            chunked: false,
        },
        // A 400, never a 5xx: kvroute's own `unparseable_body` for a body that is not JSON it
        // reads, the model server's for JSON that is not a request it serves.
        expect: Expect::Status(&[400, 422]),
    };
    let spoof = |name, headers: Vec<(&'static str, String)>| RequestCase {
        name,
        send: Send::Body {
            bytes: chat_bytes(&system_prompt("spoof-", 200)),
            headers,
            chunked: false,
        },
        expect: Expect::RoutedByKvroute,
    };
    let nested = format!(
        "{{\"model\":\"{MODEL}\",\"messages\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let mut invalid_utf8 = format!("{{\"model\":\"{MODEL}\",\"prompt\":\"").into_bytes();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28, b'"', b'}']);
    let million = chat(&"a".repeat(1_000_000), "q", 2, false)
        .to_string()
        .into_bytes();
    let oversize = chat(&system_prompt("big", 400_000), "q", 2, false)
        .to_string()
        .into_bytes();
    assert!(million.len() < MAX_BODY && oversize.len() > MAX_BODY);
    let mut spoofed_kv = chat(&system_prompt("kvspoof-", 100), "q", 2, false);
    spoofed_kv["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "10.1.2.3",
        "remote_port": 22, "remote_engine_id": "attacker", "remote_block_ids": [1, 2, 3]});
    vec![
        bad("empty body", vec![]),
        bad(
            "truncated JSON",
            format!("{{\"model\": \"{MODEL}\", \"messages\": [{{\"role\": \"us").into_bytes(),
        ),
        bad("non-object JSON (array)", b"[1, 2, 3]".to_vec()),
        bad("non-object JSON (string)", b"\"hello\"".to_vec()),
        bad("nested 10k deep", nested.into_bytes()),
        bad("invalid UTF-8 in a string", invalid_utf8),
        bad(
            "binary with NUL",
            vec![0x00, 0xff, 0x00, 0x13, 0x37, 0xfe, 0x00],
        ),
        RequestCase {
            name: "1M-character prompt",
            send: Send::Body {
                bytes: million,
                headers: vec![],
                chunked: false,
            },
            // 250k tokens is above the model's 131,072-token context: the pod's clear 400.
            expect: Expect::Status(&[200, 400]),
        },
        RequestCase {
            name: "above max_body_bytes, content-length",
            send: Send::Body {
                bytes: oversize.clone(),
                headers: vec![],
                chunked: false,
            },
            expect: Expect::Status(&[413]),
        },
        RequestCase {
            name: "above max_body_bytes, chunked",
            send: Send::Body {
                bytes: oversize,
                headers: vec![],
                chunked: true,
            },
            expect: Expect::Status(&[413]),
        },
        RequestCase {
            name: "Expect: 100-continue",
            send: Send::ExpectContinue,
            expect: Expect::Status(&[200]),
        },
        spoof(
            "spoofed destination, internal address",
            vec![("x-gateway-destination-endpoint", "10.0.0.1:8000".into())],
        ),
        spoof(
            "spoofed destination, mixed casing",
            vec![(
                "X-Gateway-Destination-ENDPOINT",
                "169.254.169.254:80".into(),
            )],
        ),
        spoof(
            "spoofed destination, comma list",
            vec![(
                "x-gateway-destination-endpoint",
                "127.0.0.1:1,10.0.0.1:8000".into(),
            )],
        ),
        spoof(
            "spoofed destination, duplicated",
            vec![
                ("x-gateway-destination-endpoint", "127.0.0.1:1".into()),
                ("x-gateway-destination-endpoint", "10.0.0.2:8000".into()),
            ],
        ),
        spoof(
            "spoofed prefiller header",
            vec![("x-prefiller-host-port", "10.0.0.3:8000".into())],
        ),
        spoof(
            "spoofed per-try timeout (1 ms)",
            vec![("x-envoy-upstream-rq-per-try-timeout-ms", "1".into())],
        ),
        spoof(
            "spoofed debug header",
            vec![("x-kvroute-debug", "pod=10.0.0.1:8000".into())],
        ),
        RequestCase {
            name: "spoofed kv_transfer_params body field",
            send: Send::Body {
                bytes: spoofed_kv.to_string().into_bytes(),
                headers: vec![],
                chunked: false,
            },
            expect: Expect::KvTransferParamsRemoved,
        },
        RequestCase {
            name: "client disconnect mid-body",
            send: Send::DisconnectMidBody,
            expect: Expect::ClientGone,
        },
        RequestCase {
            name: "client disconnect mid-stream",
            send: Send::DisconnectMidStream,
            expect: Expect::ClientGone,
        },
    ]
}

/// One raw HTTP/1.1 exchange: writes `head`, then (after `100 Continue` when `expect_continue`)
/// `body`, and returns the final status line's code.
async fn raw_exchange(addr: &str, body: &[u8], expect_continue: bool) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if expect_continue {
        head.push_str("expect: 100-continue\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    if expect_continue {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("no 100 Continue within 5 s")
            .unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(first.starts_with("HTTP/1.1 100"), "{first}");
    }
    s.write_all(body).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got))
        .await
        .expect("answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Sends a case; returns the status (`None` when the client left) and the pod that served it.
async fn send_case(envoy: &Envoy, case: &RequestCase) -> (Option<u16>, Reply) {
    let url = envoy.url("/v1/chat/completions");
    let client = fresh_client();
    let empty = Reply {
        status: 0,
        pod: None,
        debug: None,
        body: String::new(),
        ttft: Duration::ZERO,
    };
    match &case.send {
        Send::Body {
            bytes,
            headers,
            chunked: false,
        } => {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = post_raw(&client, &url, bytes.clone(), &h).await;
            (Some(r.status), r)
        }
        Send::Body { bytes, .. } => {
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
                .send()
                .await;
            match r {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body = r.text().await.unwrap_or_default();
                    (
                        Some(status),
                        Reply {
                            status,
                            body,
                            ..empty
                        },
                    )
                }
                // Envoy may answer 413 and close before the client finished sending.
                Err(e) => panic!("chunked oversize body: {e}"),
            }
        }
        Send::ExpectContinue => {
            let body = chat_bytes(&system_prompt("continue-", 100));
            let status = raw_exchange(&envoy.listener, &body, true).await;
            (Some(status), Reply { status, ..empty })
        }
        Send::DisconnectMidBody => {
            let mut s = tokio::net::TcpStream::connect(&envoy.listener)
                .await
                .unwrap();
            let body = chat_bytes(&system_prompt("midbody-", 2000));
            s.write_all(
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\
                     content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            s.write_all(&body[..body.len() / 2]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(s);
            (None, empty)
        }
        Send::DisconnectMidStream => {
            let body = chat(&system_prompt("midstream-", 300), "q", 400, true);
            let mut r = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let first = r.chunk().await.unwrap();
            assert!(first.is_some(), "a first chunk");
            drop(r);
            (None, empty)
        }
    }
}

/// VMs Envoy created so far: a plugin crash under `FAIL_RELOAD` creates a new one.
async fn vms_created(envoy: &Envoy) -> u64 {
    envoy.stat("wasm.envoy.wasm.runtime.v8.created").await
}

/// A normal request gets a 200 from each worker's VM (fresh connections spread over workers).
async fn still_serves(envoy: &Envoy, after: &str) {
    let url = envoy.url("/v1/chat/completions");
    let mut vms = HashSet::new();
    for i in 0..40 {
        let r = post(
            &fresh_client(),
            &url,
            &chat(&system_prompt(&format!("after{i}-"), 50), "q", 1, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "after {after}: {}", r.body);
        vms.insert(r.debug_field("vm").unwrap_or_default());
        if vms.len() == 2 {
            return;
        }
    }
    panic!("after {after}: only VMs {vms:?} answered 40 requests");
}

async fn check_request_case(sim: &Sim, case: &RequestCase, status: Option<u16>, r: &Reply) {
    let name = case.name;
    match case.expect {
        Expect::Status(allowed) => {
            let status = status.unwrap_or(0);
            assert!(allowed.contains(&status), "{name}: {status} {}", r.body);
            if !r.body.is_empty() && status != 200 {
                assert!(
                    serde_json::from_str::<Value>(&r.body).is_ok(),
                    "{name}: a JSON error, got {}",
                    r.body
                );
            }
        }
        Expect::RoutedByKvroute => {
            assert_eq!(status, Some(200), "{name}: {}", r.body);
            let pod = r.pod.clone().unwrap_or_default();
            assert!(sim.pods.contains(&pod), "{name}: served by {pod}");
            assert_eq!(
                r.debug_field("pod").as_deref(),
                Some(pod.as_str()),
                "{name}"
            );
        }
        Expect::KvTransferParamsRemoved => {
            assert_eq!(status, Some(200), "{name}: {}", r.body);
            let pod = r.pod.clone().unwrap_or_default();
            let seen = &sim_stats(&pod).await["last_kv_transfer_params"];
            assert!(seen.is_null(), "{name}: the pod saw {seen}");
        }
        Expect::ClientGone => assert_eq!(status, None),
    }
}

/// A pod-side case: the fault on one pod, the load clients send meanwhile, and the gauges that say
/// kvroute noticed and recovered.
struct PodCase {
    name: &'static str,
    fault: Value,
    stream: bool,
    /// Gauges (`wasmcustom.kvroute.` omitted) and the values that mean "noticed".
    notice: &'static [(&'static str, u64)],
    /// ... and "recovered" after the fault clears.
    recover: &'static [(&'static str, u64)],
    /// Client errors allowed (a stream cut after its first token cannot be retried).
    max_errors: usize,
}

fn pod_cases() -> Vec<PodCase> {
    let healthy: &'static [(&str, u64)] =
        &[("pods_healthy", 4), ("pods_stale", 0), ("pods_ejected", 0)];
    vec![
        PodCase {
            name: "refuses connections",
            fault: json!({"refuse": true}),
            stream: false,
            notice: &[("pods_healthy", 3)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "500 on half its requests",
            fault: json!({"fail_ratio": 0.5}),
            stream: false,
            notice: &[("pods_ejected", 1)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "hangs (30 s stall), streamed",
            fault: json!({"stall_ms": 30000}),
            stream: true,
            notice: &[("pods_stale", 1)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "dies mid-stream",
            fault: json!({"die_mid_stream": true}),
            stream: true,
            notice: &[("pods_ejected", 1)],
            recover: healthy,
            // A stream cut after its 200 cannot be retried: health.consecutive_failures (5) cut
            // streams in a row eject the pod, and up to one more per other client (3) was in
            // flight to it by then.
            max_errors: 8,
        },
        PodCase {
            name: "metrics late (3 s)",
            fault: json!({"metrics_delay_ms": 3000}),
            stream: false,
            notice: &[("pods_stale", 1)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "metrics garbage",
            fault: json!({"garbage_metrics": true}),
            stream: false,
            notice: &[("pods_healthy", 3)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "metrics NaN",
            fault: json!({"metrics_lie": "nan"}),
            stream: false,
            notice: &[("pods_healthy", 3)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "metrics negative",
            fault: json!({"metrics_lie": "negative"}),
            stream: false,
            notice: &[("pods_healthy", 3)],
            recover: healthy,
            max_errors: 0,
        },
        PodCase {
            name: "metrics absurd (1e300)",
            fault: json!({"metrics_lie": "absurd"}),
            stream: false,
            // Finite and positive: believed, so the pod looks full and is ranked last.
            notice: &[],
            recover: healthy,
            max_errors: 0,
        },
    ]
}

async fn gauges_hold(envoy: &Envoy, want: &[(&str, u64)]) -> bool {
    let Ok(stats) = envoy.stats().await else {
        return false;
    };
    want.iter().all(|(g, v)| {
        stats
            .get(&format!("wasmcustom.kvroute.{g}"))
            .copied()
            .unwrap_or(0)
            == *v
    })
}

struct Measured {
    requests: usize,
    errors: usize,
    to_faulty: usize,
    notice: Option<Duration>,
    recover: Option<Duration>,
}

/// Four clients send tenant requests (prefixes that recur, so the faulty pod holds some) for
/// `for_ms`; returns (requests, errors, requests the faulty pod served).
async fn load(envoy: &Envoy, faulty: &str, stream: bool, for_ms: u64, tag: &str) -> Measured {
    let url = envoy.url("/v1/chat/completions");
    let (total, errors, to_faulty) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (url, faulty, tag) = (url.clone(), faulty.to_string(), tag.to_string());
            let (total, errors, to_faulty) = (total.clone(), errors.clone(), to_faulty.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let mut i = 0;
                while start.elapsed() < Duration::from_millis(for_ms) {
                    let system = system_prompt(&format!("{tag}{w}-{}-", i % 4), 150);
                    let r = post(&fresh_client(), &url, &chat(&system, "q", 3, stream), &[]).await;
                    total.fetch_add(1, Ordering::Relaxed);
                    let complete = !stream || r.body.contains("[DONE]");
                    if r.status != 200 || !complete {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("  {tag}: {} {}", r.status, &r.body[..r.body.len().min(200)]);
                    }
                    if r.pod.as_deref() == Some(faulty.as_str()) {
                        to_faulty.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    Measured {
        requests: total.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        to_faulty: to_faulty.load(Ordering::Relaxed),
        notice: None,
        recover: None,
    }
}

async fn run_pod_case(envoy: &Envoy, sim: &Sim, case: &PodCase, index: usize) -> Measured {
    let faulty = sim.pods[index % sim.pods.len()].clone();
    let started = Instant::now();
    sim_fault(&faulty, case.fault.clone()).await;
    let notice_watch = {
        let admin = envoy.admin.clone();
        let want: Vec<(String, u64)> = case
            .notice
            .iter()
            .map(|(g, v)| (format!("wasmcustom.kvroute.{g}"), *v))
            .collect();
        tokio::spawn(async move {
            if want.is_empty() {
                return None;
            }
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(r) = reqwest::get(format!("http://{admin}/stats")).await {
                    let stats = harness::sum_over_labels(harness::parse_stats(
                        &r.text().await.unwrap_or_default(),
                    ));
                    if want
                        .iter()
                        .all(|(g, v)| stats.get(g).copied().unwrap_or(0) == *v)
                    {
                        return Some(started.elapsed());
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        })
    };
    let tag = format!("case{index}-");
    let mut m = load(envoy, &faulty, case.stream, 3000, &tag).await;
    m.notice = notice_watch.await.unwrap();
    let cleared = Instant::now();
    // Cleared through a sibling: a refusing pod answers nothing.
    let sibling = sim.pods.iter().find(|p| **p != faulty).unwrap();
    sim_fault(sibling, json!({"pod": faulty})).await;
    if wait_for(Duration::from_secs(20), case.name, || async {
        gauges_hold(envoy, case.recover).await
    })
    .await
    .is_ok()
    {
        m.recover = Some(cleared.elapsed());
    }
    m
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("—".to_string(), |d| format!("{} ms", d.as_millis()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_matrix_through_real_envoy() {
    let extra = json!({
        "max_body_bytes": MAX_BODY,
        "health": {"first_byte_timeout_ms": 800, "base_ejection_ms": 2000}
    });
    let (sim, envoy) = stack(4, &[], extra).await;
    let vms_at_start = vms_created(&envoy).await;
    let mut table = Table::new(&["case", "expected", "outcome"]).left(3);
    for case in request_cases() {
        let ejected_before = envoy
            .stat("wasmcustom.kvroute.health.ejections_total")
            .await;
        let (status, reply) = send_case(&envoy, &case).await;
        check_request_case(&sim, &case, status, &reply).await;
        still_serves(&envoy, case.name).await;
        if matches!(case.expect, Expect::ClientGone) {
            assert_eq!(
                envoy
                    .stat("wasmcustom.kvroute.health.ejections_total")
                    .await,
                ejected_before,
                "{}: a client that left counts against no pod",
                case.name
            );
        }
        assert_eq!(vms_created(&envoy).await, vms_at_start, "{}", case.name);
        let expected = match case.expect {
            Expect::Status(s) => format!("{s:?}"),
            Expect::RoutedByKvroute => "200, spoof not followed".into(),
            Expect::KvTransferParamsRemoved => "200, field removed".into(),
            Expect::ClientGone => "client gone, no ejection".into(),
        };
        let got = status.map_or("client gone".to_string(), |s| s.to_string());
        table.row([
            case.name.to_string(),
            expected,
            format!("{got}; then 200 on every VM"),
        ]);
    }
    let mut pods_table = Table::new(&[
        "pod fault",
        "requests",
        "client errors",
        "served by faulty pod",
        "noticed (gauge)",
        "recovered after clear",
    ])
    .left(6);
    let mut failures = Vec::new();
    for (i, case) in pod_cases().iter().enumerate() {
        let m = run_pod_case(&envoy, &sim, case, i).await;
        still_serves(&envoy, case.name).await;
        assert_eq!(vms_created(&envoy).await, vms_at_start, "{}", case.name);
        let gauge = case
            .notice
            .iter()
            .map(|(g, v)| format!("{g}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        pods_table.row([
            case.name.to_string(),
            m.requests.to_string(),
            m.errors.to_string(),
            m.to_faulty.to_string(),
            format!(
                "{} ({})",
                ms(m.notice),
                if gauge.is_empty() {
                    "ranked last"
                } else {
                    &gauge
                }
            ),
            ms(m.recover),
        ]);
        if m.errors > case.max_errors {
            failures.push(format!("{}: {} client errors", case.name, m.errors));
        }
        // A faulty pod is noticed, or it stops getting traffic without that: a pod failing its
        // requests loses the prefixes it failed to the fallbacks that served them, and may
        // then see too few requests to be ejected (20 at its failure rate surely would be).
        if !case.notice.is_empty() && m.notice.is_none() && m.to_faulty >= 20 {
            failures.push(format!(
                "{}: never noticed, and {} requests still reached it",
                case.name, m.to_faulty
            ));
        }
        if m.recover.is_none() {
            failures.push(format!("{}: never recovered", case.name));
        }
    }
    eprintln!("\n{}\n{}", table.markdown(), pods_table.markdown());
    eprintln!(
        "VMs created {} (unchanged), health.ejections {}, no_endpoint {}",
        vms_created(&envoy).await,
        envoy
            .stat("wasmcustom.kvroute.health.ejections_total")
            .await,
        envoy.stat("wasmcustom.kvroute.no_endpoint_total").await
    );
    assert!(
        failures.is_empty(),
        "{failures:?}\n{}",
        pods_table.markdown().trim_end()
    );
    drop(sim);
}

/// Leader fault under load: a configuration push replaces every VM (the old leader's VM stops
/// ticking when its listener drains); another VM takes the lease within the bound and clients see
/// nothing. (Native tests in `src/vm/tests.rs` cover a leader that stops ticking and comes back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_leader_is_replaced_within_the_bound_under_load() {
    let sim = Sim::start(3, &["--time-scale", TIME_SCALE]).unwrap();
    let config = |poll: u64| plugin_config(&sim.pods, json!({"poll_interval_ms": poll}));
    let lds = LdsEnvoy::start(&sim.pods, &config(50)).await.unwrap();
    wait_healthy(&lds.envoy, 3).await;
    let first = leaders_in(&lds.envoy.log());
    let url = lds.envoy.url("/v1/chat/completions");
    let client_load = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < Duration::from_secs(5) {
            let system = system_prompt(&format!("lead{}-", i % 5), 150);
            let r = post(&fresh_client(), &url, &chat(&system, "q", 2, false), &[]).await;
            statuses.push(r.status);
            i += 1;
        }
        statuses
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let pushed = Instant::now();
    lds.update(&config(60)).unwrap();
    wait_for(Duration::from_secs(20), "a new leader", || async {
        leaders_in(&lds.envoy.log())
            .iter()
            .any(|l| !first.contains(l))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", lds.envoy.log()));
    let took = pushed.elapsed();
    let statuses = client_load.await.unwrap();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    eprintln!(
        "leader replaced {} ms after the push; {} requests during, {failed} failed",
        took.as_millis(),
        statuses.len()
    );
    assert_eq!(failed, 0, "{statuses:?}");
    // The bound: the listener's drain (1 s here, --drain-time-s) plus one lease (400 ms) and a tick.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    wait_healthy(&lds.envoy, 3).await;
    drop(sim);
}
