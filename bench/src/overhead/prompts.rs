//! The request bodies: seeded chat completions of a fixed prompt size, either one system prompt
//! shared by the whole run (`repeat`, so kvroute finds a prefix hit) or a new one each time
//! (`fresh`, so its index grows). Request `n` of a kind and size is the same body in every run with
//! the same seed, and both arms are sent the very same bytes; prompts of different sizes share no
//! prefix, so no size's prompts are prefix hits on another's.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use super::options::PromptKind;
use crate::workload::Vocab;

/// Bytes of the question that follows the system prompt (part of the prompt size).
pub(super) const QUESTION_BYTES: usize = 96;

/// A seeded generator of prompt text made of kvsim-friendly pseudo-words.
pub(super) struct Prompts {
    vocab: Vocab,
    seed: u64,
    prompt_bytes: usize,
    /// The system prompt of the `repeat` kind.
    shared_system: String,
}

/// Words from `rng` until `bytes` bytes (the last word cut if needed).
fn text_of(vocab: &Vocab, rng: &mut StdRng, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 8);
    while out.len() < bytes {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&vocab.text(rng, 1));
    }
    // The words are ASCII, so any byte offset is a character boundary.
    out.truncate(bytes);
    out
}

impl Prompts {
    pub(super) fn new(seed: u64, prompt_bytes: usize) -> Self {
        let vocab = Vocab::new(seed);
        let mut rng = Self::rng(seed, "shared", prompt_bytes as u64);
        let shared_system = text_of(&vocab, &mut rng, prompt_bytes - QUESTION_BYTES);
        Self {
            vocab,
            seed,
            prompt_bytes,
            shared_system,
        }
    }

    /// The generator of one prompt; `n` says which (request number, or the size for the shared one).
    fn rng(seed: u64, what: &str, n: u64) -> StdRng {
        let mut key = what.as_bytes().to_vec();
        key.extend_from_slice(&n.to_le_bytes());
        StdRng::seed_from_u64(xxhash_rust::xxh3::xxh3_64_with_seed(&key, seed))
    }

    /// The prompt size asked for, bytes.
    pub(super) fn size(&self) -> usize {
        self.prompt_bytes
    }

    /// The request body of request `n` of `kind` (`n` counts warm-up and measured requests alike).
    pub(super) fn body(&self, kind: PromptKind, n: u64) -> (Bytes, usize) {
        // Keyed by the size too: the fresh prompts of one size must not start with those of another.
        let what = format!("{}/{}", kind.name(), self.prompt_bytes);
        let mut rng = Self::rng(self.seed, &what, n);
        let question = {
            let head = format!("Question {n}: ");
            let rest = QUESTION_BYTES.saturating_sub(head.len());
            head + &text_of(&self.vocab, &mut rng, rest)
        };
        let system = match kind {
            PromptKind::Repeat => self.shared_system.clone(),
            PromptKind::Fresh => text_of(&self.vocab, &mut rng, self.prompt_bytes - QUESTION_BYTES),
        };
        let prompt_bytes = system.len() + question.len();
        let body = json!({
            "model": "sim-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 1,
            "stream": false
        });
        (Bytes::from(body.to_string()), prompt_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn prompts_have_the_asked_size_and_kinds_differ() {
        let p = Prompts::new(1, 16_384);
        let (a, n) = p.body(PromptKind::Repeat, 0);
        let (b, _) = p.body(PromptKind::Repeat, 1);
        let (c, _) = p.body(PromptKind::Fresh, 0);
        let (d, _) = p.body(PromptKind::Fresh, 1);
        assert_eq!(n, 16_384);
        let sys = |b: &Bytes| -> String {
            let v: Value = serde_json::from_slice(b).expect("json");
            v["messages"][0]["content"]
                .as_str()
                .expect("system")
                .to_owned()
        };
        assert_eq!(sys(&a), sys(&b));
        assert_ne!(sys(&c), sys(&d));
        assert_ne!(a, b);
        // Another size starts differently, for both kinds.
        let small = Prompts::new(1, 256);
        for kind in [PromptKind::Repeat, PromptKind::Fresh] {
            let (big, _) = p.body(kind, 0);
            let (little, _) = small.body(kind, 0);
            assert_ne!(sys(&big).get(..64), sys(&little).get(..64), "{kind:?}");
        }
    }
}
