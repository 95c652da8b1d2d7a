//! The hop phase's figures as flat rows, one per (prompt size, hop), each a median over the runs
//! with its min and max: p50 and p99 of the sequential requests, the added p50 over calling the
//! pod directly (per run, p50 of the hop − p50 of `direct` in the same run), the hop's CPU per
//! sequential request, and under load requests per second and per CPU-second of the hop's
//! processes. And the hop's targets against the peers: kvroute's added p50 at most the
//! fastest peer's at every size, its requests per CPU-second at least the best peer's at 16 KB.

use serde::Serialize;

use super::hops::{HopArm, HopReport, HopRun, DIRECT};
use super::report::Spread;
use super::statistics::median_of;
use super::summary::{TargetCheck, TARGET_PROMPT_BYTES};
use super::{KVROUTE, PLAIN};

/// One hop at one prompt size, over the runs.
#[derive(Clone, Debug, Serialize)]
pub struct HopRow {
    pub prompt_size: usize,
    pub hop: String,
    /// Runs that measured this hop at this size.
    pub runs: usize,
    /// Sequential requests that failed, all runs together.
    pub failed: usize,
    pub p50_us: Spread,
    pub p99_us: Spread,
    /// p50 of the hop − p50 of `direct`, per run, µs (0 for `direct` itself).
    pub added_p50_us: Spread,
    /// The hop's CPU per sequential request, µs (none for `direct`).
    pub cpu_us_per_request: Spread,
    /// Under load: requests per second, and per CPU-second of the hop's processes.
    pub rps: Spread,
    pub rps_per_cpu_s: Spread,
    /// Cores the hop's processes used under load (median over the runs).
    pub cores: Option<f64>,
    /// p50 under load (median over the runs), µs.
    pub p50_us_under_load: Option<f64>,
}

/// Whether a hop label is a peer router's.
pub fn is_peer(hop: &str) -> bool {
    ![DIRECT, PLAIN, KVROUTE].contains(&hop)
}

fn arm<'a>(run: &'a HopRun, label: &str) -> Option<&'a HopArm> {
    run.arms.iter().find(|a| a.sequential.label == label)
}

fn row(size: usize, hop: &str, runs: &[&HopRun]) -> HopRow {
    let arms: Vec<&HopArm> = runs.iter().filter_map(|r| arm(r, hop)).collect();
    let p50 = |r: &HopRun, label: &str| arm(r, label)?.sequential.latency_us.p50;
    let loads = || arms.iter().filter_map(|a| a.load.as_ref());
    HopRow {
        prompt_size: size,
        hop: hop.to_owned(),
        runs: arms.len(),
        failed: arms
            .iter()
            .map(|a| a.sequential.requests - a.sequential.ok)
            .sum(),
        p50_us: Spread::of(arms.iter().filter_map(|a| a.sequential.latency_us.p50)),
        p99_us: Spread::of(arms.iter().filter_map(|a| a.sequential.latency_us.p99)),
        added_p50_us: Spread::of(
            runs.iter()
                .filter_map(|r| Some(p50(r, hop)? - p50(r, DIRECT)?)),
        ),
        cpu_us_per_request: Spread::of(arms.iter().filter_map(|a| a.sequential.cpu_us_per_request)),
        rps: Spread::of(loads().map(|l| l.rps)),
        rps_per_cpu_s: Spread::of(loads().filter_map(|l| l.rps_per_envoy_cpu_s)),
        cores: median_of(loads().filter_map(|l| l.cores(l.envoy_cpu_s))),
        p50_us_under_load: median_of(loads().filter_map(|l| l.latency_us.p50)),
    }
}

/// The distinct items, in the order first seen.
fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The hops of `rows` other than `direct`, and their prompt sizes, each in the order first seen.
pub fn hops_and_sizes(rows: &[HopRow]) -> (Vec<&str>, Vec<usize>) {
    (
        distinct(rows.iter().map(|r| r.hop.as_str()).filter(|&h| h != DIRECT)),
        distinct(rows.iter().map(|r| r.prompt_size)),
    )
}

/// One row per (prompt size, hop): sizes in the order first measured, hops in the report's order.
pub fn hop_rows(report: &HopReport) -> Vec<HopRow> {
    let sizes = distinct(report.runs.iter().map(|r| r.prompt_size));
    let mut rows = Vec::new();
    for size in sizes {
        let runs: Vec<&HopRun> = report
            .runs
            .iter()
            .filter(|r| r.prompt_size == size)
            .collect();
        rows.extend(report.hops.iter().map(|hop| row(size, hop, &runs)));
    }
    rows
}

/// The peer row at `size` with the best `value` (the least when `least`), and that value.
fn best_peer(
    rows: &[HopRow],
    size: usize,
    value: fn(&HopRow) -> Option<f64>,
    least: bool,
) -> Option<(&HopRow, f64)> {
    rows.iter()
        .filter(|r| r.prompt_size == size && is_peer(&r.hop))
        .filter_map(|r| Some((r, value(r)?)))
        .reduce(|a, b| {
            let b_better = if least { b.1 < a.1 } else { b.1 > a.1 };
            if b_better {
                b
            } else {
                a
            }
        })
}

/// kvroute against the best peer: its added p50 at every size at most the fastest peer's, its
/// requests per CPU-second at [`TARGET_PROMPT_BYTES`] at least the best peer's. None without peers.
pub fn hop_targets(rows: &[HopRow]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let kvroute = |size: usize| {
        rows.iter()
            .find(|r| r.prompt_size == size && r.hop == KVROUTE)
    };
    for size in distinct(rows.iter().map(|r| r.prompt_size)) {
        let Some((peer, limit)) = best_peer(rows, size, |r| r.added_p50_us.median, true) else {
            continue;
        };
        let value = kvroute(size).and_then(|r| r.added_p50_us.median);
        out.push(TargetCheck {
            what: format!(
                "kvroute's added p50 over direct, {size} B, against the fastest peer's ({}), median \
                 of runs (µs, at most)",
                peer.hop
            ),
            value,
            limit,
            met: value.map(|v| v <= limit),
        });
    }
    if let Some((peer, limit)) =
        best_peer(rows, TARGET_PROMPT_BYTES, |r| r.rps_per_cpu_s.median, false)
    {
        let value = kvroute(TARGET_PROMPT_BYTES).and_then(|r| r.rps_per_cpu_s.median);
        out.push(TargetCheck {
            what: format!(
                "kvroute's requests per CPU-second of the hop, {TARGET_PROMPT_BYTES} B, against the \
                 best peer's ({}), median of runs (at least)",
                peer.hop
            ),
            value,
            limit,
            met: value.map(|v| v >= limit),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overhead::options::PromptKind;
    use crate::overhead::report::{arm_report, LoadArm};
    use crate::report::Summary;

    /// A hop's arm with a p50, a p99 of twice it, and a load of `rps` on `cpu_s` CPU-seconds.
    fn arm(label: &str, p50: f64, cpu_s: Option<f64>, rps: f64) -> HopArm {
        let mut sequential = arm_report(label, &[], false);
        sequential.requests = 10;
        sequential.ok = 10;
        sequential.latency_us = Summary {
            count: 10,
            mean: Some(p50),
            p50: Some(p50),
            p90: None,
            p99: Some(2.0 * p50),
        };
        sequential.cpu_us_per_request = cpu_s.map(|c| c * 100.0);
        let ok = (rps * 2.0) as usize;
        let load = LoadArm {
            ok,
            failed: 0,
            wall_s: 2.0,
            rps,
            envoy_cpu_s: cpu_s,
            client_cpu_s: Some(0.5),
            sim_cpu_s: Some(0.5),
            machine_busy_cores: None,
            rps_per_envoy_cpu_s: cpu_s.map(|c| ok as f64 / c),
            latency_us: Summary::of(&[p50 * 3.0]),
        };
        HopArm {
            sequential,
            load: Some(load),
        }
    }

    /// Run `run` at `size`: direct at `base`, each other hop `added` above it.
    fn run(run: usize, size: usize, base: f64, hops: &[(&str, f64, f64)]) -> HopRun {
        let mut arms = vec![arm(DIRECT, base, None, 1000.0)];
        arms.extend(
            hops.iter()
                .map(|&(label, added, cpu_s)| arm(label, base + added, Some(cpu_s), 500.0)),
        );
        HopRun {
            run,
            prompt_size: size,
            warmup: 0,
            body_bytes: size + 100,
            arms,
        }
    }

    fn report(peers_added: [f64; 2], kvroute_cpu_s: f64) -> HopReport {
        let hops = |shift: f64| {
            [
                (PLAIN, 100.0 + shift, 1.0),
                (KVROUTE, 200.0 + shift, kvroute_cpu_s),
                ("smg", peers_added[0] + shift, 1.0),
                ("vllm-router", peers_added[1] + shift, 4.0),
            ]
        };
        let mut runs = Vec::new();
        // Three runs, the middle one slower across the board (the direct line too) and with
        // every hop 30 µs further.
        for (r, (base, shift)) in [(300.0, 0.0), (900.0, 30.0), (310.0, 10.0)]
            .into_iter()
            .enumerate()
        {
            for size in [256, TARGET_PROMPT_BYTES] {
                runs.push(run(r, size, base, &hops(shift)));
            }
        }
        HopReport {
            hops: [DIRECT, PLAIN, KVROUTE, "smg", "vllm-router"]
                .map(str::to_owned)
                .to_vec(),
            peers: Vec::new(),
            kind: PromptKind::Repeat,
            concurrency: 4,
            load_s: 2.0,
            runs,
            wall_s: 1.0,
        }
    }

    #[test]
    fn rows_give_the_added_p50_over_direct_run_by_run_with_its_spread() {
        let rows = hop_rows(&report([150.0, 2000.0], 2.0));
        let (hops, sizes) = hops_and_sizes(&rows);
        assert_eq!(hops, [PLAIN, KVROUTE, "smg", "vllm-router"]);
        assert_eq!(sizes, [256, TARGET_PROMPT_BYTES]);
        let labels: Vec<(usize, &str)> = rows
            .iter()
            .map(|r| (r.prompt_size, r.hop.as_str()))
            .collect();
        assert_eq!(labels.len(), 10);
        assert_eq!(labels[0], (256, DIRECT));
        assert_eq!(labels[5], (TARGET_PROMPT_BYTES, DIRECT));
        let kv = &rows[2];
        assert_eq!((kv.hop.as_str(), kv.runs, kv.failed), (KVROUTE, 3, 0));
        // Per run over that run's direct line: 200, 230, 210, whatever the run's base.
        assert_eq!(kv.added_p50_us.median, Some(210.0));
        assert_eq!(kv.added_p50_us.min, Some(200.0));
        assert_eq!(kv.added_p50_us.max, Some(230.0));
        // Its own p50 keeps the slow run's base: 500, 1130, 520.
        assert_eq!(kv.p50_us.median, Some(520.0));
        assert_eq!(kv.p99_us.max, Some(2260.0));
        // 1,000 requests on 2 CPU-seconds in every run, over 2 s: 1 core.
        assert_eq!(kv.rps_per_cpu_s.median, Some(500.0));
        assert_eq!(kv.rps.median, Some(500.0));
        assert_eq!(kv.cores, Some(1.0));
        assert_eq!(kv.cpu_us_per_request.median, Some(200.0));
        let direct = &rows[0];
        assert_eq!(direct.added_p50_us.median, Some(0.0));
        assert_eq!(
            direct.rps_per_cpu_s.median, None,
            "no hop process to charge"
        );
        assert_eq!(direct.cores, None);
        assert!(is_peer("smg") && is_peer("sglang-router-rr"));
        assert!(!is_peer(KVROUTE) && !is_peer(PLAIN) && !is_peer(DIRECT));
    }

    #[test]
    fn targets_hold_kvroute_to_the_best_peer_and_need_peers() {
        // The fastest peer adds 150 µs (kvroute 210: missed); at 4 CPU-seconds kvroute's
        // requests per CPU-second (250) fall below smg's (1000).
        let t = hop_targets(&hop_rows(&report([150.0, 2000.0], 4.0)));
        assert_eq!(t.len(), 3, "{t:?}");
        assert!(
            t[0].what.contains("256 B") && t[0].what.contains("(smg)"),
            "{}",
            t[0].what
        );
        assert_eq!(
            (t[0].value, t[0].limit, t[0].met),
            (Some(210.0), 160.0, Some(false))
        );
        assert!(t[2].what.contains("requests per CPU-second") && t[2].what.contains("(smg)"));
        assert_eq!(
            (t[2].value, t[2].limit, t[2].met),
            (Some(250.0), 1000.0, Some(false))
        );
        // A slower peer field and a cheaper kvroute: met.
        let t = hop_targets(&hop_rows(&report([400.0, 2000.0], 0.5)));
        assert!(t.iter().all(|t| t.met == Some(true)), "{t:?}");
        // No peer rows: no targets.
        let mut no_peers = report([150.0, 2000.0], 1.0);
        no_peers.hops.truncate(3);
        assert!(hop_targets(&hop_rows(&no_peers)).is_empty());
    }
}
