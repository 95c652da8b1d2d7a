//! The picker ranks candidates by what the request costs the pool there, cheapest first: its own
//! predicted time to first token plus the wait its uncached prefill adds to the requests that will
//! queue behind it ([`Prediction::pool_cost_ms`], see `super::predict`).
//!
//! * **Affinity floor.** A pod's cost is divided by `exp(band × held)`, `held` the share of the
//!   prompt it holds and `band` its role's prediction error ([`PodView::error_band`],
//!   `cost::ErrorBand`): a move off the pod holding the prompt must be predicted better by more
//!   than the predictions miss by (four times in five), so kvroute stays above "sticky until
//!   saturated" (llm-d's default) and moves a prefix on a real difference, not on noise. A pod that
//!   holds a few leading blocks of a long prompt gets a few percent of the band, not all of it; pods
//!   holding the same share keep their order. A holder that truly cannot keep up still spills: its
//!   queue grows until the band is crossed, or the overload guard below ranks it last.
//!   A restarted pod counts the prompt's blocks it held before as held here, until it has
//!   refilled ([`PodView::former_blocks`]): the prediction still prices a recompute everywhere,
//!   but the move off the prompt's old home must win by the band, as a move off a holder must.
//!   Without it a restart of every pod re-placed every prompt as new under the restart's queues:
//!   in one run 7 of 12 tenants moved and the 3/3/3/3 partition became 4/3/4/2, where
//!   vllm-router, keeping its stale tree, kept its partition.
//! * **Ties.** Pods whose cost is within `prediction.tie_band` (relative) of the best, and
//!   whose load is within `rendezvous_load_slack` requests of the least loaded among them, are
//!   equal; they are ordered by rendezvous (highest-random-weight) hashing of the request's first
//!   block hash with the pod address. Gateway replicas share the pods' polled load but not each
//!   other's boards or prefix knowledge; for a new prefix their predictions agree up to that noise,
//!   so they send it to the same pod without talking, and a pod joining or leaving moves only the
//!   prefixes it wins. The load slack keeps a tie from landing on a pod already running more
//!   streams than the others (its prediction differs by one decode step's share, within the band).
//!   The hashed key is the first block *no tied pod holds* ([`tie_key`]): for a new prefix that is
//!   its first block, as above; where the tied pods hold a shared prefix (an agent's tools, a
//!   common system prompt, a chat template's opening), it is where the request becomes its own.
//!   Keyed on the first block instead, every request behind a prefix all pods hold won every tie
//!   on the same pod, which ran up to a tie band more work than the others; keyed on the first
//!   block not *every* pod holds, every new tenant whose prompt opens like the others' (`You are
//!   the support assistant of …`: one 64-character block) went to the same pod once one pod held
//!   that opening. A hot prefix spilling off its holder still keys on one block of that prefix
//!   (the holder is not tied with the pods it spills to), so it spills to one pod, not to all.
//! * **Overload guard.** Only where the engine's cap on running requests is known: configured
//!   (`overload_guard.max_running`: vLLM's `--max-num-seqs`, SGLang's `--max-running-requests`,
//!   llama.cpp's `--parallel`; no engine exports it), else as the pod's polls have shown it
//!   ([`PodView::seats`], `crate::pod::seats`): a pod running that many whose queue
//!   (requests not yet started, [`PodView::queue`]) exceeds the shortest candidate queue by more
//!   than `abs_gap` and by more than `rel_gap` times is ranked after every pod that is not. Below
//!   its seat cap a request waits on a pod only for the prefills ahead of it, which the
//!   prediction prices; at the cap it waits for decodes to end, which no prefill term shows, and
//!   a burst piles up unstarted there (the real-Envoy test
//!   `a_hot_prefix_spills_over_instead_of_queueing_behind_one_pod`: 32 requests, 4 slots per
//!   pod). Without the cap the guard used to fire on the queue's count alone, exempting a holder
//!   whose queued prefill was at least the prompt it held; in the multi-tenant cell (12 tenants
//!   × 6,000-word prompts) a cold start filled holders' queues with cheap hits behind
//!   whole-prompt recomputes, the guard ranked each such holder last though its prediction was a
//!   third of the chosen pod's, and every move was another whole prefill queueing hits on the
//!   next pod: in two runs of seeds 1–6, 9 of 12 thrashed (p90 4.6–13.6 s, hit 93–97%) where
//!   the cost alone kept all 12 at 0.23–0.30 s (hit 98.4%) in the same runs (docs/results.md,
//!   "The overload guard").
//!   It compares queues, not requests in flight: it used to compare the latter, and in a pool with
//!   one pod half as fast the fast pods, running ~19 streams each against the slow one's ~5 and
//!   admitting new work at once, were all guarded, so the slow pod got requests predicted 2–10×
//!   later (`kvbench compare --workload unequal-pool --shadow-probe`: kvroute chose the pod the
//!   pods themselves estimated earliest in 58% of requests, and sent the slow pod 57 requests
//!   where it was earliest for 17).
//! * **Session pin.** A request with a session goes first to its session's pod (rendezvous of the
//!   session id, see `super::session`) unless that pod is guarded or its prediction is more than
//!   `session.max_slowdown` times the best pod's; the ranking behind it stays as predicted.
//!
//! * **Stored response.** A request continuing a stored Responses API answer goes to the pod that
//!   stored it, whatever its load: anywhere else it is answered 404 (`crate::stored_responses`).
//!   Where that pod is not a candidate, the ranking stands.
//!
//! * **Objectives.** With SLO headers, the pods predicted to meet them go first, most-cached first
//!   (see `super::slo`); none meeting them: the ranking stands (or a negative priority is shed).
//!
//! The result is the primary pod plus fallbacks for Envoy's retry policy to walk.

use super::SelectionConfig;
use super::{PodView, Prediction, Rejection, RouteRequest};
use xxhash_rust::xxh3::xxh3_64_with_seed;

#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub addr: String,
    pub matched_blocks: usize,
    /// [`PodView::former_blocks`].
    pub former_blocks: usize,
    pub prediction: Prediction,
    /// Ranked behind the others by the overload guard.
    pub guarded: bool,
    /// With latency objectives: whether this pod is predicted to meet them.
    pub meets_slo: Option<bool>,
    /// Its metrics were stale: predicted on the gateway's own view of its work.
    pub stale: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteReason {
    /// The primary pod holds part of the prompt.
    PrefixHit,
    /// No pod holds any of it: chosen by the prediction (load) alone.
    Load,
    /// The request's session is pinned to this pod (see `super::session`).
    Session,
    /// The pod stored the response the request continues (`crate::stored_responses`).
    StoredResponse,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Route {
        ranked: Vec<Choice>,
        reason: RouteReason,
    },
    NoEndpoint(Rejection),
}

pub fn rendezvous_rank(key: u64, addr: &str) -> u64 {
    xxh3_64_with_seed(addr.as_bytes(), key)
}

/// The rendezvous key of a request whose tied pods hold at most `held` leading blocks: the hash
/// of the first block none of them holds, or the request's own key when one holds all of it (or
/// it has no full block).
pub fn tie_key(held: usize, request: &RouteRequest<'_>) -> u64 {
    match request.block_hashes.get(held) {
        Some(&hash) if held > 0 => hash,
        _ => request.affinity_key,
    }
}

/// The overload guard (see the module header): `min_queue` is the shortest [`PodView::queue`]
/// among the candidates.
pub fn overloaded(config: &SelectionConfig<'_>, pod: &PodView<'_>, min_queue: f64) -> bool {
    let guard = config.overload_guard;
    let Some(seats) = guard.seats(pod.seats) else {
        return false;
    };
    let queue = pod.queue();
    pod.load() >= f64::from(seats)
        && queue - min_queue > guard.abs_gap
        && queue > guard.rel_gap * min_queue
}

/// What `pod` is ranked by: the request's cost to the pool there, less the affinity floor's
/// benefit of the doubt for the share of the prompt it holds (see the module header).
pub fn ranking_cost(pod: &PodView<'_>, prediction: &Prediction, request: &RouteRequest<'_>) -> f64 {
    let held_blocks = pod.matched_blocks.max(pod.former_blocks);
    let held_tokens = held_blocks as f64 * f64::from(request.tokens_per_block);
    let held = if request.prompt_tokens == 0 {
        0.0
    } else {
        (held_tokens / request.prompt_tokens as f64).clamp(0.0, 1.0)
    };
    let band = if pod.error_band.is_finite() {
        pod.error_band.max(0.0)
    } else {
        0.0
    };
    prediction.pool_cost_ms() * (-band * held).exp()
}

struct Entry {
    index: usize,
    /// [`ranking_cost`].
    cost: f64,
    /// The request's own predicted first token there (what the session pin's slowdown compares).
    ttft: f64,
    rank: u64,
    guarded: bool,
    tied: bool,
    meets_slo: bool,
    matched: usize,
}

pub fn pick(
    config: &SelectionConfig<'_>,
    pods: &[&PodView<'_>],
    predictions: &[Prediction],
    request: &RouteRequest<'_>,
) -> Decision {
    let min_queue = pods.iter().map(|p| p.queue()).fold(f64::INFINITY, f64::min);
    let mut entries: Vec<Entry> = pods
        .iter()
        .zip(predictions)
        .enumerate()
        .map(|(index, (pod, p))| Entry {
            index,
            cost: ranking_cost(pod, p, request),
            ttft: p.ttft_ms,
            rank: 0,
            guarded: overloaded(config, pod, min_queue),
            tied: false,
            meets_slo: request.hints.slo.met_by(p.ttft_ms, pod.itl_ms),
            matched: pod.matched_blocks,
        })
        .collect();
    mark_ties(config, pods, &mut entries, request);
    // Unguarded before guarded; ties first, by rendezvous; then the rest by cost, rendezvous
    // breaking exact equality.
    entries.sort_by(|a, b| {
        a.guarded
            .cmp(&b.guarded)
            .then_with(|| b.tied.cmp(&a.tied))
            .then_with(|| {
                if a.tied && b.tied {
                    std::cmp::Ordering::Equal
                } else {
                    a.cost.total_cmp(&b.cost)
                }
            })
            .then_with(|| b.rank.cmp(&a.rank))
    });
    if let Err(rejection) = order_for_slo(&mut entries, request) {
        return Decision::NoEndpoint(rejection);
    }
    let (pinned, stored) = pins(config, pods, &mut entries, request);
    let slo = request.hints.slo;
    let ranked: Vec<Choice> = entries
        .iter()
        .take(config.max_endpoints_in_header)
        .filter_map(|e| {
            let pod = pods.get(e.index)?;
            Some(Choice {
                addr: pod.addr.to_string(),
                matched_blocks: pod.matched_blocks,
                former_blocks: pod.former_blocks,
                prediction: predictions.get(e.index).copied().unwrap_or_default(),
                guarded: e.guarded,
                meets_slo: slo.is_set().then_some(e.meets_slo),
                stale: pod.health == crate::health::Health::Stale,
            })
        })
        .collect();
    let reason = match ranked.first() {
        _ if stored.is_some() => RouteReason::StoredResponse,
        _ if pinned.is_some() => RouteReason::Session,
        Some(c) if c.matched_blocks > 0 => RouteReason::PrefixHit,
        _ => RouteReason::Load,
    };
    if ranked.is_empty() {
        return Decision::NoEndpoint(Rejection::NoPods);
    }
    Decision::Route { ranked, reason }
}

/// Marks the unguarded entries within the tie band of the cheapest (and within the load slack of
/// the least loaded among those) as tied, and gives every entry its rendezvous rank for the
/// request's tie key.
fn mark_ties(
    config: &SelectionConfig<'_>,
    pods: &[&PodView<'_>],
    entries: &mut [Entry],
    request: &RouteRequest<'_>,
) {
    let best = entries
        .iter()
        .filter(|e| !e.guarded)
        .map(|e| e.cost)
        .fold(f64::INFINITY, f64::min);
    let band = best * (1.0 + config.tie_band);
    let load_of = |i: usize| pods.get(i).map_or(f64::INFINITY, |p| p.load());
    let min_load_in_band = entries
        .iter()
        .filter(|e| !e.guarded && e.cost <= band)
        .map(|e| load_of(e.index))
        .fold(f64::INFINITY, f64::min);
    for e in entries.iter_mut() {
        e.tied = !e.guarded
            && e.cost <= band
            && load_of(e.index) <= min_load_in_band + config.rendezvous_load_slack;
    }
    let held_by_tied = entries
        .iter()
        .filter(|e| e.tied)
        .map(|e| e.matched)
        .max()
        .unwrap_or(0);
    let key = tie_key(held_by_tied, request);
    for e in entries.iter_mut() {
        e.rank = pods
            .get(e.index)
            .map_or(0, |p| rendezvous_rank(key, p.addr));
    }
}

/// With a latency objective: the pods meeting it first, most-cached first (the order within
/// equal matches stands). None meeting it: a sheddable request (negative priority) is refused.
fn order_for_slo(entries: &mut [Entry], request: &RouteRequest<'_>) -> Result<(), Rejection> {
    if !request.hints.slo.is_set() {
        return Ok(());
    }
    if entries.iter().any(|e| e.meets_slo && !e.guarded) {
        entries.sort_by(|a, b| {
            (b.meets_slo && !b.guarded)
                .cmp(&(a.meets_slo && !a.guarded))
                .then_with(|| {
                    if a.meets_slo && b.meets_slo {
                        b.matched.cmp(&a.matched)
                    } else {
                        std::cmp::Ordering::Equal
                    }
                })
        });
    } else if request.hints.priority < 0 {
        return Err(Rejection::SloUnattainable);
    }
    Ok(())
}

/// Moves the session's pod (unless guarded, much slower than the best, or missing an objective
/// another meets) and then the pod storing the previous response to the front; returns the
/// indexes of each that was pinned.
fn pins(
    config: &SelectionConfig<'_>,
    pods: &[&PodView<'_>],
    entries: &mut Vec<Entry>,
    request: &RouteRequest<'_>,
) -> (Option<usize>, Option<usize>) {
    let best_ttft = entries
        .iter()
        .filter(|e| !e.guarded)
        .map(|e| e.ttft)
        .fold(f64::INFINITY, f64::min);
    let slo = request.hints.slo;
    let pinned = request.hints.session.and_then(|key| {
        let (i, _) = pods
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| rendezvous_rank(key, p.addr))?;
        let e = entries.iter().find(|e| e.index == i)?;
        let slow = e.ttft > best_ttft * config.session_max_slowdown;
        let misses = slo.is_set() && !e.meets_slo && entries.iter().any(|o| o.meets_slo);
        (!e.guarded && !slow && !misses).then_some(i)
    });
    let stored = request.hints.stored_at.and_then(|key| {
        pods.iter()
            .position(|p| crate::stored_responses::addr_key(p.addr) == key)
    });
    for i in [pinned, stored].into_iter().flatten() {
        if let Some(at) = entries.iter().position(|e| e.index == i) {
            let entry = entries.remove(at);
            entries.insert(0, entry);
        }
    }
    (pinned, stored)
}
