//! Real tokens for block hashing (`"block": {"mode": "tiktoken"}`): a tiktoken BPE built once per VM
//! at configuration time (~16 MiB, ~0.5 µs a token), so blocks line up with the engine's token
//! blocks more closely than the 4-characters-a-token estimate. The prompt is encoded as ordinary
//! text; special-token strings in user content are not treated as control tokens.

use crate::router::Tokenizer;
use tiktoken_rs::CoreBPE;

pub struct Tiktoken(CoreBPE);

impl Tiktoken {
    /// Builds the named encoding (`cl100k_base` or `o200k_base`; config validation checks the name).
    pub fn new(encoding: &str) -> Result<Tiktoken, String> {
        let bpe = match encoding {
            "cl100k_base" => tiktoken_rs::cl100k_base(),
            "o200k_base" => tiktoken_rs::o200k_base(),
            other => return Err(format!("unknown tiktoken encoding `{other}`")),
        };
        bpe.map(Tiktoken)
            .map_err(|e| format!("cannot build tiktoken `{encoding}`: {e}"))
    }
}

impl Tokenizer for Tiktoken {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode_ordinary(text)
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
}
