//! Tests of kvbench: workloads are deterministic and have the intended shape, the statistics and the
//! Prometheus parsing are right, and the driver measures a tiny in-process fake OpenAI server (known
//! delays, known counters, scripted failures) correctly without ever crashing on a broken response.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use kvbench::driver::{drive_with, DriveOptions, SseBuffer};
use kvbench::metrics::{
    cluster_hit_ratio, counter_delta, parse_prometheus, MetricsSnapshot, PodDelta,
};
use kvbench::workload::{word_count, Slot, WorkloadGen};
use kvbench::{
    percentile, render_json, render_table, run, AgentParams, Api, InterferenceParams, Load,
    MultiTenantParams, MultiTurnParams, RunReport, Summary, WorkloadKind, WorkloadSpec,
};

// ---------------------------------------------------------------- workloads

fn spec(kind: WorkloadKind, load: Load, seed: u64) -> WorkloadSpec {
    let mut s = WorkloadSpec::new(kind, load);
    s.seed = seed;
    s
}

/// Generates `n` requests, answering each with `reply(slot, max_tokens)` before building the next.
fn generate(
    spec: &WorkloadSpec,
    n: usize,
    mut reply: impl FnMut(&Slot, u32) -> Option<String>,
) -> Vec<(Slot, Value)> {
    let mut gen = WorkloadGen::new(spec).expect("valid spec");
    let mut out = Vec::new();
    while out.len() < n {
        let Some(slot) = gen.next_slot() else { break };
        let req = gen.build_request(&slot);
        let r = reply(&slot, req.max_tokens);
        gen.record_reply(&slot, r.as_deref());
        out.push((slot, req.body));
    }
    out
}

fn messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().expect("role").to_owned(),
                m["content"].as_str().expect("content").to_owned(),
            )
        })
        .collect()
}

fn all_kinds() -> Vec<WorkloadKind> {
    WorkloadKind::NAMES
        .iter()
        .map(|n| WorkloadKind::from_name(n).expect("known"))
        .collect()
}

#[test]
fn workloads_are_deterministic_per_seed() {
    for kind in all_kinds() {
        let load = Load::Open { rate: 5.0 };
        let a = generate(&spec(kind.clone(), load, 7), 30, |_, _| None);
        let b = generate(&spec(kind.clone(), load, 7), 30, |_, _| None);
        let c = generate(&spec(kind.clone(), load, 8), 30, |_, _| None);
        assert_eq!(a.len(), 30, "{}", kind.name());
        assert_eq!(a, b, "{}: same seed, same requests", kind.name());
        assert_ne!(a, c, "{}: another seed, other requests", kind.name());
    }
}

#[test]
fn every_request_streams_with_usage() {
    for kind in all_kinds() {
        for (_, body) in generate(
            &spec(kind.clone(), Load::Closed { concurrency: 1 }, 1),
            5,
            |_, _| None,
        ) {
            assert_eq!(body["stream"], json!(true));
            assert_eq!(body["stream_options"]["include_usage"], json!(true));
            // The spec's model, or the adapter a many-adapters request names.
            let model = body["model"].as_str().unwrap_or_default().to_string();
            match &kind {
                WorkloadKind::ManyAdapters(_) => assert!(model.starts_with("adapter-"), "{model}"),
                _ => assert_eq!(model, "sim-model", "{}", kind.name()),
            }
            assert_eq!(body["ignore_eos"], json!(true));
        }
    }
}

#[test]
fn multi_tenant_shares_each_tenants_system_prompt() {
    let p = MultiTenantParams::default();
    let reqs = generate(
        &spec(
            WorkloadKind::MultiTenant(p.clone()),
            Load::Open { rate: 10.0 },
            3,
        ),
        200,
        |_, _| None,
    );
    let mut systems: HashMap<String, String> = HashMap::new();
    let mut questions = std::collections::HashSet::new();
    for (slot, body) in &reqs {
        let m = messages(body);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, "system");
        assert_eq!(word_count(&m[0].1), p.system_words);
        let q = word_count(&m[1].1);
        assert!((40..=120).contains(&q), "question of {q} words");
        let mt = body["max_tokens"].as_u64().expect("max_tokens");
        assert!((64..=256).contains(&mt));
        let prev = systems
            .entry(slot.session.clone())
            .or_insert_with(|| m[0].1.clone());
        assert_eq!(*prev, m[0].1, "{} keeps its system prompt", slot.session);
        questions.insert(m[1].1.clone());
    }
    // Words of at most 6 lowercase letters: kvsim counts each as exactly one token.
    for text in systems.values().chain(&questions) {
        assert!(text
            .split(' ')
            .all(|w| (1..=6).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())));
    }
    assert_eq!(
        systems.len(),
        p.tenants,
        "every tenant appears in 200 requests"
    );
    let distinct: std::collections::HashSet<_> = systems.values().collect();
    assert_eq!(distinct.len(), p.tenants, "tenants' system prompts differ");
    assert_eq!(questions.len(), reqs.len(), "questions are fresh");
    // Distinct prompts must diverge at once, or prefix hashing would lump tenants together.
    let firsts: std::collections::HashSet<_> = systems
        .values()
        .map(|s| s.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(firsts.len(), p.tenants);
}

#[test]
fn multi_tenant_zipf_skews_popularity() {
    let p = MultiTenantParams {
        zipf_s: 1.2,
        ..MultiTenantParams::default()
    };
    let reqs = generate(
        &spec(
            WorkloadKind::MultiTenant(p),
            Load::Closed { concurrency: 1 },
            5,
        ),
        2000,
        |_, _| None,
    );
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for (slot, _) in &reqs {
        *counts.entry(slot.session_id).or_default() += 1;
    }
    let c0 = counts.get(&0).copied().unwrap_or(0);
    let c7 = counts.get(&7).copied().unwrap_or(0);
    assert!(c0 > 4 * c7, "tenant 0 {c0} vs tenant 7 {c7}");
}

#[test]
fn multi_turn_resends_the_conversation_with_actual_replies() {
    for stagger in [false, true] {
        let p = MultiTurnParams {
            stagger,
            ..MultiTurnParams::default()
        };
        let n = p.conversations * p.turns as usize * 2;
        // Every third turn "fails": its stand-in must be resent instead, at the requested length.
        let reply = |slot: &Slot, _max: u32| {
            (slot.index % 3 != 2).then(|| format!("reply to {} turn {}", slot.session, slot.turn))
        };
        let reqs = generate(
            &spec(
                WorkloadKind::MultiTurn(p.clone()),
                Load::Open { rate: 4.0 },
                11,
            ),
            n,
            reply,
        );
        assert_eq!(reqs.len(), n);
        // Per conversation: its last slot, the messages sent then, and that turn's max_tokens.
        type Sent = (Slot, Vec<(String, String)>, u32);
        let mut last: HashMap<String, Sent> = HashMap::new();
        let mut first_turns = Vec::new();
        for (slot, body) in &reqs {
            let m = messages(body);
            assert_eq!(
                m.len(),
                2 + 2 * slot.turn as usize,
                "system + turns + new user"
            );
            assert_eq!(word_count(&m[0].1), p.system_words);
            assert_eq!(m.last().map(|x| x.0.as_str()), Some("user"));
            match last.get(&slot.session) {
                None => {
                    // A conversation's first request: turn 0, or a staggered start whose earlier
                    // replies are all stand-ins of the turn's max_tokens (64..=256 words).
                    if slot.session_id >= p.conversations as u64 || !stagger {
                        assert_eq!(slot.turn, 0, "{}", slot.session);
                    } else {
                        first_turns.push(slot.turn);
                    }
                    for a in m.iter().filter(|x| x.0 == "assistant") {
                        assert!((64..=256).contains(&word_count(&a.1)));
                    }
                }
                Some((prev_slot, prev_msgs, prev_max)) => {
                    assert_eq!(prev_slot.turn + 1, slot.turn);
                    assert_eq!(
                        &m[..prev_msgs.len()],
                        &prev_msgs[..],
                        "prior conversation resent"
                    );
                    let assistant = &m[prev_msgs.len()];
                    assert_eq!(assistant.0, "assistant");
                    match reply(prev_slot, 0) {
                        Some(text) => assert_eq!(assistant.1, text),
                        None => assert_eq!(word_count(&assistant.1), *prev_max as usize),
                    }
                }
            }
            let max = body["max_tokens"].as_u64().expect("max_tokens") as u32;
            last.insert(slot.session.clone(), (slot.clone(), m, max));
        }
        if stagger {
            // Slot j starts at turn ⌊j·6/16⌋: 0,0,0,1,1,1,2,2,3,3,3,4,4,4,5,5 in some order.
            first_turns.sort_unstable();
            let expected: Vec<u32> = (0..16).map(|j| j * 6 / 16).collect();
            assert_eq!(first_turns, expected);
        }
        // Finished conversations are replaced by fresh ones.
        assert!(reqs
            .iter()
            .any(|(s, _)| s.session_id >= p.conversations as u64));
        assert!(reqs.iter().all(|(s, _)| s.turn < p.turns));
    }
}

#[test]
fn agent_sessions_grow_and_keep_the_45_to_1_ratio() {
    let p = AgentParams::default();
    let n = p.sessions * p.steps as usize * 3;
    // The server is assumed to return exactly max_tokens tokens (ignore_eos).
    let reqs = generate(
        &spec(
            WorkloadKind::Agent(p.clone()),
            Load::Closed { concurrency: 1 },
            2,
        ),
        n,
        |slot, max| {
            Some(
                format!("out{} ", slot.turn)
                    .repeat(max as usize)
                    .trim_end()
                    .to_owned(),
            )
        },
    );
    assert_eq!(reqs.len(), n);
    let mut input = 0usize;
    let mut output = 0usize;
    let mut preambles = std::collections::HashSet::new();
    let mut prev: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (slot, body) in &reqs {
        let m = messages(body);
        let words: usize = m.iter().map(|x| word_count(&x.1)).sum();
        assert!(
            (5500..=13000).contains(&words),
            "step {} has {words} words",
            slot.turn
        );
        input += words;
        output += body["max_tokens"].as_u64().expect("max_tokens") as usize;
        preambles.insert(m[0].1.clone());
        if let Some(before) = prev.get(&slot.session) {
            assert_eq!(&m[..before.len()], &before[..], "context only grows");
            assert_eq!(m.len(), before.len() + 2, "previous output + tool result");
            assert_eq!(m[before.len()].0, "assistant");
        }
        prev.insert(slot.session.clone(), m);
    }
    assert_eq!(preambles.len(), 1, "one preamble shared by all sessions");
    let ratio = input as f64 / output as f64;
    assert!((40.0..=50.0).contains(&ratio), "input:output {ratio:.1}:1");
}

#[test]
fn open_loop_arrivals_are_poisson_at_the_rate() {
    let mut s = spec(
        WorkloadKind::from_name("multi-tenant").expect("known"),
        Load::Open { rate: 20.0 },
        9,
    );
    s.duration_s = 100.0;
    let mut gen = WorkloadGen::new(&s).expect("valid");
    let mut arrivals = Vec::new();
    while let Some(slot) = gen.next_slot() {
        arrivals.push(slot.arrival_s);
    }
    let n = arrivals.len() as f64;
    assert!(
        (1800.0..=2200.0).contains(&n),
        "{n} arrivals for 2000 expected"
    );
    assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
    assert!(arrivals.iter().all(|&a| a > 0.0 && a <= 100.0));
    // Exponential gaps: coefficient of variation ≈ 1.
    let gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    let cv = var.sqrt() / mean;
    assert!((0.85..=1.15).contains(&cv), "cv {cv}");
    assert!(gen.next_slot().is_none(), "stays exhausted");
}

#[test]
fn invalid_specs_are_rejected() {
    let kind = WorkloadKind::from_name("agent").expect("known");
    assert!(WorkloadKind::from_name("nope").is_err());
    assert!(WorkloadSpec::new(kind.clone(), Load::Open { rate: 0.0 })
        .validate()
        .is_err());
    assert!(
        WorkloadSpec::new(kind.clone(), Load::Closed { concurrency: 0 })
            .validate()
            .is_err()
    );
    let bad = WorkloadKind::MultiTurn(MultiTurnParams {
        user_words: (10, 5),
        ..MultiTurnParams::default()
    });
    assert!(WorkloadSpec::new(bad, Load::Open { rate: 1.0 })
        .validate()
        .is_err());
    assert!(WorkloadSpec::new(kind, Load::Open { rate: 1.0 })
        .validate()
        .is_ok());
}

#[test]
fn interference_mixes_poisson_long_prompts_into_streaming_decodes() {
    let p = InterferenceParams::default();
    let mut s = spec(
        WorkloadKind::Interference(p.clone()),
        Load::Open { rate: 5.0 },
        4,
    );
    s.duration_s = 400.0;
    assert_eq!(
        WorkloadKind::from_name("interference").expect("known"),
        s.workload
    );
    assert!(
        !WorkloadGen::new(&s).expect("valid").is_sequential(),
        "independent requests: nothing waits for a previous reply"
    );
    let reqs = generate(&s, usize::MAX, |_, _| None);
    let n = reqs.len() as f64;
    assert!(
        (1800.0..=2200.0).contains(&n),
        "{n} arrivals for 2000 expected"
    );
    let (long, stream): (Vec<_>, Vec<_>) = reqs
        .iter()
        .partition(|(slot, _)| InterferenceParams::is_long_session(&slot.session));
    let share = long.len() as f64 / n;
    assert!(
        (0.17..=0.23).contains(&share),
        "long share {share} for {}",
        p.long_share
    );
    let check = |reqs: &[&(Slot, Value)], kind: &str, words: (usize, usize), max: (u32, u32)| {
        for (slot, body) in reqs {
            assert_eq!(slot.session, format!("{kind}-{}", slot.index));
            assert_eq!(slot.turn, 0);
            let m = messages(body);
            assert_eq!(m.len(), 1, "one user message");
            assert_eq!(m[0].0, "user");
            let w = word_count(&m[0].1);
            assert!((words.0..=words.1).contains(&w), "{kind}: {w} words");
            let t = body["max_tokens"].as_u64().expect("max_tokens") as u32;
            assert!((max.0..=max.1).contains(&t), "{kind}: max_tokens {t}");
            assert_eq!(body["stream"], true);
        }
    };
    check(&long, "long", p.long_prompt_words, p.long_max_tokens);
    check(
        &stream,
        "stream",
        p.stream_prompt_words,
        p.stream_max_tokens,
    );
    assert!(stream
        .iter()
        .all(|(slot, _)| InterferenceParams::is_stream_session(&slot.session)));
    // Every prompt is distinct text: no prefix cache can help a long prompt.
    let heads: std::collections::HashSet<String> = reqs
        .iter()
        .map(|(_, b)| {
            messages(b)[0]
                .1
                .split(' ')
                .take(12)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(heads.len(), reqs.len());
    // The long prompts alone arrive as a Poisson stream at rate × share: gaps with CV ≈ 1.
    let arrivals: Vec<f64> = long.iter().map(|(slot, _)| slot.arrival_s).collect();
    let gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    assert!(
        (0.8..=1.25).contains(&(mean * 5.0 * p.long_share)),
        "mean gap {mean}"
    );
    assert!((0.8..=1.2).contains(&(var.sqrt() / mean)), "cv");
    // Deterministic per seed.
    let again = generate(&s, usize::MAX, |_, _| None);
    assert_eq!(reqs, again);
    let mut other = s.clone();
    other.seed = 5;
    assert_ne!(generate(&other, 50, |_, _| None), reqs[..50].to_vec());
    // A share outside 0..=1 or an empty range is refused.
    for bad in [
        InterferenceParams {
            long_share: 1.5,
            ..p.clone()
        },
        InterferenceParams {
            long_share: f64::NAN,
            ..p.clone()
        },
        InterferenceParams {
            long_prompt_words: (10, 5),
            ..p.clone()
        },
    ] {
        assert!(
            WorkloadSpec::new(WorkloadKind::Interference(bad), Load::Open { rate: 1.0 })
                .validate()
                .is_err()
        );
    }
}

// ---------------------------------------------------------------- statistics and parsing

#[test]
fn percentiles_interpolate_like_numpy() {
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
    assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), Some(2.5));
    let v: Vec<f64> = (1..=10).map(f64::from).collect();
    let close = |a: Option<f64>, b: f64| (a.expect("value") - b).abs() < 1e-9;
    assert!(close(percentile(&v, 90.0), 9.1));
    assert!(close(percentile(&v, 99.0), 9.91));
    assert!(close(percentile(&v, 0.0), 1.0));
    assert!(close(percentile(&v, 100.0), 10.0));
    let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
    assert!(close(percentile(&hundred, 50.0), 50.5));
    assert!(close(percentile(&hundred, 99.0), 99.01));
    let s = Summary::of(&v);
    assert_eq!(s.count, 10);
    assert!(close(s.mean, 5.5));
    assert!(close(s.p50, 5.5));
    assert_eq!(Summary::of(&[]).p50, None);
}

const METRICS_BEFORE: &str = r#"# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="sim-model"} 500
vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} 400.0 1712345678000
vllm:prefix_cache_hits_total{engine="1",model_name="sim-model"} 100
vllm:prompt_tokens_total{model_name="weird \"quoted\" {name}, with comma"} 7e3
vllm:num_requests_waiting{model_name="sim-model"} 2
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="sim-model"} 12
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1
weird_metric NaN
this line is not a sample
"#;

const METRICS_AFTER: &str = r#"vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 3000
vllm:prefix_cache_queries_total{engine="1",model_name="sim-model"} 500
vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} 1900
vllm:prefix_cache_hits_total{engine="1",model_name="sim-model"} 100
vllm:prompt_tokens_total{model_name="weird \"quoted\" {name}, with comma"} 9000
vllm:num_requests_waiting{model_name="sim-model"} 0
"#;

#[test]
fn prometheus_text_is_parsed() {
    let samples = parse_prometheus(METRICS_BEFORE);
    assert_eq!(samples.len(), 9, "comments and the broken line skipped");
    let weird = samples
        .iter()
        .find(|s| s.name == "vllm:prompt_tokens_total")
        .expect("prompt tokens");
    assert_eq!(
        weird.labels,
        vec![(
            "model_name".to_owned(),
            "weird \"quoted\" {name}, with comma".to_owned()
        )]
    );
    assert_eq!(weird.value, 7000.0);
    let bucket = samples
        .iter()
        .find(|s| s.name.ends_with("_bucket"))
        .expect("bucket");
    assert_eq!(bucket.labels[0], ("le".to_owned(), "+Inf".to_owned()));
    assert!(samples
        .iter()
        .any(|s| s.name == "weird_metric" && s.value.is_nan()));

    let before = MetricsSnapshot::parse(METRICS_BEFORE);
    assert_eq!(before.get("vllm:prefix_cache_queries_total"), Some(1500.0));
    assert_eq!(before.get("vllm:prefix_cache_hits_total"), Some(500.0));
    assert_eq!(before.get("vllm:absent"), None);
}

#[test]
fn prometheus_deltas_give_the_cluster_hit_ratio() {
    let before = MetricsSnapshot::parse(METRICS_BEFORE);
    let after = MetricsSnapshot::parse(METRICS_AFTER);
    let a = PodDelta::between("10.0.0.1:8000", &before, &after);
    assert_eq!(a.prefix_cache_queries, 2000.0);
    assert_eq!(a.prefix_cache_hits, 1500.0);
    assert_eq!(a.prompt_tokens, 2000.0);
    assert_eq!(a.requests_waiting, Some(0.0));
    assert_eq!(a.hit_ratio(), Some(0.75));
    // A pod that restarted: its counters start again from zero.
    assert_eq!(counter_delta(500.0, 120.0), 120.0);
    let restarted = PodDelta::between(
        "10.0.0.2:8000",
        &MetricsSnapshot::parse(
            "vllm:prefix_cache_queries_total 9000\nvllm:prefix_cache_hits_total 9000\n",
        ),
        &MetricsSnapshot::parse(
            "vllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total 0\n",
        ),
    );
    assert_eq!(restarted.prefix_cache_queries, 1000.0);
    let unreachable = PodDelta::failed("10.0.0.3:8000", "refused".to_owned());
    let ratio = cluster_hit_ratio(&[a, restarted, unreachable]).expect("ratio");
    assert!((ratio - 1500.0 / 3000.0).abs() < 1e-12);
    assert_eq!(cluster_hit_ratio(&[]), None);
}

#[test]
fn sse_events_survive_arbitrary_read_boundaries() {
    let stream = b"data: {\"a\":1}\r\n\r\n: comment\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
    for split in 1..stream.len() {
        let mut buf = SseBuffer::default();
        let mut got = buf.push(&stream[..split]);
        got.extend(buf.push(&stream[split..]));
        assert_eq!(
            got,
            vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"],
            "split at {split}"
        );
    }
}

// ---------------------------------------------------------------- driver against a fake server

const REPLY: [&str; 5] = ["alpha", " beta", " gamma", " delta", " epsilon"];

#[derive(Default)]
struct Fake {
    /// Delay of the first content chunk after the (immediate) role chunk.
    first_delay: Duration,
    /// Delay between content chunks.
    itl: Duration,
    /// Request n (from 0): n % 4 == 1 → 503, n % 4 == 3 → stream cut before `[DONE]`.
    scripted_failures: bool,
    /// This request never finishes.
    stall_on: Option<u64>,
    /// Answer with kvroute's debug header carrying this `predicted_ttft_ms`.
    predicted_ms: Option<u64>,
    /// Serve /metrics only; no traffic.
    served: AtomicU64,
    queries: AtomicU64,
    hits: AtomicU64,
    /// (session header, body) of every request.
    seen: Mutex<Vec<(Option<String>, Value)>>,
}

impl Fake {
    fn new(first_delay_ms: u64, itl_ms: u64) -> Self {
        Self {
            first_delay: Duration::from_millis(first_delay_ms),
            itl: Duration::from_millis(itl_ms),
            queries: AtomicU64::new(1000),
            hits: AtomicU64::new(10),
            ..Self::default()
        }
    }
}

async fn start(fake: Fake) -> (SocketAddr, Arc<Fake>) {
    let fake = Arc::new(fake);
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|s, h, b| completion(s, h, b, Api::Chat)),
        )
        .route(
            "/v1/completions",
            post(|s, h, b| completion(s, h, b, Api::Completions)),
        )
        .route("/metrics", get(metrics))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, fake)
}

async fn metrics(State(fake): State<Arc<Fake>>) -> String {
    let q = fake.queries.load(Ordering::SeqCst);
    let h = fake.hits.load(Ordering::SeqCst);
    format!(
        "# TYPE vllm:prefix_cache_queries_total counter\n\
         vllm:prefix_cache_queries_total{{model_name=\"sim-model\"}} {q}\n\
         # TYPE vllm:prefix_cache_hits_total counter\n\
         vllm:prefix_cache_hits_total{{model_name=\"sim-model\"}} {h}\n\
         vllm:num_requests_running{{model_name=\"sim-model\"}} 0\n"
    )
}

fn chunk(api: Api, content: &str) -> Bytes {
    let v = match api {
        Api::Chat => json!({"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]}),
        Api::Completions => json!({"object": "text_completion",
            "choices": [{"index": 0, "text": content, "finish_reason": null}]}),
    };
    Bytes::from(format!("data: {v}\n\n"))
}

async fn completion(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
    api: Api,
) -> Response {
    let n = fake.served.fetch_add(1, Ordering::SeqCst);
    fake.queries.fetch_add(100, Ordering::SeqCst);
    fake.hits.fetch_add(75, Ordering::SeqCst);
    let session = headers
        .get("x-session")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    fake.seen.lock().expect("fake lock").push((session, body));
    // Two "pods" behind one address, to exercise the spread accounting.
    let pod = format!("10.0.0.{}:8000", n % 2 + 1);
    if fake.scripted_failures && n % 4 == 1 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("x-kvsim-pod", pod)],
            "busy",
        )
            .into_response();
    }
    let truncate = fake.scripted_failures && n % 4 == 3;
    let stall = fake.stall_on == Some(n);
    let (first, itl) = (fake.first_delay, fake.itl);
    let stream = async_stream::stream! {
        // A role-only chunk first: it must not count as the first token.
        let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
        yield Ok::<Bytes, Infallible>(Bytes::from(format!("data: {role}\n\n")));
        if stall {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(first).await;
        for (i, word) in REPLY.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(itl).await;
            }
            yield Ok(chunk(api, word));
        }
        if truncate {
            return;
        }
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
            "total_tokens": 105, "prompt_tokens_details": {"cached_tokens": 40}}});
        yield Ok(Bytes::from(format!("data: {usage}\n\n")));
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    };
    let mut resp = Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-kvsim-pod", pod.clone());
    if let Some(ms) = fake.predicted_ms {
        resp = resp.header(
            "x-kvroute-debug",
            format!("pod={pod}; reason=load; predicted_ttft_ms={ms}; score=0.5"),
        );
    }
    resp.body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn small_tenants() -> WorkloadKind {
    WorkloadKind::MultiTenant(MultiTenantParams {
        tenants: 3,
        system_words: 50,
        ..MultiTenantParams::default()
    })
}

fn within(v: Option<f64>, lo: f64, hi: f64, what: &str) {
    let v = v.unwrap_or(f64::NAN);
    assert!((lo..=hi).contains(&v), "{what} = {v}, expected {lo}..={hi}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_measures_latency_failures_and_hit_ratio() {
    // Wall delays 40 ms / 20 ms at time scale 0.5 read as 80 ms / 40 ms simulated.
    let mut fake = Fake::new(40, 20);
    fake.scripted_failures = true;
    let (addr, fake) = start(fake).await;
    let (idle_addr, _idle) = start(Fake::new(0, 0)).await;
    let mut s = spec(small_tenants(), Load::Closed { concurrency: 2 }, 1);
    s.max_requests = Some(8);
    s.keep_records = true;
    let pods = vec![
        addr.to_string(),
        idle_addr.to_string(),
        "127.0.0.1:1".to_owned(),
    ];
    let r = run(&format!("http://{addr}"), &pods, &s, 0.5)
        .await
        .expect("run");

    assert_eq!(fake.served.load(Ordering::SeqCst), 8);
    assert_eq!((r.requests, r.ok, r.failed, r.abandoned), (8, 4, 4, 0));
    assert_eq!(r.success_rate, Some(0.5));
    let errors: Vec<(&str, usize)> = r.errors.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(errors, vec![("http 503", 2), ("no [DONE]", 2)]);

    within(r.ttft_ms.p50, 75.0, 250.0, "TTFT p50 (sim ms)");
    within(r.ttft_ms.p99, 75.0, 400.0, "TTFT p99 (sim ms)");
    assert_eq!(r.ttft_ms.count, 4);
    within(r.itl_ms.p50, 30.0, 120.0, "ITL p50 (sim ms)");
    assert_eq!(r.itl_ms.count, 16, "4 gaps per successful response");
    within(r.e2e_ms.p50, 230.0, 700.0, "E2E p50 (sim ms)");

    // Counters: +100 queries, +75 hits per request; the idle pod adds nothing, the dead one is skipped.
    within(r.cache_hit_ratio, 0.75, 0.75, "cluster hit ratio");
    within(r.mean_cached_fraction, 0.4, 0.4, "mean cached fraction");
    assert_eq!(r.pods.len(), 3);
    assert_eq!(r.pods[0].prefix_cache_queries, 800.0);
    assert_eq!(r.pods[1].prefix_cache_queries, 0.0);
    assert!(r.pods[2].error.is_some());
    let spread: Vec<usize> = r.pod_requests.values().copied().collect();
    assert_eq!(spread, vec![4, 4]);

    // 4 successes × 5 tokens over the run's simulated duration.
    within(
        Some(r.output_tokens_per_s),
        20.0 / r.duration_s - 1e-9,
        20.0 / r.duration_s + 1e-9,
        "output tokens/s",
    );
    within(
        Some(r.duration_s),
        2.0 * r.wall_s - 1e-9,
        2.0 * r.wall_s + 1e-9,
        "sim duration",
    );
    assert_eq!(r.records.len(), 8);
    let ok_record = r.records.iter().find(|x| x.ok).expect("a success");
    assert_eq!(ok_record.output_tokens, 5);
    assert_eq!(ok_record.cached_tokens, Some(40));
    assert!(ok_record.pod.is_some());

    let table = render_table(&[("fake".to_owned(), r.clone())]);
    assert!(table.contains("SIMULATED"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("fake ")), "{table}");
    assert!(table.contains("http 503 ×2"), "{table}");
    // Several runs side by side: one row each, under one header.
    let two = render_table(&[
        ("fake".to_owned(), r.clone()),
        ("other".to_owned(), r.clone()),
    ]);
    let rows: Vec<&str> = two
        .lines()
        .filter(|l| l.starts_with("fake ") || l.starts_with("other "))
        .collect();
    assert_eq!(rows.len(), 2, "{two}");
    assert_eq!(rows[0].len(), rows[1].len(), "aligned columns\n{two}");
    assert_eq!(two.matches("TTFT p50").count(), 1);
    let json = render_json(&[("fake".to_owned(), r)]);
    assert_eq!(json[0]["label"], json!("fake"));
    assert_eq!(json[0]["ok"], json!(4));
    assert_eq!(json[0]["spec"]["workload"]["kind"], json!("multi-tenant"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_spread_over_the_gateway_replicas() {
    let (a, fake_a) = start(Fake::new(1, 1)).await;
    let (b, fake_b) = start(Fake::new(1, 1)).await;
    let mut s = spec(small_tenants(), Load::Closed { concurrency: 2 }, 1);
    s.max_requests = Some(10);
    let opts = DriveOptions {
        other_gateways: vec![format!("http://{b}/")],
        ..DriveOptions::default()
    };
    let out = drive_with(&format!("http://{a}"), &s, 0.5, &opts)
        .await
        .expect("drive");
    assert_eq!(out.records.len(), 10);
    assert!(out.records.iter().all(|r| r.ok), "{:?}", out.records);
    // Request N to gateway N mod 2: half each, a session's turns on both.
    assert_eq!(fake_a.served.load(Ordering::SeqCst), 5);
    assert_eq!(fake_b.served.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_follows_the_seeded_arrivals() {
    let (addr, fake) = start(Fake::new(5, 2)).await;
    let mut s = spec(small_tenants(), Load::Open { rate: 40.0 }, 4);
    s.duration_s = 1.0;
    s.keep_records = true;
    let expected: Vec<f64> = {
        let mut gen = WorkloadGen::new(&s).expect("valid");
        std::iter::from_fn(|| gen.next_slot().map(|x| x.arrival_s)).collect()
    };
    assert!(expected.len() > 20);
    let r = run(&format!("http://{addr}"), &[addr.to_string()], &s, 0.5)
        .await
        .expect("run");
    assert_eq!(r.requests, expected.len());
    assert_eq!(r.ok, expected.len(), "{:?}", r.errors);
    assert_eq!(fake.served.load(Ordering::SeqCst) as usize, expected.len());
    for (rec, arrival) in r.records.iter().zip(&expected) {
        // Records are in simulated seconds; the request leaves at its arrival time.
        assert!(
            rec.start_s >= arrival - 1e-3 && rec.start_s <= arrival + 0.1,
            "sent at {} for arrival {arrival}",
            rec.start_s
        );
    }
    within(r.cache_hit_ratio, 0.75, 0.75, "hit ratio");
    assert!(r.load.contains("rate 40"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_resends_what_the_server_returned() {
    let mut fake = Fake::new(2, 1);
    fake.scripted_failures = true;
    let (addr, fake) = start(fake).await;
    let kind = WorkloadKind::MultiTurn(MultiTurnParams {
        conversations: 2,
        turns: 3,
        system_words: 30,
        ..MultiTurnParams::default()
    });
    let mut s = spec(kind, Load::Closed { concurrency: 2 }, 6);
    s.max_requests = Some(6);
    s.keep_records = true;
    s.session_header = Some("x-session".to_owned());
    let r = run(&format!("http://{addr}"), &[], &s, 1.0)
        .await
        .expect("run");
    assert_eq!(r.requests, 6);
    assert_eq!(r.ok, 3, "{:?}", r.errors);
    assert_eq!(r.cache_hit_ratio, None, "no pods given");
    let ok: HashMap<(String, u32), bool> = r
        .records
        .iter()
        .map(|x| ((x.session.clone(), x.turn), x.ok))
        .collect();
    let seen = fake.seen.lock().expect("fake lock").clone();
    assert_eq!(seen.len(), 6);
    let full_reply = REPLY.concat();
    let (mut resent, mut stand_ins) = (0, 0);
    for (session, body) in &seen {
        let session = session.clone().expect("session header sent");
        let m = messages(body);
        let turn = (m.len() as u32 - 2) / 2;
        for t in 0..turn {
            let assistant = &m[2 + 2 * t as usize];
            assert_eq!(assistant.0, "assistant");
            // A turn without a record is the history of a staggered start: a stand-in too.
            if ok.get(&(session.clone(), t)).copied().unwrap_or(false) {
                assert_eq!(assistant.1, full_reply, "{session} turn {t}");
                resent += 1;
            } else {
                assert_ne!(
                    assistant.1, full_reply,
                    "failed turn replaced by its stand-in"
                );
                assert!(word_count(&assistant.1) >= 64);
                stand_ins += 1;
            }
        }
    }
    assert!(
        resent > 0 && stand_ins > 0,
        "{resent} replies, {stand_ins} stand-ins"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_times_out_and_the_run_goes_on() {
    let mut fake = Fake::new(2, 1);
    fake.stall_on = Some(1);
    let (addr, _fake) = start(fake).await;
    let mut s = spec(small_tenants(), Load::Closed { concurrency: 1 }, 1);
    s.max_requests = Some(3);
    s.request_timeout_s = 1.0; // 0.5 s wall
    let r = run(&format!("http://{addr}"), &[], &s, 0.5)
        .await
        .expect("run");
    assert_eq!((r.requests, r.ok), (3, 2));
    assert_eq!(r.errors.get("timeout"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_cuts_off_in_flight_and_waiting_turns() {
    let mut fake = Fake::new(2, 1);
    fake.stall_on = Some(0);
    let (addr, _fake) = start(fake).await;
    let kind = WorkloadKind::MultiTurn(MultiTurnParams {
        conversations: 1,
        turns: 3,
        system_words: 10,
        ..MultiTurnParams::default()
    });
    let mut s = spec(kind, Load::Open { rate: 100.0 }, 1);
    s.max_requests = Some(3);
    s.drain_timeout_s = 0.3;
    let started = std::time::Instant::now();
    let r = run(&format!("http://{addr}"), &[], &s, 1.0)
        .await
        .expect("run");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!((r.requests, r.ok, r.failed, r.abandoned), (1, 0, 1, 2));
    assert_eq!(r.errors.get("drain timeout"), Some(&1));
    assert_eq!(r.errors.get("abandoned"), Some(&2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_api_is_measured_too() {
    let (addr, fake) = start(Fake::new(10, 5)).await;
    let mut s = spec(
        WorkloadKind::from_name("agent").expect("known"),
        Load::Closed { concurrency: 2 },
        1,
    );
    s.api = Api::Completions;
    s.max_requests = Some(4);
    let r = run(&format!("http://{addr}"), &[addr.to_string()], &s, 1.0)
        .await
        .expect("run");
    assert_eq!(r.ok, 4, "{:?}", r.errors);
    within(r.ttft_ms.p50, 9.0, 150.0, "TTFT p50");
    let seen = fake.seen.lock().expect("fake lock").clone();
    assert!(seen
        .iter()
        .all(|(_, b)| b["prompt"].is_string() && b.get("messages").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_a_report_of_failures() {
    let mut s = spec(small_tenants(), Load::Closed { concurrency: 2 }, 1);
    s.max_requests = Some(3);
    let r: RunReport = run("http://127.0.0.1:1", &["127.0.0.1:1".to_owned()], &s, 1.0)
        .await
        .expect("a run, not an error");
    assert_eq!((r.requests, r.ok), (3, 0));
    assert_eq!(r.errors.get("connect"), Some(&3));
    assert_eq!(r.success_rate, Some(0.0));
    assert_eq!(r.ttft_ms.p50, None);
    assert!(render_table(&[("dead".to_owned(), r)]).contains("connect ×3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvroute_predictions_are_compared_with_the_wall_clock_ttft() {
    // First token after 40 ms wall at time scale 0.5 (80 ms simulated); the "plugin" predicts 40 ms
    // of wall time: the error is measured against wall clock, so it is small, not 50%.
    let (addr, _) = start(Fake {
        predicted_ms: Some(40),
        ..Fake::new(40, 1)
    })
    .await;
    let mut s = spec(small_tenants(), Load::Closed { concurrency: 2 }, 1);
    s.max_requests = Some(6);
    let r = run(&format!("http://{addr}"), &[addr.to_string()], &s, 0.5)
        .await
        .expect("run");
    assert_eq!(r.ok, 6, "{:?}", r.errors);
    assert_eq!(r.prediction.requests, 6);
    within(r.prediction.median_abs_rel_error, 0.0, 0.3, "median error");
    within(r.ttft_ms.p50, 79.0, 200.0, "TTFT p50 (simulated)");

    // Without the field: no predictions, and no failure.
    let (addr, _) = start(Fake::new(5, 1)).await;
    let r = run(&format!("http://{addr}"), &[addr.to_string()], &s, 1.0)
        .await
        .expect("run");
    assert_eq!(r.ok, 6);
    assert_eq!(r.prediction.requests, 0);
    assert_eq!(r.prediction.median_abs_rel_error, None);
}
