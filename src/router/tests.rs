use super::*;
#[cfg(feature = "tiktoken")]
use crate::common::BlockScheme;
use crate::pod::load::PodLoad;
use crate::pod::prom::PodMetrics;
use crate::protocol::parse::RequestView;
use crate::protocol::parse::{parse, Endpoint};
use crate::scheduler::Decision;
use crate::state::messages::{Observation, Page};
use crate::work::{PodWork, MAX_PENDING};

fn table(addrs: &[&str], now: u64) -> LoadTable {
    LoadTable {
        format: crate::pod::load::LOAD_FORMAT,
        version: 1,
        published_ms: now,
        pods: addrs
            .iter()
            .map(|a| PodLoad {
                addr: a.to_string(),
                role: Role::Aggregated,
                pool: String::new(),
                metrics_at_ms: now,
                failing: false,
                metrics: PodMetrics {
                    block_size: Some(16),
                    num_gpu_blocks: Some(1024),
                    ..PodMetrics::default()
                },
                served: Vec::new(),
                serves: Vec::new(),
                locality: None,
                restarts: 0,
                seats: None,
                late: false,
                ejected_until_ms: 0,
            })
            .collect(),
    }
}

fn primary(d: &Decision) -> String {
    match d {
        Decision::Route { ranked, .. } => ranked[0].addr.clone(),
        Decision::NoEndpoint(r) => panic!("{r:?}"),
    }
}

fn chat(system: &str, user: &str) -> RequestView {
    let body = serde_json::json!({"model":"m","messages":[{"role":"system","content":system},{"role":"user","content":user}]});
    parse(Endpoint::ChatCompletions, body.to_string().as_bytes()).unwrap()
}

#[test]
fn a_shared_prefix_follows_the_first_choice() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1", "c:1", "d:1"], 100));
    let system = "You are a helpful assistant. ".repeat(100);
    let first = Blocks::of(&cfg.block, &chat(&system, "question one"), None);
    let d = r.route(
        &cfg,
        "m",
        &[Role::Aggregated],
        &first,
        Hints::default(),
        100,
    );
    let pod = primary(&d);
    r.affinity.observe(&Observation {
        addr: pod.clone(),
        hashes: first.hashes.clone(),
    });
    // The chosen pod is now a little busier than the others; the prefix keeps it first.
    let mut busier = table(&["a:1", "b:1", "c:1", "d:1"], 100);
    busier
        .pods
        .iter_mut()
        .find(|p| p.addr == pod)
        .unwrap()
        .metrics
        .running = 4.0;
    r.apply_load_table(&cfg, busier);
    let mut followed = 0;
    for i in 0..20 {
        let b = Blocks::of(
            &cfg.block,
            &chat(&system, &format!("another question {i}")),
            None,
        );
        if primary(&r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100)) == pod {
            followed += 1;
        }
    }
    // Without the observation the same load sends it elsewhere.
    let mut fresh = Router::new();
    let mut busier = table(&["a:1", "b:1", "c:1", "d:1"], 100);
    busier
        .pods
        .iter_mut()
        .find(|p| p.addr == pod)
        .unwrap()
        .metrics
        .running = 4.0;
    fresh.apply_load_table(&cfg, busier);
    assert_ne!(
        primary(&fresh.route(
            &cfg,
            "m",
            &[Role::Aggregated],
            &first,
            Hints::default(),
            100
        )),
        pod
    );
    assert_eq!(followed, 20);
}

#[test]
fn removed_pods_leave_the_index_and_stale_tables_still_route() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: vec![1, 2, 3],
    });
    assert_eq!(r.affinity.index_entries(), 3);
    r.apply_load_table(&cfg, table(&["b:1"], 100));
    assert_eq!(r.affinity.index_entries(), 0);
    assert_eq!(r.affinity.slot_of("a:1"), None);
    let b = Blocks::of(&cfg.block, &chat("x", "y"), None);
    let late = 100 + cfg.stale_after_ms + 1;
    let plan = r.plan(&cfg, "m", &b, Hints::default(), late);
    assert_eq!(
        primary(&plan.decision),
        "b:1",
        "stale metrics are not a dead pod"
    );
    assert!(
        plan.observer_suspect,
        "every pod is stale: the observer is suspect"
    );
    let mut failing = table(&["b:1"], 100);
    failing.pods[0].failing = true;
    r.apply_load_table(&cfg, failing);
    assert_eq!(
        r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100),
        Decision::NoEndpoint(crate::scheduler::Rejection::NoneHealthy)
    );
}

#[test]
fn snapshot_reproduces_the_index() {
    let cfg = Config::default();
    let mut a = Router::new();
    a.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    a.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: vec![1, 2, 3],
    });
    a.affinity.observe(&Observation {
        addr: "b:1".into(),
        hashes: vec![1, 9],
    });
    let mut b = Router::new();
    b.apply_load_table(&cfg, table(&["b:1", "a:1"], 100));
    b.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: vec![77],
    });
    b.affinity.load_snapshot(&a.affinity.snapshot(5));
    assert_eq!(b.affinity.applied_page, 5);
    assert_eq!(
        b.affinity.index().match_lengths(&[1, 2, 3], 64)[b.affinity.slot_of("a:1").unwrap()],
        3
    );
    assert_eq!(
        b.affinity.index().match_lengths(&[1, 9], 64)[b.affinity.slot_of("b:1").unwrap()],
        2
    );
    assert_eq!(
        b.affinity.index().match_lengths(&[77], 64)[b.affinity.slot_of("a:1").unwrap()],
        0
    );
    assert_eq!(
        a.affinity
            .index()
            .slot_blocks_oldest_first(a.affinity.slot_of("a:1").unwrap()),
        b.affinity
            .index()
            .slot_blocks_oldest_first(b.affinity.slot_of("a:1").unwrap())
    );
}

#[test]
fn other_vms_work_counts_as_soon_as_the_board_is_read() {
    use crate::work::Board;
    let cfg = Config::default();
    let (mut vm1, mut vm2) = (Router::new(), Router::new());
    for r in [&mut vm1, &mut vm2] {
        r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    }
    let mut board = Board::default();
    vm1.work.inflight_start("a:1");
    vm1.work.inflight_start("a:1");
    let first = FirstToken {
        addr: "a:1".into(),
        uncached_tokens: 3000.0,
        prompt_tokens: 0.0,
        held_prefix: 0,
        tokens: 3000.0,
        decoding: 0.0,
        predicted_ms: 100.0,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    };
    let id = vm1.work.prefill_start(&first, 100, None);
    board.put_row(1, 100, &vm1.work.own_work(), 3000);
    vm2.work.inflight_start("a:1");
    vm2.work.set_others_work(board.others(2, 100, 3000), 100);
    let w = vm2.work.of("a:1");
    assert_eq!(
        (w.inflight, w.prefill_tokens, w.prefill_requests),
        (3, 3000, 1)
    );
    assert_eq!(vm2.work.of("b:1"), PodWork::default());
    // The other VM's queued prefill makes a new prompt cheaper on the idle pod.
    let b = Blocks::of(&cfg.block, &chat("fresh", "prompt"), None);
    assert_eq!(
        primary(&vm2.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100)),
        "b:1"
    );
    assert!(vm1.work.prefill_done(id, 150));
    assert!(!vm1.work.prefill_done(id, 150), "done once");
    vm1.work.inflight_end("a:1");
    vm1.work.inflight_end("a:1");
    assert!(
        vm1.work.own_work().is_empty(),
        "finished requests leave the row"
    );
}

#[test]
fn a_prefill_queued_behind_another_vms_starts_when_that_one_ends() {
    use crate::work::Board;
    let cfg = Config::default();
    let (mut vm1, mut vm2) = (Router::new(), Router::new());
    for r in [&mut vm1, &mut vm2] {
        r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    }
    let long = |tokens: f64| FirstToken {
        addr: "a:1".into(),
        uncached_tokens: tokens,
        prompt_tokens: 0.0,
        held_prefix: 0,
        tokens,
        decoding: 0.0,
        predicted_ms: 4000.0,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    };
    let mut board = Board::default();
    // vm1's prompt is computed first; vm2's, routed a little later, waits behind it.
    let first = vm1.work.prefill_start(&long(9000.0), 1000, Some(60_000));
    board.put_row(1, 1000, &vm1.work.own_work(), 60_000);
    let second = vm2.work.prefill_start(&long(8000.0), 1200, Some(60_000));
    assert!(!vm2
        .work
        .set_others_work(board.others(2, 1200, 60_000), 1200));
    board.put_row(2, 1200, &vm2.work.own_work(), 60_000);
    // Work stays queued: vm2 reads the board again, nothing moved.
    assert!(!vm2
        .work
        .set_others_work(board.others(2, 3000, 60_000), 3000));
    assert_eq!(
        vm2.work.of("a:1").head_since_ms,
        1000,
        "vm1's prompt is the head"
    );
    // vm1's prompt ends at 5000; vm2 reads the board at 5010.
    assert!(vm1.work.prefill_done(first, 5000));
    board.put_row(1, 5000, &vm1.work.own_work(), 60_000);
    assert!(
        vm2.work
            .set_others_work(board.others(2, 5010, 60_000), 5010),
        "vm2's row changed"
    );
    let w = vm2.work.of("a:1");
    assert_eq!((w.head_since_ms, w.head_tokens), (5010, 8000));
    // Computing since 5010, not since it was routed at 1200 (at the prior's 40 µs per token it
    // would be long done): 100 ms later most of it is still ahead.
    let cost = vm2.costs.cost_of(&cfg.costs(), "a:1");
    let ahead = w.prefill_tokens as f64 - crate::scheduler::predict::head_progress(&w, &cost, 5110);
    assert!(ahead > 5000.0, "{ahead} tokens still ahead");
    // A prefill routed by another VM is not an end.
    let behind = vm1.work.prefill_start(&long(500.0), 5020, Some(60_000));
    board.put_row(1, 5020, &vm1.work.own_work(), 60_000);
    assert!(!vm1
        .work
        .set_others_work(board.others(1, 5020, 60_000), 5020));
    assert!(!vm2
        .work
        .set_others_work(board.others(2, 5030, 60_000), 5030));
    // vm2's prompt ends; vm1's moves on, and vm1 moving on (its start, not its tokens) does not
    // echo back to a prefill vm2 routed meanwhile.
    assert!(vm2.work.prefill_done(second, 8000));
    vm2.work.prefill_start(&long(700.0), 8005, Some(60_000));
    board.put_row(2, 8005, &vm2.work.own_work(), 60_000);
    assert!(vm1
        .work
        .set_others_work(board.others(1, 8010, 60_000), 8010));
    board.put_row(1, 8010, &vm1.work.own_work(), 60_000);
    assert_eq!(
        vm1.work.of("a:1").head_since_ms,
        8005,
        "vm2's new one is older"
    );
    assert!(!vm2
        .work
        .set_others_work(board.others(2, 8020, 60_000), 8020));
    let own = vm2.work.own_work();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].1.head_since_ms, 8005);
    assert!(vm1.work.prefill_done(behind, 9000));
}

#[test]
fn a_reported_miss_trims_what_the_pod_evidently_lost() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    let older = Blocks::of(&cfg.block, &chat(&"older tenant ".repeat(200), "q"), None);
    let newer = Blocks::of(&cfg.block, &chat(&"newer tenant ".repeat(200), "q"), None);
    for b in [&older, &newer] {
        r.affinity.observe(&Observation {
            addr: "a:1".into(),
            hashes: b.hashes.clone(),
        });
    }
    let slot = r.affinity.slot_of("a:1").unwrap();
    let matched = r.affinity.index().match_lengths(&newer.hashes, 64)[slot];
    let expected = r.affinity.expect_cache("a:1", &newer, matched).unwrap();
    assert_eq!(expected.matched_blocks, newer.hashes.len());
    assert!(
        r.affinity.expect_cache("b:1", &newer, 0).is_none(),
        "b holds nothing"
    );
    // Routing observes the prompt again (the pod recomputes it) ...
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: newer.hashes.clone(),
    });
    // ... a report that matches changes nothing ...
    let prompt = newer.prompt_tokens;
    assert_eq!(
        r.affinity.on_cache_report(&expected, prompt - 10, prompt),
        CacheVerdict::Confirmed
    );
    assert_eq!(
        r.affinity.index().match_lengths(&older.hashes, 64)[slot],
        older.hashes.len()
    );
    // ... but "nothing cached" means the pod's LRU dropped the newer prompt, so the older one
    // is surely gone too; what was touched since (this request's own blocks) stays.
    let CacheVerdict::Evicted { kept, lost } = r.affinity.on_cache_report(&expected, 0, prompt)
    else {
        panic!("not detected")
    };
    assert_eq!(kept, newer.hashes.len() as u32);
    let mut lost_sorted = lost.clone();
    lost_sorted.sort();
    let mut older_sorted = older.hashes.clone();
    older_sorted.sort();
    older_sorted.dedup();
    assert_eq!(
        lost_sorted, older_sorted,
        "exactly the older prompt's blocks"
    );
    assert_eq!(r.affinity.index().match_lengths(&older.hashes, 64)[slot], 0);
    assert_eq!(
        r.affinity.index().match_lengths(&newer.hashes, 64)[slot],
        newer.hashes.len()
    );
    // The pod is not taken to have shrunk: the next table leaves its capacity as reported, and
    // the older prompt, routed there again, is held whole beside the newer one.
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: older.hashes.clone(),
    });
    assert_eq!(
        r.affinity.index().blocks_held(slot),
        older.hashes.len() + newer.hashes.len()
    );
}

#[test]
fn a_restarted_pods_prefix_entries_are_dropped_when_the_table_says_so() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    let prompt = Blocks::of(&cfg.block, &chat(&"tenant ".repeat(200), "q"), None);
    for addr in ["a:1", "b:1"] {
        r.affinity.observe(&Observation {
            addr: addr.into(),
            hashes: prompt.hashes.clone(),
        });
    }
    let held = |r: &Router, addr: &str| {
        let slot = r.affinity.slot_of(addr).unwrap();
        r.affinity.index().match_lengths(&prompt.hashes, 64)[slot]
    };
    let whole = prompt.hashes.len();
    // The same count again: nothing dropped.
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 200));
    assert_eq!((held(&r, "a:1"), held(&r, "b:1")), (whole, whole));
    // a restarted: its entries go at once, b's stay.
    let mut restarted = table(&["a:1", "b:1"], 300);
    restarted.pods[0].restarts = 1;
    r.apply_load_table(&cfg, restarted.clone());
    assert_eq!((held(&r, "a:1"), held(&r, "b:1")), (0, whole));
    // Relearned by routing, and kept while the count stays.
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: prompt.hashes.clone(),
    });
    r.apply_load_table(&cfg, restarted);
    assert_eq!(held(&r, "a:1"), whole);
}

/// The restart is seen a poll after it happened: a prompt this VM routed to the new process in
/// between is being computed there, so it stays held, whether the index was told of it again or
/// not, and is told to the other VMs; one routed before the start is former, also where another
/// VM's routing of it arrived here after the start.
#[test]
fn a_prompt_routed_to_a_restarted_pod_after_its_new_process_started_stays_held() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1"], 100));
    let before = Blocks::of(&cfg.block, &chat(&"first tenant ".repeat(200), "q"), None);
    let after = Blocks::of(&cfg.block, &chat(&"second tenant ".repeat(200), "q"), None);
    let observe_at = |r: &mut Router, now_ms: u64, blocks: &Blocks| {
        r.affinity.set_clock(now_ms);
        r.affinity.observe_routed(&Observation {
            addr: "a:1".into(),
            hashes: blocks.hashes.clone(),
        });
    };
    // Routed again while held, not observed again (`RecentTouches`): before and after the start.
    let third = Blocks::of(&cfg.block, &chat(&"third tenant ".repeat(200), "q"), None);
    observe_at(&mut r, 999_000, &third);
    observe_at(&mut r, 1_000_000, &before);
    r.affinity.set_clock(1_000_200);
    r.affinity.note_routing("a:1", &before.hashes);
    // Another VM's routing from before the start, arriving from a page after it.
    let late = Blocks::of(&cfg.block, &chat(&"fourth tenant ".repeat(200), "q"), None);
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: late.hashes.clone(),
    });
    observe_at(&mut r, 1_001_000, &after);
    r.affinity.set_clock(1_001_200);
    r.affinity.note_routing("a:1", &third.hashes);
    let mut restarted = table(&["a:1"], 300);
    restarted.pods[0].restarts = 1;
    restarted.pods[0].metrics.started_at = Some(1_000.5);
    let told = r.apply_load_table(&cfg, restarted);
    let told: Vec<&[u64]> = told.iter().map(|o| o.hashes.as_slice()).collect();
    assert_eq!(
        told,
        [&after.hashes[..], &third.hashes[..]],
        "told to the other VMs"
    );
    let slot = r.affinity.slot_of("a:1").unwrap();
    let held = |b: &Blocks| r.affinity.index().match_lengths(&b.hashes, 64)[slot];
    let former = |b: &Blocks| r.affinity.index().former_lengths(&b.hashes, 64)[slot];
    assert_eq!(held(&after), after.hashes.len());
    assert_eq!(held(&third), third.hashes.len(), "routed after the start");
    assert_eq!((held(&before), former(&before)), (0, before.hashes.len()));
    assert_eq!((held(&late), former(&late)), (0, late.hashes.len()));
}

/// Restarting every pod empties every cache, not the pool's partition of prompts: each prompt
/// goes back to the pod that held it (a recompute there as anywhere, not a hit), where without
/// the restarted pods' former blocks it went wherever a new prompt would.
#[test]
fn after_the_whole_pool_restarts_each_prompt_is_recomputed_at_its_old_home() {
    let cfg = Config::default();
    let addrs = ["a:1", "b:1", "c:1"];
    let fresh = {
        let mut r = Router::new();
        r.apply_load_table(&cfg, table(&addrs, 100));
        r
    };
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&addrs, 100));
    let prompts: Vec<Blocks> = (0..12)
        .map(|t| {
            Blocks::of(
                &cfg.block,
                &chat(&format!("tenant {t} ").repeat(200), "q"),
                None,
            )
        })
        .collect();
    let route = |r: &Router, prompt: &Blocks, now: u64| {
        r.route(
            &cfg,
            "m",
            &[Role::Aggregated],
            prompt,
            Hints::default(),
            now,
        )
    };
    // Each prompt lives on a pod other than the one a new prompt would go to.
    let mut homes = Vec::new();
    for prompt in &prompts {
        let new_home = primary(&route(&fresh, prompt, 100));
        let home = addrs.iter().find(|a| **a != new_home).unwrap().to_string();
        r.affinity.observe(&Observation {
            addr: home.clone(),
            hashes: prompt.hashes.clone(),
        });
        homes.push((home, new_home));
    }
    let mut restarted = table(&addrs, 200);
    for pod in &mut restarted.pods {
        pod.restarts = 1;
    }
    r.apply_load_table(&cfg, restarted);
    for (prompt, (home, new_home)) in prompts.iter().zip(&homes) {
        let d = route(&r, prompt, 200);
        let Decision::Route { ranked, .. } = &d else {
            panic!("{d:?}")
        };
        assert_eq!(&ranked[0].addr, home, "not {new_home}: {d:?}");
        assert_eq!(ranked[0].matched_blocks, 0, "a recompute, not a hit");
        assert_eq!(ranked[0].former_blocks, prompt.hashes.len());
    }
    // Without them (the same index, its pods left and listed again) each goes where a new one
    // would.
    r.apply_load_table(&cfg, table(&[], 300));
    r.apply_load_table(&cfg, table(&addrs, 300));
    for (prompt, (_, new_home)) in prompts.iter().zip(&homes) {
        assert_eq!(&primary(&route(&r, prompt, 300)), new_home);
    }
}

#[test]
fn the_head_of_a_pods_queue_counts_less_as_the_pod_works_on_it() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1"], 100));
    let first = |tokens: f64| FirstToken {
        addr: "a:1".into(),
        uncached_tokens: tokens,
        prompt_tokens: 0.0,
        held_prefix: 0,
        tokens,
        decoding: 0.0,
        predicted_ms: 1e6,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    };
    let head = r.work.prefill_start(&first(4000.0), 1000, None);
    r.work.prefill_start(&first(2000.0), 1500, None);
    let w = r.work.of("a:1");
    assert_eq!(
        (w.prefill_tokens, w.head_since_ms, w.head_tokens),
        (6000, 1000, 4000)
    );
    let cost = r.costs.cost_of(&cfg.costs(), "a:1");
    let per_ms = 1e3 / cost.us_per_token;
    let at = |ms: f64| 1000 + (cost.overhead_ms + ms) as u64;
    assert_eq!(head_progress(&w, &cost, 1000), 0.0, "nothing done at once");
    let half = head_progress(&w, &cost, at(2000.0 / per_ms));
    assert!((half - 2000.0).abs() < per_ms + 1.0, "{half}");
    assert_eq!(
        head_progress(&w, &cost, at(1e7)),
        4000.0,
        "at most the whole head"
    );
    // The next prefill becomes the head when the first ends, computing only since then.
    assert!(r.work.prefill_done(head, 9000));
    let w = r.work.of("a:1");
    assert_eq!((w.head_since_ms, w.head_tokens), (9000, 2000));
    assert_eq!(head_progress(&w, &cost, 9000), 0.0);
}

#[test]
fn an_unseen_prefill_expires_and_the_pool_is_bounded() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1"], 100));
    let first = FirstToken {
        addr: "a:1".into(),
        uncached_tokens: 10.0,
        prompt_tokens: 0.0,
        held_prefix: 0,
        tokens: 10.0,
        decoding: 0.0,
        predicted_ms: 100.0,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    };
    r.work.prefill_start(&first, 1000, None);
    assert!(!r.work.expire_prefills(1000 + 200));
    assert!(
        r.work.expire_prefills(1000 + 251),
        "2 × 100 ms + 50 ms margin"
    );
    // A streamed response shows its first byte at the first token: it stays queued until its
    // first-byte deadline, however low the prediction ran.
    r.work.prefill_start(&first, 1000, Some(5000));
    assert!(!r.work.expire_prefills(1000 + 4999));
    assert!(r.work.expire_prefills(1000 + 5000));
    for _ in 0..MAX_PENDING + 10 {
        r.work.prefill_start(&first, 1000, None);
    }
    assert_eq!(r.work.pending_prefills(), MAX_PENDING);
}

/// A hit routed to a pod that restarted before it got there is a recompute: once the table shows
/// the restart, the board counts the whole prompt of the first request queued for each prefix, on
/// that pod only.
#[test]
fn a_restart_makes_the_hits_queued_on_the_pod_whole_prompts() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    let hit = |addr: &str, held_prefix: u64| FirstToken {
        addr: addr.into(),
        uncached_tokens: 40.0,
        prompt_tokens: 6000.0,
        held_prefix,
        tokens: 40.0,
        decoding: 0.0,
        predicted_ms: 20.0,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    };
    r.work.prefill_start(&hit("a:1", 7), 1000, Some(60_000));
    // Behind it, the same prefix (it hits what the first computes) and another one.
    r.work.prefill_start(&hit("a:1", 7), 1000, Some(60_000));
    r.work.prefill_start(&hit("a:1", 8), 1000, Some(60_000));
    r.work.prefill_start(&hit("b:1", 7), 1000, Some(60_000));
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 200));
    assert_eq!(
        r.work.of("a:1").prefill_tokens,
        120,
        "no restart, no change"
    );
    let mut restarted = table(&["a:1", "b:1"], 300);
    restarted.pods[0].restarts = 1;
    r.apply_load_table(&cfg, restarted);
    assert_eq!(r.work.of("a:1").prefill_tokens, 6000 + 40 + 6000);
    assert_eq!(r.work.of("b:1").prefill_tokens, 40);
}

#[test]
fn a_slow_pod_is_learned_and_gets_less_work() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["fast:1", "slow:1"], 100));
    // Samples as the board gives them: the request's own tokens plus a queue ahead that varies.
    for i in 0..40 {
        let tokens = 500.0 + 800.0 * f64::from(i % 10);
        for (addr, us) in [("fast:1", 20.0), ("slow:1", 40.0)] {
            let first = FirstToken {
                addr: addr.into(),
                uncached_tokens: tokens,
                prompt_tokens: 0.0,
                held_prefix: 0,
                tokens,
                decoding: 0.0,
                predicted_ms: 0.0,
                adapter_load_ms: 0.0,
                warm_load_ms: 0.0,
            };
            r.costs.learn(&cfg.costs(), &first, 2.0 + us * tokens / 1e3);
        }
    }
    let fast = r.costs.cost_of(&cfg.costs(), "fast:1");
    let slow = r.costs.cost_of(&cfg.costs(), "slow:1");
    assert!(
        (slow.us_per_token / fast.us_per_token - 2.0).abs() < 0.2,
        "{fast:?} {slow:?}"
    );
    // Queue equal work on both: new prompts keep choosing the fast pod until its queue is
    // about twice the slow one's.
    let mut queued = [0u64; 2];
    for i in 0..30 {
        let b = Blocks::of(
            &cfg.block,
            &chat(&format!("unique {i} "), &"w ".repeat(1000)),
            None,
        );
        let pod = primary(&r.route(&cfg, "m", &[Role::Aggregated], &b, Hints::default(), 100));
        let first = FirstToken {
            addr: pod.clone(),
            uncached_tokens: b.prompt_tokens as f64,
            prompt_tokens: 0.0,
            held_prefix: 0,
            tokens: 0.0,
            decoding: 0.0,
            predicted_ms: 1e9,
            adapter_load_ms: 0.0,
            warm_load_ms: 0.0,
        };
        r.work.prefill_start(&first, 100, None);
        queued[usize::from(pod == "slow:1")] += 1;
    }
    assert!(
        queued[0] >= 18 && queued[0] <= 22,
        "fast pod took about two thirds: {queued:?}"
    );
}

#[test]
fn identical_pods_whose_queues_are_known_roughly_are_predicted_alike() {
    // Three identical pods (3 ms + 20 µs per token + 0.1 ms per decoding sequence), but the
    // gateway knows the work queued ahead only roughly: ± 3,000 tokens (a poll's age, the head's
    // progress), and one time in five a request that has already started is still counted whole.
    // A fit per pod let each pod's intercept and slope wander apart on such samples (here up to
    // 1.20× apart), so equal pods were ranked apart; one fit for the role and a speed per pod keep
    // them within 1.10×.
    let cfg = Config::default();
    let mut r = Router::new();
    let pods = ["a:1", "b:1", "c:1"];
    r.apply_load_table(&cfg, table(&pods, 100));
    let mut x = 7u64;
    let mut next = |modulo: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % modulo
    };
    let mut widest = 1.0f64;
    for round in 0..300 {
        for addr in pods {
            let own = 4000.0 + next(2000) as f64;
            let ahead = next(3) as f64 * 5000.0;
            let phantom = if next(5) == 0 { 5000.0 } else { 0.0 };
            let seen_ahead = (ahead + phantom + next(6000) as f64 - 3000.0).max(0.0);
            let decoding = next(12) as f64;
            let first = FirstToken {
                addr: addr.into(),
                uncached_tokens: own,
                prompt_tokens: 0.0,
                held_prefix: 0,
                tokens: seen_ahead + own,
                decoding,
                predicted_ms: 0.0,
                adapter_load_ms: 0.0,
                warm_load_ms: 0.0,
            };
            r.costs.learn(
                &cfg.costs(),
                &first,
                3.0 + 0.020 * (ahead + own) + 0.1 * decoding,
            );
        }
        if round < 50 {
            continue;
        }
        for (tokens, decoding) in [(5000.0, 2.0), (5000.0, 10.0), (15000.0, 6.0)] {
            let predicted: Vec<f64> = pods
                .iter()
                .map(|a| {
                    r.costs
                        .cost_of(&cfg.costs(), a)
                        .predict_ms(tokens, decoding)
                })
                .collect();
            let (lo, hi) = predicted
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(*p), hi.max(*p)));
            widest = widest.max(hi / lo);
        }
    }
    assert!(widest < 1.15, "equal pods predicted {widest:.3}× apart");
}

#[test]
fn an_observation_travels_from_one_vm_to_another() {
    use crate::state::messages::Message;
    let cfg = Config::default();
    let (mut w1, mut leader, mut w2) = (Router::new(), Router::new(), Router::new());
    for r in [&mut w1, &mut leader, &mut w2] {
        r.apply_load_table(&cfg, table(&["a:1", "b:1", "c:1", "d:1"], 100));
    }
    let blocks = Blocks::of(&cfg.block, &chat(&"word ".repeat(5000), "q"), None);
    let o = Observation {
        addr: "c:1".into(),
        hashes: blocks.hashes.clone(),
    };
    w1.affinity.observe(&o);
    let msg = Message::Observation {
        vm: 1,
        observation: o,
    }
    .encode();
    let Some(Message::Observation { observation, .. }) = Message::decode(&msg) else {
        panic!()
    };
    leader.affinity.observe(&observation);
    let page = Page {
        seq: 1,
        observations: vec![observation],
        evictions: vec![],
        from_peer: false,
    }
    .encode();
    w2.affinity.apply_page(&Page::decode(&page).unwrap());
    let slot = w2.affinity.slot_of("c:1").unwrap();
    assert_eq!(
        w2.affinity.index().match_lengths(&blocks.hashes, 64)[slot],
        blocks.hashes.len()
    );
    assert_eq!(
        primary(&w2.route(
            &cfg,
            "m",
            &[Role::Aggregated],
            &blocks,
            Hints::default(),
            100
        )),
        "c:1"
    );
}

/// One token per word (the tiktoken-mode test's tokenizer).
#[cfg(feature = "tiktoken")]
struct Words;
#[cfg(feature = "tiktoken")]
impl Tokenizer for Words {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.split_whitespace().map(|w| w.len() as u32).collect()
    }
}

#[test]
#[cfg(feature = "tiktoken")]
fn tiktoken_mode_uses_the_tokenizer() {
    let mut cfg = Config::default();
    cfg.block.scheme = BlockScheme::Tiktoken(crate::common::Encoding::Cl100kBase);
    let v = chat(&"word ".repeat(64), "q");
    let b = Blocks::of(&cfg.block, &v, Some(&Words));
    assert_eq!(b.prompt_tokens, 65);
    assert_eq!(b.hashes.len(), 4);
    // Without a tokenizer it falls back to characters rather than failing.
    let c = Blocks::of(&cfg.block, &v, None);
    assert_eq!(c.hashes.len(), v.prompt.len() / 64);
}

#[test]
fn a_pool_of_512_pods_is_indexed_whole_within_the_index_budget() {
    let cfg = Config {
        max_index_blocks: 512 * 512,
        ..Config::default()
    };
    let addrs: Vec<String> = (0..512)
        .map(|i| format!("10.1.{}.{}:8000", i / 250, i % 250))
        .collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&refs, 100));
    let mut slots: Vec<usize> = refs
        .iter()
        .map(|a| r.affinity.slot_of(a).unwrap())
        .collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 512, "every pod has its own slot");
    // Each pod reports 1,024 blocks; the budget caps each to its share, 512.
    let share = cfg.max_index_blocks as usize / 512;
    let pod = refs[300];
    let hashes: Vec<u64> = (1..=(share as u64 + 500)).collect();
    r.affinity.observe(&Observation {
        addr: pod.into(),
        hashes: hashes.clone(),
    });
    assert_eq!(
        r.affinity
            .index()
            .blocks_held(r.affinity.slot_of(pod).unwrap()),
        share
    );
    // A prompt held by pod 300 (beyond the first 64) goes there.
    let held = Blocks::of(
        &cfg.block,
        &chat(&"shared system prompt ".repeat(300), "q"),
        None,
    );
    r.affinity.observe(&Observation {
        addr: pod.into(),
        hashes: held.hashes.clone(),
    });
    let d = r.route(&cfg, "m", &[Role::Aggregated], &held, Hints::default(), 100);
    assert_eq!(primary(&d), pod);
    // Half the pods leave and come back: slots are reused, none is shared.
    r.apply_load_table(&cfg, table(&refs[..256], 200));
    r.apply_load_table(&cfg, table(&refs, 300));
    let mut again: Vec<usize> = refs
        .iter()
        .map(|a| r.affinity.slot_of(a).unwrap())
        .collect();
    again.sort_unstable();
    again.dedup();
    assert_eq!(again.len(), 512);
}

#[test]
fn equal_pods_share_their_roles_speed_from_each_first_byte() {
    let cfg = Config::default();
    let mut r = Router::new();
    r.apply_load_table(&cfg, table(&["a:1", "b:1"], 100));
    // Equal pods, first tokens with a wide spread (as short prompts' are): each pod's own mean
    // moves with its luck.
    let mut seed = 7u64;
    for _ in 0..60 {
        for addr in ["a:1", "b:1"] {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = ((seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 1.4;
            let first = FirstToken {
                addr: addr.into(),
                uncached_tokens: 2000.0,
                prompt_tokens: 0.0,
                held_prefix: 0,
                tokens: 2000.0,
                decoding: 0.0,
                predicted_ms: 0.0,
                adapter_load_ms: 0.0,
                warm_load_ms: 0.0,
            };
            r.costs
                .learn(&cfg.costs(), &first, (2.0 + 0.03 * 2000.0) * noise.exp());
        }
    }
    let (a, b) = (
        r.costs.speed_of("a:1").unwrap(),
        r.costs.speed_of("b:1").unwrap(),
    );
    let own = (a.factor() / b.factor()).ln().abs();
    let shared = (r.costs.cost_of(&cfg.costs(), "a:1").us_per_token
        / r.costs.cost_of(&cfg.costs(), "b:1").us_per_token)
        .ln()
        .abs();
    assert!(own > 0.02, "the pods' own means differ by luck: {own}");
    assert!(shared < own / 4.0, "shared {shared} against own {own}");
    // What the first bytes moved one at a time is what a pass over the pods gives.
    let whole = r.costs.role_speed_sums_of(Role::Aggregated).speeds();
    for speed in [&a, &b] {
        let (moved, taken) = (
            r.costs.role_speeds_of(Role::Aggregated).factor(speed),
            whole.factor(speed),
        );
        assert!((moved - taken).abs() < 1e-9, "{moved} against {taken}");
    }
}

/// An adapter's requests stay on the pod that loaded it while its queue is short, and load it on
/// another pod once waiting there is longer than a load; with loads not priced they go to the
/// idler pod at once.
#[test]
fn an_adapter_stays_where_it_is_loaded_until_the_queue_outweighs_a_load() {
    let with_adapter = |waiting_on_a: f64| {
        let mut t = table(&["a:1", "b:1"], 100);
        for p in &mut t.pods {
            p.served = vec![crate::pod::models::ServedModel {
                id: "sql-lora".into(),
                parent: Some("m".into()),
                root: None,
                max_model_len: None,
            }];
        }
        t.pods[0].metrics.waiting = waiting_on_a;
        t
    };
    let route = |r: &Router, cfg: &Config, i: usize| {
        let view = chat("", &format!("question {i} about the tables"));
        let b = Blocks::of(&cfg.block, &view, None);
        primary(&r.route(
            cfg,
            "sql-lora",
            &[Role::Aggregated],
            &b,
            Hints::default(),
            100,
        ))
    };
    let mut cfg = Config::default();
    cfg.adapters.load_ms = 200.0;
    let mut r = Router::new();
    r.apply_load_table(&cfg, with_adapter(0.0));
    assert_eq!(r.adapter_of("sql-lora"), Some("sql-lora"));
    assert_eq!(r.adapter_of("m"), None);
    r.affinity.observe(&Observation {
        addr: "a:1".into(),
        hashes: vec![crate::adapters::adapter_block("sql-lora")],
    });
    // a loaded it; one request waiting there (about 20 ms of work) is cheaper than a load.
    r.apply_load_table(&cfg, with_adapter(1.0));
    assert!((0..10).all(|i| route(&r, &cfg, i) == "a:1"));
    // Forty waiting (about 800 ms) are not.
    r.apply_load_table(&cfg, with_adapter(40.0));
    assert!((0..10).all(|i| route(&r, &cfg, i) == "b:1"));
    // Unpriced, the single waiting request already sends it to b.
    cfg.adapters.price_loads = false;
    r.apply_load_table(&cfg, with_adapter(1.0));
    assert!((0..10).all(|i| route(&r, &cfg, i) == "b:1"));
}

/// With a host-memory tier, a prefix aged out of a pod's GPU is still held there, loaded instead
/// of recomputed: that pod ranks after one holding it in its GPU and before an idle pod without
/// it. Without the tier the index forgets it with the GPU and the two pods look alike.
#[test]
fn a_warm_tier_hit_beats_recomputing_but_loses_to_a_gpu_hit() {
    let prompt: Vec<u64> = (0..100).map(|i| 7_000 + i).collect();
    let blocks = Blocks {
        hashes: prompt.clone(),
        affinity_key: prompt[0],
        prompt_tokens: 1600,
    };
    let ranking = |cfg: &Config| {
        let mut r = Router::new();
        r.apply_load_table(cfg, table(&["a:1", "b:1", "c:1"], 100));
        let observe = |r: &mut Router, addr: &str, hashes: Vec<u64>| {
            r.affinity.observe(&Observation {
                addr: addr.into(),
                hashes,
            })
        };
        observe(&mut r, "a:1", prompt.clone());
        // 2,000 other blocks on a: the prompt ages out of its 1,024-block GPU.
        for k in 0..20u64 {
            observe(
                &mut r,
                "a:1",
                (0..100).map(|i| 1_000_000 * (k + 1) + i).collect(),
            );
        }
        observe(&mut r, "b:1", prompt.clone());
        match r.route(
            cfg,
            "m",
            &[Role::Aggregated],
            &blocks,
            Hints::default(),
            100,
        ) {
            Decision::Route { ranked, .. } => ranked
                .iter()
                .map(|c| (c.addr.clone(), c.matched_blocks, c.prediction.warm_load_ms))
                .collect::<Vec<_>>(),
            Decision::NoEndpoint(r) => panic!("{r:?}"),
        }
    };
    let cfg = Config {
        kv_tiers: vec![crate::affinity::tiers::KvTier {
            name: "host".into(),
            capacity_tokens: 64_000,
            load_us_per_token: 2.6,
        }],
        ..Config::default()
    };
    let tiered = ranking(&cfg);
    assert_eq!(tiered[0], ("b:1".to_string(), 100, 0.0), "{tiered:?}");
    assert_eq!(tiered[1].0, "a:1", "{tiered:?}");
    assert_eq!(tiered[1].1, 100, "held, in host memory: {tiered:?}");
    assert!(
        (tiered[1].2 - 1600.0 * 2.6 / 1e3).abs() < 1e-6,
        "{tiered:?}"
    );
    assert_eq!(tiered[2].0, "c:1", "{tiered:?}");
    let gpu_only = ranking(&Config::default());
    assert_eq!(gpu_only[0].0, "b:1");
    assert!(
        gpu_only
            .iter()
            .all(|(addr, matched, _)| addr == "b:1" || *matched == 0),
        "the GPU-only index forgot it on a: {gpu_only:?}"
    );
}
