//! The prefill leg under the decode leg's rules, on the fake host: bounded, judged by passive
//! health, taught only by legs that worked, and probed while splits are predicted to lose.

use super::tests::{chat_body, send};
use super::*;
use crate::config::Config;
use crate::vm::tests::{Cluster, PODS};

/// Prefill pod `PODS[0]`, decode pod `PODS[1]`; `pd` and `health` sections as given.
fn cluster(pd: &str, health: &str) -> Cluster {
    let cfg = Config::parse(
        format!(
            r#"{{"pools":[{{"name":"p","role":"prefill","endpoints":["{}"]}},
                         {{"name":"d","role":"decode","endpoints":["{}"]}}],
                "pd":{pd}, "health":{health}}}"#,
            PODS[0], PODS[1]
        )
        .as_bytes(),
    )
    .unwrap();
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    c
}

fn long(tag: &str) -> Vec<u8> {
    chat_body("m", &format!("{tag} {}", "context ".repeat(1500)))
}

fn route_of(outcome: BodyOutcome) -> Route {
    match outcome {
        BodyOutcome::Route(route) => route,
        other => panic!("{other:?}"),
    }
}

/// Ticks the leader until its verdicts are in, and returns the ejections so far.
fn ejections(c: &mut Cluster) -> u64 {
    c.tick();
    c.advance_ms(100);
    c.tick();
    c.vms[0].1.counter(Counter::Ejections)
}

#[test]
fn an_inline_prefill_call_is_bounded_by_the_first_byte_rule_and_a_pod_failing_it_is_ejected() {
    let mut c = cluster(
        r#"{"mode":"inline"}"#,
        r#"{"first_byte_timeout_ms":1000,"max_ejected_share":1.0}"#,
    );
    for i in 0..5 {
        let (mut flow, outcome) = send(&mut c, 0, &[], &long(&format!("fail{i}")));
        let call = route_of(outcome).prefill_call.expect("a split");
        assert_eq!(call.timeout_ms, 1000, "the first-byte bound, not 60 s");
        let (vm, host) = &mut c.vms[0];
        assert_eq!(
            flow.on_prefill_answer(vm, host, 500, b"{}"),
            PrefillOutcome::Resume(None)
        );
        flow.on_response_headers(vm, host, Some("200"), false);
        flow.on_response_body(vm, host, 10, None, false);
        flow.on_done(vm, host, None, None);
        assert_eq!(
            vm.router.costs.fit_samples(PODS[0]),
            0.0,
            "a fallback teaches nothing"
        );
    }
    assert_eq!(ejections(&mut c), 1, "five failed legs in a row");
    let (_, outcome) = send(&mut c, 0, &[], &long("after"));
    let route = route_of(outcome);
    assert!(route.prefill_call.is_none(), "no split to an ejected pod");
    assert_eq!(route.destinations.split(',').next(), Some(PODS[1]));
}

#[test]
fn an_inline_prefill_that_times_out_counts_as_a_timeout() {
    let mut c = cluster(r#"{"mode":"inline"}"#, r#"{"first_byte_timeout_ms":1000}"#);
    let (mut flow, _) = send(&mut c, 0, &[], &long("slow"));
    let (vm, host) = &mut c.vms[0];
    host.advance_ms(1000);
    flow.on_prefill_answer(vm, host, 504, b"");
    assert_eq!(host.counter(Counter::PdPrefillTimeouts), 1);
    assert_eq!(host.counter(Counter::PdPrefillFailures), 1);
    flow.on_done(vm, host, None, None);
}

#[test]
fn a_sidecar_leg_past_its_bound_is_the_prefill_pods_failure_and_teaches_nothing() {
    let mut c = cluster(
        r#"{"mode":"sidecar"}"#,
        r#"{"first_byte_timeout_ms":1000,"max_ejected_share":1.0}"#,
    );
    let (mut flow, outcome) = send(&mut c, 0, &[], &long("quick"));
    let route = route_of(outcome);
    assert_eq!(route.prefiller.as_deref(), Some(PODS[0]));
    assert_eq!(
        flow.prefill_bound_ms(),
        Some(1000),
        "x-prefiller-timeout-ms"
    );
    assert_eq!(
        route.first_byte_timeout_ms,
        Some(2000),
        "the decode attempt waits for the prefill's bound, then its own"
    );
    let (vm, host) = &mut c.vms[0];
    host.advance_ms(200);
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 10, None, false);
    flow.on_done(vm, host, None, None);
    assert!(
        vm.router.costs.fit_samples(PODS[0]) > 0.0,
        "a leg within its bound teaches"
    );
    let learned = vm.router.costs.fit_samples(PODS[0]);
    for i in 0..5 {
        let (mut flow, _) = send(&mut c, 0, &[], &long(&format!("late{i}")));
        let (vm, host) = &mut c.vms[0];
        // The sidecar gave up on the prefiller at the bound and prefilled locally.
        host.advance_ms(1050);
        flow.on_response_headers(vm, host, Some("200"), false);
        flow.on_response_body(vm, host, 10, None, false);
        flow.on_done(vm, host, None, None);
        assert_eq!(
            vm.router.costs.fit_samples(PODS[0]),
            learned,
            "a late leg teaches nothing"
        );
    }
    assert_eq!(c.vms[0].1.counter(Counter::PdPrefillTimeouts), 5);
    assert_eq!(ejections(&mut c), 1);
}

#[test]
fn a_split_predicted_to_lose_is_still_made_once_per_probe_interval() {
    let mut c = cluster(
        r#"{"mode":"sidecar","probe_interval_ms":2000}"#,
        r#"{"first_byte_timeout_ms":30000}"#,
    );
    // A slow spell within the bound: the prefill role learns that a split takes 10 s.
    for i in 0..3 {
        let (mut flow, outcome) = send(&mut c, 0, &[], &long(&format!("slow{i}")));
        assert!(route_of(outcome).prefiller.is_some());
        let (vm, host) = &mut c.vms[0];
        host.advance_ms(10_000);
        flow.on_response_headers(vm, host, Some("200"), false);
        flow.on_response_body(vm, host, 10, None, false);
        flow.on_done(vm, host, None, None);
    }
    let split = |c: &mut Cluster, body: &[u8]| {
        let (mut flow, outcome) = send(c, 0, &[], body);
        let (vm, host) = &mut c.vms[0];
        flow.on_done(vm, host, None, None);
        route_of(outcome).prefiller.is_some()
    };
    let probes_before = c.vms[0].1.counter(Counter::PdProbes);
    c.advance_ms(100);
    assert!(split(&mut c, &long("a")), "a probe: no split for 10 s");
    assert!(
        !split(&mut c, &long("b")),
        "predicted to lose, and a probe was just made"
    );
    c.advance_ms(1000);
    assert!(!split(&mut c, &long("c")), "one per interval");
    c.advance_ms(1000);
    assert!(
        !split(&mut c, &chat_body("m", "short")),
        "a short prompt is never a probe"
    );
    assert!(split(&mut c, &long("d")), "the interval passed");
    assert_eq!(c.vms[0].1.counter(Counter::PdProbes) - probes_before, 2);
}
