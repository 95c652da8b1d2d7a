//! Scheduling, in the llm-d scheduler's vocabulary: **filters** drop pods that cannot serve the
//! request, the **predictor** estimates each remaining pod's time to first token, the **picker**
//! ranks pods by that estimate and breaks ties by rendezvous hashing. Selection is a pure function
//! of its inputs (pods, the request's blocks, the learned costs passed in): no side effects, no
//! randomness, no clock, so the same inputs give the same pod in every worker and every replica.
//!
//! What replaced the weighted sum. Until version 0.1 the pods were ranked by a weighted sum of
//! prefix match, queue length, KV use and in-flight count (llm-d-like weights 3/2/1/2), with an
//! affinity cap. It balanced *requests*, not *work*: where every pod held the shared prefix and
//! requests differed in what they brought, it lost to round-robin by 1.7–2.5× on p90 TTFT, and
//! behind an engine whose prefills stall decodes it trailed sglang-router's cache-aware policy
//! several times over. A request costs its pod the tokens that pod does not hold, and it waits for
//! the prefill work queued ahead of it; the gateway knows both because it routed that work, and it
//! learns each pod's speed from the first bytes it sees (`crate::cost`). So the score is one number
//! in milliseconds (`predict`), and prefix affinity (the uncached-token term), hot-spot avoidance
//! (the queue term) and replicating a hot prefix (recomputing elsewhere once that is faster than
//! waiting) all follow from it.

mod filters;
mod picker;
pub mod predict;
pub mod saturation;
pub mod session;
pub mod slo;

pub use filters::{filter, Rejection};
pub use picker::{rendezvous_rank, Choice, Decision, RouteReason};
pub use predict::Prediction;

use crate::common::{OverloadGuard, Role};
use crate::cost::Coefficients;

/// What the scheduler knows about one pod at decision time.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView<'a> {
    pub addr: &'a str,
    pub role: Role,
    /// Fresh, stale (polls late: the figures below are the board's view only) or down (see
    /// `crate::health`).
    pub health: crate::health::Health,
    /// Polled: requests the engine has queued, running, and its KV-cache use.
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    /// The engine's cap on requests running at once: `overload_guard.max_running` where
    /// configured, else as the pod's polls have shown it (`crate::pod::seats`); `None`: unknown.
    pub seats: Option<u32>,
    /// How long a request holds one of those seats: how long the pod's streams decode
    /// (`crate::cost`), if any were timed.
    pub seat_hold_ms: Option<f64>,
    /// Requests this gateway has sent to the pod that have not finished (every worker VM).
    pub inflight: f64,
    /// Of those, the uncached prompt tokens of the ones still before their first byte (their
    /// prefill is queued or running), and how many requests that is.
    pub queued_tokens: f64,
    pub queued_requests: f64,
    /// This gateway's requests on the pod when it was polled (0 with no poll in use): how much of
    /// `waiting` and `running` can be ours (`crate::pod::prom::GatewayShare`).
    pub ours_at_poll: crate::pod::prom::GatewayShare,
    /// The pod's learned first-token cost.
    pub cost: Coefficients,
    /// Its prediction is multiplied by this: its role's calibration to the median
    /// (`cost::MedianScale`).
    pub ttft_scale: f64,
    /// How widely its role's predictions miss, as a natural-log width (`cost::ErrorBand`): a move
    /// off the pod holding the prompt must win by more than this.
    pub error_band: f64,
    /// Recently observed inter-token latency of its streams (ms), if any were timed.
    pub itl_ms: Option<f64>,
    /// Models the pod reports; empty means unknown (no model filtering).
    pub models: &'a [String],
    /// Leading blocks of the request that the index believes the pod holds, in any KV tier.
    pub matched_blocks: usize,
    /// Leading blocks of the request the pod held before it restarted, until it has refilled:
    /// not a hit, but where the prompt lived, which the affinity floor counts as held (`picker`).
    pub former_blocks: usize,
    /// Milliseconds to load those of them that are in a tier beyond the GPU
    /// (`crate::affinity::tiers`).
    pub warm_load_ms: f64,
    /// Milliseconds the pod would spend loading the request's LoRA adapter first (0: it holds
    /// it, or the request names none; `crate::adapters`).
    pub adapter_load_ms: f64,
    /// Milliseconds another adapter's next request there would spend loading it again, evicted by
    /// this request's load (every slot holds another adapter): what the pool pays, not this
    /// request (`crate::adapters::AdapterLoad`).
    pub adapter_reload_ms: f64,
}

impl PodView<'_> {
    /// The queue the next request would join, in requests. Metrics lag by a poll interval, the
    /// gateway's own in-flight count does not; the larger of the two is the better guess. Used by
    /// shedding and the rendezvous load slack, not by the ranking.
    pub fn load(&self) -> f64 {
        (self.waiting + self.running).max(self.inflight)
    }

    /// Requests on the pod that have not started producing tokens: the engine's polled waiting
    /// count, or the gateway's own requests before their first byte if more (the poll lags). What
    /// the overload guard compares: a pod that runs many streams but admits new work at once is
    /// not overloaded, however many it runs.
    pub fn queue(&self) -> f64 {
        self.waiting.max(self.queued_requests)
    }

    /// Requests the pod reports waiting beyond this gateway's own unstarted ones, but no more than
    /// the pod holds that this gateway did not send (another replica's traffic, invisible on our
    /// board). The poll is up to an interval old (at the bench's time scale a 100 ms poll is 2 s
    /// of simulated prefill), so ours are counted as of when it was sent as well as now,
    /// whichever is more: a request of ours that was waiting then and has started or finished
    /// since still counts as waiting on the page. Counting it as another gateway's over-predicted
    /// the busiest pods by whole typical requests.
    pub fn unseen_waiting(&self) -> f64 {
        let ours_waiting = self.queued_requests.max(self.ours_at_poll.prefilling);
        let ours_held = self.inflight.max(self.ours_at_poll.inflight);
        let foreign = (self.waiting + self.running - ours_held).max(0.0);
        (self.waiting - ours_waiting).max(0.0).min(foreign)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// Roles that may serve this step (decode and aggregated pods both decode).
    pub roles: &'a [Role],
    pub block_hashes: &'a [u64],
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens per index block.
    pub tokens_per_block: u32,
    /// Key for rendezvous tie-breaking where no block tells candidates apart (see
    /// [`picker::tie_key`]): the first block hash, or the chain seed for short prompts.
    pub affinity_key: u64,
    /// The typical uncached tokens of a request (this VM's running mean): the size given to
    /// requests a pod reports waiting that this gateway did not send (other replicas' traffic).
    pub typical_tokens: f64,
    /// Hints the client sent with the request.
    pub hints: Hints,
}

/// What the client asked for beyond the body: a session to stick to, a priority.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Hints {
    /// [`session::session_key`] of the session header, when present.
    pub session: Option<u64>,
    /// From the priority header; absent = 0. Negative = may be shed under saturation.
    pub priority: i32,
    /// Latency objectives from the SLO headers (see `slo`).
    pub slo: slo::Slo,
    /// The pod that stored the Responses API answer this request continues
    /// (`crate::stored_responses::addr_key` of its address): no other pod can serve it.
    pub stored_at: Option<u64>,
}

/// What the selection reads of the configuration; `crate::config::Config::selection` assembles
/// it from the configuration's sections.
#[derive(Debug, Clone, Copy)]
pub struct SelectionConfig<'a> {
    pub shedding: &'a saturation::Shedding,
    /// With flow control on: a request every candidate is full for is held, not routed.
    pub flow_control: Option<&'a crate::admission::FlowControl>,
    pub overload_guard: &'a OverloadGuard,
    /// `prediction.tie_band`: pods within this share of the best cost are tied.
    pub tie_band: f64,
    pub rendezvous_load_slack: f64,
    /// `session.max_slowdown`.
    pub session_max_slowdown: f64,
    pub max_endpoints_in_header: usize,
}

/// Runs filters → (shedding) → predictor → picker.
pub fn decide(
    config: &SelectionConfig<'_>,
    pods: &[PodView<'_>],
    request: &RouteRequest<'_>,
) -> Decision {
    let candidates = match filter(pods, request) {
        Ok(c) => c,
        Err(rejection) => return Decision::NoEndpoint(rejection),
    };
    if request.hints.priority < 0 && candidates.iter().all(|p| config.shedding.is_saturated(p)) {
        return Decision::NoEndpoint(Rejection::Saturated);
    }
    if let Some(flow_control) = config.flow_control {
        if candidates
            .iter()
            .all(|p| flow_control.is_full(p.queue(), p.kv_usage))
        {
            return Decision::NoEndpoint(Rejection::Full);
        }
    }
    let pool_queue =
        candidates.iter().map(|p| p.queue()).sum::<f64>() / candidates.len().max(1) as f64;
    let predictions: Vec<Prediction> = candidates
        .iter()
        .map(|p| predict::with_added_wait(predict::predict(p, request), p, pool_queue))
        .collect();
    picker::pick(config, &candidates, &predictions, request)
}

#[cfg(test)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
mod tests;
