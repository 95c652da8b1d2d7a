//! Each pod's speed against its role's fit, and how far the speeds of a role's pods spread.

use super::fit::{FORGET_SAMPLES, OUTLIER_FACTOR};

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
