use super::*;
use crate::pd::PdReason;
use crate::pod::load::PodLoad;
use crate::pod::prom::PodMetrics;
use crate::state::messages::Observation;

fn pd_config() -> Config {
    Config::parse(
        br#"{"pools":[{"name":"p","role":"prefill","endpoints":["10.0.0.1:1","10.0.0.2:1"]},
                      {"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}]}"#,
    )
    .unwrap()
}

fn router(cfg: &Config, prefill_waiting: f64) -> Router {
    router_with_streams(cfg, prefill_waiting, 0.0)
}

fn router_with_streams(cfg: &Config, prefill_waiting: f64, decode_running: f64) -> Router {
    let mut pods = Vec::new();
    for pool in &cfg.pools {
        let crate::config::Members::Static(endpoints) = &pool.members else {
            continue;
        };
        for ep in endpoints {
            pods.push(PodLoad {
                addr: ep.clone(),
                role: pool.role,
                pool: String::new(),
                metrics_at_ms: 100,
                failing: false,
                // Decode pods run their streams; only queues count as pressure.
                metrics: PodMetrics {
                    waiting: if pool.role == Role::Prefill {
                        prefill_waiting
                    } else {
                        0.0
                    },
                    running: if pool.role == Role::Decode {
                        decode_running
                    } else {
                        0.0
                    },
                    ..PodMetrics::default()
                },
                served: Vec::new(),
                serves: Vec::new(),
                locality: None,
                restarts: 0,
                seats: None,
                late: false,
                ejected_until_ms: 0,
            });
        }
    }
    let mut r = Router::new();
    r.apply_load_table(
        cfg,
        LoadTable {
            format: crate::pod::load::LOAD_FORMAT,
            version: 1,
            published_ms: 100,
            pods,
        },
    );
    r
}

fn blocks(tokens: u64) -> Blocks {
    Blocks {
        hashes: (1..=tokens / 16).collect(),
        affinity_key: 1,
        prompt_tokens: tokens,
    }
}

#[test]
fn long_uncached_prompts_get_a_prefill_pod_short_ones_do_not() {
    let cfg = pd_config();
    let r = router(&cfg, 0.0);
    let long = r.plan(&cfg, "m", &blocks(8000), Hints::default(), 100);
    let Decision::Route { ranked, .. } = &long.decision else {
        panic!()
    };
    assert_eq!(ranked[0].addr, "10.0.1.1:1", "decode pod first");
    let pd = long.pd.unwrap();
    assert_eq!(pd.outcome, PdOutcome::Disaggregated);
    assert!(pd.prefill.unwrap().addr.starts_with("10.0.0."));
    let short = r
        .plan(&cfg, "m", &blocks(100), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(short.outcome, PdOutcome::LocalCheaper);
    assert!(short.prefill.is_none());
}

#[test]
fn a_prompt_cached_on_the_decode_pod_stays_there() {
    let cfg = pd_config();
    let mut r = router(&cfg, 0.0);
    let b = blocks(8000);
    r.affinity.observe(&Observation {
        addr: "10.0.1.1:1".into(),
        hashes: b.hashes.clone(),
    });
    let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
    assert_eq!(pd.uncached_tokens, 0.0);
    assert_eq!(pd.outcome, PdOutcome::LocalCheaper);
}

#[test]
fn a_busy_prefill_pool_keeps_prefills_local_and_a_dead_one_means_decode_only() {
    let cfg = pd_config();
    let idle = router(&cfg, 0.0)
        .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(idle.outcome, PdOutcome::Disaggregated);
    // Each prefill pod reports 12 waiting requests the gateway did not send.
    let busy = router(&cfg, 12.0)
        .plan(&cfg, "m", &blocks(1000), Hints::default(), 100)
        .pd
        .unwrap();
    assert!(busy.split_cost_ms.unwrap() > idle.split_cost_ms.unwrap());
    assert_eq!(busy.outcome, PdOutcome::LocalCheaper);
    let mut dead = router(&cfg, 0.0);
    let mut table = dead.load_table().clone();
    for p in table.pods.iter_mut().filter(|p| p.role == Role::Prefill) {
        p.failing = true;
    }
    dead.apply_load_table(&cfg, table);
    let pd = dead
        .plan(&cfg, "m", &blocks(8000), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.outcome, PdOutcome::NoPrefillPod);
}

#[test]
fn a_long_prompt_beside_running_streams_is_split_but_not_on_an_idle_short_one() {
    let cfg = pd_config();
    // 20 streams decode on the decode pod: a 300-token prefill there stalls every one of them,
    // so even a short prompt is cheaper on a prefill pod ...
    let r = router_with_streams(&cfg, 0.0, 20.0);
    let pd = r
        .plan(&cfg, "m", &blocks(300), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.outcome, PdOutcome::Disaggregated, "{pd:?}");
    // ... but a handful of tokens are not worth a split's overhead ...
    let pd = r
        .plan(&cfg, "m", &blocks(16), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.outcome, PdOutcome::LocalCheaper, "{pd:?}");
    // ... and without streams to stall, 300 tokens stay local too.
    let pd = router(&cfg, 0.0)
        .plan(&cfg, "m", &blocks(300), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.outcome, PdOutcome::LocalCheaper, "{pd:?}");
}

#[test]
fn without_a_split_there_is_no_pd_plan() {
    let cfg = Config::parse(br#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1"]}]}"#).unwrap();
    let r = router(&cfg, 0.0);
    assert_eq!(
        r.plan(&cfg, "m", &blocks(8000), Hints::default(), 100).pd,
        None
    );
}

#[test]
fn a_context_only_the_decode_pod_holds_is_prefilled_there() {
    let cfg = pd_config();
    let mut r = router(&cfg, 0.0);
    let b = blocks(12_000);
    // The decode pod holds all but the last 1,000 tokens; no prefill pod holds any of it.
    let held = (12_000 - 1_000) / 16;
    r.affinity.observe(&Observation {
        addr: "10.0.1.1:1".into(),
        hashes: b.hashes[..held].to_vec(),
    });
    let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
    assert_eq!(pd.outcome, PdOutcome::LocalCheaper);
    // Once a prefill pod holds the context too, the split pays again.
    r.affinity.observe(&Observation {
        addr: "10.0.0.1:1".into(),
        hashes: b.hashes[..held].to_vec(),
    });
    let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
    assert_eq!(pd.outcome, PdOutcome::Disaggregated);
    assert_eq!(pd.prefill.unwrap().addr, "10.0.0.1:1");
}

#[test]
fn the_debug_line_lists_every_prefill_candidate_only_when_asked() {
    let cfg = pd_config();
    let r = router_with_streams(&cfg, 0.0, 20.0);
    let pd = r
        .plan(&cfg, "m", &blocks(4000), Hints::default(), 100)
        .pd
        .unwrap();
    assert!(pd.prefill_predictions.is_empty(), "{pd:?}");
    let mut debug = cfg.clone();
    debug.debug_header = true;
    let pd = r
        .plan(&debug, "m", &blocks(4000), Hints::default(), 100)
        .pd
        .unwrap();
    let listed: Vec<&str> = pd
        .prefill_predictions
        .iter()
        .map(|(a, _)| a.as_str())
        .collect();
    assert_eq!(listed.len(), 2, "both prefill pods: {pd:?}");
    assert_eq!(
        Some(listed[0]),
        pd.prefill.as_ref().map(|c| c.addr.as_str()),
        "the chosen one first"
    );
    assert_eq!(pd.split_cost_ms, Some(pd.prefill_predictions[0].1.ttft_ms));
}

#[test]
fn a_short_prompt_beside_streams_within_their_objective_stays_local() {
    let cfg = pd_config();
    // 20 streams decode on the decode pod, as in the test above that splits 300 tokens when
    // every stall counts; here the streams were timed: 25 ms between tokens.
    let mut r = router_with_streams(&cfg, 0.0, 20.0);
    r.costs.observe_itl("10.0.1.1:1", 25.0);
    let short = r
        .plan(&cfg, "m", &blocks(300), Hints::default(), 100)
        .pd
        .unwrap();
    // Within the objective the stall does not count: the decode pod answers sooner.
    assert_eq!(
        short.streams.objective_ms,
        Some(100.0),
        "4 × the pool's 25 ms"
    );
    assert_eq!(short.outcome, PdOutcome::LocalCheaper, "{short:?}");
    assert_eq!(short.reason, PdReason::WithinObjective);
    assert!(short.local_cost_ms < short.split_cost_ms.unwrap());
    // A long one stalls them past it, and goes to a prefill pod. stalls them past it, and goes to a prefill pod.
    let long = r
        .plan(&cfg, "m", &blocks(8000), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(long.outcome, PdOutcome::Disaggregated, "{long:?}");
    assert_eq!(long.reason, PdReason::Streams);
    // A request whose own objective is tighter splits the short prompt too.
    let tight = Hints {
        slo: crate::scheduler::slo::Slo {
            tpot_ms: Some(26.0),
            ..Default::default()
        },
        ..Hints::default()
    };
    let short = r.plan(&cfg, "m", &blocks(300), tight, 100).pd.unwrap();
    assert_eq!(short.streams.objective_ms, Some(26.0));
    assert_eq!(short.outcome, PdOutcome::Disaggregated, "{short:?}");
    assert_eq!(short.reason, PdReason::Streams);
}

/// Two idle prefill pods, one decode pod; `pd.topology` with the given localities.
fn topology_config(prefill_zones: [&str; 2], decode_zone: &str) -> Config {
    let text = format!(
        r#"{{"pools":[{{"name":"p","role":"prefill","endpoints":["10.0.0.1:1","10.0.0.2:1"]}},
                      {{"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}}],
            "pd":{{"topology":{{"kv_bytes_per_token":131072,"localities":{{
                "10.0.0.1:1":{{"region":"eu","zone":"{}"}},
                "10.0.0.2:1":{{"region":"eu","zone":"{}"}},
                "10.0.1.1:1":{{"region":"eu","zone":"{decode_zone}"}}}}}}}}}}"#,
        prefill_zones[0], prefill_zones[1]
    );
    Config::parse(text.as_bytes()).unwrap()
}

#[test]
fn of_two_equally_loaded_prefill_pods_the_one_in_the_decode_pods_zone_prefills() {
    for (zones, want) in [(["a", "b"], "10.0.0.1:1"), (["b", "a"], "10.0.0.2:1")] {
        let cfg = topology_config(zones, "a");
        let r = router(&cfg, 0.0);
        // Prompts of every affinity key: without the link term, rendezvous spreads them.
        for key in 1..=16u64 {
            let mut b = blocks(8000);
            b.affinity_key = key;
            b.hashes.iter_mut().for_each(|h| *h += key << 32);
            let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
            assert_eq!(pd.outcome, PdOutcome::Disaggregated, "{pd:?}");
            assert_eq!(
                pd.prefill.as_ref().unwrap().addr,
                want,
                "zones {zones:?}, key {key}"
            );
        }
    }
}

#[test]
fn a_far_prefill_pod_wins_only_when_sooner_by_more_than_the_transfer() {
    let cfg = topology_config(["a", "b"], "a");
    // Streams on the decode pod make a split worth it. The near pod's queue: 12 requests the
    // gateway did not send (their work is seconds), against 8,000 tokens over the region's
    // 25 Gb/s (0.34 s) rather than the zone's 100 (0.08 s).
    let mut r = router_with_streams(&cfg, 0.0, 20.0);
    let pd = r
        .plan(&cfg, "m", &blocks(8000), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.prefill.as_ref().unwrap().addr, "10.0.0.1:1", "{pd:?}");
    let mut table = r.load_table().clone();
    for p in table.pods.iter_mut().filter(|p| p.addr == "10.0.0.1:1") {
        p.metrics.waiting = 12.0;
    }
    r.apply_load_table(&cfg, table);
    let pd = r
        .plan(&cfg, "m", &blocks(8000), Hints::default(), 100)
        .pd
        .unwrap();
    assert_eq!(pd.prefill.as_ref().unwrap().addr, "10.0.0.2:1", "{pd:?}");
}

#[test]
fn localities_envoy_reports_are_used_and_the_split_is_priced_with_its_transfer() {
    let cfg = Config::parse(
        br#"{"pools":[{"name":"p","role":"prefill","endpoints":["10.0.0.1:1","10.0.0.2:1"]},
                      {"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}],
             "pd":{"topology":{"kv_bytes_per_token":131072}}}"#,
    )
    .unwrap();
    let off = pd_config();
    let before = router(&off, 0.0)
        .plan(&off, "m", &blocks(8000), Hints::default(), 100)
        .pd
        .unwrap();
    let mut r = router(&cfg, 0.0);
    let mut table = r.load_table().clone();
    for p in table.pods.iter_mut() {
        let zone = if p.addr == "10.0.0.2:1" { "b" } else { "a" };
        p.locality = Some(crate::pod::locality::at("eu", zone, ""));
    }
    r.apply_load_table(&cfg, table);
    for key in 1..=8u64 {
        let mut b = blocks(8000);
        b.affinity_key = key;
        let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
        assert_eq!(pd.prefill.as_ref().unwrap().addr, "10.0.0.1:1", "key {key}");
        // 8,000 tokens × 128 KiB over the zone's 100 Gb/s: 84 ms more than without topology.
        let added = pd.split_cost_ms.unwrap() - before.split_cost_ms.unwrap();
        assert!((added - 83.9).abs() < 0.5, "{added}");
    }
}

#[test]
fn the_near_prefill_pod_wins_even_where_the_picker_ranks_it_past_the_headers_few() {
    // Five idle prefill pods, one in the decode pod's zone: rendezvous alone puts it past the
    // three the header keeps for two keys in five.
    let cfg = Config::parse(
        br#"{"pools":[{"name":"p","role":"prefill","endpoints":
                ["10.0.0.1:1","10.0.0.2:1","10.0.0.3:1","10.0.0.4:1","10.0.0.5:1"]},
              {"name":"d","role":"decode","endpoints":["10.0.1.1:1"]}],
             "pd":{"topology":{"kv_bytes_per_token":131072,"localities":{
               "10.0.0.1:1":{"zone":"b"},"10.0.0.2:1":{"zone":"b"},"10.0.0.3:1":{"zone":"a"},
               "10.0.0.4:1":{"zone":"b"},"10.0.0.5:1":{"zone":"b"},"10.0.1.1:1":{"zone":"a"}}}}}"#,
    )
    .unwrap();
    let r = router(&cfg, 0.0);
    for key in 1..=20u64 {
        let mut b = blocks(8000);
        b.affinity_key = key;
        b.hashes.iter_mut().for_each(|h| *h += key << 32);
        let pd = r.plan(&cfg, "m", &b, Hints::default(), 100).pd.unwrap();
        assert_eq!(pd.prefill.as_ref().unwrap().addr, "10.0.0.3:1", "key {key}");
    }
}

#[test]
fn in_an_elastic_pool_a_pod_never_prefills_for_itself_and_prefills_go_where_no_streams_run() {
    let cfg = Config::parse(
        br#"{"pools":[{"name":"e","role":"both",
                       "endpoints":["10.0.2.1:1","10.0.2.2:1","10.0.2.3:1"]}]}"#,
    )
    .unwrap();
    let mut r = router(&cfg, 0.0);
    let mut table = r.load_table().clone();
    // Two pods decode 16 streams each; the third none.
    for p in table.pods.iter_mut().take(2) {
        p.metrics.running = 16.0;
    }
    r.apply_load_table(&cfg, table);
    // The first holds half the prompt: it decodes, but its streams must not wait for the rest.
    let b = blocks(8000);
    r.affinity.observe(&Observation {
        addr: "10.0.2.1:1".into(),
        hashes: b.hashes[..b.hashes.len() / 2].to_vec(),
    });
    let long = r.plan(&cfg, "m", &b, Hints::default(), 100);
    let Decision::Route { ranked, .. } = &long.decision else {
        panic!("{long:?}")
    };
    assert_eq!(ranked[0].addr, "10.0.2.1:1", "the holder decodes");
    let pd = long.pd.clone().expect("an elastic pool is split");
    assert_eq!(pd.outcome, PdOutcome::Disaggregated, "{pd:?}");
    assert_eq!(
        pd.prefill.map(|p| p.addr).as_deref(),
        Some("10.0.2.3:1"),
        "the pod without streams prefills, not the holder nor the other one decoding"
    );
    // Where the pod without streams decodes, its own prefill is cheapest: no pod prefills for it.
    let other = Blocks {
        hashes: (10_001..=10_500).collect(),
        affinity_key: 2,
        prompt_tokens: 8000,
    };
    let idle = r.plan(&cfg, "m", &other, Hints::default(), 100);
    let Decision::Route { ranked, .. } = &idle.decision else {
        panic!("{idle:?}")
    };
    assert_eq!(ranked[0].addr, "10.0.2.3:1");
    assert_eq!(idle.pd.unwrap().prefill, None);
    // With an objective the short prompt's stall stays within, it is served whole.
    let cfg = Config::parse(
        br#"{"pools":[{"name":"e","role":"both",
                       "endpoints":["10.0.2.1:1","10.0.2.2:1","10.0.2.3:1"]}],
             "pd":{"itl_objective_ms":200}}"#,
    )
    .unwrap();
    let short = r.plan(&cfg, "m", &blocks(100), Hints::default(), 100);
    let pd = short.pd.expect("planned");
    assert_eq!(pd.outcome, PdOutcome::LocalCheaper, "{pd:?}");
    assert_eq!(pd.reason, PdReason::WithinObjective);
}
