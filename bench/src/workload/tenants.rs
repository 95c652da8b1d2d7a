//! `multi-tenant` and `multi-tenant-stall`: tenants, each with its own long system prompt, asking
//! short independent questions; a tenant is picked per request (Zipf-weighted, or uniformly).

use super::{rng_for, Family, Message, Slot, Vocab};
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Many tenants, each with its own long system prompt, asking short independent questions: the
/// case where routing a tenant to the pod that holds its system prompt saves most of the prefill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiTenantParams {
    /// Number of tenants (distinct system prompts).
    pub tenants: usize,
    /// Words in each tenant's system prompt.
    pub system_words: usize,
    /// Words in each user question, inclusive range.
    pub question_words: (usize, usize),
    /// `max_tokens` of each request, inclusive range.
    pub max_tokens: (u32, u32),
    /// Zipf exponent of tenant popularity: 0 is uniform; 1 makes tenant 0 about T/ln T times as busy
    /// as the average.
    pub zipf_s: f64,
}

impl Default for MultiTenantParams {
    fn default() -> Self {
        Self {
            tenants: 8,
            system_words: 3000,
            question_words: (40, 120),
            max_tokens: (64, 256),
            zipf_s: 0.0,
        }
    }
}

impl MultiTenantParams {
    /// The `tiered-tenants` workload: 24 tenants × 3,000-word system prompts, 72,000 tokens of
    /// prefixes, for pods whose GPU holds 16,000 tokens and host memory 40,000 more: more hot
    /// prefixes than the pool's GPUs hold, fewer than its host memory does.
    pub fn tiered() -> Self {
        Self {
            tenants: 24,
            system_words: 3000,
            question_words: (40, 120),
            max_tokens: (64, 256),
            zipf_s: 0.0,
        }
    }

    /// The `multi-tenant-stall` workload: 12 tenants with 6,000-word system prompts and short
    /// questions (run on an engine whose prefills run whole and stall the decodes beside them).
    pub fn stall() -> Self {
        Self {
            tenants: 12,
            system_words: 6000,
            question_words: (20, 60),
            max_tokens: (64, 256),
            zipf_s: 0.0,
        }
    }
}

#[derive(Debug)]
pub(super) struct Tenants {
    p: MultiTenantParams,
    prompts: Vec<String>,
    pick: Option<WeightedIndex<f64>>,
    pick_rng: Box<StdRng>,
    counts: Vec<u32>,
}

impl Tenants {
    pub(super) fn new(seed: u64, vocab: &Vocab, p: &MultiTenantParams) -> Self {
        let prompts = (0..p.tenants as u64)
            .map(|t| vocab.text(&mut rng_for(seed, "tenant-system", t, 0), p.system_words))
            .collect();
        let weights: Vec<f64> = (0..p.tenants)
            .map(|k| 1.0 / ((k + 1) as f64).powf(p.zipf_s))
            .collect();
        Self {
            p: p.clone(),
            prompts,
            pick: WeightedIndex::new(weights).ok(),
            pick_rng: Box::new(rng_for(seed, "tenant-pick", 0, 0)),
            counts: vec![0; p.tenants],
        }
    }
}

impl Family for Tenants {
    fn next_session(&mut self, _index: u64) -> (String, u64, u32) {
        let pick_rng = &mut self.pick_rng;
        let t = self.pick.as_ref().map(|w| w.sample(pick_rng)).unwrap_or(0);
        let turn = self.counts.get(t).copied().unwrap_or(0);
        if let Some(c) = self.counts.get_mut(t) {
            *c += 1;
        }
        (format!("tenant-{t}"), t as u64, turn)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let mut rng = rng_for(seed, "tenant-question", slot.index, 0);
        let p = &self.p;
        tenant_question(
            &self.prompts,
            &mut rng,
            vocab,
            slot,
            p.question_words,
            p.max_tokens,
        )
    }
}

/// A tenant's request: its system prompt (`prompts[slot.session_id]`) and a question of
/// `question_words` words drawn from `rng`, with `max_tokens` drawn after it.
pub(super) fn tenant_question(
    prompts: &[String],
    rng: &mut StdRng,
    vocab: &Vocab,
    slot: &Slot,
    question_words: (usize, usize),
    max_tokens: (u32, u32),
) -> (Vec<Message>, u32) {
    let n = rng.gen_range(question_words.0..=question_words.1);
    let question = vocab.text(rng, n);
    let max_tokens = rng.gen_range(max_tokens.0..=max_tokens.1);
    let system = prompts
        .get(slot.session_id as usize)
        .cloned()
        .unwrap_or_default();
    (
        vec![
            Message::new("system", system),
            Message::new("user", question),
        ],
        max_tokens,
    )
}
