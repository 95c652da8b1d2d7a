//! One request through the core on the fake host, from headers to the last response byte.

use super::*;
use crate::router::{Blocks, Router};
use crate::vm::tests::{config, Cluster, PODS};
use serde_json::json;

pub(super) fn headers(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
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

pub(super) fn chat_body(model: &str, system: &str) -> Vec<u8> {
    json!({"model": model, "stream": true,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    .to_string()
    .into_bytes()
}

/// Headers (the chat path's, and `extra`) then body through one flow on VM `i`.
pub(super) fn send(
    c: &mut Cluster,
    i: usize,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (RequestFlow, BodyOutcome) {
    let all: Vec<(&str, &str)> = CHAT.iter().chain(extra).copied().collect();
    send_headers(c, i, &all, body)
}

/// `request_headers` then body through one flow on VM `i`.
fn send_headers(
    c: &mut Cluster,
    i: usize,
    request_headers: &[(&str, &str)],
    body: &[u8],
) -> (RequestFlow, BodyOutcome) {
    send_through(c, i, RequestFlow::new(), request_headers, body)
}

/// `request_headers` then body through `flow` on VM `i`.
pub(super) fn send_through(
    c: &mut Cluster,
    i: usize,
    mut flow: RequestFlow,
    request_headers: &[(&str, &str)],
    body: &[u8],
) -> (RequestFlow, BodyOutcome) {
    let (vm, host) = &mut c.vms[i];
    let h = headers(request_headers);
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
        let w = vm.router.work.of(&pod);
        assert_eq!((w.inflight, w.prefill_requests), (1, 1));
        assert!(w.prefill_tokens > 500, "{w:?}");
    }
    let (vm, host) = &mut c.vms[0];
    host.advance_ms(120);
    assert_eq!(flow.on_response_headers(vm, host, Some("200"), false), None);
    flow.on_response_body(vm, host, 40, None, false);
    assert_eq!(
        host.histogram_samples(Histogram::TtftMs),
        vec![120],
        "routing to first byte"
    );
    assert!(vm.router.costs.fit_samples(&pod) > 0.0);
    let w = vm.router.work.of(&pod);
    assert_eq!((w.inflight, w.prefill_requests), (1, 0), "prefill done");
    flow.on_done(vm, host, None, None);
    assert_eq!(vm.router.work.of(&pod).inflight, 0);
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
    let h = headers(&[(":method", "GET"), (":path", "/v1/embeddings")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &h, true),
        HeadersOutcome::Continue
    );
}

pub(super) fn pd_cluster(mode: &str) -> Cluster {
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
        vm.router.work.of(PODS[0]).prefill_requests,
        1,
        "the prefill pod's work"
    );
    // The host answers 504: the call timed out.
    let outcome = flow.on_prefill_answer(vm, host, 504, b"");
    assert_eq!(outcome, PrefillOutcome::Resume(None), "decode without it");
    assert_eq!(host.counter(Counter::PdPrefillFailures), 1);
    assert_eq!(host.counter(Counter::PdDecodeOnly), 1);
    assert_eq!(vm.router.work.of(PODS[0]).prefill_requests, 0);
    // Its first byte teaches nothing about the split path.
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 10, None, false);
    assert_eq!(vm.router.costs.fit_samples(PODS[0]), 0.0);
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

/// A pool behind an API key: the prefill call carries the client's own key and trace, and a
/// 401 from the prefill pod is counted as the pod refusing kvroute's call, never sent back to the
/// client (the decode pod judges the client's key).
#[test]
fn an_inline_prefill_carries_the_clients_key_and_trace_and_a_401_is_the_pods_refusal() {
    let mut c = pd_cluster("inline");
    let long = "context ".repeat(3000);
    let client = [
        ("authorization", "Bearer sk-client"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("x-unrelated", "stays home"),
    ];
    let (mut flow, outcome) = send(&mut c, 0, &client, &chat_body("m", &long));
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    let call = route.prefill_call.expect("an inline prefill");
    let sent = |name: &str| {
        call.headers
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(sent("authorization"), Some("Bearer sk-client"));
    assert_eq!(sent("traceparent"), Some(client[1].1));
    assert_eq!(sent("x-unrelated"), None, "only pd.forward_headers");
    let (vm, host) = &mut c.vms[0];
    let outcome = flow.on_prefill_answer(vm, host, 401, br#"{"error":"Unauthorized"}"#);
    assert_eq!(outcome, PrefillOutcome::Resume(None), "decode without it");
    assert_eq!(host.counter(Counter::PdPrefillUnauthorized), 1);
    assert_eq!(host.counter(Counter::PdPrefillRejected), 0);
    assert_eq!(host.counter(Counter::PdDecodeOnly), 1);
    flow.on_done(vm, host, None, None);
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

#[test]
fn a_sidecar_prefill_leaves_the_prefill_pod_at_the_decode_pods_headers_and_teaches_at_its_first_byte(
) {
    let mut c = pd_cluster("sidecar");
    let (mut flow, outcome) = send(&mut c, 0, &[], &chat_body("m", &"context ".repeat(3000)));
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(route.prefiller.as_deref(), Some(PODS[0]));
    let (vm, host) = &mut c.vms[0];
    assert_eq!(vm.router.work.of(PODS[0]).prefill_requests, 1, "queued");
    host.advance_ms(300);
    // The sidecar sends the decode request once the prefiller answered: its headers end the
    // prefill pod's part, while the KV pull and the first token are still to come.
    assert_eq!(flow.on_response_headers(vm, host, Some("200"), false), None);
    assert_eq!(
        vm.router.work.of(PODS[0]).prefill_requests,
        0,
        "prefill over"
    );
    assert_eq!(vm.router.costs.fit_samples(PODS[0]), 0.0, "not learned yet");
    host.advance_ms(80);
    flow.on_response_body(vm, host, 40, None, false);
    assert_eq!(
        host.histogram_samples(Histogram::TtftMs),
        vec![380],
        "the split path's whole time, routing to first byte"
    );
    assert!(vm.router.costs.fit_samples(PODS[0]) > 0.0);
    flow.on_done(vm, host, None, None);
    assert_eq!(vm.router.work.of(PODS[1]).inflight, 0);
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

/// The leader's calls to pods carry the configured key; a client's key never reaches them.
#[test]
fn the_leaders_polls_carry_the_pools_key() {
    let cfg = crate::vm::tests::config(r#","pod_api_key":"sk-pool""#);
    let mut c = Cluster::new(&cfg, 1);
    let (vm, host) = &mut c.vms[0];
    let now = host.now_ms();
    vm.tick(host, now);
    let calls = host.take_calls();
    let to_pods: Vec<&HttpCall> = calls
        .iter()
        .map(|(_, call)| call)
        .filter(|call| call.path == "/metrics" || call.path == "/v1/models")
        .collect();
    assert!(to_pods.iter().any(|c| c.path == "/metrics"), "{calls:?}");
    assert!(to_pods.iter().any(|c| c.path == "/v1/models"), "{calls:?}");
    for call in to_pods {
        assert!(
            call.headers
                .iter()
                .any(|(n, v)| n.as_ref() == "authorization" && v == "Bearer sk-pool"),
            "{call:?}"
        );
    }
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
    assert_eq!(host.gauge_sum(crate::metrics::Gauge::PodsHealthy), 1);
    assert_eq!(host.gauge_sum(crate::metrics::Gauge::PodsStale), 1);
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

#[test]
fn only_a_response_that_did_not_arrive_whole_asks_how_the_stream_ended() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (mut whole, _) = send(&mut c, 0, &[], &chat_body("m", &distinct("whole")));
    let (mut cut, _) = send(&mut c, 0, &[], &chat_body("m", &distinct("cut")));
    let (vm, host) = &mut c.vms[0];
    assert!(whole.wants_end_details(), "routed, nothing back yet");
    whole.on_response_headers(vm, host, Some("200"), false);
    whole.on_response_body(vm, host, 10, None, false);
    assert!(whole.wants_end_details(), "the body is still coming");
    whole.on_response_body(vm, host, 0, None, true);
    assert!(!whole.wants_end_details(), "whole: the status says it all");
    cut.on_response_headers(vm, host, Some("200"), false);
    cut.on_response_body(vm, host, 10, None, false);
    assert!(
        cut.wants_end_details(),
        "a pod that dies now leaves its 200 behind"
    );
    cut.on_done(
        vm,
        host,
        None,
        Some("upstream_reset_after_response_started{remote_reset}".into()),
    );
    whole.on_done(vm, host, None, None);
    c.tick();
    assert_eq!(
        c.vms[0].1.counter(Counter::RequestFailures),
        1,
        "the cut one only"
    );
}

#[test]
fn the_work_board_hears_of_a_prefill_end_before_the_client_has_the_response() {
    // Another worker may take the client's next request as soon as the response reaches it, and
    // `on_log` (`on_done`) can run after that: the prefill's end must be on the board already.
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    // What VM 1 believes VM 0 has queued, after reading the board.
    let seen_by_other = |c: &mut Cluster| {
        let (vm, host) = &mut c.vms[1];
        let now = host.now_ms();
        let (board, _) = vm.read_inflight_board(host, now);
        let work = board.others(1, now, crate::work::ROW_TTL_MS);
        (
            work.values().map(|w| w.prefill_requests).sum::<u32>(),
            work.values().map(|w| w.inflight).sum::<u32>(),
        )
    };
    for stream in [false, true] {
        let body = json!({"model": "m", "stream": stream, "messages": [
            {"role": "user", "content": distinct(&format!("stream {stream}"))}]})
        .to_string();
        let (mut flow, _) = send(&mut c, 0, &[], body.as_bytes());
        assert_eq!(seen_by_other(&mut c), (1, 1), "stream {stream}: routed");
        c.vms[0].1.take_census();
        {
            let (vm, host) = &mut c.vms[0];
            flow.on_response_headers(vm, host, Some("200"), false);
            flow.on_response_body(vm, host, 100, None, false);
        }
        // A stream's first byte is its first token; a whole answer is not the client's yet.
        let first = if stream { (0, 1) } else { (1, 1) };
        assert_eq!(seen_by_other(&mut c), first, "stream {stream}: first byte");
        {
            let (vm, host) = &mut c.vms[0];
            flow.on_response_body(vm, host, 0, None, true);
        }
        assert_eq!(
            seen_by_other(&mut c),
            (0, 0),
            "stream {stream}: end of stream"
        );
        // One board write for a whole answer (its prefill and its end together), two for a stream.
        let writes = c.vms[0].1.take_census().get("shared_set").copied();
        assert_eq!(writes, Some(if stream { 2 } else { 1 }), "stream {stream}");
        {
            let (vm, host) = &mut c.vms[0];
            flow.on_done(vm, host, None, None);
        }
        assert_eq!(seen_by_other(&mut c), (0, 0), "stream {stream}: done");
        let writes = c.vms[0].1.take_census().get("shared_set").copied();
        assert_eq!(
            writes, None,
            "stream {stream}: nothing left to write at the end"
        );
    }
}

#[test]
fn a_request_reset_before_its_end_of_stream_leaves_the_board_at_its_end() {
    // No end of stream (the client went away, the pod reset): `on_done` ends both, once.
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": distinct("cut")}]})
        .to_string();
    let (mut flow, _) = send(&mut c, 0, &[], body.as_bytes());
    {
        let (vm, host) = &mut c.vms[0];
        flow.on_response_headers(vm, host, Some("200"), false);
        flow.on_response_body(vm, host, 100, None, false);
        flow.on_done(
            vm,
            host,
            None,
            Some("upstream_reset_after_response_started".into()),
        );
    }
    let (vm, host) = &mut c.vms[1];
    let now = host.now_ms();
    let (board, _) = vm.read_inflight_board(host, now);
    let work = board.others(1, now, crate::work::ROW_TTL_MS);
    assert_eq!(work.values().map(|w| w.prefill_requests).sum::<u32>(), 0);
    assert_eq!(work.values().map(|w| w.inflight).sum::<u32>(), 0);
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
    // Announced: read to its end and dropped (a reply while the client still sends ends in a
    // reset), then answered.
    let mut flow = RequestFlow::new();
    let outcome = flow.on_request_headers(vm, host, &h, false);
    assert_eq!(outcome, HeadersOutcome::WaitForBody);
    assert_eq!(flow.on_body_chunk(vm, 10), BodyChunk::Drop);
    assert_eq!(flow.on_body_chunk(vm, 10), BodyChunk::Drop);
    let BodyOutcome::Reply(reply) = flow.on_request_body(vm, host, Some(b"{}")) else {
        panic!()
    };
    assert_eq!(reply.status, 413);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "body_too_large");
    // Announced past what is worth reading: answered at once.
    let huge = (1000 + DISCARD_LIMIT_BYTES + 1).to_string();
    let h = headers(&[
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", huge.as_str()),
    ]);
    let outcome = RequestFlow::new().on_request_headers(vm, host, &h, false);
    assert!(
        matches!(outcome, HeadersOutcome::Reply(ref r) if r.status == 413),
        "{outcome:?}"
    );
    // Chunked: only the body's size tells; dropped from the chunk that crosses the limit, and
    // answered at once past the discard limit.
    let mut flow = RequestFlow::new();
    let h = headers(&[(":method", "POST"), (":path", "/v1/chat/completions")]);
    assert_eq!(
        flow.on_request_headers(vm, host, &h, false),
        HeadersOutcome::WaitForBody
    );
    assert_eq!(flow.on_body_chunk(vm, 1000), BodyChunk::Keep);
    assert_eq!(flow.on_body_chunk(vm, 1001), BodyChunk::Drop);
    assert_eq!(
        flow.on_body_chunk(vm, DISCARD_LIMIT_BYTES),
        BodyChunk::AnswerNow
    );
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", &"x".repeat(2000)));
    let BodyOutcome::Reply(reply) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(reply.status, 413);
    assert_eq!(c.vms[0].1.counter(Counter::BodyTooLarge), 3);
}

/// How many of `body`'s leading blocks VM `i` believes `pod` holds.
fn held(c: &Cluster, i: usize, pod: &str, body: &[u8]) -> usize {
    let vm = &c.vms[i].0;
    let view = parse::parse(Endpoint::ChatCompletions, body).unwrap();
    let blocks = Blocks::of(&vm.config.block, &view, None);
    let slot = vm.router.affinity.slot_of(pod).unwrap();
    vm.router.affinity.index().match_lengths(&blocks.hashes, 64)[slot]
}

#[test]
fn a_request_the_pod_refuses_leaves_no_entry_in_any_vm_and_an_accepted_one_stays() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let shared = "a long shared system prompt ".repeat(40);
    let known = chat_body("m", &shared);
    // An accepted request teaches its blocks; a refused one that extends it withdraws only what it
    // added, so the accepted prefix stays.
    let (mut flow, outcome) = send(&mut c, 1, &[], &known);
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[1];
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_done(vm, host, None, None);
    let longer = json!({"model": "m", "stream": true, "messages": [
        {"role": "system", "content": shared}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "more context ".repeat(40)}, {"role": "user", "content": "x"}]})
    .to_string()
    .into_bytes();
    let (mut flow, outcome) = send(&mut c, 1, &[], &longer);
    assert_eq!(primary_of(&outcome), pod, "it follows its prefix");
    let full = held(&c, 1, &pod, &longer);
    let accepted = held(&c, 1, &pod, &known);
    assert!(full > accepted && accepted > 10, "{full} {accepted}");
    // The other VM learns both through the leader.
    c.tick();
    assert_eq!(held(&c, 0, &pod, &longer), full);
    let (vm, host) = &mut c.vms[1];
    flow.on_response_headers(vm, host, Some("400"), false);
    flow.on_done(vm, host, None, None);
    assert_eq!(host.counter(Counter::ObservationsWithdrawn), 1);
    assert_eq!(
        held(&c, 1, &pod, &longer),
        accepted,
        "withdrawn at once here"
    );
    c.tick();
    c.tick();
    for i in 0..2 {
        assert_eq!(held(&c, i, &pod, &longer), accepted, "VM {i}");
        assert_eq!(
            held(&c, i, &pod, &known),
            accepted,
            "VM {i} keeps the accepted prefix"
        );
    }
    // A fresh prompt refused by Envoy for its upstream (503 before any byte) leaves nothing at all.
    let fresh = chat_body("m", &"an unrelated prompt ".repeat(40));
    let (mut flow, outcome) = send(&mut c, 0, &[], &fresh);
    let pod = primary_of(&outcome);
    assert!(held(&c, 0, &pod, &fresh) > 10);
    let (vm, host) = &mut c.vms[0];
    flow.on_response_headers(vm, host, Some("503"), true);
    flow.on_done(vm, host, None, None);
    c.tick();
    c.tick();
    for i in 0..2 {
        assert_eq!(held(&c, i, &pod, &fresh), 0, "VM {i}");
    }
    // An accepted one stays accepted whatever happens after its headers.
    let (mut flow, outcome) = send(&mut c, 0, &[], &fresh);
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[0];
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 10, None, false);
    flow.on_done(vm, host, None, None);
    c.tick();
    c.tick();
    for i in 0..2 {
        assert!(held(&c, i, &pod, &fresh) > 10, "VM {i}");
    }
}

#[test]
fn a_block_withdrawn_and_learned_again_in_one_tick_stays_learned_everywhere() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let body = chat_body("m", &"retry me ".repeat(120));
    // Refused, then the client's retry is accepted, all before the leader's next tick.
    let (mut refused, outcome) = send(&mut c, 1, &[], &body);
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[1];
    refused.on_response_headers(vm, host, Some("429"), true);
    refused.on_done(vm, host, None, None);
    let (mut retry, outcome) = send(&mut c, 1, &[], &body);
    assert_eq!(primary_of(&outcome), pod);
    let (vm, host) = &mut c.vms[1];
    retry.on_response_headers(vm, host, Some("200"), false);
    retry.on_done(vm, host, None, None);
    let blocks = held(&c, 1, &pod, &body);
    assert!(blocks > 10);
    c.tick();
    c.tick();
    assert_eq!(held(&c, 0, &pod, &body), blocks, "pages keep the order");
    // And a VM that loads the snapshot agrees.
    let (leader, _) = &c.vms[0];
    let snapshot = leader.router.affinity.snapshot(1);
    let mut follower = Router::new();
    follower.apply_load_table(&cfg, leader.router.load_table().clone());
    follower.affinity.load_snapshot(&snapshot);
    let view = parse::parse(Endpoint::ChatCompletions, &body).unwrap();
    let hashes = Blocks::of(&cfg.block, &view, None).hashes;
    let slot = follower.affinity.slot_of(&pod).unwrap();
    assert_eq!(
        follower.affinity.index().match_lengths(&hashes, 64)[slot],
        blocks
    );
}

#[test]
fn a_refused_inline_prefill_withdraws_both_pods_and_a_failed_one_only_the_prefill_pod() {
    let mut c = pd_cluster("inline");
    let long = chat_body("m", &"context ".repeat(3000));
    let (mut flow, _) = send(&mut c, 0, &[], &long);
    assert!(held(&c, 0, PODS[0], &long) > 100 && held(&c, 0, PODS[1], &long) > 100);
    let (vm, host) = &mut c.vms[0];
    assert!(matches!(
        flow.on_prefill_answer(vm, host, 400, b"{}"),
        PrefillOutcome::Reply(_)
    ));
    flow.on_done(vm, host, None, None);
    assert_eq!(
        (held(&c, 0, PODS[0], &long), held(&c, 0, PODS[1], &long)),
        (0, 0)
    );
    let (mut flow, _) = send(&mut c, 0, &[], &long);
    let (vm, host) = &mut c.vms[0];
    assert_eq!(
        flow.on_prefill_answer(vm, host, 503, b""),
        PrefillOutcome::Resume(None)
    );
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_done(vm, host, None, None);
    assert_eq!(
        held(&c, 0, PODS[0], &long),
        0,
        "the prefill pod computed nothing"
    );
    assert!(
        held(&c, 0, PODS[1], &long) > 100,
        "the decode pod prefilled it"
    );
}

/// Where a chat request for `model` goes: a pod, or the refusal's code.
fn outcome_for(c: &mut Cluster, model: &str, system: &str) -> Result<BodyOutcome, String> {
    match send(c, 1, &[], &chat_body(model, system)).1 {
        BodyOutcome::Reply(reply) => {
            let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            Err(body["error"]["code"].as_str().unwrap().to_string())
        }
        routed => Ok(routed),
    }
}

#[test]
fn aliases_and_adapters_route_by_the_pods_model_lists_and_unknown_names_are_refused() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    // vLLM with `--model org/m --served-model-name m m-alias --lora-modules sql-lora=/a/sql`.
    c.models = Some(
        br#"{"object":"list","data":[
            {"id":"m","object":"model","root":"org/m","parent":null,"max_model_len":4096},
            {"id":"m-alias","object":"model","root":"org/m","parent":null,"max_model_len":4096},
            {"id":"sql-lora","object":"model","root":"/a/sql","parent":"m","max_model_len":null}]}"#
            .to_vec(),
    );
    c.ready();
    for model in ["m", "m-alias", "sql-lora"] {
        assert!(
            matches!(outcome_for(&mut c, model, "sys"), Ok(BodyOutcome::Route(_))),
            "{model}"
        );
    }
    assert_eq!(
        outcome_for(&mut c, "other-lora", "sys").err().as_deref(),
        Some("unknown_model")
    );
    // The gateway's model list: every name once, as vLLM lists them.
    let list = |c: &mut Cluster, path: &str| {
        let (vm, host) = &mut c.vms[0];
        let h = headers(&[(":method", "GET"), (":path", path)]);
        match RequestFlow::new().on_request_headers(vm, host, &h, true) {
            HeadersOutcome::Reply(r) => (
                r.status,
                serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
            ),
            other => panic!("{other:?}"),
        }
    };
    let (status, body) = list(&mut c, "/v1/models");
    assert_eq!(status, 200);
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec!["m", "m-alias", "sql-lora"],
        "each once, from both pods"
    );
    assert_eq!(body["data"][2]["parent"], "m");
    assert_eq!(body["data"][0]["max_model_len"], 4096);
    let (status, card) = list(&mut c, "/v1/models/sql-lora");
    assert_eq!((status, card["id"].as_str()), (200, Some("sql-lora")));
    let (status, missing) = list(&mut c, "/v1/models/nope");
    assert_eq!(
        (status, missing["error"]["code"].as_str()),
        (404, Some("unknown_model"))
    );
    // Aliases share the base model's KV cache; an adapter has its own.
    let system = "the same long system prompt ".repeat(40);
    let (mut first, outcome) = send(&mut c, 1, &[], &chat_body("m", &system));
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[1];
    first.on_response_headers(vm, host, Some("200"), false);
    let keyed = |c: &Cluster, model: &str| {
        let vm = &c.vms[1].0;
        let view = parse::parse(Endpoint::ChatCompletions, &chat_body(model, &system)).unwrap();
        let blocks = Blocks::in_cache(&vm.config.block, &view, vm.router.cache_model(model), None);
        let slot = vm.router.affinity.slot_of(&pod).unwrap();
        (
            vm.router.affinity.index().match_lengths(&blocks.hashes, 64)[slot],
            blocks.hashes.len(),
        )
    };
    let (held, total) = keyed(&c, "m-alias");
    assert!(held == total && total > 10, "{held}/{total}");
    assert_eq!(keyed(&c, "sql-lora").0, 0);
    assert_eq!(c.vms[1].0.router.cache_model("m-alias"), "m");
    assert_eq!(c.vms[1].0.router.cache_model("unlisted"), "unlisted");
}

#[test]
fn running_adapters_in_the_metrics_route_before_the_model_list_is_read() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.extra_metrics = "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"hot-lora\",waiting_lora_adapters=\"\"} 1.7e9\n".to_string();
    c.ready();
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("hot-lora", "sys"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("cold-lora", "sys"));
    assert!(
        matches!(outcome, BodyOutcome::Reply(ref r) if r.status == 404),
        "{outcome:?}"
    );
}

#[test]
fn a_metrics_scrape_of_the_gateway_is_refused_with_where_to_scrape() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (vm, host) = &mut c.vms[0];
    for path in ["/metrics", "/metrics?format=prometheus"] {
        let h = headers(&[(":method", "GET"), (":path", path)]);
        let HeadersOutcome::Reply(reply) =
            RequestFlow::new().on_request_headers(vm, host, &h, true)
        else {
            panic!("{path}")
        };
        assert_eq!(reply.status, 404);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["error"]["code"], "metrics_not_proxied");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/stats/prometheus"));
    }
    for path in ["/metrics/x", "/v1/metrics", "/health"] {
        let h = headers(&[(":method", "GET"), (":path", path)]);
        assert_eq!(
            RequestFlow::new().on_request_headers(vm, host, &h, true),
            HeadersOutcome::Continue,
            "{path}"
        );
    }
}

#[test]
fn a_request_a_fallback_served_is_learned_for_the_fallback_not_the_primary() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let body = chat_body("m", &"retried on a fallback ".repeat(40));
    let (mut flow, outcome) = send(&mut c, 1, &[], &body);
    let BodyOutcome::Route(route) = &outcome else {
        panic!("{outcome:?}")
    };
    let (primary_pod, fallback) = {
        let mut hosts = route.destinations.split(',');
        (
            hosts.next().unwrap().to_string(),
            hosts.next().unwrap().to_string(),
        )
    };
    let blocks = held(&c, 1, &primary_pod, &body);
    assert!(blocks > 10);
    // The primary answered 503, Envoy retried on the fallback, which answers 200.
    let (vm, host) = &mut c.vms[1];
    host.advance_ms(50);
    flow.on_upstream(vm, host, &fallback);
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 100, None, false);
    flow.on_done(vm, host, None, None);
    assert_eq!(
        vm.router.costs.fit_samples(&primary_pod),
        0.0,
        "the fallback's time is not the primary's"
    );
    c.tick();
    c.tick();
    for i in 0..2 {
        assert_eq!(held(&c, i, &primary_pod, &body), 0, "VM {i}");
        assert_eq!(held(&c, i, &fallback, &body), blocks, "VM {i}");
    }
    // The primary itself answering changes nothing.
    let other = chat_body("m", &"served where routed ".repeat(40));
    let (mut flow, outcome) = send(&mut c, 0, &[], &other);
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[0];
    flow.on_upstream(vm, host, &pod);
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_done(vm, host, None, None);
    assert!(held(&c, 0, &pod, &other) > 10);
}

fn send_to(c: &mut Cluster, path: &str, body: &[u8]) -> (RequestFlow, BodyOutcome) {
    post_on(c, 0, path, body)
}

#[test]
fn a_routable_body_past_the_parse_budget_is_refused_and_bad_ones_still_pass_through() {
    let cfg = config(r#","max_parse_bytes":2000"#);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let long = "context ".repeat(500);
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", &long));
    let BodyOutcome::Reply(reply) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(reply.status, 413);
    let error: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(error["error"]["code"], "parse_budget_exceeded");
    assert_eq!(c.vms[0].1.counter(Counter::ParseBudgetExceeded), 1);
    // Within the budget, routed; over it but not JSON, refused as not JSON.
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", "short"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    let mut truncated = chat_body("m", &long);
    truncated.pop();
    let (_, outcome) = send(&mut c, 0, &[], &truncated);
    assert!(
        matches!(outcome, BodyOutcome::Reply(ref r) if r.status == 400),
        "{outcome:?}"
    );
    assert!(Config::parse(br#"{"max_parse_bytes":0}"#).is_err());
}

#[test]
fn a_kv_handle_is_removed_from_a_body_passed_through_for_lacking_a_model() {
    let mut c = Cluster::new(&config(""), 1);
    c.ready();
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
                      "kv_transfer_params": {"remote_host": "10.1.2.3", "remote_port": 22}});
    let (mut flow, outcome) = send(&mut c, 0, &[], body.to_string().as_bytes());
    assert_eq!(outcome, BodyOutcome::Continue);
    let sent: serde_json::Value =
        serde_json::from_slice(&flow.take_rewritten_body().expect("rewritten")).unwrap();
    assert_eq!(
        sent,
        json!({"messages": [{"role": "user", "content": "hi"}]})
    );
}

#[test]
fn responses_requests_are_routed_and_decoded_where_routed_in_inline_pd() {
    let mut c = pd_cluster("inline");
    let long = "context ".repeat(3000);
    let responses = json!({"model": "m", "instructions": long, "input": "hi", "stream": true});
    let (_, outcome) = send_to(&mut c, "/v1/responses", responses.to_string().as_bytes());
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        route.prefill_call.is_none(),
        "no inline split for /v1/responses"
    );
    assert_eq!(
        route.destinations.split(',').next(),
        Some(PODS[1]),
        "the decode pod"
    );
    assert_eq!(c.vms[0].1.counter(Counter::PdDecodeOnly), 1);
    // The same conversation through chat renders alike: the decode pod holds its prefix now, so
    // it is a prefix hit there (and not split: what is cached is not prefilled again).
    let chat = json!({"model": "m", "stream": true, "messages": [
        {"role": "system", "content": long}, {"role": "user", "content": "hi"}]});
    let (_, outcome) = send_to(&mut c, "/v1/chat/completions", chat.to_string().as_bytes());
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(route.destinations.split(',').next(), Some(PODS[1]));
    assert_eq!(
        c.vms[0]
            .1
            .counter_where(Counter::RequestsRouted, metrics::REASON, "prefix_hit"),
        1
    );
    // On a fresh pool the chat request is split.
    let mut fresh = pd_cluster("inline");
    let (_, outcome) = send_to(
        &mut fresh,
        "/v1/chat/completions",
        chat.to_string().as_bytes(),
    );
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(route.prefill_call.is_some());
}

#[test]
fn under_a_path_prefix_the_inline_prefill_calls_the_plain_path_and_messages_are_not_split() {
    let cfg = Config::parse(
        format!(
            r#"{{"pools":[{{"name":"p","role":"prefill","endpoints":["{}"]}},
                         {{"name":"d","role":"decode","endpoints":["{}"]}}],
                "pd":{{"mode":"inline"}},"api_path_prefix":"/openai"}}"#,
            PODS[0], PODS[1]
        )
        .as_bytes(),
    )
    .unwrap();
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let long = "context ".repeat(3000);
    let (_, outcome) = send_to(
        &mut c,
        "/openai/v1/chat/completions?x=1",
        &chat_body("m", &long),
    );
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    let call = route.prefill_call.expect("an inline prefill");
    assert_eq!(call.path, "/v1/chat/completions?x=1");
    let messages = json!({"model": "m", "max_tokens": 4, "system": "other ".repeat(3000),
        "messages": [{"role": "user", "content": "hi"}]});
    let (_, outcome) = send_to(
        &mut c,
        "/openai/v1/messages",
        messages.to_string().as_bytes(),
    );
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        route.prefill_call.is_none(),
        "no inline split for /v1/messages"
    );
    assert_eq!(route.destinations.split(',').next(), Some(PODS[1]));
}

#[test]
fn a_routed_request_counts_under_its_pods_pool_and_role_and_its_model_if_served() {
    let mut c = pd_cluster("sidecar");
    let long = "a long system prompt ".repeat(400);
    let (_, outcome) = send(&mut c, 0, &[], &chat_body("m", &long));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    let host = &c.vms[0].1;
    let routed =
        |label: &str, value: &str| host.counter_where(Counter::RequestsRouted, label, value);
    assert_eq!(routed(metrics::POOL, "d"), 1, "{:?}", host.counters);
    assert_eq!(routed(metrics::ROLE, "decode"), 1);
    assert_eq!(routed(metrics::MODEL, "m"), 1, "the pods serve `m`");
    assert_eq!(routed(metrics::REASON, "load"), 1);
    assert_eq!(
        host.counter_where(Counter::PdDisaggregated, metrics::POOL, "d"),
        1
    );
    // A name no pod reports is no label value (its requests route while pods list no names).
    let labels = RouteLabels::of(&c.vms[0].0, PODS[1], "made-up-by-a-client");
    assert_eq!((labels.pool.as_str(), labels.role), ("d", "decode"));
    assert_eq!(labels.model, "");
}

#[test]
fn the_leader_publishes_each_pools_pods_and_waiting_requests() {
    let mut c = pd_cluster("sidecar");
    c.tick();
    let leader = c.leaders()[0];
    let host = &c.vms[leader].1;
    use crate::metrics::Gauge;
    for pool in ["p", "d"] {
        assert_eq!(
            host.gauge_where(Gauge::PodsKnown, metrics::POOL, pool),
            Some(1)
        );
        assert_eq!(
            host.gauge_where(Gauge::PodsHealthy, metrics::POOL, pool),
            Some(1)
        );
    }
    assert_eq!(host.gauge_sum(Gauge::PodsKnown), 2);
    assert_eq!(
        host.gauge_where(Gauge::PodFitSamples, metrics::POD, PODS[0]),
        Some(0)
    );
    assert!(host
        .gauge_where(Gauge::PodPrefillTokensPerSecond, metrics::POD, PODS[1])
        .is_some_and(|v| v > 0));
    assert_eq!(
        host.gauge_where(Gauge::PoolRequestsWaiting, metrics::ROLE, "prefill"),
        Some(0)
    );
}

/// `body` routed through VM 0 and finished at once; the pod it went to.
fn route(c: &mut Cluster, body: &[u8]) -> String {
    let (mut flow, outcome) = send(c, 0, &[], body);
    let pod = primary_of(&outcome);
    let (vm, host) = &mut c.vms[0];
    flow.on_done(vm, host, None, None);
    pod
}

/// VM 0's index stamps of `blocks` on `slot` (`None` where not held).
fn stamps_of(c: &Cluster, slot: usize, blocks: &[u64]) -> Vec<Option<u64>> {
    let index = c.vms[0].0.router.affinity.index();
    blocks.iter().map(|h| index.stamp_of(slot, *h)).collect()
}

#[test]
fn what_a_pod_holds_is_observed_again_only_after_a_second() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let prefix = distinct("retouch").repeat(40);
    let body = chat_body("m", &prefix);
    let newest_stamp = |c: &Cluster, pod: &str| {
        let vm = &c.vms[0].0;
        let slot = vm.router.affinity.slot_of(pod).unwrap();
        let first = vm.router.affinity.index().slot_blocks_oldest_first(slot);
        vm.router
            .affinity
            .index()
            .stamp_of(slot, *first.last().unwrap())
    };
    let pod = route(&mut c, &body);
    let learned = newest_stamp(&c, &pod);
    assert!(
        learned.is_some(),
        "a new prompt is observed, and remembered"
    );
    c.advance_ms(10);
    assert_eq!(route(&mut c, &body), pod);
    assert_eq!(newest_stamp(&c, &pod), learned, "held whole: not observed");
    c.advance_ms(500);
    assert_eq!(route(&mut c, &body), pod);
    assert_eq!(
        newest_stamp(&c, &pod),
        learned,
        "held whole and seen 0.5 s ago: not touched again"
    );
    c.advance_ms(600);
    assert_eq!(route(&mut c, &body), pod);
    let refreshed = newest_stamp(&c, &pod);
    assert!(refreshed > learned, "1.1 s later its recency is refreshed");

    // The same start with more after it, within the second: only the new blocks are observed.
    let slot = c.vms[0].0.router.affinity.slot_of(&pod).unwrap();
    let held_before = c.vms[0]
        .0
        .router
        .affinity
        .index()
        .slot_blocks_oldest_first(slot);
    let stamps = |c: &Cluster| stamps_of(c, slot, &held_before);
    let before = stamps(&c);
    c.advance_ms(10);
    let longer = |tail: &str| chat_body("m", &format!("{prefix}{}", tail.repeat(100)));
    assert_eq!(route(&mut c, &longer("more ")), pod);
    let index = c.vms[0].0.router.affinity.index();
    assert!(
        index.blocks_held(slot) > held_before.len(),
        "the new blocks are learned"
    );
    assert_eq!(stamps(&c), before, "the held prefix is not touched again");
    // Past the second, the prefix is observed with what follows it.
    c.advance_ms(1100);
    assert_eq!(route(&mut c, &longer("other ")), pod);
    let after = stamps(&c);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a > b),
        "the prefix's recency is refreshed: {after:?} against {before:?}"
    );
}

#[test]
fn a_prefix_its_pod_could_have_evicted_since_is_observed_whole() {
    let prefix = distinct("turnover").repeat(40);
    let body = chat_body("m", &prefix);
    let longer = chat_body("m", &format!("{prefix}{}", "more ".repeat(100)));
    let held_after = |c: &mut Cluster, body: &[u8]| {
        let pod = route(c, body);
        let vm = &c.vms[0].0;
        let slot = vm.router.affinity.slot_of(&pod).unwrap();
        (
            pod,
            slot,
            vm.router.affinity.index().slot_blocks_oldest_first(slot),
        )
    };
    // How many blocks the prompt and its longer form take, on a pod with room to spare.
    let mut roomy = Cluster::new(&config(""), 1);
    roomy.ready();
    let prefix_blocks = held_after(&mut roomy, &body).2.len();
    let longer_blocks = held_after(&mut roomy, &longer).2.len();
    assert!(longer_blocks > prefix_blocks + 2);

    // A pod whose cache is the prefix and two blocks more: the longer prompt's new blocks cannot
    // all fit beside the prefix, so its prefix is touched again, within the second or not.
    let cfg = config(&format!(
        r#","default_pod_capacity_blocks":{}"#,
        prefix_blocks + 2
    ));
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (pod, slot, prefix_hashes) = held_after(&mut c, &body);
    let stamps = |c: &Cluster| stamps_of(c, slot, &prefix_hashes);
    let before = stamps(&c);
    c.advance_ms(10);
    assert_eq!(route(&mut c, &longer), pod);
    let after = stamps(&c);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a.is_some() && a > b),
        "the prefix is touched again and still held: {after:?} against {before:?}"
    );
}

/// Headers then body for `path` on VM `i`.
fn post_on(c: &mut Cluster, i: usize, path: &str, body: &[u8]) -> (RequestFlow, BodyOutcome) {
    send_headers(c, i, &[(":method", "POST"), (":path", path)], body)
}

#[test]
fn a_stored_response_is_continued_retrieved_and_cancelled_on_the_pod_that_stored_it() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let first = json!({"model": "m", "input": "tell me a story ".repeat(50)});
    let (mut flow, outcome) = post_on(&mut c, 0, "/v1/responses", first.to_string().as_bytes());
    let stored_on = primary_of(&outcome);
    {
        let (vm, host) = &mut c.vms[0];
        flow.on_response_headers(vm, host, Some("200"), false);
        assert!(flow.wants_response_bytes(), "the answer's id is read");
        // The id comes split over two chunks.
        let answer = br#"{"id":"resp_7f3a","object":"response","output":[]}"#;
        flow.on_response_body(vm, host, 9, Some(&answer[..9]), false);
        flow.on_response_body(vm, host, answer.len() - 9, Some(&answer[9..]), true);
        flow.on_done(vm, host, None, None);
    }
    // Follow-ups with new inputs, from the other VM: prefix routing alone would spread them.
    for i in 0..8 {
        let follow_up = json!({"model": "m", "previous_response_id": "resp_7f3a",
                               "input": format!("question {i} ").repeat(40)});
        let (_, outcome) = post_on(&mut c, 1, "/v1/responses", follow_up.to_string().as_bytes());
        assert_eq!(primary_of(&outcome), stored_on, "follow-up {i}");
    }
    assert_eq!(c.vms[1].1.counter(Counter::StoredResponsePinned), 8);
    // Retrieve and cancel, from their headers alone.
    for (method, path) in [
        ("GET", "/v1/responses/resp_7f3a"),
        ("DELETE", "/v1/responses/resp_7f3a"),
        ("POST", "/v1/responses/resp_7f3a/cancel"),
    ] {
        let (vm, host) = &mut c.vms[1];
        let h = headers(&[(":method", method), (":path", path)]);
        assert_eq!(
            RequestFlow::new().on_request_headers(vm, host, &h, false),
            HeadersOutcome::Route(stored_on.clone()),
            "{method} {path}"
        );
    }
    // An id never seen stored: routed as if it named none, and counted.
    let unknown = json!({"model": "m", "previous_response_id": "resp_other", "input": "hi"});
    let (_, outcome) = post_on(&mut c, 1, "/v1/responses", unknown.to_string().as_bytes());
    assert!(matches!(outcome, BodyOutcome::Route(_)));
    let (vm, host) = &mut c.vms[1];
    let h = headers(&[(":method", "GET"), (":path", "/v1/responses/resp_other")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &h, false),
        HeadersOutcome::Continue
    );
    assert_eq!(host.counter(Counter::StoredResponseUnplaced), 2);
}

#[test]
fn an_answer_the_server_does_not_store_is_not_remembered() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let body = json!({"model": "m", "store": false, "input": "hello"});
    let (mut flow, _) = post_on(&mut c, 0, "/v1/responses", body.to_string().as_bytes());
    let (vm, host) = &mut c.vms[0];
    flow.on_response_headers(vm, host, Some("200"), false);
    let answer = br#"{"id":"resp_1","object":"response"}"#;
    flow.on_response_body(vm, host, answer.len(), Some(answer), true);
    let h = headers(&[(":method", "GET"), (":path", "/v1/responses/resp_1")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &h, false),
        HeadersOutcome::Continue
    );
}

#[test]
fn a_stored_response_is_found_under_the_api_path_prefix() {
    let cfg = config(r#","api_path_prefix":"/openai""#);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let (vm, host) = &mut c.vms[0];
    assert!(crate::stored_responses::record(host, "resp_9", PODS[1]));
    let h = headers(&[(":method", "GET"), (":path", "/openai/v1/responses/resp_9")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &h, false),
        HeadersOutcome::Route(PODS[1].to_string())
    );
}

#[test]
fn a_body_serde_json_refuses_is_refused_or_passed_on_without_its_kv_handle() {
    let kv = r#""kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9"}"#;
    let bodies = [
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"temperature":NaN,{kv}}}"#
        ),
        format!(r#"{{"model":"m","prompt":"p","n":1e400,{kv}}}"#),
        format!(r#"{{"model":"m","prompt":"\udc00",{kv}}}"#),
        format!(
            r#"{{{kv},"model":"m","prompt":"p","x":{}{}}}"#,
            "[".repeat(130),
            "]".repeat(130)
        ),
    ];
    let strict = config("");
    let mut c = Cluster::new(&strict, 1);
    c.ready();
    for body in &bodies {
        let (mut flow, outcome) = send(&mut c, 0, &[], body.as_bytes());
        let BodyOutcome::Reply(reply) = outcome else {
            panic!("{body}: {outcome:?}")
        };
        assert_eq!(reply.status, 400, "{body}");
        let error: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(error["error"]["code"], "unparseable_body");
        assert_eq!(flow.take_rewritten_body(), None);
    }
    assert_eq!(c.vms[0].1.counter(Counter::UnparseableBody), 4);
    // JSON of another shape is the pod's to answer, its handle taken out as before.
    let odd = format!(r#"{{"model":"m","messages":5,{kv}}}"#);
    let (mut flow, outcome) = send(&mut c, 0, &[], odd.as_bytes());
    assert_eq!(outcome, BodyOutcome::Continue);
    assert_eq!(
        flow.take_rewritten_body().as_deref(),
        Some(&br#"{"model":"m","messages":5}"#[..])
    );
    let open = config(r#","passthrough_unparseable_bodies":true"#);
    let mut c = Cluster::new(&open, 1);
    c.ready();
    for body in &bodies {
        let (mut flow, outcome) = send(&mut c, 0, &[], body.as_bytes());
        assert_eq!(outcome, BodyOutcome::Continue, "{body}");
        let sent = flow.take_rewritten_body().expect("rewritten");
        let sent = String::from_utf8(sent).unwrap();
        assert!(!sent.contains("kv_transfer_params"), "{sent}");
        assert_eq!(sent.len(), body.len() - kv.len() - 1, "{sent}");
    }
    assert_eq!(c.vms[0].1.counter(Counter::UnparseableBody), 0);
    assert_eq!(c.vms[0].1.counter(Counter::ClientKvParamsRemoved), 4);
}

#[test]
fn inference_paths_are_recognised_as_the_engines_servers_read_them() {
    let mut c = Cluster::new(&config(""), 1);
    c.ready();
    let body = chat_body("m", "hello");
    for path in [
        "/v1/chat/%63ompletions",
        "/v1/chat%2fcompletions",
        "//v1//chat/completions/",
        "/v1/./x/../chat/completions?y=1",
    ] {
        let (_, outcome) = post_on(&mut c, 0, path, &body);
        assert!(
            matches!(outcome, BodyOutcome::Route(_)),
            "{path}: {outcome:?}"
        );
    }
}

#[test]
fn a_stream_is_read_for_its_usage_only_where_it_carries_one() {
    // The engines put `usage` in a chat stream only when `stream_options` asks: an unasked
    // stream's chunks are never copied into the VM; a whole answer and an asked stream are read
    // where the index expects a hit.
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let system = "a system prompt the pod will hold ".repeat(20);
    let body = |stream: bool, options: serde_json::Value| {
        json!({"model": "m", "stream": stream, "stream_options": options, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
        .to_string()
    };
    let wants = |c: &mut Cluster, body: String| {
        let (mut flow, outcome) = send(c, 0, &[], body.as_bytes());
        assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
        let (vm, host) = &mut c.vms[0];
        flow.on_response_headers(vm, host, Some("200"), false);
        let wanted = flow.wants_response_bytes();
        flow.on_response_body(vm, host, 0, None, true);
        flow.on_done(vm, host, None, None);
        wanted
    };
    wants(&mut c, body(false, json!(null))); // the pod now holds the prompt
    assert!(wants(&mut c, body(false, json!(null))), "a whole answer");
    assert!(
        !wants(&mut c, body(true, json!(null))),
        "a stream, nothing asked"
    );
    assert!(
        !wants(&mut c, body(true, json!({"include_usage": false}))),
        "a stream, usage refused"
    );
    assert!(
        wants(&mut c, body(true, json!({"include_usage": true}))),
        "a stream with usage"
    );
    assert!(
        wants(&mut c, body(true, json!({"continuous_usage_stats": true}))),
        "usage in every chunk (vLLM)"
    );
}
