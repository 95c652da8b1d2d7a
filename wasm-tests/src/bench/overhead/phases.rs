//! The measured phases on the two Envoys. The paired phase sends one request at a time over one
//! connection per Envoy, alternating the Envoys and swapping which goes first on every pair, so that
//! drift on the machine hits both arms alike; its samples become each arm's report and the paired
//! difference. The throughput phase runs a closed loop through each arm in two halves, order
//! swapped; the idle phase measures both Envoys' CPU while nothing is sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;

use super::conn::{us, Conn, Sample};
use super::options::{OverheadOptions, PromptKind};
use super::process::{cpu_per_request, thread_cpu_ns};
use super::prompts::Prompts;
use super::report::{arm_report, IdleCpu, KindReport, ThroughputReport};
use super::statistics::median_difference;
use super::{KVROUTE, PLAIN};
use crate::harness::Envoy;

/// Counters of kvroute whose growth over a phase is reported.
const KVROUTE_COUNTERS: [&str; 5] = [
    "wasmcustom.kvroute.requests_routed_total",
    "wasmcustom.kvroute.requests_routed_total{reason=\"prefix_hit\"}",
    "wasmcustom.kvroute.requests_routed_total{reason=\"load\"}",
    "wasmcustom.kvroute.passthrough_total",
    "wasmcustom.kvroute.no_endpoint_total",
];

/// kvroute's stats in `stats` (Envoy's labelled names → value).
fn kvroute_stats(stats: &HashMap<String, u64>) -> BTreeMap<String, u64> {
    crate::harness::kvroute_summary(stats)
}

/// The two Envoys and the sequential phase's connection to each.
pub(super) struct Arms {
    pub(super) kvroute: Envoy,
    pub(super) plain: Envoy,
    pub(super) kvroute_conn: Conn,
    pub(super) plain_conn: Conn,
}

impl Arms {
    fn listener(&self, kvroute: bool) -> &str {
        if kvroute {
            &self.kvroute.listener
        } else {
            &self.plain.listener
        }
    }
}

/// Sends `count` pairs of `kind` starting at request number `first`, one request at a time,
/// alternating the arms and swapping which goes first on every pair. Returns (kvroute, plain).
async fn run_pairs(
    arms: &mut Arms,
    prompts: &Prompts,
    kind: PromptKind,
    first: u64,
    count: usize,
) -> (Vec<Sample>, Vec<Sample>, usize, usize) {
    let mut kv = Vec::with_capacity(count);
    let mut plain = Vec::with_capacity(count);
    let (mut prompt_total, mut body_total) = (0usize, 0usize);
    for i in 0..count as u64 {
        let (body, prompt_bytes) = prompts.body(kind, first + i);
        prompt_total += prompt_bytes;
        body_total += body.len();
        let request = Bytes::copy_from_slice(&body);
        if i % 2 == 0 {
            kv.push(arms.kvroute_conn.send(&request).await);
            plain.push(arms.plain_conn.send(&request).await);
        } else {
            plain.push(arms.plain_conn.send(&request).await);
            kv.push(arms.kvroute_conn.send(&request).await);
        }
    }
    let n = count.max(1);
    (kv, plain, prompt_total / n, body_total / n)
}

/// Measures one prompt kind: warm-up pairs, then measured pairs.
pub(super) async fn measure_kind(
    arms: &mut Arms,
    prompts: &Prompts,
    kind: PromptKind,
    opts: &OverheadOptions,
) -> Result<KindReport> {
    let before = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    run_pairs(arms, prompts, kind, 0, opts.warmup).await;
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let (kv_cpu0, plain_cpu0) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let t0 = Instant::now();
    let (kv, plain, prompt_bytes, body_bytes) =
        run_pairs(arms, prompts, kind, opts.warmup as u64, opts.requests).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (kv_cpu1, plain_cpu1) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let after = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    let plain_stats = arms.plain.labelled_stats().await?;
    let paired: Vec<(f64, f64)> = kv
        .iter()
        .zip(&plain)
        .filter(|(a, b)| a.ok() && b.ok())
        .map(|(a, b)| (us(a.latency), us(b.latency)))
        .collect();
    let (diff_p50_us, diff_p50_ci95_us) =
        median_difference(&paired, opts.bootstrap, opts.seed ^ kind as u64);
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
    let mut kvroute = arm_report(KVROUTE, &kv, opts.keep_samples);
    (
        kvroute.cpu_us_per_request,
        kvroute.cpu_threads_us_per_request,
    ) = cpu_per_request(&kv_cpu0, &kv_cpu1, kv.len());
    let mut plain_arm = arm_report(PLAIN, &plain, opts.keep_samples);
    (
        plain_arm.cpu_us_per_request,
        plain_arm.cpu_threads_us_per_request,
    ) = cpu_per_request(&plain_cpu0, &plain_cpu1, plain.len());
    let diff_cpu_us_per_request = kvroute
        .cpu_us_per_request
        .zip(plain_arm.cpu_us_per_request)
        .map(|(a, b)| a - b);
    Ok(KindReport {
        kind,
        prompt_bytes,
        body_bytes,
        warmup_pairs: opts.warmup,
        wall_s,
        pairs: paired.len(),
        kvroute,
        plain: plain_arm,
        diff_p50_us,
        diff_p50_ci95_us,
        diff_mean_us,
        diff_cpu_us_per_request,
        kvroute_counters,
        index_entries: after
            .get("wasmcustom.kvroute.index_entries")
            .copied()
            .unwrap_or(0),
        plain_kvroute_stats: kvroute_stats(&plain_stats).into_keys().collect(),
    })
}

/// `count` requests of `kind` at `concurrency` in flight through one arm; returns (ok, seconds).
async fn closed_loop(
    arms: &Arms,
    prompts: &Arc<Vec<Bytes>>,
    kvroute: bool,
    concurrency: usize,
    count: usize,
) -> (usize, f64) {
    let addr = arms.listener(kvroute).to_owned();
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (mut conn, next, ok, prompts) =
            (Conn::new(&addr), next.clone(), ok.clone(), prompts.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let Some(body) = prompts.get(i % prompts.len().max(1)).cloned() else {
                    break;
                };
                if conn.send(&body).await.ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    (ok.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

/// The throughput phase: each arm runs its requests in two halves, kvroute–plain then plain–kvroute.
pub(super) async fn throughput(
    arms: &Arms,
    prompts: &Prompts,
    opts: &OverheadOptions,
) -> ThroughputReport {
    let kind = PromptKind::Repeat;
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..256u64)
            .map(|i| Bytes::copy_from_slice(&prompts.body(kind, 1_000_000 + i).0))
            .collect(),
    );
    let half = opts.throughput_requests.div_ceil(2);
    let (mut kv_ok, mut kv_s, mut plain_ok, mut plain_s) = (0, 0.0, 0, 0.0);
    for order in [[true, false], [false, true]] {
        for kvroute in order {
            let (ok, s) = closed_loop(arms, &bodies, kvroute, opts.concurrency, half).await;
            if kvroute {
                kv_ok += ok;
                kv_s += s;
            } else {
                plain_ok += ok;
                plain_s += s;
            }
        }
    }
    let rate = |ok: usize, s: f64| if s > 0.0 { ok as f64 / s } else { 0.0 };
    ThroughputReport {
        kind,
        concurrency: opts.concurrency,
        requests_per_arm: 2 * half,
        kvroute_ok: kv_ok,
        plain_ok,
        kvroute_rps: rate(kv_ok, kv_s),
        plain_rps: rate(plain_ok, plain_s),
    }
}

/// Both Envoys' CPU over `seconds` without requests.
pub(super) async fn idle_cpu(arms: &Arms, seconds: f64) -> IdleCpu {
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let total = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
    let (kv0, plain0) = (
        total(&thread_cpu_ns(kv_pid)),
        total(&thread_cpu_ns(plain_pid)),
    );
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let s = t0.elapsed().as_secs_f64();
    let (kv1, plain1) = (
        total(&thread_cpu_ns(kv_pid)),
        total(&thread_cpu_ns(plain_pid)),
    );
    let ms_per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6 / s;
    IdleCpu {
        seconds: s,
        kvroute_ms_per_s: ms_per_s(kv0, kv1),
        plain_ms_per_s: ms_per_s(plain0, plain1),
    }
}
