//! What a pod's first token costs, learned from what the gateway observes.
//!
//! The model: time to first token = `speed × (overhead + per_token × (prefill tokens queued ahead +
//! this prompt's uncached tokens) + per_decoding × (sequences decoding there))`. The three
//! coefficients are learned online per role (aggregated, prefill, decode) from every streamed
//! response on any pod of the role: the gateway knows what it put on the pod (the uncached tokens
//! of the requests ahead, from the work board, and this prompt's own), and it sees the first
//! response byte arrive. Pods need not be alike: each learns its `speed` against the role's fit
//! ([`PodSpeed`], which says why one factor per pod rather than a fit per pod), so a pool mixing
//! GPU generations is ranked by what each pod actually does.
//!
//! The fit is a ridge regression with exponential forgetting: decayed sums of the features'
//! outer products (a 3×3 matrix and a 3-vector, 12 numbers per fit whatever the traffic), solved on
//! every sample, regularised toward a configured prior worth `prior_samples` samples at a typical
//! request, so a role with no history predicts by the prior and one with history by its
//! observations. Old samples fade with `1/ROLE_FORGET_SAMPLES` per new one, and a pod's speed with
//! `1/FORGET_SAMPLES`, so a pod that slows down (thermal throttling, a noisy neighbour) is
//! re-learned within tens of requests. Robust to outliers: once a fit has `ROBUST_AFTER` samples,
//! an observation is clamped to within `OUTLIER_FACTOR` of the current prediction before it is
//! added (a winsorised update), so one request that waited on a pod-side hiccup moves the fit by a
//! bounded amount.
//!
//! Time is in milliseconds of wall clock. Nothing here knows the engine: vLLM with a prefill
//! stalling decodes, chunked prefill, SGLang or a simulator at 20× speed all fit the same three
//! numbers; what they do not capture (a step's decode-batch cost that grows with context, slot
//! limits) is absorbed by the overhead or guarded against elsewhere (see `crate::scheduler`).

use serde::Deserialize;

/// A pod's sample weight decays by `1 - 1/FORGET_SAMPLES` with every newer one.
const FORGET_SAMPLES: f64 = 64.0;
/// The same for a role's fit ([`CostFit::for_role`]), which every pod of the role feeds: its shape
/// is the model's and the engine's, not one pod's, and a longer memory is what keeps the intercept
/// and the slope from trading off between requests (each pod's speed still follows the pod within
/// `FORGET_SAMPLES` of its own first bytes, [`PodSpeed`]).
const ROLE_FORGET_SAMPLES: f64 = 256.0;
/// Samples before observations are clamped to the current prediction's neighbourhood.
const ROBUST_AFTER: f64 = 8.0;
/// An observation is clamped to [prediction / F, prediction × F].
const OUTLIER_FACTOR: f64 = 4.0;
/// The typical request the prior's strength is measured at: this many tokens, this many decoding.
const PRIOR_TOKENS: f64 = 1000.0;
const PRIOR_DECODING: f64 = 8.0;

/// Coefficients of the TTFT model, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct Coefficients {
    /// Fixed time of a request's first step (scheduling, the step's base cost, the network).
    pub overhead_ms: f64,
    /// Prefill time per uncached prompt token, in microseconds.
    pub us_per_token: f64,
    /// Extra first-token time per sequence decoding on the pod, in microseconds.
    pub us_per_decoding: f64,
}

impl Default for Coefficients {
    /// A prior between published single-GPU fits (Llama-3.1-8B on one H100: 5.8 ms per step + 17 µs
    /// per prefill token + 6 µs per decode token; Llama-3.3-70B on 4 H100: 12.6 ms + 76 µs + 67 µs;
    /// llm-d's inference-sim `defaults.yaml`). Each pod's own observations replace it within a few
    /// requests.
    fn default() -> Self {
        Coefficients {
            overhead_ms: 10.0,
            us_per_token: 40.0,
            us_per_decoding: 30.0,
        }
    }
}

impl Coefficients {
    pub fn validate(&self, field: &str) -> Result<(), crate::common::ConfigError> {
        for (name, v) in [
            ("overhead_ms", self.overhead_ms),
            ("us_per_token", self.us_per_token),
            ("us_per_decoding", self.us_per_decoding),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(crate::common::ConfigError::at(
                    format!("{field}.{name}"),
                    "must be a finite number ≥ 0",
                ));
            }
        }
        if self.us_per_token <= 0.0 {
            return Err(crate::common::ConfigError::at(
                format!("{field}.us_per_token"),
                "must be positive: prefill is never free",
            ));
        }
        Ok(())
    }

    /// Predicted milliseconds to first token for `tokens` of prefill (queued ahead + own) with
    /// `decoding` sequences running beside it.
    pub fn predict_ms(&self, tokens: f64, decoding: f64) -> f64 {
        self.overhead_ms
            + self.us_per_token * tokens.max(0.0) / 1e3
            + self.us_per_decoding * decoding.max(0.0) / 1e3
    }

    fn as_vector(&self) -> [f64; 3] {
        [
            self.overhead_ms,
            self.us_per_token / 1e3,
            self.us_per_decoding / 1e3,
        ]
    }

    fn from_vector(v: [f64; 3]) -> Coefficients {
        let [o, t, d] = v;
        Coefficients {
            overhead_ms: o.max(0.0),
            // Prefill is never free: a fit that says so is noise, not information.
            us_per_token: (t * 1e3).max(0.01),
            us_per_decoding: (d * 1e3).max(0.0),
        }
    }
}

/// One pod's online fit.
#[derive(Debug, Clone, PartialEq)]
pub struct CostFit {
    /// Σ w·φφᵀ (φ = [1, tokens, decoding]) and Σ w·φ·y, decayed.
    xx: [[f64; 3]; 3],
    xy: [f64; 3],
    /// Σ w: the effective number of samples.
    samples: f64,
    current: Coefficients,
    /// What a sample's weight is multiplied by with every newer one.
    keep: f64,
}

/// The learning settings every fit shares.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    /// The model of a pod with no history.
    pub prior: Coefficients,
    /// How many samples at a typical request (1,000 tokens, 8 decoding) the prior is worth.
    pub prior_samples: f64,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            prior: Coefficients::default(),
            prior_samples: 2.0,
        }
    }
}

impl CostConfig {
    pub fn validate(&self, field: &str) -> Result<(), crate::common::ConfigError> {
        self.prior.validate(&format!("{field}.prior"))?;
        if !(self.prior_samples.is_finite() && self.prior_samples > 0.0) {
            return Err(crate::common::ConfigError::at(
                format!("{field}.prior_samples"),
                "must be a positive number",
            ));
        }
        Ok(())
    }
}

impl CostFit {
    /// A fit with a pod's memory (`FORGET_SAMPLES`): what the tests below exercise the regression
    /// with; routing keeps one per role ([`CostFit::for_role`]).
    #[cfg(test)]
    pub fn new(config: &CostConfig) -> CostFit {
        CostFit::remembering(config, FORGET_SAMPLES)
    }

    /// A fit that every pod of a role feeds.
    pub fn for_role(config: &CostConfig) -> CostFit {
        CostFit::remembering(config, ROLE_FORGET_SAMPLES)
    }

    fn remembering(config: &CostConfig, samples: f64) -> CostFit {
        CostFit {
            xx: [[0.0; 3]; 3],
            xy: [0.0; 3],
            samples: 0.0,
            current: config.prior,
            keep: 1.0 - 1.0 / samples,
        }
    }

    pub fn coefficients(&self) -> Coefficients {
        self.current
    }

    /// Effective samples behind the fit (decayed).
    pub fn samples(&self) -> f64 {
        self.samples
    }

    /// Adds one observation: `tokens` of prefill (ahead + own) and `decoding` sequences at routing
    /// time, first byte `observed_ms` later.
    pub fn observe(&mut self, config: &CostConfig, tokens: f64, decoding: f64, observed_ms: f64) {
        if !(observed_ms.is_finite() && observed_ms >= 0.0 && tokens.is_finite()) {
            return;
        }
        let predicted = self.current.predict_ms(tokens, decoding);
        let y = if self.samples >= ROBUST_AFTER && predicted > 0.0 {
            observed_ms.clamp(predicted / OUTLIER_FACTOR, predicted * OUTLIER_FACTOR)
        } else {
            observed_ms
        };
        let keep = self.keep;
        let phi = [1.0, tokens.max(0.0), decoding.max(0.0)];
        for (row, pi) in self.xx.iter_mut().zip(phi) {
            for (cell, pj) in row.iter_mut().zip(phi) {
                *cell = *cell * keep + pi * pj;
            }
        }
        for (cell, pi) in self.xy.iter_mut().zip(phi) {
            *cell = *cell * keep + pi * y;
        }
        self.samples = self.samples * keep + 1.0;
        if let Some(solved) = self.solve(config) {
            self.current = Coefficients::from_vector(solved);
        }
    }

    /// Ridge solution: (XᵀX + Λ)θ = Xᵀy + Λθ₀, Λ = n₀·diag(1, T², D²) at the typical request.
    fn solve(&self, config: &CostConfig) -> Option<[f64; 3]> {
        let n0 = config.prior_samples;
        let scale = [1.0, PRIOR_TOKENS, PRIOR_DECODING];
        let prior = config.prior.as_vector();
        let mut a = self.xx;
        let mut b = self.xy;
        for (i, ((row, bi), (s, p))) in a
            .iter_mut()
            .zip(b.iter_mut())
            .zip(scale.iter().zip(prior))
            .enumerate()
        {
            let lambda = n0 * s * s;
            if let Some(diagonal) = row.get_mut(i) {
                *diagonal += lambda;
            }
            *bi += lambda * p;
        }
        // Non-negative least squares by active set: a coefficient the data want below zero (an
        // overhead partly hidden because the step in progress was already under way when the
        // request was routed) is fixed at zero and the others re-solved, rather than clamped after
        // the fact (which would shift every prediction up by the clamped amount).
        let mut fixed = [false; 3];
        for _ in 0..3 {
            let x = solve3(pin(a, &fixed), pin_rhs(b, &fixed))?;
            let negative: Vec<usize> = (0..3)
                .filter(|&i| {
                    x.get(i).is_some_and(|v| *v < 0.0) && !fixed.get(i).copied().unwrap_or(true)
                })
                .collect();
            if negative.is_empty() {
                return Some(x);
            }
            for i in negative {
                if let Some(f) = fixed.get_mut(i) {
                    *f = true;
                }
            }
        }
        solve3(pin(a, &fixed), pin_rhs(b, &fixed))
    }
}

/// The system with the `fixed` coefficients held at zero (their rows made identity rows, their
/// columns cleared elsewhere).
fn pin(mut a: [[f64; 3]; 3], fixed: &[bool; 3]) -> [[f64; 3]; 3] {
    for (i, row) in a.iter_mut().enumerate() {
        for (k, cell) in row.iter_mut().enumerate() {
            let row_fixed = fixed.get(i).copied().unwrap_or(false);
            let col_fixed = fixed.get(k).copied().unwrap_or(false);
            if row_fixed {
                *cell = if i == k { 1.0 } else { 0.0 };
            } else if col_fixed {
                *cell = 0.0;
            }
        }
    }
    a
}

fn pin_rhs(mut b: [f64; 3], fixed: &[bool; 3]) -> [f64; 3] {
    for (v, f) in b.iter_mut().zip(fixed) {
        if *f {
            *v = 0.0;
        }
    }
    b
}

/// Cramer's rule on a symmetric positive definite 3×3 system; `None` when (nearly) singular.
fn solve3(a: [[f64; 3]; 3], b: [f64; 3]) -> Option<[f64; 3]> {
    let det = |m: [[f64; 3]; 3]| {
        let [[a, b, c], [d, e, f], [g, h, i]] = m;
        a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    };
    let d = det(a);
    if !d.is_finite() || d.abs() < 1e-300 {
        return None;
    }
    let with_column = |col: usize| {
        let mut m = a;
        for (row, bv) in m.iter_mut().zip(b) {
            if let Some(cell) = row.get_mut(col) {
                *cell = bv;
            }
        }
        det(m) / d
    };
    let x = [with_column(0), with_column(1), with_column(2)];
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// A calibration of the served predictions to the median, one per role, shared by every pod of it.
///
/// The fits are least squares, so they predict the *mean* first-token time, and TTFT residuals are
/// skewed: a few requests wait far longer than their queue explains (a batch that formed after
/// they were routed, a preemption), so the mean sits above the typical request. On `shared-agent`
/// the fits over-predicted a median +20%. The calibration is a factor on what is served: every
/// first byte moves it [`MEDIAN_STEP`] up if the request was slower than predicted and down if it
/// was faster, so it settles where half the requests are each side. It is one factor per role, so
/// it never reorders pods of a role, nor changes which are tied (the tie band is relative): the
/// fits decide the ranking. Tried and left out, because they cost p90 TTFT: a shift per pod (a
/// random walk per pod that reorders equal pods: shared-agent p90 1.11× round-robin against 0.98×),
/// and fitting relative error instead of absolute (flattened slopes, so queues looked cheap: agent,
/// multi-turn and unequal-pool p90 up 3–13%). An additive shift per role did as well on
/// shared-agent but moved short requests' predictions by a larger share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianScale {
    factor: f64,
}

impl Default for MedianScale {
    fn default() -> Self {
        MedianScale { factor: 1.0 }
    }
}

/// Each first byte moves the factor by this fraction. Replaying the learning over traced
/// decisions of every `make bench` workload (seed 1, kvroute's own decisions), the median relative
/// error without it and with steps of 0.5% / 1% / 2%: shared-agent 26% → 7 / 6 / 7%, unequal-pool
/// 19% → 11 / 11 / 11%, agent 18% → 12 / 13 / 13%, the other four 6–9% throughout.
const MEDIAN_STEP: f64 = 0.01;
/// The factor stays within [1/F, F]: beyond that the fits themselves are wrong, not skewed.
const MAX_SCALE: f64 = 4.0;

impl MedianScale {
    /// What to multiply a prediction by.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// One first byte: `observed_ms` after a served prediction of `predicted_ms`.
    pub fn observe(&mut self, predicted_ms: f64, observed_ms: f64) {
        if !(predicted_ms.is_finite() && observed_ms.is_finite()) || observed_ms == predicted_ms {
            return;
        }
        let step = if observed_ms > predicted_ms {
            1.0 + MEDIAN_STEP
        } else {
            1.0 - MEDIAN_STEP
        };
        self.factor = (self.factor * step).clamp(1.0 / MAX_SCALE, MAX_SCALE);
    }
}

/// How far a role's served predictions typically miss, as a factor: the picker keeps a request on
/// the pod holding its prefix unless another pod is predicted better by more than this (see
/// `crate::scheduler::picker`, "affinity floor"). Moving a prefix on a difference smaller than the
/// prediction's own error is moving it on noise: each move recomputes the prefix and gives it a
/// second home, which a pool near saturation pays for with every request queued behind it.
///
/// It is the [`ERROR_QUANTILE`] quantile of `|ln(observed / predicted)|`, tracked like
/// [`MedianScale`] by a fixed step per first byte (up by `q × step` when a miss is wider, down by
/// `(1 − q) × step` when narrower: it settles where a share `q` of misses are narrower). Learned,
/// not a constant: a pool whose first tokens the model predicts within 5% moves a prefix for a 6%
/// gain, one it predicts within 40% does not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBand {
    log_error: f64,
}

/// The share of first bytes predicted within the band: a move must win even when the prediction
/// errs as widely as it does four times in five.
pub const ERROR_QUANTILE: f64 = 0.8;
/// Step of the quantile's tracker, in natural-log units per first byte: from its start it reaches
/// a pool's band within about a hundred first bytes and then moves a few percent at most.
const ERROR_STEP: f64 = 0.02;
/// Where the band starts before any first byte: predictions within ±25%.
const ERROR_START: f64 = 0.223;

impl Default for ErrorBand {
    fn default() -> Self {
        ErrorBand {
            log_error: ERROR_START,
        }
    }
}

impl ErrorBand {
    /// The band as a natural-log width (0.2 ≈ ±22%).
    pub fn log_width(&self) -> f64 {
        self.log_error
    }

    /// One first byte: `observed_ms` after a served prediction of `predicted_ms`.
    pub fn observe(&mut self, predicted_ms: f64, observed_ms: f64) {
        let usable = |ms: f64| ms.is_finite() && ms > 0.0;
        if !(usable(predicted_ms) && usable(observed_ms)) {
            return;
        }
        let miss = (observed_ms / predicted_ms).ln().abs();
        let step = if miss > self.log_error {
            ERROR_QUANTILE * ERROR_STEP
        } else {
            -(1.0 - ERROR_QUANTILE) * ERROR_STEP
        };
        self.log_error = (self.log_error + step).clamp(0.0, MAX_SCALE.ln());
    }
}

/// How much slower than its role's fit one pod is: the factor its predictions are multiplied by.
///
/// Why a factor and not a fit per pod: three coefficients learned from one pod's requests alone
/// are noisy in a way that ranks equal pods apart. The queue ahead of a request is known only
/// approximately (a poll's age, the head's progress), so the intercept and the slope trade off
/// from sample to sample: on `shared-agent`, three identical simulated pods settled on 12, 14 and
/// 17 µs per token and a decode-batch cost from −0.2 to 13 ms per sequence (the fits replayed
/// over a run's `kvbench compare --records`), and against the pods' own estimates
/// (`--shadow-probe`) their predictions ran a median 1.04, 1.12 and 1.50× high: equal pods ranked
/// up to 1.4× apart. One fit per role sees every pod's samples (the shape: overhead, per token, per
/// decoding sequence), and each pod learns one number, the mean log ratio of what it took to what
/// the role's fit predicted: a pool mixing GPU generations is still ranked by what each pod does
/// (a pod half as fast settles near 2× the others), and equal pods stay within a few percent of
/// each other (1.02–1.04× their own estimates on `shared-agent`).
///
/// The mean is decayed like the fits' (`FORGET_SAMPLES`), so a pod that slows down is re-learned
/// within tens of requests; each ratio is clamped to `OUTLIER_FACTOR` either way, so one request
/// that waited on a hiccup moves it a bounded amount; and it starts from 1 with the weight of
/// [`SPEED_PRIOR_SAMPLES`] samples, so a pod's first request does not decide its speed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PodSpeed {
    /// Σ w·ln(observed / role-predicted), decayed.
    log_ratio_sum: f64,
    /// Σ w·ln(…)² and Σ w², for the standard error of the mean.
    log_ratio_sq_sum: f64,
    weight_sq_sum: f64,
    /// Σ w: the effective number of samples.
    samples: f64,
}

/// The weight of the starting factor, 1, against a pod's own samples.
const SPEED_PRIOR_SAMPLES: f64 = 2.0;

impl PodSpeed {
    /// What the role's prediction is multiplied by for this pod.
    pub fn factor(&self) -> f64 {
        self.log_mean().exp()
    }

    /// The mean log ratio, drawn toward 0 by the prior's samples.
    pub fn log_mean(&self) -> f64 {
        self.log_ratio_sum / (self.samples + SPEED_PRIOR_SAMPLES)
    }

    /// The squared standard error of [`Self::log_mean`]: the log ratios' variance over the
    /// effective number of samples behind a decayed mean.
    pub fn log_mean_variance(&self) -> f64 {
        if self.samples <= 0.0 {
            return 0.0;
        }
        let mean = self.log_ratio_sum / self.samples;
        let variance = (self.log_ratio_sq_sum / self.samples - mean * mean).max(0.0);
        let weight = self.samples + SPEED_PRIOR_SAMPLES;
        variance * self.weight_sq_sum / (weight * weight)
    }

    /// Effective samples behind the factor (decayed).
    pub fn samples(&self) -> f64 {
        self.samples
    }

    /// One first byte `observed_ms` after routing, where the role's fit predicted `role_ms`.
    pub fn observe(&mut self, role_ms: f64, observed_ms: f64) {
        if !(role_ms.is_finite() && observed_ms.is_finite() && role_ms > 0.0 && observed_ms >= 0.0)
        {
            return;
        }
        let bound = OUTLIER_FACTOR.ln();
        // A first byte at 0 ms is as fast as the clamp allows, not minus infinity.
        let ratio = (observed_ms.max(f64::MIN_POSITIVE) / role_ms).ln();
        let keep = 1.0 - 1.0 / FORGET_SAMPLES;
        let ratio = ratio.clamp(-bound, bound);
        self.log_ratio_sum = self.log_ratio_sum * keep + ratio;
        self.log_ratio_sq_sum = self.log_ratio_sq_sum * keep + ratio * ratio;
        self.weight_sq_sum = self.weight_sq_sum * keep * keep + 1.0;
        self.samples = self.samples * keep + 1.0;
    }
}

/// How a role's pods' speeds spread beyond their own noise, for [`RoleSpeeds::factor`].
///
/// Empirical Bayes (positive-part James–Stein): each pod's mean log ratio is its speed plus noise
/// of a known variance (its standard error); the spread of the pods' means beyond that noise is the
/// spread of their real speeds. A pod's factor is drawn toward the role's level by the share of its
/// departure that noise would explain: equal pods, whose means differ by no more than their noise,
/// share the role's level; a pod half as fast stands out at once. Without it, two equal prefill
/// pods' factors moved apart with their recent mix of short and long prompts (log ratios' spread
/// 0.65–0.8 for the short ones, 0.15–0.2 for the long), and with them the predicted wait for the
/// next long prompt by hundreds of ms: on `make bench-pd`'s interference scenario a build with no
/// speed factor at all came 1–5% lower in p90 TTFT on each of seeds 1–3 and both modes. With this,
/// inline mode's p90 against `selective >512` went from 1.04 / 1.07 / 1.04× to 1.02 / 1.03 / 1.00×
/// (sidecar 1.01 / 1.02 / 0.96× to 1.02 / 0.98 / 1.00×), and kvroute alone on `unequal-pool`,
/// `multi-tenant`, `multi-tenant-stall` and `shared-agent` stayed within its seed-to-seed noise.
///
/// One spread for the whole role: a pool with one slow pod has a large spread, and its equal pods
/// are then hardly drawn together (the slow pod's departure is kept, which matters more).
/// Tried before this: a ratio of totals (each first token weighted by its predicted time), which
/// left a pod's speed to the few long requests in its memory (`multi-tenant` seed 2: p90 378 and
/// 387 ms in two runs of three, against 162–169), and subtracting the role's size shape (a line of
/// log ratio against log prediction), no better than nothing on interference.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RoleSpeeds {
    /// The sample-weighted mean of the pods' mean log ratios.
    level: f64,
    /// The variance of the pods' real speeds (log), beyond their noise; 0: all alike.
    spread: f64,
    /// At least two pods were timed (else each pod's own factor stands).
    compared: bool,
}

impl RoleSpeeds {
    /// From the speeds of one role's pods.
    pub fn of<'a>(speeds: impl IntoIterator<Item = &'a PodSpeed>) -> RoleSpeeds {
        let mut sums = RoleSpeedSums::default();
        for speed in speeds {
            sums.add(speed);
        }
        sums.speeds()
    }

    /// `speed`'s factor, drawn toward the role's level by its noise.
    pub fn factor(&self, speed: &PodSpeed) -> f64 {
        if !self.compared || speed.samples <= 0.0 {
            // One timed pod, or none: nothing to compare it with.
            return speed.factor();
        }
        let noise = speed.log_mean_variance();
        let keep = if self.spread + noise > 0.0 {
            self.spread / (self.spread + noise)
        } else {
            1.0
        };
        (self.level + (speed.log_mean() - self.level) * keep).exp()
    }
}

/// Sample-weighted sums over one role's timed pods, from which [`RoleSpeeds`] reads in O(1): a
/// first byte takes its pod out, learns, and puts it back, so the role's level and spread follow
/// every first byte at a cost that does not grow with the pool (a pass over the role's pods per
/// first byte cost 6 µs natively at 512 pods, `examples/scale_cost.rs`). The router takes them
/// afresh with each load table, which also bounds the rounding that taking out and putting back
/// accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RoleSpeedSums {
    timed: u32,
    weight: f64,
    /// Σ w·m, Σ w·m², Σ w·(the variance of m), m a pod's mean log ratio and w its samples.
    mean: f64,
    mean_sq: f64,
    noise: f64,
}

impl RoleSpeedSums {
    pub fn add(&mut self, speed: &PodSpeed) {
        self.shift(speed, 1.0);
    }

    pub fn remove(&mut self, speed: &PodSpeed) {
        self.shift(speed, -1.0);
    }

    fn shift(&mut self, speed: &PodSpeed, sign: f64) {
        if speed.samples <= 0.0 {
            return;
        }
        let (w, m) = (speed.samples, speed.log_mean());
        self.timed = if sign > 0.0 {
            self.timed.saturating_add(1)
        } else {
            self.timed.saturating_sub(1)
        };
        self.weight += sign * w;
        self.mean += sign * w * m;
        self.mean_sq += sign * w * m * m;
        self.noise += sign * w * speed.log_mean_variance();
    }

    pub fn speeds(&self) -> RoleSpeeds {
        if self.timed < 2 || self.weight <= 0.0 {
            return RoleSpeeds::default();
        }
        let level = self.mean / self.weight;
        // Σ w·(m − level)² / Σ w, written with the sums.
        let between = self.mean_sq / self.weight - level * level;
        RoleSpeeds {
            level,
            spread: (between - self.noise / self.weight).max(0.0),
            compared: true,
        }
    }
}

impl Coefficients {
    /// This model with every prediction multiplied by `factor`.
    pub fn scaled(&self, factor: f64) -> Coefficients {
        Coefficients {
            overhead_ms: self.overhead_ms * factor,
            us_per_token: self.us_per_token * factor,
            us_per_decoding: self.us_per_decoding * factor,
        }
    }
}

/// Combines fits published by several VMs (each learned from its own requests) into one model:
/// the sample-weighted mean of their coefficients; the prior when nobody has samples.
pub fn merge(
    prior: Coefficients,
    fits: impl IntoIterator<Item = (Coefficients, f64)>,
) -> Coefficients {
    let (mut o, mut t, mut d, mut n) = (0.0, 0.0, 0.0, 0.0);
    for (c, samples) in fits {
        if !(samples.is_finite() && samples > 0.0) {
            continue;
        }
        o += c.overhead_ms * samples;
        t += c.us_per_token * samples;
        d += c.us_per_decoding * samples;
        n += samples;
    }
    if n <= 0.0 {
        return prior;
    }
    Coefficients {
        overhead_ms: o / n,
        us_per_token: t / n,
        us_per_decoding: d / n,
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn truth(tokens: f64, decoding: f64) -> f64 {
        // A pod at 20 µs per token, 3 ms overhead, 0.5 ms per decoding sequence.
        3.0 + 0.020 * tokens + 0.5 * decoding
    }

    #[test]
    fn without_history_the_prior_predicts() {
        let cfg = CostConfig::default();
        let fit = CostFit::new(&cfg);
        assert_eq!(fit.coefficients(), cfg.prior);
        assert!((fit.coefficients().predict_ms(1000.0, 0.0) - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_pod_is_learned_from_its_observations() {
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        let mut x = 17u64;
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let tokens = (x >> 33) as f64 % 8000.0;
            let decoding = ((x >> 20) % 32) as f64;
            fit.observe(&cfg, tokens, decoding, truth(tokens, decoding));
        }
        let c = fit.coefficients();
        assert!((c.us_per_token - 20.0).abs() < 1.0, "{c:?}");
        assert!((c.overhead_ms - 3.0).abs() < 1.0, "{c:?}");
        assert!((c.us_per_decoding - 500.0).abs() < 100.0, "{c:?}");
        let p = c.predict_ms(5000.0, 4.0);
        assert!(
            (p - truth(5000.0, 4.0)).abs() / truth(5000.0, 4.0) < 0.05,
            "{p}"
        );
    }

    #[test]
    fn a_negative_overhead_is_fixed_at_zero_not_clamped_after_the_fact() {
        // Work ahead is counted whole although the step in progress is half done: the data say
        // ttft = 0.02 × tokens − 30 ms. Clamping the solved −30 to 0 would predict 30 ms too much
        // everywhere; fixing it at zero refits the slope through the data instead.
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        for i in 0..200 {
            let tokens = 3000.0 + 500.0 * f64::from(i % 10);
            fit.observe(&cfg, tokens, 0.0, 0.020 * tokens - 30.0);
        }
        let c = fit.coefficients();
        assert_eq!(c.overhead_ms, 0.0);
        let mean_error: f64 = (0..10)
            .map(|i| {
                let tokens = 3000.0 + 500.0 * f64::from(i);
                c.predict_ms(tokens, 0.0) - (0.020 * tokens - 30.0)
            })
            .sum::<f64>()
            / 10.0;
        assert!(mean_error.abs() < 3.0, "mean error {mean_error} ms, {c:?}");
    }

    #[test]
    fn the_calibration_settles_on_the_median_not_the_mean() {
        // Least squares over requests of which one in ten waits 10× longer (a preemption) predicts
        // the typical request too slow; the calibration brings half of them below again.
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        let mut scale = MedianScale::default();
        let mut x = 5u64;
        for i in 0..600 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let tokens = 2000.0 + (x >> 33) as f64 % 4000.0;
            let y = truth(tokens, 0.0) * if i % 10 == 9 { 10.0 } else { 1.0 };
            scale.observe(
                fit.coefficients().predict_ms(tokens, 0.0) * scale.factor(),
                y,
            );
            fit.observe(&cfg, tokens, 0.0, y);
        }
        let typical = truth(4000.0, 0.0);
        let fitted = fit.coefficients().predict_ms(4000.0, 0.0);
        let served = fitted * scale.factor();
        assert!(
            fitted > 1.15 * typical,
            "least squares: {fitted} vs {typical}"
        );
        assert!(
            (served - typical).abs() < 0.1 * typical,
            "served: {served} vs {typical}"
        );
        // Exact predictions and garbage leave it where it is; it stays bounded.
        let mut exact = MedianScale::default();
        exact.observe(50.0, 50.0);
        exact.observe(f64::NAN, 1.0);
        assert_eq!(exact.factor(), 1.0);
        for _ in 0..10_000 {
            exact.observe(1.0, 1e9);
        }
        assert_eq!(exact.factor(), MAX_SCALE);
    }

    #[test]
    fn one_outlier_moves_a_settled_fit_a_bounded_amount() {
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        for i in 0..100 {
            let tokens = (i % 10) as f64 * 800.0;
            fit.observe(&cfg, tokens, 0.0, truth(tokens, 0.0));
        }
        let before = fit.coefficients().predict_ms(4000.0, 0.0);
        fit.observe(&cfg, 4000.0, 0.0, 60_000.0); // one request stuck a minute
        let after = fit.coefficients().predict_ms(4000.0, 0.0);
        assert!(after / before < 1.2, "{before} -> {after}");
    }

    #[test]
    fn the_error_band_settles_where_four_misses_in_five_are_narrower() {
        // Misses spread evenly over ±0..50% in log units: four in five are within 0.4.
        let mut band = ErrorBand::default();
        for i in 0..4000u32 {
            let miss = f64::from(i * 37 % 100) / 200.0;
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            band.observe(100.0, 100.0 * (sign * miss).exp());
        }
        assert!((band.log_width() - 0.4).abs() < 0.05, "{band:?}");
        // Exact predictions narrow it to nothing; garbage leaves it alone.
        for _ in 0..200 {
            band.observe(100.0, 100.0);
        }
        let narrow = band.log_width();
        assert!(narrow < 0.01, "{band:?}");
        band.observe(0.0, 10.0);
        band.observe(10.0, f64::NAN);
        band.observe(f64::INFINITY, 10.0);
        assert_eq!(band.log_width(), narrow);
    }

    #[test]
    fn a_pod_that_slows_down_is_relearned() {
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        for i in 0..100 {
            let tokens = (i % 10) as f64 * 800.0;
            fit.observe(&cfg, tokens, 0.0, truth(tokens, 0.0));
        }
        for i in 0..150 {
            let tokens = (i % 10) as f64 * 800.0;
            fit.observe(&cfg, tokens, 0.0, 2.0 * truth(tokens, 0.0));
        }
        let c = fit.coefficients();
        assert!((c.us_per_token - 40.0).abs() < 4.0, "{c:?}");
    }

    #[test]
    fn garbage_observations_are_ignored_and_merge_weighs_by_samples() {
        let cfg = CostConfig::default();
        let mut fit = CostFit::new(&cfg);
        fit.observe(&cfg, f64::NAN, 0.0, 10.0);
        fit.observe(&cfg, 10.0, 0.0, -1.0);
        fit.observe(&cfg, 10.0, 0.0, f64::INFINITY);
        assert_eq!(fit.samples(), 0.0);
        let a = Coefficients {
            overhead_ms: 1.0,
            us_per_token: 10.0,
            us_per_decoding: 0.0,
        };
        let b = Coefficients {
            overhead_ms: 4.0,
            us_per_token: 40.0,
            us_per_decoding: 0.0,
        };
        let m = merge(cfg.prior, [(a, 1.0), (b, 3.0), (a, f64::NAN)]);
        assert!((m.us_per_token - 32.5).abs() < 1e-9);
        assert_eq!(merge(cfg.prior, []), cfg.prior);
    }

    #[test]
    fn equal_pods_share_the_roles_speed_and_a_slow_one_stands_out() {
        // Every pod of the role takes 0.6× its prediction for a short request and 1.2× for a long
        // one, and each request is short with probability 2/3: equal pods, whose own means move
        // apart with the luck of their recent mix.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut short = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            !state.is_multiple_of(3)
        };
        let mut pods = [PodSpeed::default(); 3];
        // Mean over the rounds of how far apart (log) the two equal pods are predicted.
        let (mut own_gap, mut shared_gap, mut rounds) = (0.0, 0.0, 0.0);
        for round in 0..400 {
            for (i, pod) in pods.iter_mut().enumerate() {
                let slow = if i == 2 { 2.0 } else { 1.0 };
                let observed = if short() { 60.0 } else { 120.0 };
                pod.observe(100.0, observed * slow);
            }
            if round >= 100 {
                let [a, b, _] = &pods;
                own_gap += (a.factor() / b.factor()).ln().abs();
                // The two equal pods as a role of their own.
                let equal = RoleSpeeds::of([a, b]);
                shared_gap += (equal.factor(a) / equal.factor(b)).ln().abs();
                rounds += 1.0;
                // With the slow one: its departure is real, and kept.
                let role = RoleSpeeds::of(&pods);
                let fa = role.factor(a);
                // The slow pod keeps its own departure (its own mix's luck included).
                let slow = role.factor(&pods[2]) / fa;
                let own = pods[2].factor() / a.factor();
                assert!(
                    (slow / own - 1.0).abs() < 0.05,
                    "round {round}: {slow} against {own}"
                );
                assert!(slow > 1.6 && slow < 2.5, "round {round}: {slow}");
            }
        }
        let (own_gap, shared_gap) = (own_gap / rounds, shared_gap / rounds);
        assert!(own_gap > 0.02, "their own means drift apart: {own_gap}");
        assert!(shared_gap < own_gap / 2.0, "{shared_gap} against {own_gap}");
        // One pod alone keeps its own factor.
        assert_eq!(
            RoleSpeeds::of([&pods[0]]).factor(&pods[0]),
            pods[0].factor()
        );
    }

    #[test]
    fn a_pod_speed_follows_the_pod_and_ignores_garbage() {
        let mut speed = PodSpeed::default();
        assert_eq!(speed.factor(), 1.0, "an untimed pod is as fast as its role");
        for _ in 0..200 {
            speed.observe(100.0, 100.0);
        }
        assert!((speed.factor() - 1.0).abs() < 1e-9);
        // It slows to half speed: half-way (in log) within 44 first bytes, nearly there in 200.
        for _ in 0..44 {
            speed.observe(100.0, 200.0);
        }
        assert!(
            (speed.factor() - 2f64.sqrt()).abs() < 0.03,
            "{}",
            speed.factor()
        );
        for _ in 0..156 {
            speed.observe(100.0, 200.0);
        }
        assert!(
            speed.factor() > 1.9 && speed.factor() < 2.0,
            "{}",
            speed.factor()
        );
        // One request that waited a minute moves it by at most the clamp's share.
        let before = speed.factor();
        speed.observe(100.0, 60_000.0);
        assert!(
            speed.factor() / before < 1.05,
            "{before} → {}",
            speed.factor()
        );
        for (role_ms, observed) in [
            (f64::NAN, 1.0),
            (0.0, 1.0),
            (100.0, -1.0),
            (100.0, f64::INFINITY),
        ] {
            let kept = speed;
            speed.observe(role_ms, observed);
            assert_eq!(speed, kept);
        }
    }
}
