//! `shared-agent`: independent agent calls on a pool where every pod already holds one shared
//! long prefix.

use super::{rng_for, Family, Message, Slot, Vocab};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Independent agent calls on a pool where every pod already holds one shared long prefix (tools and
/// instructions): each call is that prefix plus its own long, never-repeated context, so the prefix
/// cannot decide where a call goes (every pod holds it) and the unique context is a full prefill
/// wherever it lands. Sessions are `call-N` (N = the slot index). The prefix is sent to every pod
/// before the run ([`WorkloadGen::prewarm_bodies`]), so "every pod holds it" is true from the first
/// measured request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedAgentParams {
    /// Words in the prefix every call starts with (and every pod holds).
    pub prefix_words: usize,
    /// Words in each call's own context, inclusive range.
    pub context_words: (usize, usize),
    /// `max_tokens` of each call, inclusive range.
    pub max_tokens: (u32, u32),
}

impl Default for SharedAgentParams {
    fn default() -> Self {
        Self {
            prefix_words: 4000,
            context_words: (4500, 5500),
            max_tokens: (200, 200),
        }
    }
}

#[derive(Debug)]
pub(super) struct SharedAgent {
    p: SharedAgentParams,
    prefix: String,
}

impl SharedAgent {
    pub(super) fn new(seed: u64, vocab: &Vocab, p: &SharedAgentParams) -> Self {
        Self {
            p: p.clone(),
            prefix: vocab.text(&mut rng_for(seed, "shared-prefix", 0, 0), p.prefix_words),
        }
    }
}

impl Family for SharedAgent {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        (format!("call-{index}"), index, 0)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let p = &self.p;
        let mut rng = rng_for(seed, "shared-agent-call", slot.index, 0);
        let n = rng.gen_range(p.context_words.0..=p.context_words.1);
        let max_tokens = rng.gen_range(p.max_tokens.0..=p.max_tokens.1);
        (
            vec![
                Message::new("system", self.prefix.clone()),
                Message::new("user", vocab.text(&mut rng, n)),
            ],
            max_tokens,
        )
    }

    fn prewarm(&self) -> Option<Vec<Message>> {
        Some(vec![Message::new("system", self.prefix.clone())])
    }
}
