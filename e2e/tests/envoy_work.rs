//! Work-aware scheduling through real Envoy: the prediction decides between waiting behind a
//! prefix holder's queue and recomputing the prefix elsewhere, a slower pod is learned and given
//! less, latency objectives steer, and the work board empties when the work is done.

mod common;

use common::*;
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// The predictions of the ranked pods in a debug header: `addr/ms,addr/ms,…`.
fn predictions(r: &Reply) -> HashMap<String, f64> {
    r.debug_field("predictions")
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| {
            let (addr, ms) = p.rsplit_once('/')?;
            Some((addr.to_string(), ms.parse().ok()?))
        })
        .collect()
}

/// A few unique prompts so that every pod has been timed (its cost fit has samples).
async fn warm_up(url: &str, n: usize) {
    for i in 0..n {
        let r = post(
            &fresh_client(),
            url,
            &chat(&system_prompt(&format!("warm{i}-"), 400), "go", 2, true),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_waits_for_its_holder_until_recomputing_it_elsewhere_costs_the_pool_less() {
    // A slower simulator clock than the other tests: the prefills below must still be running
    // when the next request is routed, so that their work is on the board.
    let sim = Sim::start(2, &["--time-scale", "0.25"]).unwrap();
    let options = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(&sim.pods, json!({}))),
    );
    let envoy = Envoy::start(&options).await.unwrap();
    wait_healthy(&envoy, 2).await;
    let url = envoy.url("/v1/chat/completions");
    warm_up(&url, 6).await;

    // The shared context (2,000 words), cached on one pod only.
    let context = system_prompt("agent-context-", 2000);
    let first = post(
        &fresh_client(),
        &url,
        &chat(&context, "start", 2, true),
        &[],
    )
    .await;
    let holder = first.pod.clone().unwrap();
    let other = sim.pods.iter().find(|p| **p != holder).unwrap().clone();

    // Calls that each bring 1,200 new words on top of the context, sent 40 ms apart: while their
    // prefills run, each one's work is on the board when the next is routed. Moving costs the
    // pool the context's recompute (2,000 words) and the wait it adds to the pool's queue, and the
    // affinity floor asks the move to win by the learned error band besides. With `q` calls queued
    // on the holder, each computing `c` (its 1,200 words) against the idle pod's `r × c` (the whole
    // prompt, r ≈ 2.7), the holder costs the pool about `2qc` (its wait plus what it adds to the
    // `q` behind it) less the floor's `e^(−0.63 band)`, and the idle pod `rc(1 + q/2)` (the pool's
    // mean queue behind it): a move pays once `q > r / (2e^(−0.63 band) − r/2)`, about 7 calls at
    // the band's starting width (0.22), 17 at 0.45, 21 at 0.48 and 30 at 0.52. 10 calls were
    // enough on a quiet machine but not on a loaded 2-core CI runner (its band wider: every call
    // waited); 20 failed once in a full local suite (the holder predicted 5× the idle pod at the
    // 20th call and still kept it: a band near 0.5 from widely missed warm-ups); 30 cover a band
    // of 0.52. Bounded by what it asserts: a move must come, and only after the holder's queue.
    let mut calls = Vec::new();
    for i in 0..30 {
        let body = chat(
            &context,
            &system_prompt(&format!("tool-result-{i}-"), 1200),
            2,
            true,
        );
        let url = url.clone();
        calls.push(tokio::spawn(async move {
            post(&fresh_client(), &url, &body, &[]).await
        }));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let mut replies = Vec::new();
    for c in calls {
        replies.push(c.await.unwrap());
    }
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let pods: Vec<&str> = replies.iter().map(|r| r.pod.as_deref().unwrap()).collect();
    // The first call waits for nobody: the holder, whose cache saves the context's prefill.
    assert_eq!(pods[0], holder, "{:?}", replies[0].debug);
    assert_eq!(replies[0].debug_field("reason").as_deref(), Some("prefix"));
    // Later ones find the holder's queue growing; once waiting behind it costs the pool more than
    // computing the whole context on the idle pod, the context is replicated there.
    let moved = replies
        .iter()
        .position(|r| r.pod.as_deref() == Some(&other));
    let Some(moved) = moved else {
        panic!(
            "every call waited behind the holder: {:?}",
            replies.iter().map(|r| &r.debug).collect::<Vec<_>>()
        );
    };
    let at_move = &replies[moved];
    let p = predictions(at_move);
    // Within the tie band (5%) the two are equal and rendezvous decides.
    assert!(
        p[&other] <= p[&holder] * 1.05,
        "the move was predicted no slower: {:?}",
        at_move.debug
    );
    let ahead: f64 = at_move
        .debug_field("tokens_ahead")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        ahead < 1.0,
        "the idle pod had nothing queued: {:?}",
        at_move.debug
    );

    // All done: the board is empty again, for every pod.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = post(
        &fresh_client(),
        &url,
        &chat(&context, "one more", 2, true),
        &[],
    )
    .await;
    assert_eq!(after.debug_field("tokens_ahead").as_deref(), Some("0"));
    assert_eq!(after.debug_field("decoding").as_deref(), Some("0"));
    // Envoy computes histogram quantiles at its stats flush (every 5 s).
    let admin = envoy.admin.clone();
    let exported = wait_for(Duration::from_secs(12), "histograms", || {
        let admin = admin.clone();
        async move {
            let text = reqwest::get(format!("http://{admin}/stats?filter=kvroute.*ttft"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            // Histogram lines, their labels taken out of the names (`NAME: P0(…) …`).
            let names: Vec<String> = text
                .lines()
                .filter(|l| l.contains(": P0"))
                .filter_map(|l| l.split(": ").next())
                .map(harness::strip_labels)
                .collect();
            [
                "ttft_milliseconds",
                "ttft_predicted_milliseconds",
                "ttft_prediction_error_percent",
            ]
            .iter()
            .all(|h| names.contains(&format!("wasmcustom.kvroute.{h}")))
        }
    })
    .await;
    assert!(
        exported.is_ok(),
        "the TTFT and prediction-error histograms are exported"
    );
    drop(sim);
}

/// Two simulator processes in one pool: `fast` with the defaults, `slow` at half their speed.
async fn mixed_pool(extra: serde_json::Value) -> (Sim, Sim, Envoy) {
    let fast = Sim::start(1, &["--time-scale", TIME_SCALE]).unwrap();
    let slow = Sim::start(
        1,
        &[
            "--time-scale",
            TIME_SCALE,
            "--prefill-overhead-ms",
            "80",
            "--prefill-us-per-token",
            "800",
            "--decode-base-ms",
            "30",
            "--decode-us-per-seq",
            "1000",
        ],
    )
    .unwrap();
    let pods: Vec<String> = fast.pods.iter().chain(&slow.pods).cloned().collect();
    let options = EnvoyOptions::new(&pods, Lb::OverrideHost, Some(plugin_config(&pods, extra)));
    let envoy = Envoy::start(&options).await.unwrap();
    wait_healthy(&envoy, 2).await;
    (fast, slow, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slower_pod_is_learned_and_given_less_work() {
    let (fast, slow, envoy) = mixed_pool(json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    warm_up(&url, 8).await;
    // Four clients, each sending unique 800-word prompts back to back.
    let per_client = 20;
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut pods = Vec::new();
                for i in 0..per_client {
                    let body = chat(
                        &system_prompt(&format!("c{c}-r{i}-"), 800),
                        "answer",
                        4,
                        true,
                    );
                    let r = post(&fresh_client(), &url, &body, &[]).await;
                    assert_eq!(r.status, 200, "{}", r.body);
                    pods.push(r.pod.unwrap());
                }
                pods
            })
        })
        .collect();
    let mut on_fast = 0;
    let mut total = 0;
    for c in clients {
        for pod in c.await.unwrap() {
            total += 1;
            if pod == fast.pods[0] {
                on_fast += 1;
            }
        }
    }
    let share = f64::from(on_fast) / f64::from(total);
    println!("fast pod's share of {total} requests: {share:.2}");
    assert!(
        share >= 0.6,
        "the pod twice as fast took {on_fast} of {total}"
    );
    // The learned costs are exported per pod, and the slow pod's is the larger.
    let name = "wasmcustom.kvroute.pod.prefill_tokens_per_second";
    let fast_speed = envoy.stat_where(name, "pod", &fast.pods[0]).await;
    let slow_speed = envoy.stat_where(name, "pod", &slow.pods[0]).await;
    assert!(
        fast_speed > slow_speed && slow_speed > 0,
        "fast {fast_speed} tokens/s, slow {slow_speed} tokens/s"
    );
    drop((fast, slow));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_objectives_steer_and_unattainable_ones_are_answered_clearly() {
    let (fast, slow, envoy) = mixed_pool(json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    // Streams long enough to time the pods' inter-token latency, until both pods have streamed
    // (an untimed pod is given the benefit of the doubt).
    let mut streamed = std::collections::HashSet::new();
    for i in 0..40 {
        let r = post(
            &fresh_client(),
            &url,
            &chat(&system_prompt(&format!("itl{i}-"), 50), "go", 40, true),
            &[("x-session-id", &format!("warm-{i}"))],
        )
        .await;
        assert_eq!(r.status, 200);
        streamed.insert(r.pod.unwrap());
        if streamed.len() == 2 && i >= 7 {
            break;
        }
    }
    assert_eq!(streamed.len(), 2, "both pods streamed");
    // Each worker VM publishes what it timed once a second; let every VM hear from the others.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Fast: (15 ms + 0.5 ms) × 0.05 ≈ 0.8 ms per token; slow: twice that. An objective between
    // them leaves only the fast pod.
    let mut on_fast = 0;
    for i in 0..12 {
        let r = post(
            &fresh_client(),
            &url,
            &chat(&system_prompt(&format!("slo{i}-"), 50), "go", 8, true),
            &[("x-slo-tpot-ms", "1.2")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        if r.pod.as_deref() == Some(fast.pods[0].as_str()) {
            on_fast += 1;
        } else {
            panic!("routed to the slow pod: {:?}", r.debug);
        }
    }
    assert_eq!(on_fast, 12);
    // Nobody can give a first token in a microsecond: routed anyway and counted ...
    let r = post(
        &fresh_client(),
        &url,
        &chat("hi", "go", 2, false),
        &[("x-slo-ttft-ms", "0.001")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.debug_field("meets_slo").as_deref(), Some("false"));
    assert!(
        envoy
            .stat("wasmcustom.kvroute.slo.predicted_miss_total")
            .await
            >= 1
    );
    // ... or, with a negative priority, refused at once with a reason.
    let shed = post(
        &fresh_client(),
        &url,
        &chat("hi", "go", 2, false),
        &[("x-slo-ttft-ms", "0.001"), ("x-kvroute-priority", "-1")],
    )
    .await;
    assert_eq!(shed.status, 429, "{}", shed.body);
    assert!(shed.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("latency objectives"));
    let bad = post(
        &fresh_client(),
        &url,
        &chat("hi", "go", 2, false),
        &[("x-slo-ttft-ms", "soon")],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("x-slo-ttft-ms"), "{}", bad.body);
    assert_eq!(envoy.stat("wasmcustom.kvroute.bad_slo_total").await, 1);
    drop((fast, slow));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_evicted_a_prefix_stops_attracting_what_it_lost() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    let older = system_prompt("older-tenant-", 800);
    let newer = system_prompt("newer-tenant-", 800);
    // Both tenants' prompts on one pod (a session keeps them together), the older one first.
    let mut holder = None;
    for system in [&older, &newer] {
        let r = post(
            &fresh_client(),
            &url,
            &chat(system, "q", 2, false),
            &[("x-session-id", "both-tenants")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(holder.is_none() || holder == r.pod, "one pod");
        holder = r.pod;
    }
    let holder = holder.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // every VM has the pages

    // The pod drops its whole prefix cache (vLLM's reset_prefix_cache; here the simulator's).
    let reset = reqwest::Client::new()
        .post(format!("http://{holder}/sim/reset"))
        .send()
        .await
        .unwrap();
    assert!(reset.status().is_success());
    // The next request for the newer tenant still goes there (the index cannot know yet), and
    // its response reports nothing cached ...
    let miss = post(&fresh_client(), &url, &chat(&newer, "after", 2, false), &[]).await;
    assert_eq!(
        miss.pod.as_deref(),
        Some(holder.as_str()),
        "{:?}",
        miss.debug
    );
    assert_eq!(
        miss.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    harness::wait_for(Duration::from_secs(5), "the eviction counted", || async {
        envoy
            .stat("wasmcustom.kvroute.cache.evictions_detected_total")
            .await
            >= 1
    })
    .await
    .unwrap();
    assert!(
        envoy
            .stat("wasmcustom.kvroute.cache.predicted_tokens_total")
            .await
            > 0
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // the leader's hint reaches every VM
                                                          // ... so the older tenant, which went out of that cache before the newer one, is no longer
                                                          // believed to be there, whichever worker decides.
    let first = post(&fresh_client(), &url, &chat(&older, "later", 2, false), &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.debug_field("reason").as_deref(),
        Some("load"),
        "no pod is believed to hold it any more: {:?}",
        first.debug
    );
    assert_eq!(first.debug_field("longest").as_deref(), Some(""));
    // Whoever took it computed it: the next ones are hits there, on every worker.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..4 {
        let r = post(
            &fresh_client(),
            &url,
            &chat(&older, &format!("later {i}"), 2, false),
            &[],
        )
        .await;
        assert_eq!(r.pod, first.pod, "{:?}", r.debug);
        assert_eq!(r.debug_field("reason").as_deref(), Some("prefix"));
    }
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_pods_prefixes_are_forgotten_at_its_next_poll() {
    let (sim, envoy) = stack(2, &[], json!({})).await;
    let url = envoy.url("/v1/chat/completions");
    let tenant = system_prompt("restarted-tenant-", 800);
    let first = post(&fresh_client(), &url, &chat(&tenant, "q", 2, false), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.pod.clone().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // every VM has the pages
    let hit = post(
        &fresh_client(),
        &url,
        &chat(&tenant, "again", 2, false),
        &[],
    )
    .await;
    assert_eq!(hit.pod.as_deref(), Some(holder.as_str()), "{:?}", hit.debug);
    assert_eq!(hit.debug_field("reason").as_deref(), Some("prefix"));

    // The holder restarts between two polls: nothing failed, its process start time moved.
    let restart = reqwest::Client::new()
        .post(format!("http://{holder}/sim/restart"))
        .send()
        .await
        .unwrap();
    assert!(restart.status().is_success());
    harness::wait_for(Duration::from_secs(5), "the restart counted", || async {
        envoy
            .stat_where("wasmcustom.kvroute.pod.restarts_total", "pod", &holder)
            .await
            == 1
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // every VM has read the table
                                                          // Before any response reported the loss, no pod is believed to hold the prompt any more.
    let after = post(
        &fresh_client(),
        &url,
        &chat(&tenant, "after", 2, false),
        &[],
    )
    .await;
    assert_eq!(after.status, 200, "{}", after.body);
    assert_eq!(
        after.debug_field("longest").as_deref(),
        Some(""),
        "{:?}",
        after.debug
    );
    assert_eq!(after.debug_field("reason").as_deref(), Some("load"));
    assert_eq!(
        after.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0,
        "it was not held anywhere"
    );
    // Not a hit, but its old home: the prompt is recomputed where it lived, not moved.
    assert_eq!(
        after.pod.as_deref(),
        Some(holder.as_str()),
        "{:?}",
        after.debug
    );
    let former: usize = after
        .debug_field("former_blocks")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(former > 0, "{:?}", after.debug);
    // The other pod never restarted.
    let other = sim.pods.iter().find(|p| **p != holder).unwrap();
    assert_eq!(
        envoy
            .stat_where("wasmcustom.kvroute.pod.restarts_total", "pod", other)
            .await,
        0
    );
}
