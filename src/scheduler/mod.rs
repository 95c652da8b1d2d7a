//! Scheduling, in the llm-d scheduler's vocabulary: **filters** drop pods that cannot serve the
//! request, **scorers** rate each remaining pod in [0, 1], the **picker** ranks pods by the weighted
//! sum and breaks ties by rendezvous hashing. Selection is a pure function of its inputs (pods, the
//! request's block hashes, the clock value passed in): no side effects, no randomness, so the same
//! inputs give the same pod in every worker and every gateway replica.

mod filters;
mod picker;
pub mod saturation;
mod scorers;
pub mod session;

pub use filters::{filter, Rejection};
pub use picker::{rendezvous_rank, Choice, Decision, RouteReason};

use crate::config::{Config, Role};

/// What the scheduler knows about one pod at decision time.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView<'a> {
    pub addr: &'a str,
    pub role: Role,
    /// Metrics are recent and the last poll answered.
    pub fresh: bool,
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    /// Requests this gateway has sent to the pod that have not finished.
    pub inflight: f64,
    /// Models the pod reports; empty means unknown (no model filtering).
    pub models: &'a [String],
    /// Leading blocks of the request that the index believes the pod holds.
    pub matched_blocks: usize,
}

impl PodView<'_> {
    /// The queue the next request would join. Metrics lag by a poll interval, the gateway's own
    /// in-flight count does not; the larger of the two is the better guess.
    pub fn load(&self) -> f64 {
        (self.waiting + self.running).max(self.inflight)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// Roles that may serve this step (decode and aggregated pods both decode).
    pub roles: &'a [Role],
    pub block_hashes: &'a [u64],
    /// Key for rendezvous tie-breaking: the first block hash, or the chain seed for short prompts.
    pub affinity_key: u64,
    /// Hints the client sent with the request.
    pub hints: Hints,
}

/// What the client asked for beyond the body: a session to stick to, a priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hints {
    /// [`session::session_key`] of the session header, when present.
    pub session: Option<u64>,
    /// From the priority header; absent = 0. Negative = may be shed under saturation.
    pub priority: i32,
}

/// Runs filters → (shedding) → scorers → picker.
pub fn decide(config: &Config, pods: &[PodView<'_>], request: &RouteRequest<'_>) -> Decision {
    let candidates = match filter(pods, request) {
        Ok(c) => c,
        Err(rejection) => return Decision::NoEndpoint(rejection),
    };
    if request.hints.priority < 0 && candidates.iter().all(|p| config.shedding.is_saturated(p)) {
        return Decision::NoEndpoint(Rejection::Saturated);
    }
    let scored = scorers::score(config, &candidates, request.block_hashes.len());
    picker::pick(config, &candidates, &scored, request)
}

#[cfg(test)]
mod tests;
