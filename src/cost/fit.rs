//! The role fit: three coefficients learned online by weighted ridge regression with directional
//! forgetting, and the merge of several VMs' fits into one model.

use serde::Deserialize;

/// A pod's sample weight decays by `1 - 1/FORGET_SAMPLES` with every newer one.
pub(super) const FORGET_SAMPLES: f64 = 64.0;
/// The same for a role's fit ([`CostFit::for_role`]), which every pod of the role feeds: its shape
/// is the model's and the engine's, not one pod's, and a longer memory is what keeps the intercept
/// and the slope from trading off between requests (each pod's speed still follows the pod within
/// `FORGET_SAMPLES` of its own first bytes, [`PodSpeed`]).
const ROLE_FORGET_SAMPLES: f64 = 256.0;
/// Samples before observations are clamped to the current prediction's neighbourhood.
const ROBUST_AFTER: f64 = 8.0;
/// An observation is clamped to [prediction / F, prediction × F].
pub(super) const OUTLIER_FACTOR: f64 = 4.0;
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
    /// time, first byte `observed_ms` later, every token known exactly.
    #[cfg(test)]
    pub fn observe(&mut self, config: &CostConfig, tokens: f64, decoding: f64, observed_ms: f64) {
        self.observe_behind(config, tokens, 0.0, decoding, observed_ms);
    }

    /// Adds one observation of a request with `own_tokens` uncached behind `tokens_ahead` of
    /// prefill the work board believed queued on the pod.
    ///
    /// The sample counts by the square of the share of its tokens that are its own
    /// (`own / (own + ahead)`). The request's own uncached tokens are known exactly; the queue
    /// ahead is an estimate (a poll's age, a head's progress, a queued prompt another request
    /// already computed) that is off by a factor of two or more during a cold start of whole
    /// prefills, and regressed on as if exact that error flattens the slope and lifts the
    /// overhead (errors in variables: on the tenants cold start, 40 µs a token and 60 ms of
    /// overhead against the pods' 80 µs and 7 ms). The error's variance grows with the square of
    /// the queue, hence the square: a request on an idle pod is a clean sample, a recompute
    /// behind as much again counts a quarter, a hit behind a recompute next to nothing.
    ///
    /// Forgetting is directional (Kulhavý's): a sample fades the fit's information only along its
    /// own features, so a run of hits (tens of uncached tokens each) renews what the fit knows
    /// about hits and leaves what recomputes taught about the cost per token. With plain
    /// exponential forgetting, 6,000 hits after the recomputes left the per-token cost to the
    /// prior and the hits' noise: a recompute predicted at 0.75× its time (`cost::tests`).
    pub fn observe_behind(
        &mut self,
        config: &CostConfig,
        own_tokens: f64,
        tokens_ahead: f64,
        decoding: f64,
        observed_ms: f64,
    ) {
        if !(observed_ms.is_finite()
            && observed_ms >= 0.0
            && own_tokens.is_finite()
            && tokens_ahead.is_finite())
        {
            return;
        }
        let (own, ahead) = (own_tokens.max(0.0), tokens_ahead.max(0.0));
        let tokens = own + ahead;
        let known = if tokens > 0.0 { own / tokens } else { 1.0 };
        let weight = known * known;
        let predicted = self.current.predict_ms(tokens, decoding);
        let y = if self.samples >= ROBUST_AFTER && predicted > 0.0 {
            observed_ms.clamp(predicted / OUTLIER_FACTOR, predicted * OUTLIER_FACTOR)
        } else {
            observed_ms
        };
        let phi = [1.0, tokens, decoding.max(0.0)];
        self.forget_along(phi, (1.0 - self.keep) * weight);
        for (row, pi) in self.xx.iter_mut().zip(phi) {
            for (cell, pj) in row.iter_mut().zip(phi) {
                *cell += weight * pi * pj;
            }
        }
        for (cell, pi) in self.xy.iter_mut().zip(phi) {
            *cell += weight * pi * y;
        }
        self.samples = self.samples * (1.0 - (1.0 - self.keep) * weight) + weight;
        if let Some(solved) = self.solve(config) {
            self.current = Coefficients::from_vector(solved);
        }
    }

    /// Fades a `fraction` of the information the sums hold along `phi`, and none across it:
    /// R ← R − f·(Rφ)(Rφ)ᵀ / φᵀRφ, and Xᵀy ← Xᵀy − f·(Rφ)(φᵀXᵀy) / φᵀRφ, which leaves the
    /// data's own estimate (R⁻¹Xᵀy) where it was.
    fn forget_along(&mut self, phi: [f64; 3], fraction: f64) {
        let r_phi: [f64; 3] = self
            .xx
            .map(|row| row.iter().zip(phi).map(|(a, p)| a * p).sum::<f64>());
        let along: f64 = r_phi.iter().zip(phi).map(|(a, p)| a * p).sum();
        // Nothing known along φ yet (the first sample, or only samples across it): nothing fades.
        if !(along.is_finite() && along > 1e-12 * (1.0 + self.xx[0][0])) {
            return;
        }
        let phi_xy: f64 = self.xy.iter().zip(phi).map(|(a, p)| a * p).sum();
        let f = fraction.clamp(0.0, 1.0) / along;
        for (row, ri) in self.xx.iter_mut().zip(r_phi) {
            for (cell, rj) in row.iter_mut().zip(r_phi) {
                *cell -= f * ri * rj;
            }
        }
        for (cell, ri) in self.xy.iter_mut().zip(r_phi) {
            *cell -= f * ri * phi_xy;
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
