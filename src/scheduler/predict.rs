//! The predictor: each candidate's time to first token for this request, in milliseconds.
//!
//! `ttft = overhead + per_token × (tokens ahead + uncached) + per_decoding × decoding`, with the
//! pod's learned coefficients (`crate::cost`) and:
//!
//! * **uncached** — the prompt's tokens minus the leading blocks the index believes the pod holds:
//!   what this pod would compute for this prompt. Prefix affinity is this term.
//! * **tokens ahead** — the uncached tokens of the requests this gateway sent the pod that have not
//!   yet produced their first byte (the work board), plus, for requests the pod reports waiting
//!   beyond those (another gateway replica's traffic, invisible on our board; no more than the pod
//!   holds beyond this gateway's requests in flight there, ours counted as of the poll as well as
//!   now), the typical request size. Hot-spot avoidance is this term: a hot prefix's holder fills
//!   up until recomputing the prefix on another pod is faster than waiting, and then the prefix is
//!   replicated there.
//!   The queue's head is already being computed: since the board's `head_since_ms` the pod has
//!   spent the time past its fixed overhead on it, at its learned speed, so that much of the head
//!   ([`head_progress`], at most all of it) is not ahead any more. Counting a nearly finished
//!   prefill as wholly ahead over-predicted busy pods by about 14% (median, `make bench`) and
//!   ranked a pod whose head was about to finish behind one whose head had just begun.
//! * **scale** — the whole is multiplied by the pod's role's calibration to the median
//!   (`cost::MedianScale`): the fit predicts the mean, and first-token times are skewed.
//! * **warm load** — the matched blocks in a KV tier beyond the GPU (host memory, disk) are not
//!   recomputed but loaded ([`PodView::warm_load_ms`], `crate::affinity::tiers`): added after the
//!   scale, to this request's first token only (tier loads run beside the engine's steps).
//! * **adapter load** — where the request names a LoRA adapter the pod does not hold, the time to
//!   load it ([`PodView::adapter_load_ms`], `crate::adapters`), added after the scale: it is not a
//!   token cost, and it is also work the pod does for this request (the load runs in the engine's
//!   step, so it delays the requests queued behind it as the prefill does).
//! * **seat wait** — where the pod's cap on running requests is known ([`PodView::seats`]:
//!   configured, or learned from its polls) and the requests on it fill its seats, the request
//!   waits for seats to free: those beyond the seats go first, then it, and a seat frees every
//!   `hold ÷ seats` on average, `hold` how long the pod's streams decode
//!   ([`PodView::seat_hold_ms`]): [`seat_wait_ms`]. Added after the scale, to this request's first
//!   token only: it waits for decodes, it adds no work. Without it a pod at its cap looked as
//!   soon as its prefill queue said, and only the overload guard, past its gap, saw the queue for
//!   seats (docs/results.md, "Overload and flow control").
//! * **decoding** — sequences decoding on the pod (polled, or the gateway's own count of requests
//!   past their first byte if larger): an engine that runs prefill and decode in one step pays for
//!   the decode batch in every step, the first token's included.
//!
//! **What the request costs the pool** ([`Prediction::pool_cost_ms`]) is what the picker ranks by:
//! its own predicted first token plus the wait its uncached prefill adds to the requests that will
//! queue behind it (`added_wait_ms`, [`with_added_wait`]): this request's own compute time × the
//! queue the next arrivals there join, an M/M/1 queue's marginal cost of `W` more work being
//! `W × L`, `L` the mean number in the system. The queue is the pod's ([`PodView::queue`]) or, if
//! longer, the candidates' mean: the router sends the next arrivals to whichever pod is free, so a
//! pod idle for the moment in a busy pool does not stay idle, and the work put on it delays them
//! as surely as on any other (counted by the pod's own queue alone, the pods that emptied for a
//! moment during a cold start took recompute after recompute, and a pool whose tenants fit its
//! caches once each held some twice and thrashed). In an idle pool it is nothing and the ranking
//! is the request's own first token; under load a recompute costs what it costs everybody behind
//! it. Ranked by the request's own first token alone, a 6,000-token recompute on a pod without the
//! prefix looked sooner than the holder's queue; each such move added a whole prefill to the pool
//! and gave the prefix a second home, queues grew, more requests moved, and a pool of four near
//! saturation fell into cache thrashing (12 tenants × 6,000-word prompts on pods caching 32k
//! tokens, `kvbench compare --workload multi-tenant-stall`, docs/results.md "A matrix of workloads": p90
//! TTFT 0.2–88.6 s and hit ratio 0.72–0.99 over three seeds, against 160–174 ms and 0.99 ranked
//! by the pool's cost).

use super::{PodView, RouteRequest};
use crate::cost::Coefficients;
use crate::work::PodWork;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub uncached_tokens: f64,
    pub tokens_ahead: f64,
    pub decoding: f64,
    /// The pod's time to compute this request's uncached tokens alone.
    pub own_compute_ms: f64,
    /// What this request's uncached prefill adds to the wait of the requests that will queue
    /// behind it there (see the module header).
    pub added_wait_ms: f64,
    /// Of `ttft_ms`, the time to load the request's adapter (see the module header).
    pub adapter_load_ms: f64,
    /// The reload of the adapter that load evicts, which another request pays (in
    /// `added_wait_ms`, not in `ttft_ms`).
    pub adapter_reload_ms: f64,
    /// Of `ttft_ms`, the time to load its cached blocks from tiers beyond the GPU.
    pub warm_load_ms: f64,
    /// Of `ttft_ms`, the wait for one of the pod's seats ([`seat_wait_ms`]).
    pub seat_wait_ms: f64,
}

impl Prediction {
    /// What the picker ranks by: the request's own first token plus the wait it adds to others.
    pub fn pool_cost_ms(&self) -> f64 {
        self.ttft_ms + self.added_wait_ms
    }
}

/// Prompt tokens a pod holding `matched_blocks` leading blocks would still compute.
pub fn uncached_tokens(prompt_tokens: u64, matched_blocks: usize, tokens_per_block: u32) -> f64 {
    prompt_tokens.saturating_sub(matched_blocks as u64 * u64::from(tokens_per_block)) as f64
}

/// Tokens of `work`'s head prefill the pod has computed by `now_ms`, at the speed `cost` predicts.
pub fn head_progress(work: &PodWork, cost: &Coefficients, now_ms: u64) -> f64 {
    if work.head_tokens == 0 || cost.us_per_token <= 0.0 {
        return 0.0;
    }
    let busy_ms = now_ms.saturating_sub(work.head_since_ms) as f64 - cost.overhead_ms.max(0.0);
    (busy_ms.max(0.0) * 1e3 / cost.us_per_token).min(work.head_tokens as f64)
}

/// Milliseconds the request would wait for a seat on `pod` (see the module header): 0 where its
/// cap or how long its requests hold a seat is unknown, or a seat is free.
pub fn seat_wait_ms(pod: &PodView<'_>) -> f64 {
    let (Some(seats), Some(hold)) = (pod.seats, pod.seat_hold_ms) else {
        return 0.0;
    };
    if seats == 0 || !(hold.is_finite() && hold > 0.0) {
        return 0.0;
    }
    let seats = f64::from(seats);
    let beyond = pod.load() + 1.0 - seats;
    if beyond > 0.0 {
        beyond * hold / seats
    } else {
        0.0
    }
}

pub fn predict(pod: &PodView<'_>, request: &RouteRequest<'_>) -> Prediction {
    let uncached = uncached_tokens(
        request.prompt_tokens,
        pod.matched_blocks,
        request.tokens_per_block,
    );
    let unseen_waiting = pod.unseen_waiting();
    let tokens_ahead = pod.queued_tokens.max(0.0) + unseen_waiting * request.typical_tokens;
    // The engine counts a request still prefilling as running; the board knows which those are.
    let decoding = (pod.running.max(pod.inflight) - pod.queued_requests).max(0.0);
    let adapter_load_ms = pod.adapter_load_ms.max(0.0);
    let warm_load_ms = if pod.warm_load_ms.is_finite() {
        pod.warm_load_ms.max(0.0)
    } else {
        0.0
    };
    let own_compute_ms = pod.cost.us_per_token * uncached / 1e3 * pod.ttft_scale + adapter_load_ms;
    let seat_wait_ms = seat_wait_ms(pod);
    Prediction {
        ttft_ms: pod.cost.predict_ms(tokens_ahead + uncached, decoding) * pod.ttft_scale
            + adapter_load_ms
            + warm_load_ms
            + seat_wait_ms,
        uncached_tokens: uncached,
        tokens_ahead,
        decoding,
        own_compute_ms,
        added_wait_ms: 0.0,
        adapter_load_ms,
        adapter_reload_ms: pod.adapter_reload_ms.max(0.0),
        warm_load_ms,
        seat_wait_ms,
    }
}

/// `prediction` with the wait it adds behind it: its prefill × the longer of the pod's queue and
/// `pool_queue`, the candidates' mean (see the module header), its adapter load × the pod's
/// own queue, and the reload of an adapter it evicts, paid once by that adapter's next request
/// and once by each request queued behind it. A load is paid once: the pod then holds the adapter, and the next arrivals there
/// do not pay it again, where every request moved off a prefix's holder recomputes. Priced by
/// the pool's queue, a load never looked cheaper than the holder's queue however long that grew,
/// and a hot adapter stayed on one pod while another sat idle.
pub fn with_added_wait(prediction: Prediction, pod: &PodView<'_>, pool_queue: f64) -> Prediction {
    let waiters = |queue: f64| {
        if queue.is_finite() {
            queue.max(0.0)
        } else {
            0.0
        }
    };
    let load = prediction.adapter_load_ms;
    let prefill = prediction.own_compute_ms - load;
    // An evicted adapter's reload is a load like this one, paid by its next request and by
    // whoever queues behind that.
    let reload = prediction.adapter_reload_ms;
    Prediction {
        added_wait_ms: prefill * waiters(pod.queue().max(pool_queue))
            + (load + reload) * waiters(pod.queue())
            + reload,
        ..prediction
    }
}

/// `prediction` in the configuration: the prior every role's cost fit starts from and how close two
/// predictions must be to count as a tie.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct PredictionConfig {
    pub prior: crate::cost::Coefficients,
    /// How many typical requests the prior is worth against a pod's own observations.
    pub prior_samples: f64,
    /// Predictions within this fraction of the best are equal (rendezvous decides among them).
    pub tie_band: f64,
}

impl Default for PredictionConfig {
    fn default() -> Self {
        let learning = crate::cost::CostConfig::default();
        PredictionConfig {
            prior: learning.prior,
            prior_samples: learning.prior_samples,
            // Replicas' views of a pod differ by their own in-flight work and a poll's noise; a
            // few percent of a prediction is well inside what one request more or less changes.
            tie_band: 0.05,
        }
    }
}

impl PredictionConfig {
    pub fn learning(&self) -> crate::cost::CostConfig {
        crate::cost::CostConfig {
            prior: self.prior,
            prior_samples: self.prior_samples,
        }
    }

    pub fn validate(&self) -> Result<(), crate::common::ConfigError> {
        self.learning().validate("prediction")?;
        if !(self.tie_band.is_finite() && (0.0..=1.0).contains(&self.tie_band)) {
            return Err(crate::common::ConfigError::at(
                "prediction.tie_band",
                "must be in [0, 1]",
            ));
        }
        Ok(())
    }
}
