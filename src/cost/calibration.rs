//! How served predictions compare with what happened: the median calibration and the error band.

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
///
/// The step grows with a run of first bytes on the same side: beyond [`FREE_RUN`] in a row, each
/// further one adds a [`MEDIAN_STEP`] (up to a run of [`MAX_RUN`]), so a factor far from the
/// median comes back in tens of first bytes, not hundreds. A fixed 1% step took ~125 first bytes
/// to undo the ×3.5 a cold start leaves behind (whole 6,000-token prefills queued on pods 25×
/// slower than the prior while the fits were still learning): served predictions stayed 1.5–4×
/// too high for the first 50 simulated seconds of `make bench-matrix`'s tenants-stall cell, a
/// median error of 23% in a run where the settled part's was 8%. At the median the sides alternate
/// as a coin's do, runs stay short and the two sides' steps grow alike, so where it settles does
/// not move. Replayed (a ×3.5 factor, then first bytes missing log-uniformly within ±20%, 20
/// seeds): back within 10% after 23 [max 27] first bytes against 120 [132]; settled, the factor's
/// wander (median, 99th percentile) 2% and 8% either way; with bursts of six first bytes twice as
/// slow (one burst per twenty), 4% either way and 28% against 15%. Accelerating from a run of four
/// came back in 18 but wandered 51% in bursts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianScale {
    factor: f64,
    /// First bytes in a row on the same side: positive slower than predicted, negative faster.
    run: i32,
}

impl Default for MedianScale {
    fn default() -> Self {
        MedianScale {
            factor: 1.0,
            run: 0,
        }
    }
}

/// Each first byte moves the factor by this fraction (more at the end of a long run, see
/// [`MedianScale`]). Replaying the learning over traced decisions of every `make bench` workload
/// (seed 1, kvroute's own decisions), the median relative error without it and with steps of
/// 0.5% / 1% / 2%: shared-agent 26% → 7 / 6 / 7%, unequal-pool 19% → 11 / 11 / 11%, agent 18% →
/// 12 / 13 / 13%, the other four 6–9% throughout.
const MEDIAN_STEP: f64 = 0.01;
/// Runs this long keep the plain step: a coin gives one longer once in 128 tosses.
const FREE_RUN: i32 = 7;
/// The longest run that still lengthens the step: at most a 9% move per first byte.
const MAX_RUN: i32 = 16;
/// The factor stays within [1/F, F]: beyond that the fits themselves are wrong, not skewed.
pub(super) const MAX_SCALE: f64 = 4.0;

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
        let slower = observed_ms > predicted_ms;
        self.run = match (slower, self.run) {
            (true, run) if run > 0 => (run + 1).min(MAX_RUN),
            (true, _) => 1,
            (false, run) if run < 0 => (run - 1).max(-MAX_RUN),
            (false, _) => -1,
        };
        let steps = (self.run.abs() - FREE_RUN).max(1) * self.run.signum();
        // In log units, so a run up and a run down of the same length cancel.
        let step = MEDIAN_STEP * f64::from(steps);
        self.factor = (self.factor * step.exp()).clamp(1.0 / MAX_SCALE, MAX_SCALE);
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
