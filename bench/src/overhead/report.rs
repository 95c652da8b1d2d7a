//! The report's shape, as serialised to `overhead.json`: per block scheme a section with, per
//! prompt size and kind, each arm's figures and their difference, the throughput rounds, the idle
//! phase and both Envoys' memory. Also how one arm's samples become its figures ([`arm_report`])
//! and the rounds their medians; the flat rows are [`summary`](super::summary)'s, the text
//! [`render`](super::render)'s.

use std::collections::BTreeMap;

use serde::Serialize;

use super::conn::{us, Sample};
use super::decision::DecisionSummary;
use super::hops::HopReport;
use super::options::{BlockMode, OverheadOptions, PromptKind};
use super::process::{MemoryDiff, MemoryFigures};
use super::statistics::median_of;
use super::summary::SummaryTables;
use crate::report::Summary;

/// One arm's measurements in one phase. Latencies in wall-clock microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct ArmReport {
    pub label: String,
    /// Requests sent (measured ones).
    pub requests: usize,
    /// Answered 200 with a body.
    pub ok: usize,
    /// Requests by HTTP status (0 = no response).
    pub statuses: BTreeMap<u16, usize>,
    /// Requests by the pod that answered (`x-kvsim-pod`).
    pub pods: BTreeMap<String, usize>,
    /// Over successful requests.
    pub latency_us: Summary,
    /// The Envoy process's CPU time over the measured requests divided by their number (Linux).
    pub cpu_us_per_request: Option<f64>,
    /// The same per thread (`name (tid)`), threads that used any CPU.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_threads_us_per_request: BTreeMap<String, f64>,
    /// The first failures, for the report.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Every request's latency in sending order (`NaN` for a failure), when asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples_us: Vec<f64>,
}

/// One cell of the sweep (block scheme, prompt size, prompt kind): both arms, their difference,
/// and what kvroute counted.
#[derive(Clone, Debug, Serialize)]
pub struct KindReport {
    pub mode: BlockMode,
    /// The prompt size asked for, bytes.
    pub prompt_size: usize,
    pub kind: PromptKind,
    /// Mean bytes of prompt text (system + question) per request.
    pub prompt_bytes: usize,
    /// Mean bytes of the request bodies.
    pub body_bytes: usize,
    /// Pairs sent before the measured ones (fewer than asked when the warm-up hit its time limit).
    pub warmup_pairs: usize,
    /// Wall seconds of the measured pairs.
    pub wall_s: f64,
    /// Pairs in which both requests succeeded (the difference is computed over these).
    pub pairs: usize,
    pub kvroute: ArmReport,
    pub plain: ArmReport,
    /// p50(kvroute) − p50(plain), µs.
    pub diff_p50_us: Option<f64>,
    /// Bootstrap 95% interval of that difference (paired resampling), µs.
    pub diff_p50_ci95_us: Option<(f64, f64)>,
    /// mean(kvroute) − mean(plain) over the same pairs, µs.
    pub diff_mean_us: Option<f64>,
    /// Envoy CPU per request, kvroute − plain, µs.
    pub diff_cpu_us_per_request: Option<f64>,
    /// kvroute's own time in its body phase over the measured requests (`decision_microseconds`).
    pub decision_us: Option<DecisionSummary>,
    /// Growth of kvroute's counters over the cell (warm-up included).
    pub kvroute_counters: BTreeMap<String, u64>,
    /// `wasmcustom.kvroute.index_entries` at the end of the cell.
    pub index_entries: u64,
    /// Names of any kvroute stats the Envoy without the filter has (expected: none).
    pub plain_kvroute_stats: Vec<String>,
}

/// One Envoy under load for one round.
#[derive(Clone, Debug, Serialize)]
pub struct LoadArm {
    /// Requests answered 200 with a body.
    pub ok: usize,
    pub failed: usize,
    /// From the first request to the last answer.
    pub wall_s: f64,
    pub rps: f64,
    /// CPU seconds over the round of the loaded Envoy, of the load generator (this process) and
    /// of the pods' process (Linux).
    pub envoy_cpu_s: Option<f64>,
    pub client_cpu_s: Option<f64>,
    pub sim_cpu_s: Option<f64>,
    /// Cores the whole machine was busy on average over the round (every process, other
    /// tenants' too; `/proc/stat`): near the core count, the machine was full.
    pub machine_busy_cores: Option<f64>,
    /// Requests per CPU-second of the loaded Envoy: the figure a busy machine distorts least.
    pub rps_per_envoy_cpu_s: Option<f64>,
    /// Latency under this load, µs.
    pub latency_us: Summary,
}

impl LoadArm {
    /// CPU cores a process used on average over the round.
    pub(super) fn cores(&self, cpu_s: Option<f64>) -> Option<f64> {
        cpu_s.map(|c| c / self.wall_s.max(1e-9))
    }
}

/// One throughput round: each Envoy loaded in turn.
#[derive(Clone, Debug, Serialize)]
pub struct LoadRound {
    pub kvroute_first: bool,
    pub kvroute: LoadArm,
    pub plain: LoadArm,
    /// kvroute rps / plain rps.
    pub ratio: Option<f64>,
    /// The same per Envoy CPU-second.
    pub ratio_per_envoy_cpu: Option<f64>,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b).filter(|&(_, b)| b > 0.0).map(|(a, b)| a / b)
}

impl LoadRound {
    pub(super) fn of(kvroute_first: bool, kvroute: LoadArm, plain: LoadArm) -> Self {
        Self {
            kvroute_first,
            ratio: ratio(Some(kvroute.rps), Some(plain.rps)),
            ratio_per_envoy_cpu: ratio(kvroute.rps_per_envoy_cpu_s, plain.rps_per_envoy_cpu_s),
            kvroute,
            plain,
        }
    }
}

/// The spread of a figure over the rounds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        Self {
            median: median_of(v.iter().copied()),
            min: v.iter().copied().reduce(f64::min),
            max: v.iter().copied().reduce(f64::max),
        }
    }
}

/// The throughput phase of one prompt size: every round, and the medians over them.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputReport {
    pub mode: BlockMode,
    pub prompt_size: usize,
    pub kind: PromptKind,
    /// Connections, each with one request in flight.
    pub concurrency: usize,
    /// Seconds each Envoy is loaded per round.
    pub round_s: f64,
    /// Seconds each Envoy was loaded before the rounds, not measured.
    pub warmup_s: f64,
    pub rounds: Vec<LoadRound>,
    pub kvroute_rps: Spread,
    pub plain_rps: Spread,
    /// kvroute rps / plain rps, per round.
    pub ratio: Spread,
    pub kvroute_rps_per_envoy_cpu_s: Spread,
    pub plain_rps_per_envoy_cpu_s: Spread,
    pub ratio_per_envoy_cpu: Spread,
    /// Cores each process used while an Envoy was loaded (medians over the loads).
    pub kvroute_envoy_cores: Option<f64>,
    pub plain_envoy_cores: Option<f64>,
    pub client_cores: Option<f64>,
    pub sim_cores: Option<f64>,
    pub machine_busy_cores: Option<f64>,
    /// Whether in every load the load generator used less CPU than the Envoy it loaded.
    pub client_below_envoy: bool,
    /// Cores of this machine (`available_parallelism`).
    pub machine_cores: usize,
}

impl ThroughputReport {
    pub(super) fn of(
        mode: BlockMode,
        prompt_size: usize,
        kind: PromptKind,
        opts: &OverheadOptions,
        warmup_s: f64,
        rounds: Vec<LoadRound>,
    ) -> Self {
        let loads = || rounds.iter().flat_map(|r| [&r.kvroute, &r.plain]);
        let cores = |arm: fn(&LoadRound) -> &LoadArm, cpu: fn(&LoadArm) -> Option<f64>| {
            median_of(rounds.iter().filter_map(|r| arm(r).cores(cpu(arm(r)))))
        };
        let client_cores = median_of(loads().filter_map(|a| a.cores(a.client_cpu_s)));
        let sim_cores = median_of(loads().filter_map(|a| a.cores(a.sim_cpu_s)));
        let client_below_envoy = loads().all(|a| match (a.client_cpu_s, a.envoy_cpu_s) {
            (Some(c), Some(e)) => c < e,
            _ => false,
        });
        Self {
            mode,
            prompt_size,
            kind,
            concurrency: opts.concurrency,
            round_s: opts.throughput_s,
            warmup_s,
            kvroute_rps: Spread::of(rounds.iter().map(|r| r.kvroute.rps)),
            plain_rps: Spread::of(rounds.iter().map(|r| r.plain.rps)),
            ratio: Spread::of(rounds.iter().filter_map(|r| r.ratio)),
            kvroute_rps_per_envoy_cpu_s: Spread::of(
                rounds.iter().filter_map(|r| r.kvroute.rps_per_envoy_cpu_s),
            ),
            plain_rps_per_envoy_cpu_s: Spread::of(
                rounds.iter().filter_map(|r| r.plain.rps_per_envoy_cpu_s),
            ),
            ratio_per_envoy_cpu: Spread::of(rounds.iter().filter_map(|r| r.ratio_per_envoy_cpu)),
            kvroute_envoy_cores: cores(|r| &r.kvroute, |a| a.envoy_cpu_s),
            plain_envoy_cores: cores(|r| &r.plain, |a| a.envoy_cpu_s),
            client_cores,
            sim_cores,
            machine_busy_cores: median_of(loads().filter_map(|a| a.machine_busy_cores)),
            client_below_envoy,
            machine_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            rounds,
        }
    }
}

/// Both Envoys' memory at the start (ready, before any request) and at the end of a section (the
/// prefix index as full as the sweep's fresh prompts made it).
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// Envoy workers (each runs one kvroute VM).
    pub workers: usize,
    /// `wasm.wasm_vm_count` of the kvroute Envoy: the workers' VMs plus the main thread's.
    pub kvroute_vms: u64,
    /// The same stat in the Envoy without the filter (expected: 0).
    pub plain_vms: u64,
    pub kvroute_start: MemoryFigures,
    pub plain_start: MemoryFigures,
    pub kvroute_end: MemoryFigures,
    pub plain_end: MemoryFigures,
    pub diff_start: MemoryDiff,
    pub diff_end: MemoryDiff,
    /// `wasmcustom.kvroute.index_entries` at the end (blocks in the prefix index).
    pub index_entries: u64,
}

/// Both Envoys' CPU while no request is sent: kvroute's background work (polling, leader duties).
#[derive(Clone, Debug, Serialize)]
pub struct IdleCpu {
    pub seconds: f64,
    /// CPU milliseconds per wall second.
    pub kvroute_ms_per_s: f64,
    pub plain_ms_per_s: f64,
}

/// One block scheme's part of the run: its own pods and pair of Envoys.
#[derive(Clone, Debug, Serialize)]
pub struct SectionReport {
    pub mode: BlockMode,
    pub plugin_config: String,
    pub pods: Vec<String>,
    /// One per (prompt size, prompt kind), in the order measured.
    pub cells: Vec<KindReport>,
    /// One per prompt size, when this section has the throughput phase.
    pub throughput: Vec<ThroughputReport>,
    pub idle_cpu: Option<IdleCpu>,
    /// Client connections each Envoy accepted over the section, per worker
    /// (`listener.*.worker_N.downstream_cx_total`).
    pub connections: BTreeMap<String, BTreeMap<String, u64>>,
    pub memory: MemoryReport,
    /// The hop phase (direct, both Envoys, the peer routers), in the section that ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hops: Option<HopReport>,
    pub wall_s: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    /// Always true: latencies are wall-clock microseconds, not simulated time.
    pub wall_clock: bool,
    pub envoy_version: Option<String>,
    pub options: OverheadOptions,
    pub sections: Vec<SectionReport>,
    /// The per-size figures in flat rows, for charts.
    pub summary: SummaryTables,
    /// The queue phase: flow control's queue path (`--held-pairs`).
    pub held: Option<super::held::HeldReport>,
    /// Wall seconds the whole run took.
    pub wall_s: f64,
}

pub(super) fn arm_report(label: &str, samples: &[Sample], keep: bool) -> ArmReport {
    let mut statuses = BTreeMap::new();
    let mut pods = BTreeMap::new();
    let mut errors = Vec::new();
    for s in samples {
        *statuses.entry(s.status).or_insert(0) += 1;
        if let Some(p) = &s.pod {
            *pods.entry(p.clone()).or_insert(0) += 1;
        }
        if let Some(e) = &s.error {
            if errors.len() < 5 {
                errors.push(e.clone());
            }
        }
    }
    let ok: Vec<f64> = samples
        .iter()
        .filter(|s| s.ok())
        .map(|s| us(s.latency))
        .collect();
    ArmReport {
        label: label.to_owned(),
        requests: samples.len(),
        ok: ok.len(),
        statuses,
        pods,
        latency_us: Summary::of(&ok),
        cpu_us_per_request: None,
        cpu_threads_us_per_request: BTreeMap::new(),
        errors,
        samples_us: if keep {
            samples
                .iter()
                .map(|s| if s.ok() { us(s.latency) } else { f64::NAN })
                .collect()
        } else {
            Vec::new()
        },
    }
}
