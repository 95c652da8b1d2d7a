use super::*;

fn held(id: u32, priority: i32, flow: u64, since_ms: u64) -> Held {
    Held {
        id,
        model: "m".to_string(),
        priority,
        flow,
        since_ms,
    }
}

/// Releases everything in order, as the host would.
fn drain(queue: &mut HeldQueue) -> Vec<u32> {
    let mut order = Vec::new();
    while let Some(id) = queue.next_by(|_| 0).map(|h| h.id) {
        queue.remove(id);
        order.push(id);
    }
    order
}

#[test]
fn higher_bands_go_first_and_flows_take_turns_within_a_band() {
    let mut q = HeldQueue::default();
    // Tenant 1 bursts four requests, tenant 2 sends two, then a high-priority one arrives last.
    for (id, flow) in [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)] {
        q.hold(held(id, 0, flow, id.into()), 100).unwrap();
    }
    q.hold(held(7, 5, 3, 7), 100).unwrap();
    q.hold(held(8, -1, 4, 8), 100).unwrap();
    assert_eq!(q.len(), 8);
    assert_eq!(drain(&mut q), vec![7, 1, 5, 2, 6, 3, 4, 8]);
    assert!(q.is_empty() && !q.holds_model("m"));
}

#[test]
fn a_request_that_leaves_mid_queue_leaves_no_trace() {
    let mut q = HeldQueue::default();
    for (id, flow) in [(1, 1), (2, 2), (3, 1), (4, 2)] {
        q.hold(held(id, 0, flow, 0), 100).unwrap();
    }
    // Flow 2's first request disconnects: not its flow's turn, so flow 1 still goes first.
    assert_eq!(q.remove(2).map(|h| h.id), Some(2));
    assert_eq!(q.remove(2), None);
    assert!(!q.contains(2));
    assert_eq!(drain(&mut q), vec![1, 4, 3]);
}

#[test]
fn the_queue_is_bounded_and_a_context_is_held_once() {
    let mut q = HeldQueue::default();
    q.hold(held(1, 0, 1, 0), 2).unwrap();
    q.hold(held(1, 0, 1, 0), 2).unwrap();
    q.hold(held(2, 0, 1, 0), 2).unwrap();
    assert_eq!(q.hold(held(3, 0, 1, 0), 2), Err(QueueFull));
    assert_eq!(q.len(), 2);
}

#[test]
fn expiry_lists_the_oldest_first_and_only_those_past_the_ttl() {
    let mut q = HeldQueue::default();
    q.hold(held(1, 0, 1, 500), 10).unwrap();
    q.hold(held(2, 3, 2, 100), 10).unwrap();
    q.hold(held(3, 0, 1, 900), 10).unwrap();
    assert_eq!(q.expired(1_500, 1_000), vec![2, 1]);
    assert!(q.expired(1_099, 1_000).is_empty());
}

#[test]
fn models_are_counted_apart() {
    let mut q = HeldQueue::default();
    let mut other = held(2, 0, 1, 0);
    other.model = "other".to_string();
    q.hold(held(1, 0, 1, 0), 10).unwrap();
    q.hold(other, 10).unwrap();
    q.remove(1);
    assert!(!q.holds_model("m") && q.holds_model("other"));
}

#[test]
fn configuration_is_checked_and_off_by_default() {
    assert_eq!(FlowControlConfig::default().compile(), Ok(None));
    let on = FlowControlConfig {
        enabled: true,
        ..Default::default()
    };
    let compiled = on.compile().unwrap().unwrap();
    assert_eq!(compiled.retry_after_s(), 30);
    for (bad, field) in [
        (
            FlowControlConfig {
                queue_depth: 0.5,
                ..on.clone()
            },
            "flow_control.queue_depth",
        ),
        (
            FlowControlConfig {
                kv_cache: 0.0,
                ..on.clone()
            },
            "flow_control.kv_cache",
        ),
        (
            FlowControlConfig {
                max_held: 0,
                ..on.clone()
            },
            "flow_control.max_held",
        ),
        (
            FlowControlConfig {
                ttl_ms: 0,
                ..on.clone()
            },
            "flow_control.ttl_ms",
        ),
    ] {
        assert_eq!(bad.compile().unwrap_err().field, field);
    }
}
