use super::*;
use crate::config::Config;
use crate::scheduler::picker::RouteReason;

fn pod(addr: &'static str) -> PodView<'static> {
    PodView {
        addr,
        role: Role::Aggregated,
        fresh: true,
        waiting: 0.0,
        running: 0.0,
        kv_usage: 0.0,
        inflight: 0.0,
        models: &[],
        matched_blocks: 0,
    }
}

fn request(hashes: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        roles: &[Role::Aggregated],
        block_hashes: hashes,
        affinity_key: hashes.first().copied().unwrap_or(7),
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
    let d = decide(&cfg, &pods, &request(&hashes));
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
        let first = decide(&cfg, &pods, &request(&hashes));
        let again = decide(&cfg, &pods, &request(&hashes));
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
fn a_buried_pod_loses_its_affinity() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 100;
    pods[0].running = 32.0;
    pods[0].waiting = 10.0;
    pods[1].running = 1.0;
    let hashes: Vec<u64> = (1..=100).collect();
    let d = decide(&cfg, &pods, &request(&hashes));
    assert_ne!(primary(&d), ADDRS[0]);
    let Decision::Route { ranked, reason } = d else {
        unreachable!()
    };
    assert_eq!(reason, RouteReason::Load);
    assert_eq!(ranked.len(), 3, "primary plus two fallbacks");
    // Within the gap the affinity holds.
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].matched_blocks = 100;
    pods[0].running = 6.0;
    assert_eq!(primary(&decide(&cfg, &pods, &request(&hashes))), ADDRS[0]);
}

#[test]
fn in_flight_counts_steer_before_metrics_catch_up() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let hashes = [42u64];
    let first = primary(&decide(&cfg, &pods, &request(&hashes))).to_string();
    let i = ADDRS.iter().position(|a| *a == first).unwrap();
    pods[i].inflight = 3.0;
    assert_ne!(primary(&decide(&cfg, &pods, &request(&hashes))), first);
}

#[test]
fn filters_explain_why_nothing_is_routable() {
    let cfg = Config::default();
    let hashes = [1u64];
    assert_eq!(
        decide(&cfg, &[], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoPods)
    );
    let mut stale = pod(ADDRS[0]);
    stale.fresh = false;
    assert_eq!(
        decide(&cfg, &[stale.clone()], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoneHealthy)
    );
    static OTHER: [String; 0] = [];
    let models = vec!["other".to_string()];
    let mut wrong_model = pod(ADDRS[1]);
    wrong_model.models = Box::leak(models.into_boxed_slice());
    assert_eq!(
        decide(&cfg, &[wrong_model.clone()], &request(&hashes)),
        Decision::NoEndpoint(Rejection::UnknownModel)
    );
    let mut prefill = pod(ADDRS[2]);
    prefill.role = Role::Prefill;
    assert_eq!(
        decide(&cfg, &[prefill], &request(&hashes)),
        Decision::NoEndpoint(Rejection::NoPods)
    );
    let mut unknown_models = pod(ADDRS[3]);
    unknown_models.models = &OTHER;
    assert_eq!(
        primary(&decide(
            &cfg,
            &[stale, wrong_model, unknown_models],
            &request(&hashes)
        )),
        ADDRS[3]
    );
}

#[test]
fn scores_stay_in_unit_range() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    pods[0].kv_usage = 3.0;
    pods[1].matched_blocks = 500;
    pods[2].inflight = 9.0;
    let hashes: Vec<u64> = (1..=10).collect();
    let candidates: Vec<&PodView> = pods.iter().collect();
    for s in scorers::score(&cfg, &candidates, hashes.len()) {
        for v in [s.prefix, s.queue, s.kv_cache, s.inflight, s.total] {
            assert!((0.0..=1.0).contains(&v), "{s:?}");
        }
    }
}

#[test]
fn a_new_prefix_ignores_load_noise_within_the_slack() {
    let cfg = Config::default();
    let hashes = [0xfeed_u64];
    let idle: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let choice = primary(&decide(&cfg, &idle, &request(&hashes))).to_string();
    // Another replica sees the chosen pod one request busier (a stale poll): same choice.
    let mut noisy = idle.clone();
    let i = ADDRS.iter().position(|a| *a == choice).unwrap();
    noisy[i].running = 1.0;
    noisy[(i + 1) % 4].kv_usage = 0.3;
    assert_eq!(primary(&decide(&cfg, &noisy, &request(&hashes))), choice);
    // Beyond the slack, load wins.
    noisy[i].running = 3.0;
    assert_ne!(primary(&decide(&cfg, &noisy, &request(&hashes))), choice);
}

fn with_hints<'a>(hashes: &'a [u64], session: Option<&str>, priority: i32) -> RouteRequest<'a> {
    RouteRequest {
        hints: Hints {
            session: session.map(session::session_key),
            priority,
        },
        ..request(hashes)
    }
}

#[test]
fn a_session_sticks_to_one_pod_over_prefix_and_load_until_it_is_overloaded() {
    let cfg = Config::default();
    let mut pods: Vec<PodView> = ADDRS.iter().map(|a| pod(a)).collect();
    let pinned = primary(&decide(
        &cfg,
        &pods,
        &with_hints(&[1, 2], Some("chat-42"), 0),
    ))
    .to_string();
    let reason = match decide(&cfg, &pods, &with_hints(&[1, 2], Some("chat-42"), 0)) {
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
                &cfg,
                &pods,
                &with_hints(&hashes, Some("chat-42"), 0)
            )),
            pinned
        );
    }
    // Without a session the prefix decides.
    assert_eq!(
        primary(&decide(&cfg, &pods, &request(&[1, 2]))),
        ADDRS[other]
    );
    // Overloaded (beyond the affinity cap): the pin yields to the scores.
    pods[me].running = 20.0;
    assert_ne!(
        primary(&decide(
            &cfg,
            &pods,
            &with_hints(&[1, 2], Some("chat-42"), 0)
        )),
        pinned
    );
    // A dead pinned pod: its sessions move, and only its sessions.
    pods[me].running = 0.0;
    let sessions: Vec<String> = (0..64).map(|i| format!("s{i}")).collect();
    let before: Vec<String> = sessions
        .iter()
        .map(|id| primary(&decide(&cfg, &pods, &with_hints(&[5], Some(id), 0))).to_string())
        .collect();
    pods[me].fresh = false;
    for (id, was) in sessions.iter().zip(&before) {
        let now = primary(&decide(&cfg, &pods, &with_hints(&[5], Some(id), 0))).to_string();
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
        primary(&decide(&cfg, &pods, &with_hints(&[1], None, -1))),
        ADDRS[3]
    );
    pods[3].kv_usage = 0.85;
    assert_eq!(
        decide(&cfg, &pods, &with_hints(&[1], None, -1)),
        Decision::NoEndpoint(Rejection::Saturated)
    );
    for priority in [0, 5] {
        assert!(matches!(
            decide(&cfg, &pods, &with_hints(&[1], None, priority)),
            Decision::Route { .. }
        ));
    }
}
