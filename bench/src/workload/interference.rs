//! `interference` and `long-unique`: streaming decodes of short prompts with long uncached prompts
//! arriving among them.

use super::{rng_for, Family, Message, Slot, Vocab};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Prefill/decode interference: many long-running streaming decodes (short prompts, long outputs)
/// with long uncached prompts (short outputs) arriving among them. Each arrival of the run's Poisson
/// stream is a long prompt with probability `long_share`, else a stream, so both kinds arrive as
/// Poisson streams of their own (at `rate × long_share` and `rate × (1 − long_share)`) and about
/// `stream rate × stream lifetime` streams are running at any time. Every prompt is distinct text, so
/// no prefix cache helps: a long prompt is a full prefill wherever it lands, which on a pod that also
/// decodes stalls (or, with chunked prefill, slows) every stream it runs next to. Sessions are
/// `stream-N` and `long-N` (N = the slot index), so a report can tell the two kinds apart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InterferenceParams {
    /// Share of the arrivals that are long-prompt requests (0..=1).
    pub long_share: f64,
    /// Words in a stream's prompt, inclusive range.
    pub stream_prompt_words: (usize, usize),
    /// `max_tokens` of a stream, inclusive range.
    pub stream_max_tokens: (u32, u32),
    /// Words in a long prompt, inclusive range.
    pub long_prompt_words: (usize, usize),
    /// `max_tokens` of a long-prompt request, inclusive range.
    pub long_max_tokens: (u32, u32),
}

impl Default for InterferenceParams {
    fn default() -> Self {
        Self {
            long_share: 0.2,
            stream_prompt_words: (50, 150),
            stream_max_tokens: (400, 800),
            long_prompt_words: (6000, 10000),
            long_max_tokens: (16, 64),
        }
    }
}

impl InterferenceParams {
    /// Session prefix of the streaming decodes.
    pub const STREAM: &'static str = "stream";
    /// Session prefix of the long-prompt requests.
    pub const LONG: &'static str = "long";

    /// Whether a session name (`stream-N`, `long-N`) is a long-prompt request.
    pub fn is_long_session(session: &str) -> bool {
        session
            .strip_prefix(Self::LONG)
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Whether a session name is a streaming decode.
    pub fn is_stream_session(session: &str) -> bool {
        session
            .strip_prefix(Self::STREAM)
            .is_some_and(|rest| rest.starts_with('-'))
    }
}

impl InterferenceParams {
    /// The `long-unique` workload: unique 8,000-word prompts with few output tokens, 8% of the
    /// arrivals, among streaming decodes of short prompts and long outputs.
    pub fn long_unique() -> Self {
        Self {
            long_share: 0.08,
            stream_prompt_words: (50, 150),
            stream_max_tokens: (400, 800),
            long_prompt_words: (8000, 8000),
            long_max_tokens: (8, 32),
        }
    }
}

#[derive(Debug)]
pub(super) struct Interference {
    p: InterferenceParams,
    /// Draws each slot's kind, in slot order.
    kind_rng: Box<StdRng>,
}

impl Interference {
    pub(super) fn new(seed: u64, p: &InterferenceParams) -> Self {
        Self {
            p: p.clone(),
            kind_rng: Box::new(rng_for(seed, "interference-kind", 0, 0)),
        }
    }
}

impl Family for Interference {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        let kind = if self.kind_rng.gen_bool(self.p.long_share) {
            InterferenceParams::LONG
        } else {
            InterferenceParams::STREAM
        };
        (format!("{kind}-{index}"), index, 0)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let p = &self.p;
        let long = InterferenceParams::is_long_session(&slot.session);
        let (words, max_tokens) = if long {
            (p.long_prompt_words, p.long_max_tokens)
        } else {
            (p.stream_prompt_words, p.stream_max_tokens)
        };
        let mut rng = rng_for(seed, "interference", slot.index, 0);
        let n = rng.gen_range(words.0..=words.1);
        let max_tokens = rng.gen_range(max_tokens.0..=max_tokens.1);
        (
            vec![Message::new("user", vocab.text(&mut rng, n))],
            max_tokens,
        )
    }
}
