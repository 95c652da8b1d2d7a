//! `many-adapters`: requests for many LoRA adapters of one base model, a few of them hot (Zipf),
//! each with its adapter's short system prompt and a question of its own. The pods hold two
//! adapters at a time (`--max-loras 2`) and load a missing one first; what routing decides is
//! where each adapter is loaded, and how often.

use super::{tenants, Family, Message, MultiTenantParams, Slot, Vocab};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManyAdapterParams {
    /// Number of adapters, named `adapter-0` … (the pods must serve them: [`Self::lora_modules`]).
    pub adapters: usize,
    /// Words of each adapter's system prompt.
    pub system_words: usize,
    /// Words in each question, inclusive range.
    pub question_words: (usize, usize),
    /// `max_tokens` of each request, inclusive range.
    pub max_tokens: (u32, u32),
    /// Zipf exponent of adapter popularity (1: adapter 0 about A/ln A times the average).
    pub zipf_s: f64,
}

impl Default for ManyAdapterParams {
    fn default() -> Self {
        Self {
            adapters: 16,
            system_words: 400,
            question_words: (100, 400),
            max_tokens: (32, 128),
            zipf_s: 1.0,
        }
    }
}

impl ManyAdapterParams {
    /// Adapter `k`'s model name.
    pub fn name(k: usize) -> String {
        format!("adapter-{k}")
    }

    /// kvsim's `--lora-modules` values serving every adapter of the workload.
    pub fn lora_modules(&self) -> Vec<String> {
        (0..self.adapters)
            .map(|k| format!("{}=/adapters/{k}", Self::name(k)))
            .collect()
    }
}

/// Tenants, one per adapter, each request naming its tenant's adapter as the model.
#[derive(Debug)]
pub(super) struct ManyAdapters(tenants::Tenants);

impl ManyAdapters {
    pub(super) fn new(seed: u64, vocab: &Vocab, p: &ManyAdapterParams) -> Self {
        let as_tenants = MultiTenantParams {
            tenants: p.adapters,
            system_words: p.system_words,
            question_words: p.question_words,
            max_tokens: p.max_tokens,
            zipf_s: p.zipf_s,
        };
        Self(tenants::Tenants::new(seed, vocab, &as_tenants))
    }
}

impl Family for ManyAdapters {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        self.0.next_session(index)
    }

    fn model(&self, slot: &Slot) -> Option<String> {
        Some(ManyAdapterParams::name(slot.session_id as usize))
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        self.0.messages(seed, vocab, slot)
    }
}
