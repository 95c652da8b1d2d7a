//! The measured phases on the two Envoys. The paired phase sends one request at a time over one
//! connection per Envoy, alternating the Envoys and swapping which goes first on every pair, so that
//! drift on the machine hits both arms alike; its samples become each arm's report and the paired
//! difference. The throughput phase loads one Envoy at a time with many connections for a fixed
//! time, in rounds that alternate which Envoy goes first, and reads every process's CPU over each
//! round (the Envoy's, the load generator's, the pods'), so that requests per Envoy CPU-second can
//! be given beside requests per second, and a load generator that starves the Envoy shows. The
//! idle phase measures both Envoys' CPU while nothing is sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;

use super::conn::{us, Conn, Sample};
use super::decision;
use super::options::{BlockMode, OverheadOptions, PromptKind};
use super::process::{
    cpu_per_request, machine_cpu_ticks, process_cpu_ns, thread_cpu_ns, tree_cpu_ns,
};
use super::prompts::Prompts;
use super::report::{arm_report, IdleCpu, KindReport, LoadArm, LoadRound, ThroughputReport};
use super::statistics::median_difference;
use super::{KVROUTE, PLAIN};
use crate::report::Summary;
use harness::Envoy;

/// Counters of kvroute whose growth over a phase is reported.
const KVROUTE_COUNTERS: [&str; 6] = [
    "wasmcustom.kvroute.requests_routed_total",
    "wasmcustom.kvroute.requests_routed_total{reason=\"prefix_hit\"}",
    "wasmcustom.kvroute.requests_routed_total{reason=\"load\"}",
    "wasmcustom.kvroute.passthrough_total",
    "wasmcustom.kvroute.no_endpoint_total",
    "wasmcustom.kvroute.body_too_large_total",
];

/// Distinct request bodies the throughput phase cycles through.
const LOAD_BODIES: u64 = 64;

/// The bodies a load cycles through: `repeat` prompts numbered apart from the sequential ones.
pub(super) fn load_bodies(prompts: &Prompts) -> Arc<Vec<Bytes>> {
    Arc::new(
        (0..LOAD_BODIES)
            .map(|i| prompts.body(PromptKind::Repeat, 1_000_000 + i).0)
            .collect(),
    )
}

/// kvroute's stats in `stats` (Envoy's labelled names → value).
fn kvroute_stats(stats: &HashMap<String, u64>) -> BTreeMap<String, u64> {
    harness::kvroute_summary(stats)
}

/// The two Envoys, the sequential phase's connection to each, and the pods' process.
pub(super) struct Arms {
    pub(super) kvroute: Envoy,
    pub(super) plain: Envoy,
    pub(super) kvroute_conn: Conn,
    pub(super) plain_conn: Conn,
    pub(super) sim_pid: u32,
}

impl Arms {
    fn envoy(&self, kvroute: bool) -> &Envoy {
        if kvroute {
            &self.kvroute
        } else {
            &self.plain
        }
    }
}

/// The pairs of one stretch, both arms, and the mean sizes of what was sent.
struct Pairs {
    kvroute: Vec<Sample>,
    plain: Vec<Sample>,
    prompt_bytes: usize,
    body_bytes: usize,
}

/// Sends up to `count` pairs of `kind` starting at request number `first`, one request at a time,
/// alternating the arms and swapping which goes first on every pair; stops early once `limit`
/// has passed (after at least one pair).
async fn run_pairs(
    arms: &mut Arms,
    prompts: &Prompts,
    kind: PromptKind,
    first: u64,
    count: usize,
    limit: Option<Duration>,
) -> Pairs {
    let mut kv = Vec::with_capacity(count);
    let mut plain = Vec::with_capacity(count);
    let (mut prompt_total, mut body_total) = (0usize, 0usize);
    let t0 = Instant::now();
    for i in 0..count as u64 {
        if i > 0 && limit.is_some_and(|l| t0.elapsed() >= l) {
            break;
        }
        let (body, prompt_bytes) = prompts.body(kind, first + i);
        prompt_total += prompt_bytes;
        body_total += body.len();
        if i % 2 == 0 {
            kv.push(arms.kvroute_conn.send(&body).await);
            plain.push(arms.plain_conn.send(&body).await);
        } else {
            plain.push(arms.plain_conn.send(&body).await);
            kv.push(arms.kvroute_conn.send(&body).await);
        }
    }
    let n = kv.len().max(1);
    Pairs {
        prompt_bytes: prompt_total / n,
        body_bytes: body_total / n,
        kvroute: kv,
        plain,
    }
}

/// The time limit of a cell's measured pairs (`cell_s`) and of its warm-up (a quarter of it).
fn limits(opts: &OverheadOptions) -> (Option<Duration>, Option<Duration>) {
    let limit = (opts.cell_s > 0.0).then(|| Duration::from_secs_f64(opts.cell_s));
    (limit, limit.map(|l| l / 4))
}

/// Measures one cell of the sweep: warm-up pairs, then measured pairs, of one prompt kind and size.
pub(super) async fn measure_kind(
    arms: &mut Arms,
    prompts: &Prompts,
    mode: BlockMode,
    kind: PromptKind,
    opts: &OverheadOptions,
) -> Result<KindReport> {
    let before = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    let (limit, warmup_limit) = limits(opts);
    let warmed = run_pairs(arms, prompts, kind, 0, opts.warmup, warmup_limit).await;
    let warmup_pairs = warmed.kvroute.len();
    let decisions_before = decision::read_after_flush(&arms.kvroute).await?;
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let (kv_cpu0, plain_cpu0) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let t0 = Instant::now();
    let measured = run_pairs(
        arms,
        prompts,
        kind,
        warmup_pairs as u64,
        opts.requests,
        limit,
    )
    .await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (kv_cpu1, plain_cpu1) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let decisions = decision::read_after_flush(&arms.kvroute)
        .await?
        .since(&decisions_before)
        .summary();
    let after = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    let plain_stats = arms.plain.labelled_stats().await?;
    let (kv, plain) = (&measured.kvroute, &measured.plain);
    let paired: Vec<(f64, f64)> = kv
        .iter()
        .zip(plain)
        .filter(|(a, b)| a.ok() && b.ok())
        .map(|(a, b)| (us(a.latency), us(b.latency)))
        .collect();
    let seed = opts.seed ^ kind as u64 ^ ((mode as u64) << 8) ^ ((prompts.size() as u64) << 16);
    let (diff_p50_us, diff_p50_ci95_us) = median_difference(&paired, opts.bootstrap, seed);
    let diff_mean_us = (!paired.is_empty())
        .then(|| paired.iter().map(|(a, b)| a - b).sum::<f64>() / paired.len() as f64);
    let kvroute_counters = KVROUTE_COUNTERS
        .iter()
        .map(|&name| {
            let grew = after
                .get(name)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get(name).copied().unwrap_or(0));
            (name.trim_start_matches("wasmcustom.").to_owned(), grew)
        })
        .collect();
    let mut kvroute = arm_report(KVROUTE, kv, opts.keep_samples);
    (
        kvroute.cpu_us_per_request,
        kvroute.cpu_threads_us_per_request,
    ) = cpu_per_request(&kv_cpu0, &kv_cpu1, kv.len());
    let mut plain_arm = arm_report(PLAIN, plain, opts.keep_samples);
    (
        plain_arm.cpu_us_per_request,
        plain_arm.cpu_threads_us_per_request,
    ) = cpu_per_request(&plain_cpu0, &plain_cpu1, plain.len());
    let diff_cpu_us_per_request = kvroute
        .cpu_us_per_request
        .zip(plain_arm.cpu_us_per_request)
        .map(|(a, b)| a - b);
    Ok(KindReport {
        mode,
        prompt_size: prompts.size(),
        kind,
        prompt_bytes: measured.prompt_bytes,
        body_bytes: measured.body_bytes,
        warmup_pairs,
        wall_s,
        pairs: paired.len(),
        kvroute,
        plain: plain_arm,
        diff_p50_us,
        diff_p50_ci95_us,
        diff_mean_us,
        diff_cpu_us_per_request,
        decision_us: decisions,
        kvroute_counters,
        index_entries: after
            .get("wasmcustom.kvroute.index_entries")
            .copied()
            .unwrap_or(0),
        plain_kvroute_stats: kvroute_stats(&plain_stats).into_keys().collect(),
    })
}

/// What one connection of a load round saw.
struct ConnLoad {
    latencies_us: Vec<f64>,
    failed: usize,
}

/// `concurrency` connections to one Envoy, each sending its next request as soon as the last is
/// answered, until `seconds` have passed; the round lasts until the last answer is in.
async fn load_round(
    arms: &Arms,
    bodies: &Arc<Vec<Bytes>>,
    kvroute: bool,
    concurrency: usize,
    seconds: f64,
) -> LoadArm {
    let envoy = arms.envoy(kvroute);
    let target = LoadTarget {
        addr: &envoy.listener,
        hop_pid: Some(envoy.proc.pid()),
        sim_pid: arms.sim_pid,
    };
    load(&target, bodies, concurrency, seconds).await
}

/// Where a load goes: the listener, the process its CPU is charged to (with every process below
/// it; none when the load goes straight to a pod) and the pods' process.
pub(super) struct LoadTarget<'a> {
    pub(super) addr: &'a str,
    pub(super) hop_pid: Option<u32>,
    pub(super) sim_pid: u32,
}

/// `concurrency` connections to `target`, each sending its next request as soon as the last is
/// answered, until `seconds` have passed; the load lasts until the last answer is in. The hop's CPU
/// (in [`LoadArm::envoy_cpu_s`]: the Envoy's, or a peer router's) is its whole process tree's.
pub(super) async fn load(
    target: &LoadTarget<'_>,
    bodies: &Arc<Vec<Bytes>>,
    concurrency: usize,
    seconds: f64,
) -> LoadArm {
    let addr = target.addr.to_owned();
    let cpu_now = || {
        [
            target.hop_pid.and_then(tree_cpu_ns),
            process_cpu_ns(std::process::id()),
            process_cpu_ns(target.sim_pid),
        ]
    };
    let cpu0 = cpu_now();
    let machine0 = machine_cpu_ticks();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..concurrency {
        let (mut conn, bodies) = (Conn::new(&addr), bodies.clone());
        tasks.spawn(async move {
            let mut out = ConnLoad {
                latencies_us: Vec::new(),
                failed: 0,
            };
            let mut i = c;
            while Instant::now() < deadline {
                let Some(body) = bodies.get(i % bodies.len().max(1)) else {
                    break;
                };
                let sample = conn.send(body).await;
                if sample.ok() {
                    out.latencies_us.push(us(sample.latency));
                } else {
                    out.failed += 1;
                }
                i += concurrency;
            }
            out
        });
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        if let Ok(c) = done {
            latencies.extend(c.latencies_us);
            failed += c.failed;
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let cpu1 = cpu_now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let machine_busy_cores = machine0
        .zip(machine_cpu_ticks())
        .and_then(|((b0, t0), (b1, t1))| {
            let total = t1.saturating_sub(t0);
            (total > 0).then(|| b1.saturating_sub(b0) as f64 / total as f64 * cores)
        });
    let cpu_s = |i: usize| {
        cpu0[i]
            .zip(cpu1[i])
            .map(|(a, b)| b.saturating_sub(a) as f64 / 1e9)
    };
    let envoy_cpu_s = cpu_s(0);
    let ok = latencies.len();
    LoadArm {
        ok,
        failed,
        wall_s,
        rps: ok as f64 / wall_s.max(1e-9),
        envoy_cpu_s,
        client_cpu_s: cpu_s(1),
        sim_cpu_s: cpu_s(2),
        machine_busy_cores,
        rps_per_envoy_cpu_s: envoy_cpu_s.filter(|&s| s > 0.0).map(|s| ok as f64 / s),
        latency_us: Summary::of(&latencies),
    }
}

/// The throughput phase for one prompt size: a short warm-up of each Envoy, then
/// `throughput_rounds` rounds in which each Envoy is loaded for `throughput_s`, the first of each
/// round alternating. Each round's ratio compares two loads taken seconds apart.
pub(super) async fn throughput(
    arms: &Arms,
    prompts: &Prompts,
    mode: BlockMode,
    opts: &OverheadOptions,
) -> ThroughputReport {
    let kind = PromptKind::Repeat;
    let bodies = load_bodies(prompts);
    let warmup_s = (opts.throughput_s / 4.0).min(1.0);
    for kvroute in [true, false] {
        load_round(arms, &bodies, kvroute, opts.concurrency, warmup_s).await;
    }
    let mut rounds = Vec::with_capacity(opts.throughput_rounds);
    for r in 0..opts.throughput_rounds {
        let kvroute_first = r % 2 == 0;
        let first = load_round(
            arms,
            &bodies,
            kvroute_first,
            opts.concurrency,
            opts.throughput_s,
        )
        .await;
        let second = load_round(
            arms,
            &bodies,
            !kvroute_first,
            opts.concurrency,
            opts.throughput_s,
        )
        .await;
        let (kv, plain) = if kvroute_first {
            (first, second)
        } else {
            (second, first)
        };
        rounds.push(LoadRound::of(kvroute_first, kv, plain));
    }
    ThroughputReport::of(mode, prompts.size(), kind, opts, warmup_s, rounds)
}

/// Both Envoys' CPU over `seconds` without requests.
pub(super) async fn idle_cpu(arms: &Arms, seconds: f64) -> IdleCpu {
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let (kv0, plain0) = (process_cpu_ns(kv_pid), process_cpu_ns(plain_pid));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let s = t0.elapsed().as_secs_f64();
    let (kv1, plain1) = (process_cpu_ns(kv_pid), process_cpu_ns(plain_pid));
    let ms_per_s = |a: Option<u64>, b: Option<u64>| {
        a.zip(b)
            .map_or(0.0, |(a, b)| b.saturating_sub(a) as f64 / 1e6 / s)
    };
    IdleCpu {
        seconds: s,
        kvroute_ms_per_s: ms_per_s(kv0, kv1),
        plain_ms_per_s: ms_per_s(plain0, plain1),
    }
}
