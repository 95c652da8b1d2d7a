//! `unequal-pool`: independent requests with unique prompts, nothing to cache.

use super::{rng_for, Family, Message, Slot, Vocab};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Independent requests with unique prompts (nothing to cache): where a request goes is decided by
/// load alone. Sessions are `req-N` (N = the slot index).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UniqueParams {
    /// Words in each prompt, inclusive range.
    pub prompt_words: (usize, usize),
    /// `max_tokens` of each request, inclusive range.
    pub max_tokens: (u32, u32),
}

impl Default for UniqueParams {
    fn default() -> Self {
        Self {
            prompt_words: (2000, 4000),
            max_tokens: (64, 256),
        }
    }
}

#[derive(Debug)]
pub(super) struct Unique {
    pub(super) p: UniqueParams,
}

impl Family for Unique {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        (format!("req-{index}"), index, 0)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let p = &self.p;
        let mut rng = rng_for(seed, "unique", slot.index, 0);
        let n = rng.gen_range(p.prompt_words.0..=p.prompt_words.1);
        let max_tokens = rng.gen_range(p.max_tokens.0..=p.max_tokens.1);
        (
            vec![Message::new("user", vocab.text(&mut rng, n))],
            max_tokens,
        )
    }
}
