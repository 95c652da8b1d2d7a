use super::*;
use crate::config::Config;
use crate::scheduler::picker::RouteReason;

fn pod(addr: &'static str) -> PodView<'static> {
    PodView {
        addr,
        role: Role::Aggregated,
        health: crate::health::Health::Fresh,
        waiting: 0.0,
        running: 0.0,
        kv_usage: 0.0,
        seats: None,
        seat_hold_ms: None,
        inflight: 0.0,
        queued_tokens: 0.0,
        queued_requests: 0.0,
        ours_at_poll: Default::default(),
        cost: crate::cost::Coefficients::default(),
        ttft_scale: 1.0,
        error_band: 0.0,
        itl_ms: None,
        models: &[],
        matched_blocks: 0,
        former_blocks: 0,
        adapter_load_ms: 0.0,
        adapter_reload_ms: 0.0,
        warm_load_ms: 0.0,
    }
}

fn request(hashes: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        roles: &[Role::Aggregated],
        block_hashes: hashes,
        prompt_tokens: hashes.len() as u64 * 16,
        tokens_per_block: 16,
        affinity_key: hashes.first().copied().unwrap_or(7),
        typical_tokens: 512.0,
        hints: Hints::default(),
    }
}

fn primary(d: &Decision) -> &str {
    match d {
        Decision::Route { ranked, .. } => &ranked[0].addr,
        Decision::NoEndpoint(r) => panic!("no endpoint: {r:?}"),
    }
}

const ADDRS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];

#[test]
fn the_pod_holding_the_prefix_wins() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[2].matched_blocks = 90;
    pods[2].running = 2.0; // a little busier, still wins on prefix
    let hashes: Vec<u64> = (1..=100).collect();
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[2]);
    assert!(matches!(
        d,
        Decision::Route {
            reason: RouteReason::PrefixHit,
            ..
        }
    ));
}

#[test]
fn a_new_prefix_goes_where_rendezvous_says_and_spreads() {
    let cfg = Config::default();
    let pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let mut counts = [0usize; 4];
    for key in 0..400u64 {
        let hashes = [key.wrapping_mul(0x9E37_79B9_7F4A_7C15)];
        let first = decide(&cfg.selection(), &pods, &request(&hashes));
        let again = decide(&cfg.selection(), &pods, &request(&hashes));
        assert_eq!(primary(&first), primary(&again), "deterministic");
        assert!(matches!(
            first,
            Decision::Route {
                reason: RouteReason::Load,
                ..
            }
        ));
        let i = ADDRS.iter().position(|a| *a == primary(&first)).unwrap();
        counts[i] += 1;
    }
    for c in counts {
        assert!((60..=140).contains(&c), "spread over the pool: {counts:?}");
    }
}

#[test]
fn behind_a_prefix_every_pod_holds_ties_spread_by_what_follows_it() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    for p in &mut pods {
        p.matched_blocks = 50; // the shared tools prefix
    }
    let mut counts = [0usize; 4];
    for call in 0..400u64 {
        let mut hashes: Vec<u64> = (1..=50).collect();
        hashes.extend((0..50).map(|i| (call * 100 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let d = decide(&cfg.selection(), &pods, &request(&hashes));
        let i = ADDRS.iter().position(|a| *a == primary(&d)).unwrap();
        counts[i] += 1;
    }
    for c in counts {
        assert!((60..=140).contains(&c), "spread over the pool: {counts:?}");
    }
}

#[test]
fn new_prompts_that_open_alike_spread_though_one_pod_holds_the_opening() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    // Pod 1 served a first tenant: it holds the opening every tenant's prompt shares (a chat
    // template and `You are the support assistant of`), two blocks of about four hundred.
    pods[1].matched_blocks = 2;
    let mut counts = [0usize; 4];
    for tenant in 0..400u64 {
        let mut hashes: Vec<u64> = vec![1, 2];
        hashes.extend((0..400).map(|i| (tenant * 1000 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let d = decide(&cfg.selection(), &pods, &request(&hashes));
        assert_eq!(
            primary(&d),
            primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
            "a tenant's pod is stable"
        );
        let i = ADDRS.iter().position(|a| *a == primary(&d)).unwrap();
        counts[i] += 1;
    }
    for c in counts {
        assert!((60..=140).contains(&c), "spread over the pool: {counts:?}");
    }
}

#[test]
fn a_holder_queued_behind_prefill_work_is_priced_not_guarded() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=400).collect(); // 6,400 tokens, all held by pod 0
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 400;
    // Ten requests wait on pod 0, two of them whole prompts: prefill work the prediction sees,
    // less than recomputing 6,400 tokens elsewhere with the pool this busy.
    pods[0].queued_requests = 10.0;
    pods[0].inflight = 10.0;
    pods[0].queued_tokens = 13_000.0;
    for p in &mut pods[1..] {
        p.queued_requests = 1.0;
        p.inflight = 1.0;
        p.queued_tokens = 6_400.0;
    }
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[0]);
    // The same count of requests carrying little prefill: with no seat cap configured, every
    // request queued on a pod waits only for the prefill ahead of it, which the prediction prices.
    pods[0].queued_tokens = 500.0;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[0]);
    let Decision::Route { ranked, .. } = d else {
        unreachable!()
    };
    assert!(ranked.iter().all(|c| !c.guarded), "{ranked:?}");
}

#[test]
fn a_holder_with_every_seat_taken_is_guarded_though_its_queue_is_prefill_work() {
    let mut cfg = Config::default();
    let hashes: Vec<u64> = (1..=400).collect();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 400;
    pods[0].queued_requests = 10.0;
    pods[0].inflight = 10.0;
    pods[0].queued_tokens = 13_000.0;
    for p in &mut pods[1..] {
        p.queued_requests = 1.0;
        p.inflight = 1.0;
        p.queued_tokens = 6_400.0;
    }
    // Ten requests on a pod that runs twelve at once: the queue is the prefill it shows.
    cfg.overload_guard.max_running = Some(12);
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // Four at once: six of the ten wait for a decode to end, which no prefill term shows.
    cfg.overload_guard.max_running = Some(4);
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // Unconfigured, the cap its polls showed (`crate::pod::seats`) guards it alike, and the
    // configured one goes before it.
    cfg.overload_guard.max_running = None;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    pods[0].seats = Some(4);
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    cfg.overload_guard.max_running = Some(12);
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
}

#[test]
fn a_hot_prefix_spills_to_one_pod_not_to_all() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    // Pod 0 holds the tenant's 100-block prompt but is far behind; the others are idle and cold.
    pods[0].matched_blocks = 100;
    pods[0].queued_tokens = 50_000.0;
    pods[0].queued_requests = 3.0;
    pods[0].inflight = 3.0;
    let mut spilled_to = std::collections::HashSet::new();
    for question in 0..50u64 {
        let mut hashes: Vec<u64> = (1..=100).collect();
        hashes.extend((0..5).map(|i| (question * 10 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let d = decide(&cfg.selection(), &pods, &request(&hashes));
        assert_ne!(primary(&d), ADDRS[0]);
        spilled_to.insert(primary(&d).to_string());
    }
    assert_eq!(spilled_to.len(), 1, "one second home: {spilled_to:?}");
}

#[test]
fn the_holder_keeps_a_prefix_until_recomputing_it_elsewhere_is_faster() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=100).collect(); // 1,600 tokens
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 100;
    // Waiting behind 1,000 queued tokens beats recomputing 1,600 elsewhere ...
    pods[0].queued_tokens = 1000.0;
    pods[0].queued_requests = 2.0;
    pods[0].inflight = 2.0;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // ... waiting behind 5,000 does not: the prefix is replicated to another pod.
    pods[0].queued_tokens = 5000.0;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_ne!(primary(&d), ADDRS[0]);
    let Decision::Route { ranked, reason } = d else {
        unreachable!()
    };
    assert_eq!(reason, RouteReason::Load);
    assert_eq!(ranked.len(), 3, "primary plus two fallbacks");
    assert!(ranked[0].prediction.ttft_ms < 210.0 - 1.0);
}

#[test]
fn a_faster_pod_gets_the_request_a_slower_one_would_finish_later() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=200).collect();
    let mut pods: Vec<PodView> = ADDRS.iter().take(2).map(|a| pod(a)).collect();
    pods[1].cost.us_per_token *= 2.0;
    // The fast pod has a queue as long as this prompt, the slow one none: still equal-ish? No:
    // fast = 10 + 0.04 × 6400 = 266 ms, slow = 10 + 0.08 × 3200 = 266 ms. One token less ahead
    // on the fast pod tips it.
    pods[0].queued_tokens = 3199.0;
    pods[0].queued_requests = 1.0;
    pods[0].inflight = 1.0;
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &request(&hashes)) else {
        panic!()
    };
    assert!(
        (ranked[0].prediction.ttft_ms - ranked[1].prediction.ttft_ms).abs() < 1.0,
        "{ranked:?}"
    );
    pods[0].queued_tokens = 6000.0;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[1]
    );
}

#[test]
fn a_buried_pod_at_its_seat_cap_is_guarded_whatever_its_prefix() {
    let mut cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 100;
    pods[0].running = 32.0;
    pods[0].waiting = 10.0;
    pods[0].queued_requests = 10.0;
    pods[1].running = 1.0;
    let hashes: Vec<u64> = (1..=100).collect();
    // Without the engine's seat cap the ten waiting requests are prefill work, priced: the
    // holder of the whole prompt keeps it.
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[0]);
    // At a cap of 32 running, they wait for decodes to end, which no prefill term shows.
    cfg.overload_guard.max_running = Some(32);
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    let Decision::Route { ranked, .. } = d else {
        unreachable!()
    };
    assert_ne!(ranked[0].addr, ADDRS[0]);
    assert!(!ranked[0].guarded);
    // Within the gap the prefix holds.
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 100;
    pods[0].running = 6.0;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
}

#[test]
fn in_flight_work_steers_before_metrics_catch_up() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let hashes = [42u64];
    let first = primary(&decide(&cfg.selection(), &pods, &request(&hashes))).to_string();
    let i = ADDRS.iter().position(|a| *a == first).unwrap();
    pods[i].inflight = 1.0;
    pods[i].queued_requests = 1.0;
    pods[i].queued_tokens = 2000.0;
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        first
    );
    // Requests decoding there (past their first byte) count too, beyond the load slack.
    pods[i].queued_requests = 0.0;
    pods[i].queued_tokens = 0.0;
    pods[i].inflight = 3.0;
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        first
    );
}

#[test]
fn an_evicted_adapters_reload_is_the_pools_cost_not_this_requests_first_token() {
    let hashes: Vec<u64> = (1..=10).collect();
    let r = request(&hashes);
    let mut p = pod(ADDRS[0]);
    p.matched_blocks = 10;
    p.waiting = 3.0;
    p.adapter_load_ms = 40.0;
    let free_slot = predict::with_added_wait(predict::predict(&p, &r), &p, 0.0);
    p.adapter_reload_ms = 40.0;
    let full = predict::with_added_wait(predict::predict(&p, &r), &p, 0.0);
    // The request waits for its own load either way.
    assert_eq!(full.ttft_ms, free_slot.ttft_ms);
    assert_eq!(full.adapter_load_ms, 40.0);
    // The reload is paid by the evicted adapter's next request and the three queued behind it.
    assert_eq!(
        full.pool_cost_ms() - free_slot.pool_cost_ms(),
        40.0 * (1.0 + 3.0)
    );
}

#[test]
fn other_replicas_waiting_requests_count_at_the_typical_size() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=10).collect();
    let mut pods: Vec<PodView> = ADDRS.iter().take(2).map(|a| pod(a)).collect();
    pods[0].matched_blocks = 10;
    pods[0].waiting = 4.0; // none of them ours
    let r = request(&hashes);
    let p = predict::predict(&pods[0], &r);
    assert_eq!(p.tokens_ahead, 4.0 * 512.0);
    assert_eq!(p.uncached_tokens, 0.0);
    assert_eq!(primary(&decide(&cfg.selection(), &pods, &r)), ADDRS[1]);
    // Waiting requests the board accounts for are not counted twice.
    pods[0].queued_requests = 4.0;
    pods[0].queued_tokens = 100.0;
    pods[0].inflight = 4.0;
    assert_eq!(predict::predict(&pods[0], &r).tokens_ahead, 100.0);
    assert_eq!(predict::predict(&pods[0], &r).decoding, 0.0);
    // A poll older than the board: our four have started (the board knows, the poll does not),
    // and the pod holds nothing we did not send, so nothing is waiting unseen.
    pods[0].queued_requests = 0.0;
    pods[0].queued_tokens = 0.0;
    pods[0].running = 6.0;
    pods[0].inflight = 10.0;
    assert_eq!(predict::predict(&pods[0], &r).tokens_ahead, 0.0);
    // Two requests beyond ours: at most two of the waiting ones are another gateway's.
    pods[0].inflight = 8.0;
    assert_eq!(predict::predict(&pods[0], &r).tokens_ahead, 2.0 * 512.0);
}

#[test]
fn our_requests_that_finished_since_the_poll_are_not_another_gateways() {
    // The real-Envoy case: a pod runs three streams another client sent it directly; our request
    // was waiting there when the leader polled, and had finished before the next request came.
    // The page still says one waiting, the board none.
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=10).collect();
    let r = request(&hashes);
    let mut pods: Vec<PodView> = ADDRS.iter().take(2).map(|a| pod(a)).collect();
    pods[0].matched_blocks = 10;
    pods[0].waiting = 1.0;
    pods[0].running = 3.0;
    let r_big = RouteRequest {
        typical_tokens: 8000.0,
        ..r.clone()
    };
    assert_eq!(
        predict::predict(&pods[0], &r_big).tokens_ahead,
        8000.0,
        "without the share, the finished request is someone else's"
    );
    assert_eq!(primary(&decide(&cfg.selection(), &pods, &r_big)), ADDRS[1]);
    pods[0].ours_at_poll = crate::pod::prom::GatewayShare {
        prefilling: 1.0,
        inflight: 1.0,
    };
    assert_eq!(predict::predict(&pods[0], &r_big).tokens_ahead, 0.0);
    assert_eq!(primary(&decide(&cfg.selection(), &pods, &r_big)), ADDRS[0]);
    // Another gateway's waiting request beside ours still counts, once.
    pods[0].waiting = 2.0;
    assert_eq!(predict::predict(&pods[0], &r).tokens_ahead, 512.0);
    // Ours routed since the poll are on the board, not on the page: the larger count is used.
    pods[0].queued_requests = 2.0;
    pods[0].queued_tokens = 300.0;
    pods[0].inflight = 2.0;
    assert_eq!(predict::predict(&pods[0], &r).tokens_ahead, 300.0);
}

#[test]
fn filters_explain_why_nothing_is_routable() {
    let cfg = Config::default();
    let hashes = [1u64];
    assert_eq!(
        decide(&cfg.selection(), &[], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoPods)
    );
    let mut down = pod(ADDRS[0]);
    down.health = crate::health::Health::Down;
    assert_eq!(
        decide(&cfg.selection(), &[down.clone()], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoneHealthy)
    );
    let mut stale = down.clone();
    stale.health = crate::health::Health::Stale;
    assert!(
        matches!(
            decide(&cfg.selection(), &[stale], &request(&hashes)),
            Decision::Route { .. }
        ),
        "a pod whose polls are late still serves"
    );
    static OTHER: [String; 0] = [];
    let models = vec!["other".to_string()];
    let mut wrong_model = pod(ADDRS[1]);
    wrong_model.models = Box::leak(models.into_boxed_slice());
    assert_eq!(
        decide(&cfg.selection(), &[wrong_model.clone()], &request(&hashes)),
        Decision::NoEndpoint(Rejection::UnknownModel)
    );
    let nameless = RouteRequest {
        model: "",
        ..request(&hashes)
    };
    assert_eq!(
        primary(&decide(
            &cfg.selection(),
            &[down.clone(), wrong_model.clone()],
            &nameless
        )),
        ADDRS[1],
        "a request naming no model (SGLang's /generate) may go to any healthy pod"
    );
    let mut prefill = pod(ADDRS[2]);
    prefill.role = Role::Prefill;
    assert_eq!(
        decide(&cfg.selection(), &[prefill], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoPods)
    );
    let mut unknown_models = pod(ADDRS[3]);
    unknown_models.models = &OTHER;
    assert_eq!(
        primary(&decide(
            &cfg.selection(),
            &[down, wrong_model, unknown_models],
            &request(&hashes)
        )),
        ADDRS[3]
    );
}

#[test]
fn predictions_grow_with_every_term_and_survive_garbage() {
    let hashes: Vec<u64> = (1..=10).collect();
    let r = request(&hashes);
    let base = predict::predict(&pod(ADDRS[0]), &r).ttft_ms;
    let mut p = pod(ADDRS[0]);
    p.queued_tokens = 10.0;
    assert!(predict::predict(&p, &r).ttft_ms > base);
    let mut p = pod(ADDRS[0]);
    p.running = 4.0;
    assert!(predict::predict(&p, &r).ttft_ms > base);
    let mut p = pod(ADDRS[0]);
    p.matched_blocks = 5;
    assert!(predict::predict(&p, &r).ttft_ms < base);
    p.matched_blocks = 500; // claims more than the prompt
    assert_eq!(predict::predict(&p, &r).uncached_tokens, 0.0);
    let mut p = pod(ADDRS[0]);
    p.waiting = -3.0;
    p.queued_tokens = -1.0;
    assert_eq!(predict::predict(&p, &r).ttft_ms, base);
}

#[test]
fn a_new_prefix_ignores_load_noise_within_the_slack() {
    let cfg = Config::default();
    let hashes = [0xfeed_u64];
    let idle: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let choice = primary(&decide(&cfg.selection(), &idle, &request(&hashes))).to_string();
    // Another replica sees the chosen pod one request busier (a stale poll): same choice.
    let mut noisy = idle.clone();
    let i = ADDRS.iter().position(|a| *a == choice).unwrap();
    noisy[i].running = 1.0;
    noisy[(i + 1) % 4].kv_usage = 0.3;
    assert_eq!(
        primary(&decide(&cfg.selection(), &noisy, &request(&hashes))),
        choice
    );
    // Beyond the slack, load wins.
    noisy[i].running = 3.0;
    assert_ne!(
        primary(&decide(&cfg.selection(), &noisy, &request(&hashes))),
        choice
    );
}

fn with_hints<'a>(hashes: &'a [u64], session: Option<&str>, priority: i32) -> RouteRequest<'a> {
    RouteRequest {
        hints: Hints {
            session: session.map(session::session_key),
            priority,
            slo: Default::default(),
            stored_at: None,
        },
        ..request(hashes)
    }
}

#[test]
fn a_fast_pod_running_many_streams_is_not_guarded_against_a_slow_idle_one() {
    // One pod half as fast runs few streams; the fast ones run many but admit new work at once.
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    for p in pods.iter_mut() {
        p.running = 19.0;
        p.inflight = 19.0;
    }
    pods[3].running = 5.0;
    pods[3].inflight = 5.0;
    pods[3].cost.us_per_token *= 2.0;
    pods[3].cost.overhead_ms *= 2.0;
    let hashes: Vec<u64> = (1..=200).collect();
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &request(&hashes)) else {
        unreachable!()
    };
    assert_ne!(ranked[0].addr, ADDRS[3], "{ranked:?}");
    assert!(ranked.iter().all(|c| !c.guarded), "{ranked:?}");
    // The same fast pods at their seat cap, requests piling up unstarted: guarded.
    let mut cfg = cfg;
    cfg.overload_guard.max_running = Some(19);
    for p in pods.iter_mut().take(3) {
        p.waiting = 12.0;
    }
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[3]
    );
}

#[test]
fn a_session_sticks_to_one_pod_over_prefix_and_load_until_it_is_overloaded() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let pinned = primary(&decide(
        &cfg.selection(),
        &pods,
        &with_hints(&[1, 2], Some("chat-42"), 0),
    ))
    .to_string();
    let reason = match decide(
        &cfg.selection(),
        &pods,
        &with_hints(&[1, 2], Some("chat-42"), 0),
    ) {
        Decision::Route { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(reason, RouteReason::Session);
    // Another pod holds the whole prompt and the pinned one is busier: the session still wins.
    let other = ADDRS.iter().position(|a| *a != pinned).unwrap();
    let me = ADDRS.iter().position(|a| *a == pinned).unwrap();
    pods[other].matched_blocks = 2;
    pods[me].running = 6.0;
    for hashes in [[1u64, 2], [9, 10]] {
        assert_eq!(
            primary(&decide(
                &cfg.selection(),
                &pods,
                &with_hints(&hashes, Some("chat-42"), 0)
            )),
            pinned
        );
    }
    // Without a session the prefix decides.
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&[1, 2]))),
        ADDRS[other]
    );
    // Many streams but nothing waiting: the pod admits at once, and the pin stands.
    pods[me].running = 20.0;
    assert_eq!(
        primary(&decide(
            &cfg.selection(),
            &pods,
            &with_hints(&[1, 2], Some("chat-42"), 0)
        )),
        pinned
    );
    // Overloaded (requests waiting beyond the guard): the pin yields to the prediction.
    pods[me].waiting = 20.0;
    assert_ne!(
        primary(&decide(
            &cfg.selection(),
            &pods,
            &with_hints(&[1, 2], Some("chat-42"), 0)
        )),
        pinned
    );
    // Far slower than the best pod (a long queue of prefill work): the pin yields too.
    pods[me].waiting = 0.0;
    pods[me].running = 1.0;
    pods[me].inflight = 1.0;
    pods[me].queued_requests = 1.0;
    pods[me].queued_tokens = 20_000.0;
    assert_ne!(
        primary(&decide(
            &cfg.selection(),
            &pods,
            &with_hints(&[1, 2], Some("chat-42"), 0)
        )),
        pinned
    );
    pods[me].inflight = 0.0;
    pods[me].queued_requests = 0.0;
    pods[me].queued_tokens = 0.0;
    // A dead pinned pod: its sessions move, and only its sessions.
    pods[me].running = 0.0;
    let sessions: Vec<String> = (0..64).map(|i| format!("s{i}")).collect();
    let before: Vec<String> = sessions
        .iter()
        .map(|id| {
            primary(&decide(
                &cfg.selection(),
                &pods,
                &with_hints(&[5], Some(id), 0),
            ))
            .to_string()
        })
        .collect();
    pods[me].health = crate::health::Health::Down;
    for (id, was) in sessions.iter().zip(&before) {
        let now = primary(&decide(
            &cfg.selection(),
            &pods,
            &with_hints(&[5], Some(id), 0),
        ))
        .to_string();
        if *was != pinned {
            assert_eq!(&now, was, "session {id} moved although its pod is alive");
        } else {
            assert_ne!(now, pinned);
        }
    }
}

#[test]
fn negative_priority_is_shed_only_when_every_candidate_is_saturated() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    for p in &mut pods {
        p.waiting = 6.0;
    }
    pods[3].waiting = 1.0;
    pods[3].kv_usage = 0.5;
    assert_eq!(
        primary(&decide(
            &cfg.selection(),
            &pods,
            &with_hints(&[1], None, -1)
        )),
        ADDRS[3]
    );
    pods[3].kv_usage = 0.85;
    assert_eq!(
        decide(&cfg.selection(), &pods, &with_hints(&[1], None, -1)),
        Decision::NoEndpoint(Rejection::Saturated)
    );
    for priority in [0, 5] {
        assert!(matches!(
            decide(&cfg.selection(), &pods, &with_hints(&[1], None, priority)),
            Decision::Route { .. }
        ));
    }
}

#[test]
fn objectives_prefer_a_cache_hit_that_meets_them_and_shed_only_negative_priorities() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=100).collect(); // 1,600 tokens
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    // Pod 0 holds the prompt but has work queued; the others are idle and cold.
    pods[0].matched_blocks = 100;
    pods[0].queued_tokens = 2500.0;
    pods[0].queued_requests = 1.0;
    pods[0].inflight = 1.0;
    let slo = |ttft: f64, priority: i32| RouteRequest {
        hints: Hints {
            slo: slo::Slo {
                ttft_ms: Some(ttft),
                tpot_ms: None,
            },
            priority,
            session: None,
            stored_at: None,
        },
        ..request(&hashes)
    };
    // Without an objective the fastest wins: cold idle pods (74 ms) beat the holder (110 ms).
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // A loose objective both meet: the cache hit, which saves the pool 1,600 tokens of prefill.
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &slo(200.0, 0)) else {
        panic!()
    };
    assert_eq!(ranked[0].addr, ADDRS[0]);
    assert_eq!(ranked[0].meets_slo, Some(true));
    // A tight one only the idle pods meet.
    assert_ne!(
        primary(&decide(&cfg.selection(), &pods, &slo(90.0, 0))),
        ADDRS[0]
    );
    // One nobody meets: the fastest, flagged; with a negative priority, shed.
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &slo(5.0, 0)) else {
        panic!()
    };
    assert_eq!(ranked[0].meets_slo, Some(false));
    assert_eq!(
        decide(&cfg.selection(), &pods, &slo(5.0, -1)),
        Decision::NoEndpoint(Rejection::SloUnattainable)
    );
    // The per-token objective uses the pods' observed inter-token latency.
    for p in pods.iter_mut().skip(1) {
        p.itl_ms = Some(50.0);
    }
    let tpot = RouteRequest {
        hints: Hints {
            slo: slo::Slo {
                ttft_ms: None,
                tpot_ms: Some(30.0),
            },
            ..Hints::default()
        },
        ..request(&hashes)
    };
    assert_eq!(primary(&decide(&cfg.selection(), &pods, &tpot)), ADDRS[0]);
}

/// The thrashing the greedy objective fell into (12 tenants × 6,000-token prompts near
/// saturation): every pod has a queue; the holder's is longer because its prefix is popular. A
/// 7,000-token recompute elsewhere is sooner for this request, but it adds 7,000 tokens of work
/// that the requests queued there wait behind: the pool pays more than the request gains.
#[test]
fn under_load_a_recompute_pays_for_the_wait_it_adds_and_the_holder_keeps_its_prefix() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=456).collect(); // 7,296 tokens
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    for p in &mut pods {
        p.queued_tokens = 20_000.0;
        p.queued_requests = 4.0;
        p.inflight = 4.0;
    }
    pods[0].matched_blocks = 437; // the tenant's 7,000-token system prompt
    pods[0].queued_tokens = 30_000.0;
    pods[0].queued_requests = 5.0;
    pods[0].inflight = 5.0;
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &request(&hashes)) else {
        panic!()
    };
    assert_eq!(ranked[0].addr, ADDRS[0], "{ranked:?}");
    let elsewhere = &ranked[1].prediction;
    assert!(
        elsewhere.ttft_ms < ranked[0].prediction.ttft_ms,
        "the move is sooner for the request itself: {ranked:?}"
    );
    assert!(elsewhere.added_wait_ms > 4.0 * 7000.0 * 0.04 * 0.99);
    // One pod idle for the moment in the busy pool: the next arrivals go there, so its recompute
    // delays them by the pool's mean queue (3.25): 302 ms of its own + 949 ms added. The holder,
    // 1.3 s behind, keeps the prefix although the idle pod is 4× sooner for this request ...
    pods[3].queued_tokens = 0.0;
    pods[3].queued_requests = 0.0;
    pods[3].inflight = 0.0;
    pods[0].queued_tokens = 25_000.0;
    let Decision::Route { ranked, .. } = decide(&cfg.selection(), &pods, &request(&hashes)) else {
        panic!()
    };
    assert_eq!(ranked[0].addr, ADDRS[0], "{ranked:?}");
    assert!(ranked[1].prediction.ttft_ms * 3.0 < ranked[0].prediction.ttft_ms);
    // ... and spills once its queue is longer than the recompute's cost to the pool.
    pods[0].queued_tokens = 40_000.0;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[3]
    );
}

/// A move off the pod holding the prompt must win by more than the predictions' error band;
/// within it the prefix stays, beyond it the request moves. A pod holding a few leading blocks
/// gets a share of the band, not all of it.
#[test]
fn a_holder_is_left_only_for_a_gain_wider_than_the_prediction_error() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=100).collect(); // 1,600 tokens
    let mut pods: Vec<PodView> = ADDRS.iter().take(2).map(|a| pod(a)).collect();
    for p in &mut pods {
        p.error_band = 0.2; // ±22%
    }
    pods[0].matched_blocks = 100;
    // Holder: 10 + 0.04 × (1,800 ahead + 0) = 82 ms; the other: 10 + 0.04 × 1,600 = 74 ms.
    // Without the band the other pod is 10% sooner (beyond the 5% tie band) and wins. (The
    // holder's queue is the head of a prefill already running: nobody waits, so the added wait
    // is nothing on either pod and the band alone decides.)
    pods[0].queued_tokens = 1800.0;
    let mut no_band = pods.clone();
    for p in &mut no_band {
        p.error_band = 0.0;
    }
    assert_eq!(
        primary(&decide(&cfg.selection(), &no_band, &request(&hashes))),
        ADDRS[1]
    );
    // The holder adds no work (it holds the whole prompt): 82 × e^-0.2 = 67 ms against 74: it
    // stays.
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // Twice that queue (154 ms against 74): beyond any band, it moves.
    pods[0].queued_tokens = 3600.0;
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[1]
    );
    // A pod holding 5 of the 100 blocks gets 5% of the band: at the same 82 ms (280 tokens ahead
    // + its 1,520 uncached) it is left for the 74 ms pod.
    pods[0].matched_blocks = 5;
    pods[0].queued_tokens = 280.0;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    let Decision::Route { ranked, .. } = &d else {
        panic!()
    };
    assert!((ranked[1].prediction.ttft_ms - 82.0).abs() < 0.01, "{d:?}");
    assert_eq!(ranked[1].prediction.added_wait_ms, 0.0);
    assert_eq!(primary(&d), ADDRS[1], "{d:?}");
}

/// A restarted pod keeps the affinity floor for the prompts it held: the prediction
/// prices the recompute there as anywhere, but the prompt moves off its old home only for a gain
/// wider than the band, so a restart of the pool does not reshuffle which pod serves what.
#[test]
fn a_prompts_old_home_keeps_it_after_a_restart_unless_another_pod_is_clearly_sooner() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=100).collect(); // 1,600 tokens, held nowhere now
    let mut pods: Vec<PodView> = ADDRS.iter().take(2).map(|a| pod(a)).collect();
    for p in &mut pods {
        p.error_band = 0.2;
    }
    // The old home: 10 + 0.04 × (200 ahead + 1,600) = 82 ms; the other pod 74 ms (10% sooner).
    pods[0].queued_tokens = 200.0;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[1], "without a former home: {d:?}");
    pods[0].former_blocks = 100;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[0], "82 × e^-0.2 = 67 against 74: {d:?}");
    let Decision::Route { ranked, reason } = &d else {
        panic!()
    };
    assert_eq!(*reason, RouteReason::Load, "not a hit");
    assert_eq!(
        ranked[0].prediction.uncached_tokens, 1600.0,
        "priced as a recompute"
    );
    // Twice as far behind (146 ms against 74): beyond the band, it moves.
    pods[0].queued_tokens = 1800.0;
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[1], "{d:?}");
}

#[test]
fn a_request_waits_for_a_seat_on_a_pod_whose_seats_are_taken() {
    let cfg = Config::default();
    let hashes: Vec<u64> = (1..=100).collect();
    let mut pods: Vec<PodView> = ADDRS[..2].iter().map(|a| pod(a)).collect();
    // Pod 0 holds the prompt and runs its 8 seats full with 6 more waiting for one (within the
    // overload guard's gap); pod 1 runs 4 of its 8.
    pods[0].matched_blocks = 100;
    pods[0].running = 8.0;
    pods[0].waiting = 6.0;
    pods[1].running = 4.0;
    for p in &mut pods {
        p.seats = Some(8);
    }
    // Unknown how long a request holds a seat: the prompt's holder, as before.
    assert_eq!(
        primary(&decide(&cfg.selection(), &pods, &request(&hashes))),
        ADDRS[0]
    );
    // Seven seats must free before it gets one, one every 4 s ÷ 8: 3.5 s, against recomputing
    // 1,600 tokens where a seat is free.
    for p in &mut pods {
        p.seat_hold_ms = Some(4000.0);
    }
    let d = decide(&cfg.selection(), &pods, &request(&hashes));
    assert_eq!(primary(&d), ADDRS[1]);
    let Decision::Route { ranked, .. } = d else {
        unreachable!()
    };
    assert_eq!(ranked[0].prediction.seat_wait_ms, 0.0);
    assert!(
        (ranked[1].prediction.seat_wait_ms - 3500.0).abs() < 1e-9,
        "{ranked:?}"
    );
}
