//! The hop phase: what each way of reaching the pods adds to a request, in one run and on the same
//! pods. The hops are the pod itself (`direct`, the zero line), the section's two Envoys (`plain`,
//! `kvroute`) and each peer router asked for (sglang-router, smg, vllm-router, started with
//! [`PeerStack`] in front of the section's pods for this phase only). A run sends, at every prompt
//! size, sequential `repeat` requests one hop after the other over one persistent connection per
//! hop, the order rotating on every request so that drift on the machine hits every hop alike, and
//! reads each hop's CPU (its whole process tree: the Envoy, or the router and whatever its Python
//! launcher runs below it) over them; then it loads each hop in turn with many connections for a
//! fixed time. Several runs give each figure its spread; the rows and the targets are
//! [`hop_summary`](super::hop_summary)'s.

use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use super::conn::{Conn, Sample};
use super::options::{OverheadOptions, PromptKind};
use super::phases::{load, load_bodies, Arms, LoadTarget};
use super::process::{cpu_us_per_request, tree_cpu_ns};
use super::prompts::Prompts;
use super::report::{arm_report, ArmReport, LoadArm};
use super::{KVROUTE, PLAIN};
use crate::peers::{PeerPolicy, PeerStack};

/// Label of the hop that calls the pod itself.
pub const DIRECT: &str = "direct";

/// First request number of the hop phase's prompts, apart from the cells' and the loads'.
const FIRST_REQUEST: u64 = 2_000_000;

/// One hop of one run at one size: its sequential requests and, when loaded, its load.
#[derive(Clone, Debug, Serialize)]
pub struct HopArm {
    /// The sequential requests; `cpu_us_per_request` is the hop's process tree's CPU over the whole
    /// stretch (every hop's requests interleaved) per request of its own, none for `direct`.
    pub sequential: ArmReport,
    /// The load; `envoy_cpu_s` is the hop's process tree's CPU (none for `direct`).
    pub load: Option<LoadArm>,
}

/// One run at one prompt size: every hop.
#[derive(Clone, Debug, Serialize)]
pub struct HopRun {
    /// From 0.
    pub run: usize,
    pub prompt_size: usize,
    /// Sequential requests per hop sent before the measured ones, not measured.
    pub warmup: usize,
    /// Mean bytes of the request bodies.
    pub body_bytes: usize,
    /// One per hop, in [`HopReport::hops`]' order.
    pub arms: Vec<HopArm>,
}

/// The hop phase of a section.
#[derive(Clone, Debug, Serialize)]
pub struct HopReport {
    /// Labels: `direct`, `plain`, `kvroute`, then the peers'.
    pub hops: Vec<String>,
    pub peers: Vec<PeerPolicy>,
    pub kind: PromptKind,
    /// Connections of each load.
    pub concurrency: usize,
    pub load_s: f64,
    /// Run-major: every size of run 0, then of run 1, …
    pub runs: Vec<HopRun>,
    pub wall_s: f64,
}

/// One hop: a connection to it and the process its CPU is charged to.
struct Hop {
    label: String,
    addr: String,
    pid: Option<u32>,
    conn: Conn,
}

impl Hop {
    fn new(label: &str, addr: &str, pid: Option<u32>) -> Self {
        Self {
            label: label.to_owned(),
            addr: addr.to_owned(),
            pid,
            conn: Conn::new(addr),
        }
    }
}

/// Sends `count` requests to every hop, request `first + i` to all of them in turn, starting with
/// hop `i % hops` (the order rotates); returns each hop's samples and the mean body size.
async fn send_rotating(
    hops: &mut [Hop],
    prompts: &Prompts,
    first: u64,
    count: usize,
) -> (Vec<Vec<Sample>>, usize) {
    let n = hops.len();
    let mut samples: Vec<Vec<Sample>> = (0..n).map(|_| Vec::with_capacity(count)).collect();
    let mut body_total = 0;
    for i in 0..count {
        let (body, _) = prompts.body(PromptKind::Repeat, first + i as u64);
        body_total += body.len();
        for j in 0..n {
            let h = (i + j) % n;
            if let (Some(hop), Some(out)) = (hops.get_mut(h), samples.get_mut(h)) {
                out.push(hop.conn.send(&body).await);
            }
        }
    }
    (samples, body_total / count.max(1))
}

/// One run at one size: warm-up, the measured sequential requests with each hop's CPU over them,
/// then each hop loaded in turn (the first one rotating with the run; in run 0 each load follows
/// a short unmeasured one).
async fn hop_run(
    hops: &mut [Hop],
    prompts: &Prompts,
    run: usize,
    sim_pid: u32,
    opts: &OverheadOptions,
) -> HopRun {
    let first = FIRST_REQUEST + (run * (opts.hop_warmup + opts.hop_requests)) as u64;
    send_rotating(hops, prompts, first, opts.hop_warmup).await;
    let cpu0: Vec<Option<u64>> = hops.iter().map(|h| h.pid.and_then(tree_cpu_ns)).collect();
    let (samples, body_bytes) = send_rotating(
        hops,
        prompts,
        first + opts.hop_warmup as u64,
        opts.hop_requests,
    )
    .await;
    let cpu1: Vec<Option<u64>> = hops.iter().map(|h| h.pid.and_then(tree_cpu_ns)).collect();
    let mut loads: Vec<Option<LoadArm>> = vec![None; hops.len()];
    if opts.hop_load_s > 0.0 {
        let bodies = load_bodies(prompts);
        for j in 0..hops.len() {
            let i = (j + run) % hops.len();
            let (Some(hop), Some(slot)) = (hops.get(i), loads.get_mut(i)) else {
                continue;
            };
            let target = LoadTarget {
                addr: &hop.addr,
                hop_pid: hop.pid,
                sim_pid,
            };
            if run == 0 {
                load(&target, &bodies, opts.concurrency, opts.hop_load_s / 4.0).await;
            }
            *slot = Some(load(&target, &bodies, opts.concurrency, opts.hop_load_s).await);
        }
    }
    let arms = hops
        .iter()
        .zip(samples)
        .zip(cpu0.into_iter().zip(cpu1))
        .zip(loads)
        .map(|(((hop, samples), (c0, c1)), load)| {
            let mut sequential = arm_report(&hop.label, &samples, opts.keep_samples);
            sequential.cpu_us_per_request = cpu_us_per_request(c0, c1, samples.len());
            HopArm { sequential, load }
        })
        .collect();
    HopRun {
        run,
        prompt_size: prompts.size(),
        warmup: opts.hop_warmup,
        body_bytes,
        arms,
    }
}

/// kvroute's added p50 over direct in one run, for the progress line.
fn kvroute_added(run: &HopRun) -> Option<f64> {
    let p50 = |label: &str| {
        run.arms
            .iter()
            .find(|a| a.sequential.label == label)?
            .sequential
            .latency_us
            .p50
    };
    Some(p50(KVROUTE)? - p50(DIRECT)?)
}

/// The hop phase on a section's Envoys and pods: starts the peers, runs every run at every size,
/// stops the peers. Progress goes to stderr.
pub(super) async fn hop_phase(
    arms: &Arms,
    pods: &[String],
    opts: &OverheadOptions,
) -> Result<HopReport> {
    let t0 = Instant::now();
    let mut peers = Vec::with_capacity(opts.peers.len());
    for &policy in &opts.peers {
        eprintln!(
            "overhead: hops: starting {} in front of the {} pods…",
            policy.label(),
            pods.len()
        );
        peers.push(PeerStack::start(policy, pods.to_vec(), Vec::new()).await?);
    }
    let pod = pods.first().context("the hop phase needs a pod")?;
    let mut hops = vec![
        Hop::new(DIRECT, pod, None),
        Hop::new(PLAIN, &arms.plain.listener, Some(arms.plain.proc.pid())),
        Hop::new(
            KVROUTE,
            &arms.kvroute.listener,
            Some(arms.kvroute.proc.pid()),
        ),
    ];
    hops.extend(
        peers
            .iter()
            .map(|s| Hop::new(s.policy.label(), &s.listener, Some(s.router.pid()))),
    );
    let prompts: Vec<Prompts> = opts
        .hop_sizes
        .iter()
        .map(|&size| Prompts::new(opts.seed, size))
        .collect();
    let mut runs = Vec::with_capacity(opts.hop_runs * prompts.len());
    for run in 0..opts.hop_runs {
        for p in &prompts {
            let r0 = Instant::now();
            let r = hop_run(&mut hops, p, run, arms.sim_pid, opts).await;
            let failed: usize = r
                .arms
                .iter()
                .map(|a| a.sequential.requests - a.sequential.ok)
                .sum();
            eprintln!(
                "overhead: hops run {} {} B: {} hops × {} requests{} in {:.1} s, kvroute added p50 {} µs{}",
                run + 1,
                p.size(),
                hops.len(),
                opts.hop_requests,
                if opts.hop_load_s > 0.0 { " and loads" } else { "" },
                r0.elapsed().as_secs_f64(),
                kvroute_added(&r).map_or_else(|| "-".to_owned(), |d| format!("{d:+.1}")),
                if failed > 0 {
                    format!(", {failed} sequential requests FAILED")
                } else {
                    String::new()
                }
            );
            runs.push(r);
        }
    }
    drop(peers);
    Ok(HopReport {
        hops: hops.into_iter().map(|h| h.label).collect(),
        peers: opts.peers.clone(),
        kind: PromptKind::Repeat,
        concurrency: opts.concurrency,
        load_s: opts.hop_load_s,
        runs,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}
