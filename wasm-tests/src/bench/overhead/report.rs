//! The report's shape, as serialised to `overhead.json`: per prompt kind each arm's figures and
//! their difference, the throughput and idle phases, and both Envoys' memory. Also how one arm's
//! samples become its figures ([`arm_report`]); the text is [`render`](super::render)'s.

use std::collections::BTreeMap;

use serde::Serialize;

use super::conn::{us, Sample};
use super::options::{OverheadOptions, PromptKind};
use super::process::{MemoryDiff, MemoryFigures};
use crate::bench::report::Summary;

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

/// One prompt kind: both arms, their difference, and what kvroute counted.
#[derive(Clone, Debug, Serialize)]
pub struct KindReport {
    pub kind: PromptKind,
    /// Mean bytes of prompt text (system + question) per request.
    pub prompt_bytes: usize,
    /// Mean bytes of the request bodies.
    pub body_bytes: usize,
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
    /// Growth of kvroute's counters over the phase (warm-up included).
    pub kvroute_counters: BTreeMap<String, u64>,
    /// `wasmcustom.kvroute.index_entries` at the end of the phase.
    pub index_entries: u64,
    /// Names of any kvroute stats the Envoy without the filter has (expected: none).
    pub plain_kvroute_stats: Vec<String>,
}

/// Closed-loop requests per second of each arm.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputReport {
    pub kind: PromptKind,
    pub concurrency: usize,
    pub requests_per_arm: usize,
    pub kvroute_ok: usize,
    pub plain_ok: usize,
    pub kvroute_rps: f64,
    pub plain_rps: f64,
}

/// Both Envoys' memory at the start (ready, before any request) and at the end of the run.
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

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    /// Always true: latencies are wall-clock microseconds, not simulated time.
    pub wall_clock: bool,
    pub envoy_version: Option<String>,
    pub options: OverheadOptions,
    pub plugin_config: String,
    pub pods: Vec<String>,
    pub kinds: Vec<KindReport>,
    pub throughput: Option<ThroughputReport>,
    pub idle_cpu: Option<IdleCpu>,
    /// Client connections each Envoy accepted over the run, per worker (`listener.*.worker_N.downstream_cx_total`).
    pub connections: BTreeMap<String, BTreeMap<String, u64>>,
    pub memory: MemoryReport,
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
