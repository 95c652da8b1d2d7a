use super::*;
use crate::config::Config;

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
