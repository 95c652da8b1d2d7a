//! One request through the core on the fake host, from headers to the last response byte.

use super::*;
use crate::vm::tests::{config, Cluster, PODS};
use serde_json::json;

fn headers(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name: &str| {
        owned
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

const CHAT: [(&str, &str); 2] = [(":method", "POST"), (":path", "/v1/chat/completions")];

fn chat_body(model: &str, system: &str) -> Vec<u8> {
    json!({"model": model, "stream": true,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    .to_string()
    .into_bytes()
}

/// Headers then body through one flow on VM `i`.
fn send(
    c: &mut Cluster,
    i: usize,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (RequestFlow, BodyOutcome) {
    let (vm, host) = &mut c.vms[i];
    let mut flow = RequestFlow::new();
    let all: Vec<(&str, &str)> = CHAT.iter().chain(extra).copied().collect();
    let h = headers(&all);
    assert_eq!(
        flow.on_request_headers(vm, host, &h, false),
        HeadersOutcome::WaitForBody
    );
    let outcome = flow.on_request_body(vm, host, Some(body));
    (flow, outcome)
}

#[test]
fn before_the_first_load_table_requests_pass_through() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", "sys"));
    assert_eq!(outcome, BodyOutcome::Continue);
    assert_eq!(c.vms[0].1.counter(Counter::Passthrough), 1);
    c.ready();
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", "sys"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
}

#[test]
fn a_routed_request_counts_as_work_until_its_first_byte_then_teaches_the_pod() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let system = "a long system prompt ".repeat(200);
    let (mut flow, outcome) = send(&mut c, 0, &[], &chat_body("m", &system));
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    let pod = route.destinations.split(',').next().unwrap().to_string();
    assert!(PODS.contains(&pod.as_str()));
    assert!(route.prefiller.is_none() && route.prefill_call.is_none());
    // The other VM sees the queued prefill on the board.
    {
        let (vm, host) = &mut c.vms[1];
        let now = host.now_ms();
        vm.read_inflight_board(host, now);
        let w = vm.router.work(&pod);
        assert_eq!((w.inflight, w.prefill_requests), (1, 1));
        assert!(w.prefill_tokens > 500, "{w:?}");
    }
    let (vm, host) = &mut c.vms[0];
    host.advance_ms(120);
    assert_eq!(flow.on_response_headers(vm, host, Some("200"), false), None);
    flow.on_response_body(vm, host, 40, None, false);
    assert_eq!(
        host.histograms[Histogram::TtftMs.name()],
        vec![120],
        "routing to first byte"
    );
    assert!(vm.router.fit_samples(&pod) > 0.0);
    let w = vm.router.work(&pod);
    assert_eq!((w.inflight, w.prefill_requests), (1, 0), "prefill done");
    flow.on_done(vm, host, None, None);
    assert_eq!(vm.router.work(&pod).inflight, 0);
}

#[test]
fn refusals_carry_stable_codes() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("no-such-model", "sys"));
    let BodyOutcome::Reply(reply) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(reply.status, 404);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "unknown_model");
    assert!(reply
        .headers
        .contains(&("x-kvroute-error", "unknown_model".to_string())));
    // A bad hint header is answered before the body is read.
    let (vm, host) = &mut c.vms[0];
    let mut flow = RequestFlow::new();
    let h = headers(&[
        (":method", "POST"),
        (":path", "/v1/completions"),
        ("x-kvroute-priority", "high"),
    ]);
    let HeadersOutcome::Reply(reply) = flow.on_request_headers(vm, host, &h, false) else {
        panic!()
    };
    assert_eq!(reply.status, 400);
    assert_eq!(host.counter(Counter::BadPriority), 1);
    // Not inference: through untouched.
    let h = headers(&[(":method", "GET"), (":path", "/v1/models")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &h, true),
        HeadersOutcome::Continue
    );
}

fn pd_cluster(mode: &str) -> Cluster {
    let cfg = Config::parse(
        format!(
            r#"{{"pools":[{{"name":"p","role":"prefill","endpoints":["{}"]}},
                         {{"name":"d","role":"decode","endpoints":["{}"]}}],
                "pd":{{"mode":"{mode}","prefill_timeout_ms":700}}}}"#,
            PODS[0], PODS[1]
        )
        .as_bytes(),
    )
    .unwrap();
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    c
}

use crate::config::Config;

#[test]
fn an_inline_prefill_that_times_out_falls_back_to_decode_only() {
    let mut c = pd_cluster("inline");
    let long = "context ".repeat(3000);
    let (mut flow, outcome) = send(&mut c, 0, &[], &chat_body("m", &long));
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        route.destinations.split(',').next(),
        Some(PODS[1]),
        "decode pod"
    );
    let call = route.prefill_call.expect("an inline prefill");
    assert_eq!(call.authority, PODS[0]);
    assert_eq!(call.timeout_ms, 700);
    let sent: serde_json::Value = serde_json::from_slice(call.body.as_deref().unwrap()).unwrap();
    assert_eq!(sent["max_tokens"], 1);
    assert_eq!(sent["kv_transfer_params"]["do_remote_decode"], true);
    let (vm, host) = &mut c.vms[0];
    assert_eq!(
        vm.router.work(PODS[0]).prefill_requests,
        1,
        "the prefill pod's work"
    );
    // The host answers 504: the call timed out.
    let outcome = flow.on_prefill_answer(vm, host, 504, b"");
    assert_eq!(outcome, PrefillOutcome::Resume(None), "decode without it");
    assert_eq!(host.counter(Counter::PdPrefillFailures), 1);
    assert_eq!(host.counter(Counter::PdDecodeOnly), 1);
    assert_eq!(vm.router.work(PODS[0]).prefill_requests, 0);
    // Its first byte teaches nothing about the split path.
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 10, None, false);
    assert_eq!(vm.router.fit_samples(PODS[0]), 0.0);
    flow.on_done(vm, host, None, None);
}

#[test]
fn an_inline_prefill_hands_its_kv_to_the_decode_pod_and_a_refusal_goes_back() {
    let mut c = pd_cluster("inline");
    let long = "context ".repeat(3000);
    let (mut flow, _) = send(&mut c, 0, &[], &chat_body("m", &long));
    let (vm, host) = &mut c.vms[0];
    let answer = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}"#;
    let PrefillOutcome::Resume(Some(body)) = flow.on_prefill_answer(vm, host, 200, answer) else {
        panic!()
    };
    let decoded: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        decoded["kv_transfer_params"]["remote_block_ids"],
        json!([1, 2])
    );
    assert_eq!(decoded["stream"], true, "the client's own request");
    assert_eq!(host.counter(Counter::PdDisaggregated), 1);
    flow.on_done(vm, host, None, None);
    let (mut flow, _) = send(&mut c, 0, &[], &chat_body("m", &"other ".repeat(3000)));
    let (vm, host) = &mut c.vms[0];
    let PrefillOutcome::Reply(reply) = flow.on_prefill_answer(vm, host, 400, b"{\"error\":1}")
    else {
        panic!()
    };
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (400, &b"{\"error\":1}"[..])
    );
}

#[test]
fn sidecar_mode_names_the_prefiller() {
    let mut c = pd_cluster("sidecar");
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", &"context ".repeat(3000)));
    let BodyOutcome::Route(route) = outcome else {
        panic!()
    };
    assert_eq!(route.prefiller.as_deref(), Some(PODS[0]));
    assert!(route.prefill_call.is_none());
}

/// A poll's answer: status (0: none), body, and how long after the poll it came.
type PollAnswer = (u32, Vec<u8>, u64);

/// The leader (VM 0) ticks and answers its polls with `answer(pod)`.
fn lead_once(c: &mut Cluster, answer: &dyn Fn(&str) -> PollAnswer) {
    let (vm, host) = &mut c.vms[0];
    let now = host.now_ms();
    vm.tick(host, now);
    for (token, call) in host.take_calls() {
        if call.path == "/metrics" {
            let (status, body, after_ms) = answer(&call.authority);
            let at = now + after_ms;
            vm.on_call_response(host, token, status, &body, at);
        }
    }
    // The answers are published on the next tick.
    vm.tick(host, now);
}

/// A prompt whose first block is its own (short prompts share the chain seed's rendezvous key).
fn distinct(tag: &str) -> String {
    format!("{tag} {}", "and so on ".repeat(20))
}

fn primary_of(outcome: &BodyOutcome) -> String {
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    route.destinations.split(',').next().unwrap().to_string()
}

#[test]
fn late_polls_make_figures_stale_and_refused_polls_make_pods_down() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    // Pod 0's /metrics never answers within the timeout (a busy API process); pod 1 refuses.
    let timeout = cfg.poll_timeout_ms;
    for _ in 0..3 {
        c.advance_ms(cfg.stale_after_ms);
        lead_once(&mut c, &|pod| {
            if pod == PODS[0] {
                (504, b"upstream request timeout".to_vec(), timeout)
            } else {
                (503, b"upstream connect error".to_vec(), 2)
            }
        });
    }
    let host = &c.vms[0].1;
    assert_eq!(host.counter(Counter::PollsLate), 3);
    assert_eq!(host.counter(Counter::PollFailures), 3);
    assert_eq!(host.gauges[crate::metrics::Gauge::PodsHealthy.name()], 1);
    assert_eq!(host.gauges[crate::metrics::Gauge::PodsStale.name()], 1);
    for i in 0..5 {
        let (mut flow, outcome) = send(&mut c, 0, &[], &chat_body("m", &format!("sys {i}")));
        assert_eq!(primary_of(&outcome), PODS[0], "the late pod still serves");
        let (vm, host) = &mut c.vms[0];
        flow.on_response_headers(vm, host, Some("200"), false);
        flow.on_done(vm, host, Some(PODS[0].to_string()), None);
    }
    assert_eq!(
        c.vms[0].1.counter(Counter::RoutedStale),
        0,
        "all stale: the observer"
    );
    assert_eq!(c.vms[0].1.counter(Counter::ObserverSuspect), 5);
    // The refusing pod answers again: pod 0 is now the only stale one, routed on the board.
    c.advance_ms(cfg.poll_interval_ms);
    lead_once(&mut c, &|pod| {
        if pod == PODS[0] {
            (0, Vec::new(), timeout)
        } else {
            (200, crate::vm::tests::metrics("m", 0), 1)
        }
    });
    let sent: Vec<String> = (0..8)
        .map(|i| {
            primary_of(
                &send(
                    &mut c,
                    0,
                    &[],
                    &chat_body("m", &distinct(&format!("other {i}"))),
                )
                .1,
            )
        })
        .collect();
    assert!(sent.iter().any(|p| p == PODS[0]), "{sent:?}");
    assert!(c.vms[0].1.counter(Counter::RoutedStale) > 0);
}

#[test]
fn a_leader_that_misses_ticks_causes_no_refusal() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    assert_eq!(c.leaders(), vec![0]);
    // The leader's worker is stuck (or the whole proxy was throttled) for many stale periods;
    // the follower's table is as old.
    c.vms[1].1.advance_ms(5 * cfg.stale_after_ms);
    let (_, outcome) = send(&mut c, 1, &[], &chat_body("m", "sys"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    assert_eq!(c.vms[1].1.counter(Counter::ObserverSuspect), 1);
    assert_eq!(c.vms[1].1.counter(Counter::NoEndpoint), 0);
}

#[test]
fn a_pod_failing_its_requests_is_ejected_for_every_vm_and_comes_back() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let bad = PODS[0];
    let good = PODS[1];
    // VM 1 sends requests; those landing on the bad pod get a 500 or are answered by the good
    // pod after Envoy's retry walked past the bad one.
    let mut failures = 0;
    for i in 0..40 {
        let (mut flow, outcome) =
            send(&mut c, 1, &[], &chat_body("m", &distinct(&format!("p{i}"))));
        let pod = primary_of(&outcome);
        let (vm, host) = &mut c.vms[1];
        if pod == bad {
            failures += 1;
            if i % 2 == 0 {
                flow.on_response_headers(vm, host, Some("500"), true);
                flow.on_done(vm, host, Some(bad.to_string()), Some("via_upstream".into()));
            } else {
                flow.on_response_headers(vm, host, Some("200"), false);
                flow.on_done(
                    vm,
                    host,
                    Some(good.to_string()),
                    Some("via_upstream".into()),
                );
            }
        } else {
            flow.on_response_headers(vm, host, Some("200"), false);
            flow.on_done(
                vm,
                host,
                Some(good.to_string()),
                Some("via_upstream".into()),
            );
        }
    }
    assert!(failures >= 5, "{failures} of 40 landed on the bad pod");
    assert_eq!(c.vms[1].1.counter(Counter::RequestFailures), failures);
    c.tick();
    c.advance_ms(100);
    c.tick();
    assert_eq!(
        c.vms[0].1.counter(Counter::Ejections),
        1,
        "the leader ejected it"
    );
    for i in 0..20 {
        let (_, outcome) = send(&mut c, 1, &[], &chat_body("m", &distinct(&format!("q{i}"))));
        assert_eq!(
            primary_of(&outcome),
            good,
            "the follower avoids the ejected pod"
        );
    }
    let BodyOutcome::Route(route) = send(&mut c, 1, &[], &chat_body("m", &distinct("r"))).1 else {
        panic!()
    };
    assert!(!route.destinations.contains(bad), "not even as a fallback");
    // After the ejection it takes traffic again.
    c.advance_ms(cfg.health.base_ejection_ms + 100);
    c.tick();
    let back = (0..20)
        .filter(|i| {
            primary_of(&send(&mut c, 1, &[], &chat_body("m", &distinct(&format!("s{i}")))).1) == bad
        })
        .count();
    assert!(back > 0, "the pod came back");
}

#[test]
fn a_client_that_leaves_counts_against_no_pod() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    for i in 0..10 {
        let (mut flow, _) = send(&mut c, 0, &[], &chat_body("m", &distinct(&format!("p{i}"))));
        let (vm, host) = &mut c.vms[0];
        flow.on_done(vm, host, None, Some("downstream_remote_disconnect".into()));
    }
    c.tick();
    assert_eq!(c.vms[0].1.counter(Counter::RequestFailures), 0);
    assert_eq!(c.vms[0].1.counter(Counter::Ejections), 0);
}

fn with_kv_params(system: &str) -> Vec<u8> {
    json!({"model": "m", "stream": false,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
           "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "10.1.2.3",
                                  "remote_port": 22, "remote_block_ids": [1]}})
    .to_string()
    .into_bytes()
}

#[test]
fn a_client_kv_handle_never_reaches_a_pod() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (mut flow, outcome) = send(&mut c, 0, &[], &with_kv_params("sys"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    let body: serde_json::Value =
        serde_json::from_slice(&flow.take_rewritten_body().expect("rewritten")).unwrap();
    assert!(body.get("kv_transfer_params").is_none(), "{body}");
    assert_eq!(
        body["messages"][0]["content"], "sys",
        "the rest is the client's"
    );
    assert_eq!(c.vms[0].1.counter(Counter::ClientKvParamsRemoved), 1);
    // A body without one is left alone, byte for byte.
    let (mut flow, _) = send(&mut c, 0, &[], &chat_body("m", "sys"));
    assert_eq!(flow.take_rewritten_body(), None);
    // Before the first load table (passed through), still removed.
    let mut fresh = Cluster::new(&cfg, 1);
    let (mut flow, outcome) = send(&mut fresh, 0, &[], &with_kv_params("sys"));
    assert_eq!(outcome, BodyOutcome::Continue);
    assert!(flow.take_rewritten_body().is_some());
    // Trusted internal clients keep theirs.
    let trusted = config(r#","trust_client_kv_transfer_params":true"#);
    let mut c = Cluster::new(&trusted, 1);
    c.ready();
    let (mut flow, _) = send(&mut c, 0, &[], &with_kv_params("sys"));
    assert_eq!(flow.take_rewritten_body(), None);
}

#[test]
fn an_inline_prefill_sends_kvroutes_own_kv_handle_and_a_fallback_none() {
    let mut c = pd_cluster("inline");
    let long = "context ".repeat(3000);
    let (mut flow, outcome) = send(&mut c, 0, &[], &with_kv_params(&long));
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    let call = route.prefill_call.expect("an inline prefill");
    let sent: serde_json::Value = serde_json::from_slice(call.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        sent["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
        "kvroute's own request to the prefill pod"
    );
    let rewritten: serde_json::Value =
        serde_json::from_slice(&flow.take_rewritten_body().unwrap()).unwrap();
    assert!(rewritten.get("kv_transfer_params").is_none());
    // The prefill fails: the decode pod gets the rewritten body, without the client's handle.
    let (vm, host) = &mut c.vms[0];
    assert_eq!(
        flow.on_prefill_answer(vm, host, 503, b""),
        PrefillOutcome::Resume(None)
    );
}

#[test]
fn an_oversize_body_is_refused_with_413_whether_or_not_its_length_is_announced() {
    let cfg = config(r#","max_body_bytes":1000"#);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (vm, host) = &mut c.vms[0];
    let h = headers(&[
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", "5000"),
    ]);
    let HeadersOutcome::Reply(reply) = RequestFlow::new().on_request_headers(vm, host, &h, false)
    else {
        panic!()
    };
    assert_eq!(reply.status, 413);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "body_too_large");
    // Chunked: only the body's size tells.
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", &"x".repeat(2000)));
    let BodyOutcome::Reply(reply) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(reply.status, 413);
    assert_eq!(c.vms[0].1.counter(Counter::BodyTooLarge), 2);
}
