//! Approximate tokenisation, chat rendering and prefix-block hashing, as the *server* sees a prompt.
//!
//! The simulator must decide cache hits on its own terms, never on the router's, so it deliberately
//! tokenises differently from a router's "4 characters per token" estimate: every
//! whitespace-separated word is a token, words longer than 6 bytes are cut into 6-byte pieces, and each
//! ASCII punctuation character is a token of its own. Blocks of `block_size` tokens are hashed as a
//! chain (xxh3-64 over the previous block's hash and this block's token ids), seeded with the model
//! name, exactly like vLLM's automatic prefix caching: a block hash identifies the whole prefix up to
//! and including that block.

use xxhash_rust::xxh3::xxh3_64;

/// Longest piece of a word that still counts as one token.
const MAX_PIECE_BYTES: usize = 6;

/// Token ids of `text` (each id is the xxh3 hash of the token's bytes, so ids are stable across
/// pods and runs).
pub fn tokenize(text: &str) -> Vec<u64> {
    let mut ids = Vec::with_capacity(text.len() / 4 + 1);
    for word in text.split_whitespace() {
        let mut piece_start: Option<usize> = None;
        let bytes = word.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if b.is_ascii_punctuation() {
                if let Some(start) = piece_start.take() {
                    ids.push(token_id(bytes.get(start..i).unwrap_or_default()));
                }
                ids.push(token_id(std::slice::from_ref(b)));
                continue;
            }
            let start = *piece_start.get_or_insert(i);
            if i + 1 - start == MAX_PIECE_BYTES {
                ids.push(token_id(bytes.get(start..=i).unwrap_or_default()));
                piece_start = None;
            }
        }
        if let Some(start) = piece_start {
            ids.push(token_id(bytes.get(start..).unwrap_or_default()));
        }
    }
    ids
}

fn token_id(piece: &[u8]) -> u64 {
    xxh3_64(piece)
}

/// One chat message after parsing: its role and its text (content parts already joined).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// The role, with ` name=..` and ` tool_call_id=..` when the message has them.
    pub role: String,
    pub content: String,
}

/// Renders a conversation through a minimal chat template: the template fields that change it
/// (`chat_template_kwargs` and friends, as JSON) and the tools' JSON first (templates put tools in
/// the system turn), then `<|role|>\n{content}\n` per message, and the generation prompt last when
/// asked (vLLM's `add_generation_prompt`, true by default). The role markers make "user: X" and
/// "system: X" hash differently, as a real template does.
pub fn render_chat(
    messages: &[ChatMessage],
    tools_json: Option<&str>,
    template_json: Option<&str>,
    generation_prompt: bool,
) -> String {
    let mut out = String::new();
    if let Some(template) = template_json {
        out.push_str("<|template|>\n");
        out.push_str(template);
        out.push('\n');
    }
    if let Some(tools) = tools_json {
        out.push_str("<|tools|>\n");
        out.push_str(tools);
        out.push('\n');
    }
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        out.push_str(&m.content);
        out.push('\n');
    }
    if generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

/// Chained hashes of the prompt's *full* blocks (a trailing partial block is never cacheable).
pub fn block_hashes(model: &str, tokens: &[u64], block_size: usize) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut prev = xxh3_64(model.as_bytes());
    let mut buf = Vec::with_capacity(8 * (block_size + 1));
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            buf.clear();
            buf.extend_from_slice(&prev.to_le_bytes());
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            prev = xxh3_64(&buf);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pieces_and_punctuation() {
        assert_eq!(tokenize("hello world").len(), 2);
        // "abcdefghij" = "abcdef" + "ghij"; "," and "!" are tokens of their own.
        assert_eq!(tokenize("abcdefghij, hi!").len(), 5);
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("abcdef"), vec![token_id(b"abcdef")]);
    }

    #[test]
    fn chained_hashes_depend_on_model_and_prefix() {
        let toks: Vec<u64> = (0..40).collect();
        let a = block_hashes("m", &toks, 16);
        assert_eq!(a.len(), 2);
        assert_ne!(a, block_hashes("other", &toks, 16));
        let mut changed = toks.clone();
        changed[0] = 99;
        let b = block_hashes("m", &changed, 16);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1], "a block hash covers the whole prefix");
    }
}
