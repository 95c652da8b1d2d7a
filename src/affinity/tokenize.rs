//! Real tokens for block hashing (`"block": {"mode": "tiktoken"}`): a tiktoken BPE built once per VM
//! at configuration time (~16 MiB), so blocks line up with the engine's token blocks more closely
//! than the 4-characters-a-token estimate. The prompt is encoded as ordinary text; special-token
//! strings in user content are not treated as control tokens.
//!
//! **Per message, memoized.** tiktoken-rs encodes ~20 MB/s natively and ~10 MB/s in Envoy's V8 (its
//! pre-tokenizing regex is most of that): 1.6 ms for a 16 KB prompt, every time, although the
//! prompts that routing helps are the ones that repeat (a tenant's system prompt, a conversation's
//! earlier turns). So the rendered prompt is encoded one message at a time (each ends in the
//! rendering's `MESSAGE_END`, `crate::protocol::parse`), and each message's tokens are kept in a small
//! LRU memo: a message seen before costs a lookup and a copy. A message is encoded on its own, so
//! the tokens at a message's edge can differ from encoding the prompt whole (a separator and a word
//! that the pre-tokenizer would have joined). That changes nothing routing needs: the same prompt
//! always gives the same tokens, and block boundaries move by at most a token per message, well
//! inside how far any tiktoken encoding is from the engine's own tokenizer anyway.
//!
//! The memo compares the text itself, not only its hash, so no crafted collision can give one
//! message another's tokens; it holds at most [`MEMO_BYTES`] of text and tokens per VM, and
//! messages too short to be worth it (under [`MEMO_MIN_BYTES`]) are encoded each time.

use crate::affinity::Tokenizer;
use crate::protocol::parse::MESSAGE_END;
use hashbrown::HashMap;
use std::cell::RefCell;
use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::xxh3_64;

/// Text plus tokens the memo holds per VM, bytes (a 16 KB message takes ~29 KB).
pub const MEMO_BYTES: usize = 4 << 20;
/// Messages shorter than this are encoded each time: encoding them costs about what a lookup does.
pub const MEMO_MIN_BYTES: usize = 256;

pub struct Tiktoken {
    bpe: CoreBPE,
    memo: RefCell<Memo>,
}

impl Tiktoken {
    /// Builds the named encoding (`cl100k_base` or `o200k_base`; config validation checks the name).
    pub fn new(encoding: &str) -> Result<Tiktoken, String> {
        let bpe = match encoding {
            "cl100k_base" => tiktoken_rs::cl100k_base(),
            "o200k_base" => tiktoken_rs::o200k_base(),
            other => return Err(format!("unknown tiktoken encoding `{other}`")),
        };
        bpe.map(|bpe| Tiktoken {
            bpe,
            memo: RefCell::new(Memo::new(MEMO_BYTES)),
        })
        .map_err(|e| format!("cannot build tiktoken `{encoding}`: {e}"))
    }

    fn encode_message(&self, message: &str, out: &mut Vec<u32>) {
        if message.len() < MEMO_MIN_BYTES {
            out.extend(self.bpe.encode_ordinary(message));
            return;
        }
        // Never re-entered within a VM; if it were, encoding without the memo is still right.
        let Ok(mut memo) = self.memo.try_borrow_mut() else {
            out.extend(self.bpe.encode_ordinary(message));
            return;
        };
        if let Some(tokens) = memo.get(message) {
            out.extend_from_slice(tokens);
            return;
        }
        let tokens = self.bpe.encode_ordinary(message);
        out.extend_from_slice(&tokens);
        memo.put(message, tokens);
    }
}

impl Tokenizer for Tiktoken {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        for message in text.split_inclusive(char::from(MESSAGE_END)) {
            self.encode_message(message, &mut out);
        }
        out
    }
}

/// Messages' tokens by their text, least recently used dropped first once over the byte bound.
struct Memo {
    entries: HashMap<u64, MemoEntry>,
    bytes: usize,
    limit: usize,
    clock: u64,
}

struct MemoEntry {
    text: Box<str>,
    tokens: Box<[u32]>,
    used: u64,
}

impl MemoEntry {
    fn bytes(&self) -> usize {
        self.text.len() + self.tokens.len() * std::mem::size_of::<u32>()
    }
}

impl Memo {
    fn new(limit: usize) -> Memo {
        Memo {
            entries: HashMap::new(),
            bytes: 0,
            limit,
            clock: 0,
        }
    }

    fn get(&mut self, text: &str) -> Option<&[u32]> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.get_mut(&xxh3_64(text.as_bytes()))?;
        if &*entry.text != text {
            return None;
        }
        entry.used = clock;
        Some(&entry.tokens)
    }

    /// Keeps `tokens` for `text`, unless one entry would take over a quarter of the memo (one huge
    /// prompt must not flush everything else). Over the bound, the least recently used entries
    /// go until a quarter of it is free, so the sort that finds them is paid once per many puts.
    fn put(&mut self, text: &str, tokens: Vec<u32>) {
        let entry = MemoEntry {
            text: text.into(),
            tokens: tokens.into_boxed_slice(),
            used: self.clock,
        };
        let size = entry.bytes();
        if size > self.limit / 4 {
            return;
        }
        // A colliding hash replaces the older text: the memo stays exact, only less useful.
        if let Some(old) = self.entries.insert(xxh3_64(text.as_bytes()), entry) {
            self.bytes -= old.bytes();
        }
        self.bytes += size;
        if self.bytes > self.limit {
            self.evict_to(self.limit - self.limit / 4);
        }
    }

    fn evict_to(&mut self, target: usize) {
        let mut by_age: Vec<(u64, u64)> = self.entries.iter().map(|(k, e)| (e.used, *k)).collect();
        by_age.sort_unstable();
        for (_, key) in by_age {
            if self.bytes <= target {
                break;
            }
            if let Some(old) = self.entries.remove(&key) {
                self.bytes -= old.bytes();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_real_tokens() {
        let t = Tiktoken::new("cl100k_base").unwrap();
        // "hello world" is two tokens in cl100k_base: 15339, 1917.
        assert_eq!(t.encode("hello world"), vec![15339, 1917]);
        assert!(Tiktoken::new("gpt2").is_err());
    }

    fn long_message(word: &str) -> String {
        format!("system\x1f{}\x1e", [word; 120].join(" "))
    }

    #[test]
    fn a_prompt_is_its_messages_encoded_one_by_one_whether_memoized_or_not() {
        let t = Tiktoken::new("cl100k_base").unwrap();
        let system = long_message("deploy");
        let prompt = format!("{system}user\x1fWhy did the rollout stall?\x1e");
        let by_message: Vec<u32> = prompt
            .split_inclusive('\x1e')
            .flat_map(|m| t.bpe.encode_ordinary(m))
            .collect();
        let first = t.encode(&prompt);
        assert_eq!(first, by_message);
        assert_eq!(
            t.memo.borrow().entries.len(),
            1,
            "only the long message is kept"
        );
        // The second time the system prompt comes from the memo, and the tokens are the same.
        let hits_before = t.memo.borrow().entries.values().map(|e| e.used).max();
        assert_eq!(t.encode(&prompt), first);
        assert!(t.memo.borrow().entries.values().map(|e| e.used).max() > hits_before);
        // A prompt without separators (a completions prompt) is one message.
        assert_eq!(
            t.encode("hello world"),
            t.bpe.encode_ordinary("hello world")
        );
    }

    #[test]
    fn the_memo_compares_text_not_only_its_hash() {
        let mut memo = Memo::new(1 << 20);
        memo.put("first", vec![1, 2]);
        // Plant another text under the first one's key: a lookup of the first must miss.
        let key = xxh3_64(b"first");
        memo.entries.insert(
            key,
            MemoEntry {
                text: "other".into(),
                tokens: vec![9].into_boxed_slice(),
                used: 0,
            },
        );
        assert_eq!(memo.get("first"), None);
    }

    #[test]
    fn the_memo_stays_under_its_bound_and_keeps_what_is_used() {
        let t = Tiktoken::new("cl100k_base").unwrap();
        let limit = 64 << 10;
        *t.memo.borrow_mut() = Memo::new(limit);
        let hot = long_message("tenant");
        for i in 0..200 {
            t.encode(&hot);
            t.encode(&long_message(&format!("word{i}")));
            let memo = t.memo.borrow();
            assert!(memo.bytes <= limit, "{} bytes over {limit}", memo.bytes);
            let counted: usize = memo.entries.values().map(MemoEntry::bytes).sum();
            assert_eq!(memo.bytes, counted);
        }
        let mut memo = t.memo.borrow_mut();
        assert!(
            memo.get(&hot).is_some(),
            "the prompt used every time is kept"
        );
        assert!(
            memo.get(&long_message("word0")).is_none(),
            "the oldest went"
        );
        // One entry larger than a quarter of the memo is not kept.
        memo.put(&"x".repeat(limit / 4), vec![0; 4]);
        assert!(memo.get(&"x".repeat(limit / 4)).is_none());
    }
}
