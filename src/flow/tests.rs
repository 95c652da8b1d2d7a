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
    flow.on_done(vm, host);
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
    flow.on_done(vm, host);
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
    flow.on_done(vm, host);
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
