//! Flow control through the core on the fake host: held while every pod is full, released in
//! priority order to the pod that frees first, timed out with a 429, gone when its client leaves.

use super::tests::{chat_body, send_through};
use super::*;
use crate::vm::tests::{config, Cluster, PODS};

const CHAT: [(&str, &str); 2] = [(":method", "POST"), (":path", "/v1/chat/completions")];

/// One request as the host's context `id`, with `extra` headers, through VM 0.
fn send(
    c: &mut Cluster,
    id: u32,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (RequestFlow, BodyOutcome) {
    let all: Vec<(&str, &str)> = CHAT.iter().chain(extra).copied().collect();
    send_through(c, 0, RequestFlow::for_context(id), &all, body)
}

fn due(vm: &mut Vm, host: &mut crate::testing::FakeHost) -> Option<Release> {
    let now = host.now_ms();
    next_release(vm, host, now)
}

fn pod_of(outcome: &BodyOutcome) -> String {
    match outcome {
        BodyOutcome::Route(r) => r.destinations.split(',').next().unwrap().to_string(),
        other => panic!("not routed: {other:?}"),
    }
}

const ON: &str = r#","flow_control":{"enabled":true,"queue_depth":1,"ttl_ms":5000}"#;

#[test]
fn a_full_pool_holds_requests_and_releases_the_highest_priority_to_the_pod_that_frees() {
    let cfg = config(ON);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let body = |tag: &str| chat_body("m", &format!("{tag} {}", "words ".repeat(300)));
    // One request per pod fills both (one unstarted request each).
    let (mut first, a) = send(&mut c, 1, &[], &body("a"));
    let (_second, b) = send(&mut c, 2, &[], &body("b"));
    assert_ne!(pod_of(&a), pod_of(&b));
    // The next ones wait at the gateway: a low one, then a high one.
    let (mut low, held_low) = send(&mut c, 3, &[], &body("c"));
    let (mut high, held_high) = send(&mut c, 4, &[("x-kvroute-priority", "5")], &body("d"));
    assert_eq!(
        (held_low, held_high),
        (BodyOutcome::Hold, BodyOutcome::Hold)
    );
    let (vm, host) = &mut c.vms[0];
    assert_eq!(vm.held.len(), 2);
    assert_eq!(host.counter(Counter::FlowHeld), 2);
    // Still full: the high one is next but stays held.
    assert_eq!(due(vm, host), Some(Release::Plan(4)));
    assert_eq!(
        high.on_request_body(vm, host, Some(&body("d"))),
        BodyOutcome::Hold
    );
    assert_eq!(vm.held.len(), 2, "a request planned again keeps its place");
    // The first request's first byte frees its pod: the high one goes there, then the low one
    // finds no room and stays.
    host.advance_ms(50);
    first.on_response_headers(vm, host, Some("200"), false);
    first.on_response_body(vm, host, 40, None, false);
    assert_eq!(due(vm, host), Some(Release::Plan(4)));
    let released = high.on_request_body(vm, host, Some(&body("d")));
    assert_eq!(pod_of(&released), pod_of(&a), "the pod that freed first");
    assert_eq!(host.counter(Counter::FlowReleased), 1);
    assert_eq!(host.histogram_samples(Histogram::FlowWaitMs), vec![50]);
    assert_eq!(due(vm, host), Some(Release::Plan(3)));
    assert_eq!(
        low.on_request_body(vm, host, Some(&body("c"))),
        BodyOutcome::Hold
    );
    // A newcomer queues behind it even for a pod that frees meanwhile.
    let (mut late, held_late) = send(&mut c, 5, &[], &body("e"));
    assert_eq!(held_late, BodyOutcome::Hold);
    let (vm, host) = &mut c.vms[0];
    // The low one's client leaves: out of the queue at once.
    low.on_done(vm, host, None, None);
    assert_eq!(vm.held.len(), 1);
    // The late one times out: a 429 with Retry-After.
    host.advance_ms(5_000);
    let Some(Release::Expire(5, reply)) = due(vm, host) else {
        panic!("the late request expires")
    };
    assert_eq!(reply.status, 429);
    assert!(
        reply.headers.contains(&("retry-after", "5".to_string())),
        "{reply:?}"
    );
    assert!(String::from_utf8_lossy(&reply.body).contains("queue_timeout"));
    late.on_done(vm, host, None, None);
    assert!(vm.held.is_empty() && due(vm, host).is_none());
    let dropped = |reason: &str| host.counter_where(Counter::FlowDropped, "reason", reason);
    assert_eq!((dropped("disconnected"), dropped("queue_timeout")), (1, 1));
    assert!(PODS.contains(&pod_of(&a).as_str()));
}

#[test]
fn past_its_bound_the_queue_answers_429_at_once_and_off_nothing_is_held() {
    let cfg = config(r#","flow_control":{"enabled":true,"queue_depth":1,"max_held":1}"#);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let body = |tag: &str| chat_body("m", &format!("{tag} {}", "words ".repeat(300)));
    for id in 1..=2 {
        assert!(matches!(
            send(&mut c, id, &[], &body(&id.to_string())).1,
            BodyOutcome::Route(_)
        ));
    }
    assert_eq!(send(&mut c, 3, &[], &body("3")).1, BodyOutcome::Hold);
    let BodyOutcome::Reply(reply) = send(&mut c, 4, &[], &body("4")).1 else {
        panic!("the bound answers")
    };
    assert_eq!(reply.status, 429);
    assert!(String::from_utf8_lossy(&reply.body).contains("queue_full"));
    // Off (the default), the same load is routed: engines queue it.
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    for id in 1..=4 {
        assert!(matches!(
            send(&mut c, id, &[], &body(&id.to_string())).1,
            BodyOutcome::Route(_)
        ));
    }
}

#[test]
fn a_held_requests_first_token_objective_counts_its_hold() {
    let cfg = config(ON);
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    let body = |tag: &str| chat_body("m", &format!("{tag} {}", "words ".repeat(300)));
    let (mut first, _) = send(&mut c, 1, &[], &body("a"));
    let (_second, _) = send(&mut c, 2, &[], &body("b"));
    // An objective of 100 ms that the hold alone uses up; a sheddable one just as tight.
    let (mut held, outcome) = send(&mut c, 3, &[("x-slo-ttft-ms", "100")], &body("c"));
    assert_eq!(outcome, BodyOutcome::Hold);
    let (mut shed, outcome) = send(
        &mut c,
        4,
        &[("x-slo-ttft-ms", "100"), ("x-kvroute-priority", "-1")],
        &body("d"),
    );
    assert_eq!(outcome, BodyOutcome::Hold);
    let (vm, host) = &mut c.vms[0];
    host.advance_ms(150);
    first.on_response_headers(vm, host, Some("200"), false);
    first.on_response_body(vm, host, 40, None, false);
    assert_eq!(due(vm, host), Some(Release::Plan(3)));
    let released = held.on_request_body(vm, host, Some(&body("c")));
    assert!(matches!(released, BodyOutcome::Route(_)), "{released:?}");
    // Its first byte 10 ms after the release: 160 ms after the client sent it.
    host.advance_ms(10);
    held.on_response_headers(vm, host, Some("200"), false);
    held.on_response_body(vm, host, 40, None, false);
    assert_eq!(
        host.counter(Counter::SloTtftMissed),
        1,
        "the client waited 160 ms for a 100 ms objective"
    );
    assert_eq!(
        host.histogram_samples(Histogram::TtftMs),
        vec![150, 10],
        "the histogram stays decision to first byte, beside the prediction"
    );
    // The sheddable one's objective passed while it waited: no pod can meet it now.
    let mut refused = None;
    for _ in 0..3 {
        if let Some(Release::Plan(4)) = due(vm, host) {
            refused = Some(shed.on_request_body(vm, host, Some(&body("d"))));
            break;
        }
        host.advance_ms(20);
    }
    match refused {
        Some(BodyOutcome::Reply(reply)) => {
            assert_eq!(reply.status, 429);
            assert!(reply
                .headers
                .contains(&("x-kvroute-error", "slo_unattainable".to_string())));
        }
        other => panic!("a sheddable request past its objective is refused, got {other:?}"),
    }
}
