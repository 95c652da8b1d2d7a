//! The queue phase (`--held-pairs N`): what flow control's queue path costs a request it holds,
//! beyond the wait for room itself.
//!
//! One kvsim pod at time scale 1 (its default profile: a short prompt's first token after some
//! 40–60 ms) behind one Envoy with kvroute and `flow_control` on with `queue_depth` 1. Each pair:
//! request A is sent, then request B 5 ms later on another connection. A has not started, so the
//! pod is full and B is held; B is released on the tick after A's first byte (non-streamed,
//! `max_tokens` 1, so A's answer is its first token). Then the control, nothing held: request C,
//! and D sent the moment C's answer is in. All four prompts are fresh and of one size, so
//! (B's end − A's end) − (D's end − C's end) is what holding added to B — the wait for the next
//! tick, the second parse and plan, the resume — the queue path's latency.
//! A pair counts only where flow control's counters say exactly one request (B) was held and
//! released. kvroute's decision histogram over the phase gives its CPU: decisions per held request (the
//! first plan, each retry while at the head, the release) and µs per decision.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use harness::{Envoy, EnvoyOptions, Lb, Sim};
use serde::Serialize;
use serde_json::json;

use super::conn::{us, Conn};
use super::decision::{self, DecisionSummary};
use super::prompts::Prompts;
use super::statistics::median_of;
use super::OverheadOptions;
use crate::compare::{wait_kvroute_healthy, StackOptions};
use crate::overhead::options::PromptKind;
use crate::report::percentile;

/// Prompt bytes per request: a short prompt, so its prefill is short against a tick.
const PROMPT_BYTES: usize = 1024;
/// How long after A request B is sent.
const B_AFTER: Duration = Duration::from_millis(5);
/// The pause before each pair: longer than kvroute's poll interval (200 ms by default).
const SETTLE: Duration = Duration::from_millis(300);
const HELD_TOTAL: &str = "wasmcustom.kvroute.flow.held_total";
const RELEASED_TOTAL: &str = "wasmcustom.kvroute.flow.released_total";

#[derive(Clone, Debug, Serialize)]
pub struct HeldReport {
    pub pairs: usize,
    /// Requests held and released over the phase (one per measured pair; a pair in which the
    /// counters moved otherwise, A held too, is left out of the figures).
    pub held: u64,
    pub released: u64,
    /// Pairs measured: both answered 200, exactly B held and released.
    pub measured: usize,
    /// D's latency (an unheld request's time to its first token), µs: median.
    pub unheld_p50_us: Option<f64>,
    /// (B's end − A's end) − (D's end − C's end), µs: median, 10th and 90th percentiles.
    pub added_p50_us: Option<f64>,
    pub added_p10_us: Option<f64>,
    pub added_p90_us: Option<f64>,
    /// kvroute's body-phase decisions over the phase (both requests of every pair).
    pub decisions: Option<DecisionSummary>,
    pub wall_s: f64,
}

pub(super) async fn held_phase(opts: &OverheadOptions) -> Result<HeldReport> {
    let t0 = Instant::now();
    eprintln!(
        "overhead: queue path: one pod, Envoy + kvroute with flow control, {} held pairs…",
        opts.held_pairs
    );
    let sim = Sim::start(1, &["--time-scale", "1"]).context("starting the pod (kvsim)")?;
    let plugin = json!({
        "pools": [{"name": "default", "endpoints": sim.pods}],
        "flow_control": {"enabled": true, "queue_depth": 1, "ttl_ms": 10000}
    });
    let mut eo = EnvoyOptions::new(&sim.pods, Lb::OverrideHost, Some(plugin.to_string()));
    eo.concurrency = opts.workers;
    let envoy = Envoy::start(&eo)
        .await
        .context("starting Envoy with kvroute")?;
    wait_kvroute_healthy(&envoy, 1, &StackOptions::default()).await?;
    let prompts = Prompts::new(opts.seed, PROMPT_BYTES);
    let (mut first, mut second) = (Conn::new(&envoy.listener), Conn::new(&envoy.listener));
    // Warm-up: each connection once, alone.
    for (i, conn) in [&mut first, &mut second].into_iter().enumerate() {
        let (body, _) = prompts.body(PromptKind::Fresh, 9_000_000 + i as u64);
        ensure!(conn.send(&body).await.ok(), "the warm-up request failed");
    }
    let before = decision::read_after_flush(&envoy).await?;
    let counters = || async {
        (
            envoy.stat(HELD_TOTAL).await,
            envoy.stat(RELEASED_TOTAL).await,
        )
    };
    let (held_before, released_before) = counters().await;
    let (mut unheld, mut added) = (Vec::new(), Vec::new());
    for pair in 0..opts.held_pairs as u64 {
        // Let the pod's polled queue empty, so that A finds room and only B is held.
        tokio::time::sleep(SETTLE).await;
        let (held_then, released_then) = counters().await;
        let (a_body, _) = prompts.body(PromptKind::Fresh, 2 * pair);
        let (b_body, _) = prompts.body(PromptKind::Fresh, 2 * pair + 1);
        let a = async {
            let sample = first.send(&a_body).await;
            (sample, Instant::now())
        };
        let b = async {
            tokio::time::sleep(B_AFTER).await;
            let sample = second.send(&b_body).await;
            (sample, Instant::now())
        };
        let ((a, a_end), (b, b_end)) = tokio::join!(a, b);
        if !(a.ok() && b.ok()) {
            eprintln!(
                "overhead: queue path pair {pair}: A {} B {} ({:?} {:?})",
                a.status, b.status, a.error, b.error
            );
            continue;
        }
        // The control: the same two sizes sent one after the other, nothing held: D's end − C's
        // end is an unheld request's latency right after another's, the client's turnaround
        // included, as B's is.
        tokio::time::sleep(SETTLE).await;
        let (c_body, _) = prompts.body(PromptKind::Fresh, 1_000_000 + 2 * pair);
        let (d_body, _) = prompts.body(PromptKind::Fresh, 1_000_001 + 2 * pair);
        let c = first.send(&c_body).await;
        let c_end = Instant::now();
        let d = second.send(&d_body).await;
        let d_end = Instant::now();
        let (held_now, released_now) = counters().await;
        if !(c.ok() && d.ok()) {
            eprintln!(
                "overhead: queue path control {pair}: C {} D {}",
                c.status, d.status
            );
            continue;
        }
        if (held_now - held_then, released_now - released_then) != (1, 1) {
            eprintln!(
                "overhead: queue path pair {pair}: held {} released {} (not one each): left out",
                held_now - held_then,
                released_now - released_then
            );
            continue;
        }
        unheld.push(us(d.latency));
        let held_gap = us(b_end.saturating_duration_since(a_end));
        added.push(held_gap - us(d_end.saturating_duration_since(c_end)));
    }
    let after = decision::read_after_flush(&envoy).await?;
    let (held_after, released_after) = counters().await;
    let (held, released) = (held_after - held_before, released_after - released_before);
    let report = HeldReport {
        pairs: opts.held_pairs,
        measured: added.len(),
        held,
        released,
        unheld_p50_us: median_of(unheld),
        added_p50_us: percentile(&added, 50.0),
        added_p10_us: percentile(&added, 10.0),
        added_p90_us: percentile(&added, 90.0),
        decisions: after.since(&before).summary(),
        wall_s: t0.elapsed().as_secs_f64(),
    };
    eprintln!(
        "overhead: queue path: {} of {} pairs measured, added p50 {} µs",
        report.measured,
        report.pairs,
        report
            .added_p50_us
            .map_or_else(|| "-".to_owned(), |d| format!("{d:+.0}"))
    );
    Ok(report)
}
