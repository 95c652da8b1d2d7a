//! `overload`: tenants, each with its own system prompt, whose arrivals rise above the pool's
//! capacity for a while (a surge) and fall below it so the queue drains, one tenant bursting on top
//! of the surge, and two priority classes: what flow control at the gateway is for.
//!
//! Arrivals are a non-homogeneous Poisson process: every tenant sends at `rate / tenants` (the
//! spec's open-loop rate), all of them × `surge` inside the surge window, and the bursting tenant ×
//! `burst` more inside the burst window. Each request is interactive (priority 1) with probability
//! `high_share`, else batch (priority 0), drawn per request from the seed, and carries its tenant as
//! its flow (fairness) id.

use super::{rng_for, Family, Message, RequestTags, Slot, Vocab};
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// The overload's shape. Times are simulated seconds from the start of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverloadParams {
    /// Number of tenants (distinct system prompts and flow ids).
    pub tenants: usize,
    /// Words in each tenant's system prompt.
    pub system_words: usize,
    /// Words in each (unique) user message, inclusive range.
    pub question_words: (usize, usize),
    /// `max_tokens` of each request, inclusive range.
    pub max_tokens: (u32, u32),
    /// Every tenant's rate is multiplied by this inside `[surge_start_s, surge_end_s)`.
    pub surge: f64,
    pub surge_start_s: f64,
    pub surge_end_s: f64,
    /// The bursting tenant (an index below `tenants`).
    pub burst_tenant: usize,
    /// Its rate is multiplied by this (on top of the surge) inside `[burst_start_s, burst_end_s)`.
    pub burst: f64,
    pub burst_start_s: f64,
    pub burst_end_s: f64,
    /// Share of requests in the high-priority (interactive) class.
    pub high_share: f64,
}

/// The priority header's value of the interactive class (kvroute's `x-kvroute-priority`: higher
/// first).
pub const HIGH_PRIORITY: i64 = 1;
/// The batch class's.
pub const LOW_PRIORITY: i64 = 0;

impl Default for OverloadParams {
    /// Six tenants × 2,000 words; questions of 200–600 unique words and 64–192 output tokens (a
    /// request costs a pod about 0.2 s of prefill and a few seconds of decode); the surge
    /// multiplies every tenant's rate by 2.5 from 40 s to 100 s, tenant 0 sends 5× its share on
    /// top from 50 s to 90 s; 20% interactive.
    fn default() -> Self {
        Self {
            tenants: 6,
            system_words: 2000,
            question_words: (200, 600),
            max_tokens: (64, 192),
            surge: 2.5,
            surge_start_s: 40.0,
            surge_end_s: 100.0,
            burst_tenant: 0,
            burst: 5.0,
            burst_start_s: 50.0,
            burst_end_s: 90.0,
            high_share: 0.2,
        }
    }
}

impl OverloadParams {
    /// Tenant `k`'s rate at `t`, as a multiple of its base share.
    pub fn weight(&self, k: usize, t: f64) -> f64 {
        let inside = |a: f64, b: f64| t >= a && t < b;
        let surge = if inside(self.surge_start_s, self.surge_end_s) {
            self.surge
        } else {
            1.0
        };
        let burst = if k == self.burst_tenant && inside(self.burst_start_s, self.burst_end_s) {
            self.burst
        } else {
            1.0
        };
        surge * burst
    }

    /// The total rate at `t` as a multiple of the spec's base rate.
    pub fn intensity(&self, t: f64) -> f64 {
        let n = self.tenants.max(1);
        (0..n).map(|k| self.weight(k, t)).sum::<f64>() / n as f64
    }

    /// An upper bound of [`intensity`](Self::intensity) over the run (for thinning).
    pub fn max_intensity(&self) -> f64 {
        let n = self.tenants.max(1) as f64;
        let surge = self.surge.max(1.0);
        surge * (n - 1.0 + self.burst.max(1.0)) / n
    }

    /// Requests each tenant is expected to send over `duration_s` at base rate `rate`: its demand.
    pub fn expected_requests(&self, k: usize, rate: f64, duration_s: f64) -> f64 {
        let n = self.tenants.max(1) as f64;
        // Piecewise constant: integrate over the windows' edges.
        let mut edges = vec![
            0.0,
            duration_s,
            self.surge_start_s,
            self.surge_end_s,
            self.burst_start_s,
            self.burst_end_s,
        ];
        edges.retain(|e| (0.0..=duration_s).contains(e));
        edges.sort_by(f64::total_cmp);
        edges.dedup();
        edges
            .windows(2)
            .map(|w| (w[1] - w[0]) * self.weight(k, (w[0] + w[1]) / 2.0))
            .sum::<f64>()
            * rate
            / n
    }

    pub(super) fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.tenants >= 1, "tenants must be >= 1");
        anyhow::ensure!(
            self.burst_tenant < self.tenants,
            "the bursting tenant must be one of the tenants"
        );
        for (what, v) in [("surge", self.surge), ("burst", self.burst)] {
            anyhow::ensure!(v.is_finite() && v >= 1.0, "{what} must be >= 1");
        }
        anyhow::ensure!(
            self.high_share.is_finite() && (0.0..=1.0).contains(&self.high_share),
            "the high-priority share must be between 0 and 1"
        );
        super::check_range("question words", self.question_words)?;
        super::check_range("max tokens", self.max_tokens)?;
        super::check_range("surge window", (self.surge_start_s, self.surge_end_s))?;
        super::check_range("burst window", (self.burst_start_s, self.burst_end_s))?;
        Ok(())
    }
}

#[derive(Debug)]
pub(super) struct Overload {
    p: OverloadParams,
    prompts: Vec<String>,
    pick_rng: Box<StdRng>,
    counts: Vec<u32>,
}

impl Overload {
    pub(super) fn new(seed: u64, vocab: &Vocab, p: &OverloadParams) -> Self {
        let prompts = (0..p.tenants as u64)
            .map(|t| vocab.text(&mut rng_for(seed, "overload-system", t, 0), p.system_words))
            .collect();
        Self {
            p: p.clone(),
            prompts,
            pick_rng: Box::new(rng_for(seed, "overload-pick", 0, 0)),
            counts: vec![0; p.tenants],
        }
    }
}

impl Family for Overload {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        self.next_session_at(index, 0.0)
    }

    fn next_session_at(&mut self, _index: u64, arrival_s: f64) -> (String, u64, u32) {
        let weights: Vec<f64> = (0..self.p.tenants)
            .map(|k| self.p.weight(k, arrival_s))
            .collect();
        let t = WeightedIndex::new(weights)
            .map(|w| w.sample(&mut *self.pick_rng))
            .unwrap_or(0);
        let turn = self.counts.get(t).copied().unwrap_or(0);
        if let Some(c) = self.counts.get_mut(t) {
            *c += 1;
        }
        (format!("tenant-{t}"), t as u64, turn)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let mut rng = rng_for(seed, "overload-question", slot.index, 0);
        let p = &self.p;
        super::tenants::tenant_question(
            &self.prompts,
            &mut rng,
            vocab,
            slot,
            p.question_words,
            p.max_tokens,
        )
    }

    fn tags(&self, seed: u64, slot: &Slot) -> RequestTags {
        let high = rng_for(seed, "overload-priority", slot.index, 0).gen_bool(self.p.high_share);
        RequestTags {
            priority: Some(if high { HIGH_PRIORITY } else { LOW_PRIORITY }),
            flow: Some(slot.session.clone()),
        }
    }

    fn intensity(&self, t: f64) -> f64 {
        self.p.intensity(t)
    }

    fn max_intensity(&self) -> f64 {
        self.p.max_intensity()
    }
}
