//! The decision a routed request exports to the proxy (pod, reason, prediction, expected cache,
//! P/D outcome), and the debug header given only to requests carrying the trusted token.

use super::explain::{EXPECTED_CACHED_TOKENS, PD, POD, PREDICTED_TTFT_MS, PREFILL_POD, REASON};
use super::tests::{chat_body, headers, pd_cluster, send};
use super::*;
use crate::vm::tests::{config, Cluster, PODS};
use serde_json::json;

fn field(c: &Cluster, name: &str) -> Option<String> {
    c.vms[0].1.decision_field(name).map(str::to_string)
}

fn primary(outcome: &BodyOutcome) -> String {
    let BodyOutcome::Route(route) = outcome else {
        panic!("{outcome:?}")
    };
    route.destinations.split(',').next().unwrap().to_string()
}

/// The value of `key=` in a debug line.
fn debug_value<'a>(debug: &'a str, key: &str) -> Option<&'a str> {
    debug
        .split("; ")
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The `matched_blocks=N/M` of a debug line, as N.
fn matched_blocks(debug: &str) -> u64 {
    debug_value(debug, "matched_blocks")
        .and_then(|m| m.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn a_routed_request_exports_its_decision_and_a_repeat_expects_its_prefix_cached() {
    let mut c = Cluster::new(&config(r#","debug_header":true"#), 1);
    c.ready();
    let body = chat_body("m", &"a long system prompt ".repeat(200));
    let (mut flow, outcome) = send(&mut c, 0, &[], &body);
    let pod = primary(&outcome);
    assert_eq!(field(&c, POD), Some(pod.clone()));
    assert_eq!(field(&c, REASON).as_deref(), Some("load"));
    assert_eq!(field(&c, EXPECTED_CACHED_TOKENS).as_deref(), Some("0"));
    assert_eq!(field(&c, PD).as_deref(), Some("none"), "no decode pool");
    assert_eq!(field(&c, PREFILL_POD), None);
    let first_ms: f64 = field(&c, PREDICTED_TTFT_MS).unwrap().parse().unwrap();
    assert!(first_ms > 0.0);
    let (vm, host) = &mut c.vms[0];
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_done(vm, host, None, None);

    let (mut flow, outcome) = send(&mut c, 0, &[], &body);
    assert_eq!(primary(&outcome), pod, "its holder");
    assert_eq!(field(&c, REASON).as_deref(), Some("prefix_hit"));
    let (vm, host) = &mut c.vms[0];
    let (_, debug) = flow
        .on_response_headers(vm, host, Some("200"), false)
        .unwrap();
    let matched = matched_blocks(&debug);
    let expected: u64 = field(&c, EXPECTED_CACHED_TOKENS).unwrap().parse().unwrap();
    let tokens_per_block = u64::from(c.vms[0].0.config.block.tokens_per_block);
    assert!(matched > 1, "{debug}");
    assert!(
        expected > (matched - 1) * tokens_per_block && expected <= matched * tokens_per_block,
        "{expected} tokens for {matched} blocks: the last may be partial"
    );
    let cached_ms: f64 = field(&c, PREDICTED_TTFT_MS).unwrap().parse().unwrap();
    assert!(cached_ms < first_ms, "{cached_ms} < {first_ms}");
    // The line carries the model the prediction was computed from, and it adds up.
    let number = |key: &str| -> f64 {
        debug_value(&debug, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {debug}"))
    };
    let tokens = number("tokens_ahead") + number("uncached_tokens");
    let recomputed = (number("model_overhead_ms")
        + number("model_us_per_token") * tokens / 1e3
        + number("model_us_per_decoding") * number("decoding") / 1e3)
        * number("ttft_scale");
    let predicted = number("predicted_ttft_ms");
    assert!(
        (recomputed - predicted).abs() <= 0.2 + 0.02 * predicted,
        "{recomputed} from the model against {predicted} predicted: {debug}"
    );
}

#[test]
fn the_pd_outcome_is_exported_and_corrected_when_an_inline_split_fails() {
    let long = || chat_body("m", &"context ".repeat(3000));
    let mut c = pd_cluster("sidecar");
    send(&mut c, 0, &[], &long());
    assert_eq!(field(&c, PD).as_deref(), Some("split_sidecar"));
    assert_eq!(field(&c, POD).as_deref(), Some(PODS[1]), "the decode pod");
    assert_eq!(field(&c, PREFILL_POD).as_deref(), Some(PODS[0]));

    let mut c = pd_cluster("inline");
    let (mut flow, _) = send(&mut c, 0, &[], &long());
    assert_eq!(field(&c, PD).as_deref(), Some("split_inline"));
    let (vm, host) = &mut c.vms[0];
    flow.on_prefill_answer(vm, host, 504, b"");
    assert_eq!(field(&c, PD).as_deref(), Some("decode_only_fallback"));

    let (mut flow, _) = send(&mut c, 0, &[], &chat_body("m", &"other ".repeat(3000)));
    assert_eq!(field(&c, PD).as_deref(), Some("split_inline"));
    let (vm, host) = &mut c.vms[0];
    flow.on_prefill_answer(vm, host, 400, b"{}");
    assert_eq!(field(&c, PD).as_deref(), Some("prefill_refused"));

    // A prompt too short to split.
    send(&mut c, 0, &[], &chat_body("m", "short"));
    assert_eq!(field(&c, PD).as_deref(), Some("decode_only"));
}

const TOKEN: &str = "0123456789abcdef-operator";

/// Whether a routed request with these extra headers gets the debug header.
fn gets_debug(c: &mut Cluster, extra: &[(&str, &str)]) -> bool {
    let (mut flow, outcome) = send(c, 0, extra, &chat_body("m", "sys"));
    assert!(matches!(outcome, BodyOutcome::Route(_)), "{outcome:?}");
    let (vm, host) = &mut c.vms[0];
    let debug = flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_done(vm, host, None, None);
    debug.is_some_and(|(name, line)| name == crate::headers::DEBUG && line.contains("pod="))
}

#[test]
fn with_a_trigger_only_requests_carrying_its_token_get_the_debug_header() {
    let trigger = format!(r#","debug_header":{{"trigger_header":"x-debug-me","token":"{TOKEN}"}}"#);
    let mut c = Cluster::new(&config(&trigger), 1);
    c.ready();
    assert!(!gets_debug(&mut c, &[]));
    assert!(gets_debug(&mut c, &[("x-debug-me", TOKEN)]));
    assert!(!gets_debug(
        &mut c,
        &[("x-debug-me", "0123456789abcdef-operatoR")]
    ));
    assert!(
        !gets_debug(&mut c, &[("x-kvroute-debug-token", TOKEN)]),
        "another header"
    );
    // The decision is exported for every routed request, debug header or not.
    assert!(field(&c, REASON).is_some());

    let mut everyone = Cluster::new(&config(r#","debug_header":true"#), 1);
    everyone.ready();
    assert!(
        gets_debug(&mut everyone, &[]),
        "debug_header: true, as before"
    );
    let mut off = Cluster::new(&config(""), 1);
    off.ready();
    assert!(!gets_debug(&mut off, &[("x-kvroute-debug-token", TOKEN)]));
}

#[test]
fn a_request_continuing_or_retrieving_a_stored_response_logs_its_pod_and_why() {
    let mut c = Cluster::new(&config(""), 1);
    c.ready();
    let (vm, host) = &mut c.vms[0];
    assert!(crate::stored_responses::record(host, "resp_log", PODS[1]));
    let follow_up = json!({"model": "m", "previous_response_id": "resp_log", "input": "more"});
    let mut flow = RequestFlow::new();
    let post = headers(&[(":method", "POST"), (":path", "/v1/responses")]);
    flow.on_request_headers(vm, host, &post, false);
    let outcome = flow.on_request_body(vm, host, Some(follow_up.to_string().as_bytes()));
    assert_eq!(primary(&outcome), PODS[1]);
    assert_eq!(field(&c, POD).as_deref(), Some(PODS[1]));
    assert_eq!(field(&c, REASON).as_deref(), Some("stored_response"));

    let (vm, host) = &mut c.vms[0];
    host.decision.clear();
    let get = headers(&[(":method", "GET"), (":path", "/v1/responses/resp_log")]);
    assert_eq!(
        RequestFlow::new().on_request_headers(vm, host, &get, true),
        HeadersOutcome::Route(PODS[1].to_string())
    );
    assert_eq!(field(&c, POD).as_deref(), Some(PODS[1]));
    assert_eq!(field(&c, REASON).as_deref(), Some("stored_response"));
    assert_eq!(field(&c, PREDICTED_TTFT_MS), None, "nothing was predicted");
}
