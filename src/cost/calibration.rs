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
