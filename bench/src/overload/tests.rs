use super::*;
use crate::workload::{Load, WorkloadKind, WorkloadSpec, LOW_PRIORITY};

#[test]
fn jain_is_one_when_equal_and_one_over_n_when_one_has_all() {
    assert_eq!(jain(&[3.0, 3.0, 3.0]), Some(1.0));
    let one = jain(&[5.0, 0.0, 0.0, 0.0]).unwrap();
    assert!((one - 0.25).abs() < 1e-12, "{one}");
    let mid = jain(&[1.0, 2.0]).unwrap();
    assert!((mid - 0.9).abs() < 1e-12, "(3²)/(2·5) = 0.9, got {mid}");
    assert_eq!(jain(&[]), None);
    assert_eq!(jain(&[0.0, 0.0]), None);
}

#[test]
fn max_min_shares_fill_small_demands_and_split_the_rest_evenly() {
    // Capacity 10 between demands 2, 8, 8: 2 is owed all of it, the others 4 each.
    assert_eq!(max_min_shares(&[8.0, 2.0, 8.0], 10.0), vec![4.0, 2.0, 4.0]);
    // More capacity than demand: everyone gets their demand.
    assert_eq!(max_min_shares(&[1.0, 3.0], 10.0), vec![1.0, 3.0]);
    // A burster asking for 50 beside five asking for 10, capacity 60: 10 each, 10 for it.
    let s = max_min_shares(&[50.0, 10.0, 10.0, 10.0, 10.0, 10.0], 60.0);
    assert_eq!(s, vec![10.0; 6]);
    assert_eq!(max_min_shares(&[], 5.0), Vec::<f64>::new());
}

/// A sent request's record, wall-clock seconds at time scale 0.5.
fn rec(
    tenant: usize,
    priority: i64,
    ttft_sim_s: Option<f64>,
    gateway_error: Option<&str>,
) -> RequestRecord {
    let half = |s: f64| s * 0.5;
    RequestRecord {
        session: format!("tenant-{tenant}"),
        priority: Some(priority),
        ttft_s: ttft_sim_s.map(half),
        headers_s: Some(half(ttft_sim_s.unwrap_or(FLOW_TTL_S))),
        ok: ttft_sim_s.is_some(),
        sent: true,
        status: Some(if ttft_sim_s.is_some() { 200 } else { 429 }),
        gateway_error: gateway_error.map(str::to_owned),
        error: gateway_error.map(|_| "http 429".to_owned()),
        ..RequestRecord::default()
    }
}

#[test]
fn a_run_is_split_by_class_and_tenant_with_goodput_failures_and_late_answers() {
    let mut records = vec![
        rec(0, HIGH_PRIORITY, Some(1.0), None),
        rec(0, HIGH_PRIORITY, Some(3.0), None),
        rec(0, LOW_PRIORITY, Some(20.0), None),
        rec(0, LOW_PRIORITY, None, Some("queue_timeout")),
        rec(1, LOW_PRIORITY, Some(2.0), None),
        rec(1, LOW_PRIORITY, None, Some("queue_full")),
    ];
    // Never answered: cut off at the drain deadline.
    records.push(RequestRecord {
        session: "tenant-1".to_owned(),
        priority: Some(LOW_PRIORITY),
        sent: true,
        error: Some("drain timeout".to_owned()),
        ..RequestRecord::default()
    });
    // Answered, but long after the TTL.
    records.push(RequestRecord {
        headers_s: Some((FLOW_TTL_S + ANSWER_SLACK_S + 1.0) * 0.5),
        ..rec(1, HIGH_PRIORITY, Some(40.0), None)
    });
    let refs: Vec<&RequestRecord> = records.iter().collect();
    assert!(OverloadStats::applies(&refs));
    let o = OverloadStats::of(&refs, 0.5);
    assert_eq!((o.sent, o.completed), (8, 5));
    assert_eq!((o.high.sent, o.high.ok, o.low.sent, o.low.ok), (3, 3, 5, 2));
    assert_eq!(o.high.ttft_ms.p50, Some(3000.0), "simulated ms");
    assert_eq!(o.gateway_errors.get("queue_timeout"), Some(&1));
    assert_eq!(o.gateway_errors.get("queue_full"), Some(&1));
    assert_eq!(o.other_errors.get("drain timeout"), Some(&1));
    assert_eq!(
        o.failures(),
        "429 queue_full 1, 429 queue_timeout 1, drain timeout 1"
    );
    // Goodput: TTFT ≤ 10 s: tenant 0 has 2 of 4, tenant 1 has 1 of 4.
    assert_eq!(o.goodput, 3);
    assert_eq!(o.tenants["tenant-0"].goodput, 2);
    assert_eq!(o.tenants["tenant-1"].goodput, 1);
    // Demands 4 and 4, goodput 3: fair shares 1.5 each; x = 4/3, 2/3.
    let want = jain(&[2.0 / 1.5, 1.0 / 1.5]).unwrap();
    assert!((o.jain_fair_share.unwrap() - want).abs() < 1e-12);
    assert!((o.jain_demand.unwrap() - jain(&[0.5, 0.25]).unwrap()).abs() < 1e-12);
    assert_eq!(
        o.late_answers, 2,
        "the one cut off and the one answered late"
    );
    assert_eq!(o.longest_answer_s, Some(FLOW_TTL_S + ANSWER_SLACK_S + 1.0));
    let plain = RequestRecord::default();
    assert!(!OverloadStats::applies(&[&plain]));
}

/// A report of `label`'s run on `seed` whose high-priority TTFTs are `high_s` and whose tenants'
/// goodput is `good` of 10 requests each.
fn report(seed: u64, high_s: f64, good: &[usize]) -> RunReport {
    let mut spec = WorkloadSpec::new(
        WorkloadKind::from_name("overload").unwrap(),
        Load::Open { rate: 1.0 },
    );
    spec.seed = seed;
    let mut records = Vec::new();
    for (t, &g) in good.iter().enumerate() {
        for i in 0..10 {
            let ttft = if i < g { 1.0 } else { 20.0 };
            records.push(rec(t, LOW_PRIORITY, Some(ttft), None));
        }
        records.push(rec(t, HIGH_PRIORITY, Some(high_s), None));
    }
    RunReport::build(&spec, 0.5, 100.0, &records, Vec::new())
}

#[test]
fn the_verdict_takes_flow_controls_figures_as_ratios_to_the_baselines_seed_by_seed() {
    let runs: Vec<Vec<(String, RunReport)>> = (1..=3)
        .map(|seed| {
            vec![
                ("kvroute-flow".to_owned(), report(seed, 2.0, &[5, 5, 5])),
                ("kvroute".to_owned(), report(seed, 8.0, &[9, 1, 1])),
                ("round-robin".to_owned(), report(seed, 4.0, &[5, 5, 6])),
            ]
        })
        .collect();
    let summaries = summarize(&runs);
    assert_eq!(summaries.len(), 3);
    assert_eq!(summaries[0].high_ttft_p90_ms.median, Some(2000.0));
    assert_eq!(summaries[0].late_answers, 0);
    let v = verdict("overload", &runs);
    let check = |what: &str| {
        v.checks
            .iter()
            .find(|c| c.what == what)
            .unwrap_or_else(|| panic!("{what}: {v:?}"))
    };
    let hi = check("high-priority p90 TTFT kvroute-flow / kvroute");
    assert_eq!(hi.value, Some(0.25));
    assert_eq!(hi.per_seed.n, 3);
    assert_eq!(hi.met, Some(true));
    assert_eq!(check("Jain's index kvroute-flow / kvroute").met, Some(true));
    // Round-robin's goodput (16 + 3) is higher than flow control's (15 + 3): not met.
    let good = check("goodput kvroute-flow / round-robin");
    assert_eq!(good.met, Some(false));
    assert_eq!(v.met, Some(false));
    let text = render_summary(&summaries);
    assert!(text.contains("kvroute-flow"), "{text}");
    // Without a baseline, its checks are not measured and the verdict incomplete.
    let alone: Vec<Vec<(String, RunReport)>> =
        vec![vec![("kvroute-flow".to_owned(), report(1, 2.0, &[5, 5]))]];
    let v = verdict("overload", &alone);
    assert_eq!(v.met, None);
    assert!(render_run(&alone[0]).contains("kvroute-flow"));
}
