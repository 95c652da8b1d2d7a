//! The run's figures as flat rows, one per (block scheme, prompt size, prompt kind) for latency,
//! one per (block scheme, prompt size) for throughput and one per block scheme for memory, so that
//! a chart can be drawn from `overhead.json` without walking the sections; and the targets the
//! benchmark is held to, checked: at 16 KB in chars mode, at most [`ADDED_P50_LIMIT_US`] added
//! to the median request and at least [`THROUGHPUT_RATIO_MIN`] of plain Envoy's requests per
//! second under a load that keeps the Envoy busy.

use serde::Serialize;

use super::hop_summary::{hop_rows, hop_targets, HopRow};
use super::options::{BlockMode, PromptKind};
use super::report::{SectionReport, Spread};
use super::statistics::median_of;

/// Most microseconds kvroute may add to the median 16 KB request in chars mode.
pub const ADDED_P50_LIMIT_US: f64 = 100.0;
/// Least share of plain Envoy's requests per second kvroute may keep (16 KB, chars mode).
pub const THROUGHPUT_RATIO_MIN: f64 = 0.85;
/// The prompt size the targets are set at.
pub const TARGET_PROMPT_BYTES: usize = 16_384;

#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    pub mode: BlockMode,
    pub prompt_size: usize,
    pub kind: PromptKind,
    pub pairs: usize,
    pub plain_p50_us: Option<f64>,
    pub kvroute_p50_us: Option<f64>,
    pub added_p50_us: Option<f64>,
    pub added_p50_ci95_us: Option<(f64, f64)>,
    pub added_mean_us: Option<f64>,
    pub plain_cpu_us_per_request: Option<f64>,
    pub kvroute_cpu_us_per_request: Option<f64>,
    pub added_cpu_us_per_request: Option<f64>,
    /// kvroute's body phase, as the filter times it inside the VM.
    pub decision_p50_us: Option<f64>,
    pub decision_mean_us: Option<f64>,
    /// The added p50 less the body phase's p50: the crossings of the other callbacks, body
    /// buffering, and what the plugin's stats and shared data cost outside the body phase.
    pub added_outside_decision_p50_us: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputRow {
    pub mode: BlockMode,
    pub prompt_size: usize,
    pub concurrency: usize,
    pub rounds: usize,
    pub round_s: f64,
    pub plain_rps: Spread,
    pub kvroute_rps: Spread,
    pub ratio: Spread,
    pub plain_rps_per_envoy_cpu_s: Spread,
    pub kvroute_rps_per_envoy_cpu_s: Spread,
    pub ratio_per_envoy_cpu: Spread,
    pub plain_envoy_cores: Option<f64>,
    pub kvroute_envoy_cores: Option<f64>,
    pub client_cores: Option<f64>,
    pub sim_cores: Option<f64>,
    pub machine_busy_cores: Option<f64>,
    pub client_below_envoy: bool,
    /// Medians over the rounds of each round's p50 under load, µs.
    pub plain_p50_us_under_load: Option<f64>,
    pub kvroute_p50_us_under_load: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryRow {
    pub mode: BlockMode,
    /// kvroute VMs (`wasm.wasm_vm_count`) the figures are divided by.
    pub vms: u64,
    /// Most blocks the prefix index held at the end of any cell or of the section
    /// (`index_entries` is one VM's gauge, the last to write it; LRU-bounded by the pods'
    /// capacities, so the fresh cells leave it full).
    pub index_entries_peak: u64,
    /// kvroute Envoy − plain Envoy, bytes: at rest (ready, before any request) and with the index
    /// as full as the section made it; whole process and per VM.
    pub rss_added_at_rest: Option<i64>,
    pub rss_added_full: Option<i64>,
    pub rss_per_vm_at_rest: Option<i64>,
    pub rss_per_vm_full: Option<i64>,
    pub allocated_added_at_rest: i64,
    pub allocated_added_full: i64,
    pub allocated_per_vm_at_rest: i64,
    pub allocated_per_vm_full: i64,
}

/// One target, checked.
#[derive(Clone, Debug, Serialize)]
pub struct TargetCheck {
    pub what: String,
    pub value: Option<f64>,
    pub limit: f64,
    /// `None` when the run did not measure it.
    pub met: Option<bool>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SummaryTables {
    pub latency: Vec<LatencyRow>,
    pub throughput: Vec<ThroughputRow>,
    pub memory: Vec<MemoryRow>,
    /// The hop phase: one row per (prompt size, hop).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<HopRow>,
    pub targets: Vec<TargetCheck>,
}

fn per_vm(v: i64, vms: u64) -> i64 {
    v / i64::try_from(vms.max(1)).unwrap_or(1)
}

impl SummaryTables {
    pub fn of(sections: &[SectionReport]) -> Self {
        let mut t = SummaryTables::default();
        for s in sections {
            for c in &s.cells {
                let decision_p50 = c.decision_us.map(|d| d.p50);
                t.latency.push(LatencyRow {
                    mode: c.mode,
                    prompt_size: c.prompt_size,
                    kind: c.kind,
                    pairs: c.pairs,
                    plain_p50_us: c.plain.latency_us.p50,
                    kvroute_p50_us: c.kvroute.latency_us.p50,
                    added_p50_us: c.diff_p50_us,
                    added_p50_ci95_us: c.diff_p50_ci95_us,
                    added_mean_us: c.diff_mean_us,
                    plain_cpu_us_per_request: c.plain.cpu_us_per_request,
                    kvroute_cpu_us_per_request: c.kvroute.cpu_us_per_request,
                    added_cpu_us_per_request: c.diff_cpu_us_per_request,
                    decision_p50_us: decision_p50,
                    decision_mean_us: c.decision_us.map(|d| d.mean),
                    added_outside_decision_p50_us: c
                        .diff_p50_us
                        .zip(decision_p50)
                        .map(|(a, d)| a - d),
                });
            }
            for r in &s.throughput {
                t.throughput.push(ThroughputRow {
                    mode: r.mode,
                    prompt_size: r.prompt_size,
                    concurrency: r.concurrency,
                    rounds: r.rounds.len(),
                    round_s: r.round_s,
                    plain_rps: r.plain_rps,
                    kvroute_rps: r.kvroute_rps,
                    ratio: r.ratio,
                    plain_rps_per_envoy_cpu_s: r.plain_rps_per_envoy_cpu_s,
                    kvroute_rps_per_envoy_cpu_s: r.kvroute_rps_per_envoy_cpu_s,
                    ratio_per_envoy_cpu: r.ratio_per_envoy_cpu,
                    plain_envoy_cores: r.plain_envoy_cores,
                    kvroute_envoy_cores: r.kvroute_envoy_cores,
                    client_cores: r.client_cores,
                    sim_cores: r.sim_cores,
                    machine_busy_cores: r.machine_busy_cores,
                    client_below_envoy: r.client_below_envoy,
                    plain_p50_us_under_load: median_of(
                        r.rounds.iter().filter_map(|x| x.plain.latency_us.p50),
                    ),
                    kvroute_p50_us_under_load: median_of(
                        r.rounds.iter().filter_map(|x| x.kvroute.latency_us.p50),
                    ),
                });
            }
            if let Some(h) = &s.hops {
                t.hops.extend(hop_rows(h));
            }
            let m = &s.memory;
            t.memory.push(MemoryRow {
                mode: s.mode,
                vms: m.kvroute_vms,
                index_entries_peak: s
                    .cells
                    .iter()
                    .map(|c| c.index_entries)
                    .chain([m.index_entries])
                    .max()
                    .unwrap_or(0),
                rss_added_at_rest: m.diff_start.rss,
                rss_added_full: m.diff_end.rss,
                rss_per_vm_at_rest: m.diff_start.rss.map(|v| per_vm(v, m.kvroute_vms)),
                rss_per_vm_full: m.diff_end.rss.map(|v| per_vm(v, m.kvroute_vms)),
                allocated_added_at_rest: m.diff_start.allocated,
                allocated_added_full: m.diff_end.allocated,
                allocated_per_vm_at_rest: per_vm(m.diff_start.allocated, m.kvroute_vms),
                allocated_per_vm_full: per_vm(m.diff_end.allocated, m.kvroute_vms),
            });
        }
        t.targets = t.check_targets();
        t.targets.extend(hop_targets(&t.hops));
        t
    }

    fn check_targets(&self) -> Vec<TargetCheck> {
        let at_target =
            |mode: BlockMode, size: usize| mode == BlockMode::Chars && size == TARGET_PROMPT_BYTES;
        let mut out = Vec::new();
        for kind in [PromptKind::Repeat, PromptKind::Fresh] {
            let row = self
                .latency
                .iter()
                .find(|r| at_target(r.mode, r.prompt_size) && r.kind == kind);
            let value = row.and_then(|r| r.added_p50_us);
            out.push(TargetCheck {
                what: format!(
                    "added p50, chars, {TARGET_PROMPT_BYTES} B, {} (µs, at most)",
                    kind.name()
                ),
                value,
                limit: ADDED_P50_LIMIT_US,
                met: value.map(|v| v <= ADDED_P50_LIMIT_US),
            });
        }
        let row = self
            .throughput
            .iter()
            .find(|r| at_target(r.mode, r.prompt_size));
        for (what, value) in [
            ("requests/s", row.and_then(|r| r.ratio.median)),
            (
                "requests per Envoy CPU-second",
                row.and_then(|r| r.ratio_per_envoy_cpu.median),
            ),
        ] {
            out.push(TargetCheck {
                what: format!(
                    "kvroute/plain {what}, chars, {TARGET_PROMPT_BYTES} B, median of rounds (at least)"
                ),
                value,
                limit: THROUGHPUT_RATIO_MIN,
                met: value.map(|v| v >= THROUGHPUT_RATIO_MIN),
            });
        }
        out
    }
}
