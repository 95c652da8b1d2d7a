//! KV-cache-aware routing through real Envoy with two or more worker VMs: prefix affinity shared
//! across workers, spreading, spill-over under load, dead pods, leader hand-over, odd requests,
//! tiktoken mode, and two gateway replicas agreeing on new prefixes.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, LdsEnvoy, Sim};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Keeps `pod` busy with `n` long generations sent to it directly (not through Envoy), so its
/// metrics show load the gateway did not cause, for longer than any test runs (20,000 tokens: ~16 s
/// of wall time at the tests' time scale). Ended by aborting the returned tasks (or with the pod).
fn occupy(pod: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let url = format!("http://{pod}/v1/completions");
            tokio::spawn(async move {
                let body = json!({"model": MODEL, "prompt": format!("background job {i}"), "max_tokens": 20000, "stream": true});
                let _ = post(&fresh_client(), &url, &body, &[]).await;
            })
        })
        .collect()
}

async fn shared_prefix_follows_its_pod_on_every_worker(extra: serde_json::Value) {
    let (sim, envoy) = stack(4, &[], extra).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt("shared-agent-context-", 1500);
    let first = post(
        &client,
        &url,
        &chat(&system, "first question", 2, false),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.debug.is_some(),
        "the first request was routed by kvroute"
    );
    let holder = first.pod.clone().unwrap();
    // Make the holder the busiest pod: without prefix knowledge a worker would now pick another.
    let busy = occupy(&holder, 3);
    wait_for(
        Duration::from_secs(10),
        "holder's load to show in metrics",
        || async { sim_stats(&holder).await["running"].as_u64().unwrap_or(0) >= 3 },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a poll or two
    let mut vms = HashSet::new();
    for i in 0..24 {
        let r = post(
            &client,
            &url,
            &chat(&system, &format!("follow-up {i}"), 2, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.pod.as_deref(),
            Some(holder.as_str()),
            "request {i}: {:?}",
            r.debug
        );
        assert_eq!(
            r.debug_field("reason").as_deref(),
            Some("prefix"),
            "{:?}",
            r.debug
        );
        vms.insert(r.debug_field("vm").unwrap());
        let stats = sim_stats(&holder).await;
        assert!(stats["cached_tokens_total"].as_u64().unwrap() > 0);
    }
    assert!(
        vms.len() >= 2,
        "requests were decided by more than one worker VM: {vms:?}"
    );
    // The control: the same load without the prefix goes elsewhere.
    assert!(sim_stats(&holder).await["running"].as_u64().unwrap_or(0) >= 3);
    let other = post(
        &client,
        &url,
        &chat(&system_prompt("unrelated-", 1500), "q", 2, false),
        &[],
    )
    .await;
    assert_ne!(
        other.pod.as_deref(),
        Some(holder.as_str()),
        "{:?}",
        other.debug
    );
    busy.iter().for_each(|task| task.abort());
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_lands_on_one_pod_whichever_worker_takes_it() {
    shared_prefix_follows_its_pod_on_every_worker(json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiktoken_mode_routes_like_chars_mode() {
    shared_prefix_follows_its_pod_on_every_worker(
        json!({"block": {"mode": "tiktoken", "encoding": "cl100k_base"}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_prefixes_spread_over_the_pool() {
    let (sim, envoy) = stack(4, &[], json!({})).await;
    let client = fresh_client();
    let mut per_pod: HashMap<String, usize> = HashMap::new();
    for i in 0..60 {
        let r = post(
            &client,
            &envoy.url("/v1/chat/completions"),
            &chat(&system_prompt(&format!("tenant-{i}-"), 200), "q", 1, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        *per_pod.entry(r.pod.unwrap()).or_default() += 1;
    }
    println!(
        "distinct prefixes per pod: {:?}",
        per_pod.values().collect::<Vec<_>>()
    );
    assert_eq!(per_pod.len(), 4, "{per_pod:?}");
    for (pod, n) in &per_pod {
        assert!((5..=30).contains(n), "{pod} got {n} of 60: {per_pod:?}");
    }
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_prefix_spills_over_instead_of_queueing_behind_one_pod() {
    // The pods run four sequences at once; vLLM does not export that, so kvroute is told.
    let (sim, envoy) = stack(
        4,
        &["--max-num-seqs", "4"],
        json!({"overload_guard": {"max_running": 4}}),
    )
    .await;
    let system = system_prompt("hot-", 1500);
    let url = envoy.url("/v1/chat/completions");
    let warm = post(&fresh_client(), &url, &chat(&system, "warm", 1, false), &[]).await;
    let holder = warm.pod.unwrap();
    let replies = futures::future::join_all((0..32).map(|i| {
        let (url, body) = (url.clone(), chat(&system, &format!("burst {i}"), 300, true));
        async move { post(&fresh_client(), &url, &body, &[]).await }
    }))
    .await;
    let mut per_pod: HashMap<String, usize> = HashMap::new();
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
        *per_pod.entry(r.pod.clone().unwrap()).or_default() += 1;
    }
    let on_holder = per_pod.get(&holder).copied().unwrap_or(0);
    // On failure the decisions say why (reason, queue, predictions per pod).
    let decisions: Vec<&str> = replies.iter().filter_map(|r| r.debug.as_deref()).collect();
    let why = format!("holder {holder}: {per_pod:?}\n{}", decisions.join("\n"));
    assert!(per_pod.len() >= 3, "the burst spread: {why}");
    assert!(on_holder >= 4, "the holder kept its share: {why}");
    assert!(on_holder <= 16, "the holder was not buried: {why}");
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pod_stops_receiving_and_no_client_request_fails() {
    let sims: Vec<Sim> = (0..3)
        .map(|_| Sim::start(1, &["--time-scale", TIME_SCALE]).unwrap())
        .collect();
    let pods: Vec<String> = sims.iter().map(|s| s.pods[0].clone()).collect();
    let envoy = Envoy::start(&EnvoyOptions::new(
        &pods,
        Lb::OverrideHost,
        Some(plugin_config(&pods, json!({}))),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 3).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let system = system_prompt("doomed-", 800);
    let first = post(&client, &url, &chat(&system, "q", 1, false), &[]).await;
    let victim = first.pod.unwrap();
    let mut sims = sims;
    let idx = pods.iter().position(|p| *p == victim).unwrap();
    sims[idx].proc.kill();
    // At once, before any poll notices: Envoy's retry walks to the fallback in the header.
    for i in 0..20 {
        let r = post(
            &client,
            &url,
            &chat(&system, &format!("q{i}"), 1, false),
            &[],
        )
        .await;
        assert_eq!(
            r.status, 200,
            "request {i} right after the pod died: {}",
            r.body
        );
        assert_ne!(r.pod.as_deref(), Some(victim.as_str()));
    }
    wait_healthy(&envoy, 2).await;
    for i in 0..20 {
        let r = post(
            &client,
            &url,
            &chat(&system, &format!("later {i}"), 1, false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_ne!(
            r.debug_field("pod").as_deref(),
            Some(victim.as_str()),
            "a stale pod is never chosen"
        );
    }
    assert!(
        envoy.stat("cluster.pool.upstream_rq_retry").await >= 1,
        "the fallback was reached by a retry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_is_replaced() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let lds = LdsEnvoy::start(&sim.pods, &plugin_config(&sim.pods, json!({})))
        .await
        .unwrap();
    wait_healthy(&lds.envoy, 2).await;
    let first_leaders = leaders_in(&lds.envoy.log());
    assert_eq!(first_leaders.len(), 1, "one leader: {first_leaders:?}");
    // A configuration push replaces every VM's plugin instance; the old leader stops when its
    // listener drains and another VM takes over its lease.
    lds.update(&plugin_config(&sim.pods, json!({"poll_interval_ms": 60})))
        .unwrap();
    wait_for(Duration::from_secs(20), "a new leader", || async {
        leaders_in(&lds.envoy.log())
            .iter()
            .any(|l| !first_leaders.contains(l))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", lds.envoy.log()));
    // The new leader polls: pods stay healthy well past the staleness bound, and routing works.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_healthy(&lds.envoy, 2).await;
    let r = post(
        &fresh_client(),
        &lds.envoy.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": system_prompt("x", 100), "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.debug.is_some(), "routed by kvroute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_singleton_leads() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let config = plugin_config(&sim.pods, json!({}));
    let mut singleton: serde_json::Value = serde_json::from_str(&config).unwrap();
    singleton["singleton"] = json!(true);
    let mut opts = EnvoyOptions::new(&sim.pods, Lb::OverrideHost, Some(config));
    opts.singleton_config = Some(singleton.to_string());
    let envoy = Envoy::start(&opts).await.unwrap();
    wait_healthy(&envoy, 2).await;
    // A worker may lead for the few milliseconds before the singleton's first tick; then the
    // singleton takes the lease and keeps it.
    let singleton_leads = |log: &str| {
        log.lines()
            .rfind(|l| l.contains(" is the leader ("))
            .is_some_and(|l| l.contains("bootstrap singleton"))
    };
    wait_for(Duration::from_secs(10), "the singleton to lead", || async {
        singleton_leads(&envoy.log())
    })
    .await
    .unwrap();
    let settled = leaders_in(&envoy.log()).len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = envoy.log();
    assert!(singleton_leads(&log), "{log}");
    assert_eq!(
        leaders_in(&log).len(),
        settled,
        "nobody took the lease from the singleton"
    );
    let r = post(
        &fresh_client(),
        &envoy.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": system_prompt("y", 100), "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.pod, r.debug_field("pod"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_get_clear_answers() {
    let (sim, envoy) = stack(2, &[], json!({"max_body_bytes": 4096})).await;
    let client = fresh_client();
    let chat_url = envoy.url("/v1/chat/completions");
    // Malformed JSON and binary bodies are kvroute's 400 (a body it cannot read could carry a
    // `kv_transfer_params` it could not remove); JSON without a prompt is the model server's.
    let r = post_raw(
        &client,
        &chat_url,
        b"{\"model\": \"sim-model\", \"messages\": [".to_vec(),
        &[],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "unparseable_body", "{}", r.body);
    let r = post_raw(&client, &chat_url, vec![0xff, 0x00, 0x13, 0x37, 0xfe], &[]).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "unparseable_body", "{}", r.body);
    let r = post_raw(
        &client,
        &chat_url,
        b"{\"model\": \"sim-model\"}".to_vec(),
        &[],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.pod.is_some(), "the pod's own answer: {}", r.body);
    // Larger than max_body_bytes: refused with kvroute's JSON 413 (a body is read whole to be
    // routed and to remove what a client must not set), announced or chunked alike.
    let big = chat(&system_prompt("big", 3000), "q", 1, false);
    let r = post(&client, &chat_url, &big, &[]).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "body_too_large", "{}", r.body);
    let chunks = futures::stream::iter(
        big.to_string()
            .into_bytes()
            .chunks(1000)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let r = client
        .post(&chat_url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        envoy.stat("wasmcustom.kvroute.body_too_large_total").await,
        2
    );
    // An unknown model gets kvroute's own 404, in OpenAI's error shape.
    let r = post(
        &client,
        &chat_url,
        &json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
        &[],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "NotFoundError", "{}", r.body);
    assert!(r.body.contains("no-such-model"));
    // Other paths and methods pass through.
    assert_eq!(
        client
            .get(envoy.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The model list is kvroute's own answer (see envoy_protocol), not one pod's.
    let models = client.get(envoy.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);
    assert!(models.headers().get("x-kvsim-pod").is_none());
    assert!(envoy.stat("wasmcustom.kvroute.passthrough_total").await >= 2);
    assert_eq!(
        envoy
            .stat("wasmcustom.kvroute.unparseable_body_total")
            .await,
        2
    );
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_routable_pod_gets_a_clear_503() {
    let nobody = format!("127.0.0.1:{}", harness::free_port().unwrap());
    let pods = vec![nobody];
    let envoy = Envoy::start(&EnvoyOptions::new(
        &pods,
        Lb::OverrideHost,
        Some(plugin_config(&pods, json!({}))),
    ))
    .await
    .unwrap();
    wait_for(Duration::from_secs(10), "poll failures", || async {
        envoy.stat("wasmcustom.kvroute.poll_failures_total").await >= 3
    })
    .await
    .unwrap();
    // Every worker has read the leader's table (it ticks every 25 ms).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = post(
        &fresh_client(),
        &envoy.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "hi"}),
        &[],
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no pod is healthy"),
        "{}",
        r.body
    );
    assert!(envoy.stat("wasmcustom.kvroute.no_endpoint_total").await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_replicas_send_a_new_prefix_to_the_same_pod() {
    let sim = Sim::start(4, &["--time-scale", TIME_SCALE]).unwrap();
    let config = plugin_config(&sim.pods, json!({}));
    let a = Envoy::start(&EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(config.clone()),
    ))
    .await
    .unwrap();
    let b = Envoy::start(&EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await
    .unwrap();
    wait_healthy(&a, 4).await;
    wait_healthy(&b, 4).await;
    let client = fresh_client();
    let n = 300;
    let mut agree = 0;
    for i in 0..n {
        let body = json!({"model": MODEL, "prompt": format!("{} distinct prefix number {i}", system_prompt(&format!("r{i}-"), 40)), "max_tokens": 1});
        let ra = post(&client, &a.url("/v1/completions"), &body, &[]).await;
        let rb = post(&client, &b.url("/v1/completions"), &body, &[]).await;
        assert_eq!((ra.status, rb.status), (200, 200));
        if ra.pod == rb.pod {
            agree += 1;
        }
    }
    let share = agree as f64 / n as f64;
    println!("replica agreement on {n} new prefixes: {agree}/{n} = {share:.3}");
    assert!(share >= 0.95, "replicas agreed on {agree} of {n}");
}

/// Replicas that exchange placements (`peers`): a prefix routed through one gateway is found by
/// the other, which never saw it, on the pod the first chose, although that pod is now the
/// busiest. The same list is configured on both, each its own listener included (recognised and
/// skipped); the placements path answers only with the shared token, and is nothing special
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_replicas_exchanging_placements_find_each_others_prefixes() {
    let sim = Sim::start(4, &["--time-scale", TIME_SCALE]).unwrap();
    let ports = [harness::free_port().unwrap(), harness::free_port().unwrap()];
    let endpoints: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let config = plugin_config(
        &sim.pods,
        json!({"peers": {"endpoints": endpoints, "interval_ms": 50, "token": "s3cret"}}),
    );
    let mut gateways = Vec::new();
    for port in ports {
        let mut opts = EnvoyOptions::new(&sim.pods, Lb::OverrideHost, Some(config.clone()));
        opts.listen_port = port;
        gateways.push(Envoy::start(&opts).await.unwrap());
    }
    let (a, b) = (&gateways[0], &gateways[1]);
    wait_healthy(a, 4).await;
    wait_healthy(b, 4).await;
    let client = fresh_client();

    // The path without the token is not kvroute's: it goes to a pod like any request (404 there).
    let path = "/kvroute/v1/placements?epoch=0&after=0";
    let anonymous = client.get(a.url(path)).send().await.unwrap();
    assert_ne!(anonymous.status(), 200);
    let asked = client
        .get(a.url(path))
        .header("x-kvroute-peer-token", "s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 200);
    assert_eq!(asked.headers()["content-type"], "application/octet-stream");

    let system = system_prompt("replica-placement-", 1500);
    let first = post(
        &client,
        &a.url("/v1/chat/completions"),
        &chat(&system, "first", 2, false),
        &[],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.pod.clone().unwrap();
    // The holder becomes the busiest pod: a gateway that does not know it holds the prefix avoids
    // it.
    let _busy = occupy(&holder, 3);
    wait_for(Duration::from_secs(10), "holder's load to show", || async {
        sim_stats(&holder).await["running"].as_u64().unwrap_or(0) >= 3
    })
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(10),
        "B to learn A's placement",
        || async {
            b.stat("wasmcustom.kvroute.replicas.blocks_learned_total")
                .await
                > 0
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the load polled by both
    let second = post(
        &client,
        &b.url("/v1/chat/completions"),
        &chat(&system, "second", 2, false),
        &[],
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(
        second.pod.as_deref(),
        Some(holder.as_str()),
        "{:?}",
        second.debug
    );
    // `m/n`: B matched most of the prompt on the holder (the system prompt A routed there).
    let field = second.debug_field("matched_blocks").unwrap();
    let (m, n) = field.split_once('/').unwrap();
    let (m, n): (u64, u64) = (m.parse().unwrap(), n.parse().unwrap());
    assert!(
        m * 10 >= n * 8,
        "matched {m} of {n} blocks: {:?}",
        second.debug
    );
    // Asks fail only while the other replica is starting (A's, before B listens): none since.
    let failures = "wasmcustom.kvroute.replicas.sync_failures_total";
    let before = (a.stat(failures).await, b.stat(failures).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((a.stat(failures).await, b.stat(failures).await), before);
    for (name, g) in [("A", a), ("B", b)] {
        assert!(
            g.log().contains("is this Envoy itself"),
            "{name} recognised itself"
        );
    }
}

/// An HTTP/2 request whose body ends in trailers (gRPC-style clients send them) is routed like
/// any other: the filter decides when the trailers arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_request_ending_in_trailers_is_routed() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let stream = tokio::net::TcpStream::connect(&envoy.listener)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let body = chat(&system_prompt("trailers-", 300), "q", 2, false).to_string();
    let mut trailers = hyper::HeaderMap::new();
    trailers.insert("x-client-checksum", "1234".parse().unwrap());
    let frames = futures::stream::iter(vec![
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(body))),
        Ok(Frame::trailers(trailers)),
    ]);
    let request = hyper::Request::post(format!("http://{}/v1/chat/completions", envoy.listener))
        .header("content-type", "application/json")
        .body(StreamBody::new(frames))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let debug = response
        .headers()
        .get("x-kvroute-debug")
        .map(|v| v.to_str().unwrap().to_string());
    let pod = response
        .headers()
        .get("x-kvsim-pod")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&text).contains("chat.completion"),
        "{text:?}"
    );
    let debug = debug.expect("routed by kvroute");
    assert!(debug.contains(&format!("pod={}", pod.unwrap())), "{debug}");
    assert_eq!(
        envoy.stat("wasmcustom.kvroute.requests_routed_total").await,
        1
    );
    drop(sim);
}
