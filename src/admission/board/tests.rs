use super::*;
use crate::testing::{FakeHost, Store};
use std::cell::RefCell;
use std::rc::Rc;

fn held(id: u32, model: &str, priority: i32, flow: u64) -> Held {
    Held {
        id,
        model: model.to_string(),
        priority,
        flow,
        // Held in the order of their ids.
        since_ms: id.into(),
    }
}

/// Two worker VMs of one Envoy: their queues, their rows, one shared store.
struct Workers {
    hosts: [FakeHost; 2],
    queues: [HeldQueue; 2],
    rows: [HeldRow; 2],
}

impl Workers {
    fn new() -> Workers {
        let store = Rc::new(RefCell::new(Store::default()));
        Workers {
            hosts: [FakeHost::new(&store), FakeHost::new(&store)],
            queues: [HeldQueue::default(), HeldQueue::default()],
            rows: [HeldRow::default(), HeldRow::default()],
        }
    }

    fn now(&self) -> u64 {
        self.hosts[0].now_ms()
    }

    fn hold(&mut self, vm: usize, h: Held) {
        self.queues[vm].hold(h, 100).unwrap();
    }

    /// Both VMs' ticks, twice, so each has read what the other wrote.
    fn tick(&mut self) {
        for _ in 0..2 {
            for vm in 0..2 {
                let now = self.hosts[vm].now_ms();
                // Worker 1 is the leader.
                let leader = vm == 0;
                self.rows[vm].follow(
                    &self.queues[vm],
                    &mut self.hosts[vm],
                    vm as u64 + 1,
                    now,
                    leader,
                );
            }
        }
    }

    fn advance_ms(&mut self, ms: u64) {
        for host in &mut self.hosts {
            host.advance_ms(ms);
        }
    }

    /// What `vm` would release now: `None` while it holds back for the other VM.
    fn release(&mut self, vm: usize) -> Option<u32> {
        let now = self.now();
        let next = self.rows[vm].next(&self.queues[vm])?.clone();
        if self.rows[vm].yields(&next, now) {
            return None;
        }
        self.queues[vm].remove(next.id);
        self.rows[vm].served(next.flow, now);
        Some(next.id)
    }
}

#[test]
fn entries_survive_the_board_and_garbage_is_skipped() {
    let mut board = RowBoard::<HeldEntry>::default();
    let entries = vec![
        HeldEntry::Waiting(Waiting {
            priority: -3,
            model: model_key("m"),
            flow: 0xabc,
            count: 7,
            oldest_ms: 99,
        }),
        HeldEntry::Served {
            flow: 0xabc,
            at_ms: 12_345,
        },
    ];
    board.put_row(9, 100, entries.clone(), ROW_TTL_MS);
    let mut bytes = board.encode();
    bytes.extend_from_slice(b"a 100 wx:1:2:3:4 s:: w1:2:3 \xff\n");
    let back = RowBoard::<HeldEntry>::decode(&bytes);
    assert_eq!(
        back.others(1, 100, ROW_TTL_MS).cloned().collect::<Vec<_>>(),
        entries
    );
    assert_eq!(
        back.rows(),
        2,
        "the garbage row is a row with no readable entry"
    );
    assert!(
        RowBoard::<HeldEntry>::decode(b"kvroute-fits/1\n9 100 s1:2\n")
            .others(1, 100, ROW_TTL_MS)
            .next()
            .is_none()
    );
}

#[test]
fn a_worker_holds_back_for_a_higher_priority_held_by_another_but_not_for_long() {
    let mut w = Workers::new();
    w.hold(0, held(1, "m", 0, 10));
    w.hold(1, held(2, "m", 5, 20));
    w.tick();
    assert_eq!(
        w.release(0),
        None,
        "VM 2 holds priority 5 for the same model"
    );
    w.advance_ms(YIELD_LIMIT_MS - 1);
    assert_eq!(w.release(0), None);
    w.advance_ms(1);
    assert_eq!(
        w.release(0),
        Some(1),
        "held back at most YIELD_LIMIT_MS in a row"
    );
    assert_eq!(
        w.release(1),
        Some(2),
        "nothing outranks the high-priority one"
    );
}

#[test]
fn another_model_or_a_stale_row_is_not_waited_for() {
    let mut w = Workers::new();
    w.hold(0, held(1, "m", 0, 10));
    w.hold(1, held(2, "other", 5, 20));
    w.tick();
    assert_eq!(
        w.release(0),
        Some(1),
        "another model's queue is not this one's"
    );

    let mut w = Workers::new();
    w.hold(0, held(1, "m", 0, 10));
    w.hold(1, held(2, "m", 5, 20));
    w.tick();
    // VM 2 goes silent: VM 1 keeps ticking, VM 2 does not.
    w.advance_ms(ROW_TTL_MS + 1);
    let now = w.now();
    w.rows[0].follow(&w.queues[0], &mut w.hosts[0], 1, now, true);
    assert!(!w.rows[0].others().holds_model("m", 0));
    assert_eq!(w.release(0), Some(1), "a row past its TTL is a VM gone");
}

#[test]
fn flows_take_turns_across_workers() {
    let mut w = Workers::new();
    // Tenant 1 bursts over both workers (worker 2 took its first two); tenant 2 has one request,
    // on worker 1 behind tenant 1's third.
    w.hold(1, held(1, "m", 0, 1));
    w.hold(1, held(2, "m", 0, 1));
    w.hold(0, held(3, "m", 0, 1));
    w.hold(0, held(4, "m", 0, 2));
    w.tick();
    // Capacity frees on worker 2 first: it serves tenant 1's oldest.
    assert_eq!(w.release(1), Some(1));
    w.advance_ms(20);
    w.tick();
    // Worker 1's own turn order would take tenant 1 again; the whole Envoy's says tenant 2.
    assert_eq!(w.release(0), Some(4));
    w.advance_ms(20);
    w.tick();
    // Only tenant 1 is left, on both workers: its older request first, wherever it is held.
    assert_eq!(
        w.release(0),
        None,
        "worker 2 holds tenant 1's older request"
    );
    assert_eq!(w.release(1), Some(2));
    w.tick();
    assert_eq!(w.release(0), Some(3));
}

#[test]
fn a_worker_holds_back_for_a_flow_another_holds_that_waited_longer_for_a_turn() {
    let mut w = Workers::new();
    w.hold(0, held(1, "m", 0, 1));
    w.hold(0, held(2, "m", 0, 1));
    w.hold(1, held(3, "m", 0, 2));
    w.tick();
    // Both are tenants never served: neither holds back (ties go to whoever frees first).
    assert_eq!(w.release(0), Some(1));
    w.advance_ms(20);
    w.tick();
    // Now tenant 1 was served and tenant 2, on the other worker, was not: worker 1 holds back.
    assert_eq!(w.release(0), None);
    assert_eq!(w.release(1), Some(3));
    w.advance_ms(20);
    w.tick();
    assert_eq!(
        w.release(0),
        Some(2),
        "tenant 2 served since: tenant 1's turn again"
    );
}

#[test]
fn a_newcomer_sees_what_other_workers_hold() {
    let mut w = Workers::new();
    w.hold(1, held(1, "m", 0, 1));
    w.tick();
    let others = w.rows[0].others();
    assert!(others.holds_model("m", 0));
    assert!(others.holds_model("m", -1));
    assert!(
        !others.holds_model("m", 1),
        "a higher priority would go first anyway"
    );
    assert!(!others.holds_model("other", 0));
}

#[test]
fn rows_are_written_when_they_change_and_at_the_heartbeat_only() {
    let mut w = Workers::new();
    let writes = |w: &Workers| {
        w.hosts[0]
            .store
            .borrow()
            .data
            .get(HELD_KEY)
            .map(|(_, cas)| *cas)
    };
    w.tick();
    assert_eq!(writes(&w), None, "nothing held: nothing written");
    w.hold(0, held(1, "m", 0, 1));
    w.tick();
    let first = writes(&w);
    assert!(first.is_some());
    w.advance_ms(HEARTBEAT_MS / 2);
    w.tick();
    assert_eq!(writes(&w), first, "unchanged within the heartbeat");
    w.advance_ms(HEARTBEAT_MS / 2);
    w.tick();
    assert_ne!(
        writes(&w),
        first,
        "rewritten at the heartbeat while not empty"
    );
}

#[test]
fn the_leader_reports_the_whole_envoys_queue_per_band_when_it_changes() {
    let mut w = Workers::new();
    w.hold(0, held(1, "m", 0, 1));
    w.hold(0, held(2, "m", 0, 2));
    w.hold(1, held(3, "m", 0, 1));
    w.hold(1, held(4, "m", 2, 3));
    w.hold(1, held(5, "other", -1, 3));
    w.tick();
    let gauge = |g, band| w.hosts[0].gauge_where(g, BAND, band);
    assert_eq!(gauge(Gauge::FlowHeldRequests, "default"), Some(3));
    assert_eq!(gauge(Gauge::FlowWaitingFlows, "default"), Some(2));
    assert_eq!(gauge(Gauge::FlowHeldRequests, "high"), Some(1));
    assert_eq!(gauge(Gauge::FlowHeldRequests, "sheddable"), Some(1));
    // Everything gone (released, expired or disconnected): the gauges go back to zero.
    w.queues = [HeldQueue::default(), HeldQueue::default()];
    w.tick();
    for band in ["high", "default", "sheddable"] {
        assert_eq!(
            w.hosts[0].gauge_where(Gauge::FlowHeldRequests, BAND, band),
            Some(0)
        );
        assert_eq!(
            w.hosts[0].gauge_where(Gauge::FlowWaitingFlows, BAND, band),
            Some(0)
        );
    }
    assert!(w.hosts[1].gauges.is_empty(), "only the leader reports");
    // Nothing changed: the gauges keep their values and are not set again.
    w.hosts[0].gauges.clear();
    w.advance_ms(100);
    w.tick();
    assert!(w.hosts[0].gauges.is_empty());
}

#[test]
fn within_a_flow_the_older_request_goes_first_whichever_worker_holds_it() {
    let mut w = Workers::new();
    // One flow (no fairness header, no session): request 1 held by worker 2 before request 2 by
    // worker 1.
    w.hold(1, held(1, "m", 0, 0));
    w.hold(0, held(2, "m", 0, 0));
    w.tick();
    assert_eq!(
        w.release(0),
        None,
        "worker 2 holds an older request of the same flow"
    );
    assert_eq!(w.release(1), Some(1));
    w.tick();
    assert_eq!(w.release(0), Some(2));
}
