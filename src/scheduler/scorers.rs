//! Scorers, each in [0, 1], higher is better:
//!
//! * **prefix** — matched leading blocks / request blocks. Capped to 0 when the pod's load exceeds
//!   the least-loaded candidate's by more than `affinity_cap.abs_gap` requests *and* by more than
//!   `affinity_cap.rel_gap` times (SGLang router's balance thresholds): a hot prefix then spills to
//!   the pods that will serve it sooner instead of queueing behind one pod.
//! * **queue** — 1 − load / max(most loaded candidate's load, `load_scale_floor`), where load is
//!   waiting + running (or the gateway's in-flight count if larger). Unlike llm-d's min-max
//!   normalisation, one extra request on an otherwise idle pool costs 1/`load_scale_floor`, not the
//!   whole score: a pod that holds the prompt should not lose it to a poll's worth of load noise.
//! * **kv_cache** — 1 − KV-cache utilisation.
//! * **inflight** — the same shape over this gateway's unfinished requests to the pod; it reacts
//!   within a request, long before the next metrics poll.
//!
//! The weighted sum is divided by the sum of weights, so the total is in [0, 1] too.

use super::PodView;
use crate::config::Config;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scores {
    pub prefix: f64,
    pub queue: f64,
    pub kv_cache: f64,
    pub inflight: f64,
    pub total: f64,
    /// The prefix score was zeroed by the affinity cap.
    pub capped: bool,
}

fn inverse_share(value: f64, max: f64, floor: f64) -> f64 {
    let scale = max.max(floor);
    if scale <= f64::EPSILON {
        1.0
    } else {
        (1.0 - value / scale).clamp(0.0, 1.0)
    }
}

/// The affinity cap: a pod this far above the least-loaded candidate loses its prefix (and session)
/// preference.
pub fn overloaded(config: &Config, load: f64, min_load: f64) -> bool {
    let cap = &config.affinity_cap;
    load - min_load > cap.abs_gap && load > cap.rel_gap * min_load
}

pub fn score(config: &Config, pods: &[&PodView<'_>], request_blocks: usize) -> Vec<Scores> {
    let loads: Vec<f64> = pods.iter().map(|p| p.load()).collect();
    let min_load = loads.iter().copied().fold(f64::INFINITY, f64::min);
    let max_load = loads.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let max_inflight = pods
        .iter()
        .map(|p| p.inflight)
        .fold(f64::NEG_INFINITY, f64::max);
    let w = &config.weights;
    let weight_sum = w.prefix + w.queue + w.kv_cache + w.inflight;
    pods.iter()
        .zip(loads)
        .map(|(pod, load)| {
            let overloaded = overloaded(config, load, min_load);
            let prefix = if request_blocks == 0 || overloaded {
                0.0
            } else {
                (pod.matched_blocks as f64 / request_blocks as f64).min(1.0)
            };
            let queue = inverse_share(load, max_load, config.load_scale_floor);
            let kv_cache = (1.0 - pod.kv_usage).clamp(0.0, 1.0);
            let inflight = inverse_share(pod.inflight, max_inflight, config.load_scale_floor);
            let total = (w.prefix * prefix
                + w.queue * queue
                + w.kv_cache * kv_cache
                + w.inflight * inflight)
                / weight_sum;
            Scores {
                prefix,
                queue,
                kv_cache,
                inflight,
                total,
                capped: overloaded && pod.matched_blocks > 0,
            }
        })
        .collect()
}
