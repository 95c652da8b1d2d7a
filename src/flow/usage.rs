//! What a model server's response says about its prefix cache: vLLM (and SGLang, TRT-LLM behind the
//! OpenAI API) report `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, in a
//! non-streamed body and in a stream's final usage chunk (`stream_options.include_usage`). The
//! Responses API names them `usage.input_tokens` and `usage.input_tokens_details.cached_tokens`
//! (in the response object, and in the stream's `response.completed` event).
//!
//! Scanned, not parsed: the filter looks at response chunks as they pass (it never buffers or
//! changes them), so this finds the two numbers by their keys in whatever bytes it is given. A
//! body without them, or with a value that is not a plain integer, yields `None`.
//!
//! A report is only believed when it is possible ([`plausible`]): a pod's numbers are outside
//! bytes, and one `cached_tokens: 1e18` would otherwise outweigh every honest report in
//! `kvroute_cache_reported_tokens_total` and teach the index an eviction that did not happen.

/// `(cached_tokens, prompt_tokens)` when both appear in `bytes`.
pub fn cache_report(bytes: &[u8]) -> Option<(u64, u64)> {
    let cached = number_after(bytes, b"\"cached_tokens\"")?;
    let prompt = number_after(bytes, b"\"prompt_tokens\"")
        .or_else(|| number_after(bytes, b"\"input_tokens\""))?;
    Some((cached, prompt))
}

/// More prompt tokens than any model's context window (the longest are about 10^7): a report
/// claiming more is not a real prompt.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// Whether a `(cached_tokens, prompt_tokens)` report can be true: no more cached than prompt
/// tokens, and a prompt some model could take. The caller counts and ignores any other.
pub fn plausible(cached: u64, prompt: u64) -> bool {
    cached <= prompt && prompt <= MAX_PROMPT_TOKENS
}

/// The integer after the last `key` `:` in `bytes` (the usage chunk comes last).
fn number_after(bytes: &[u8], key: &[u8]) -> Option<u64> {
    let at = bytes.windows(key.len()).rposition(|w| w == key)?;
    let rest = bytes.get(at + key.len()..)?;
    let rest = skip_spaces(rest);
    let rest = skip_spaces(rest.strip_prefix(b":")?);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    // `parse` refuses what overflows; a count of digits would refuse leading zeros too.
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}

fn skip_spaces(bytes: &[u8]) -> &[u8] {
    let n = bytes.iter().take_while(|b| b.is_ascii_whitespace()).count();
    bytes.get(n..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_vllm_usage_in_bodies_and_stream_chunks() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":7504,"total_tokens":7510,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":7488}}}"#;
        assert_eq!(cache_report(body), Some((7488, 7504)));
        let chunk = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 12, \"prompt_tokens_details\": {\"cached_tokens\" : 0}}}\n\ndata: [DONE]\n\n";
        assert_eq!(cache_report(chunk), Some((0, 12)));
        let responses = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":328,\"input_tokens_details\":{\"cached_tokens\":320},\"output_tokens\":8,\"total_tokens\":336}}}\n\n";
        assert_eq!(cache_report(responses), Some((320, 328)));
    }

    #[test]
    fn only_possible_reports_are_plausible() {
        assert!(plausible(0, 0));
        assert!(plausible(640, 651));
        assert!(plausible(651, 651));
        assert!(!plausible(652, 651));
        assert!(!plausible(1_000_000_000_000_000_000, 651));
        assert!(plausible(MAX_PROMPT_TOKENS, MAX_PROMPT_TOKENS));
        assert!(!plausible(0, MAX_PROMPT_TOKENS + 1));
    }

    #[test]
    fn anything_else_is_none() {
        assert_eq!(cache_report(b""), None);
        assert_eq!(cache_report(br#"{"usage":{"prompt_tokens":5}}"#), None);
        assert_eq!(
            cache_report(br#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":null}}"#),
            None
        );
        assert_eq!(
            cache_report(br#"{"prompt_tokens":5,"cached_tokens":-3}"#),
            None
        );
        assert_eq!(
            cache_report(br#"{"prompt_tokens":99999999999999999999999,"cached_tokens":1}"#),
            None
        );
        assert_eq!(cache_report(b"\xff\xfe\"cached_tokens\":"), None);
        // Found by fuzzing: a number with leading zeros is still the number, even past 19 digits.
        assert_eq!(
            cache_report(br#"{"prompt_tokens":000000000000000000012,"cached_tokens":7}"#),
            Some((7, 12))
        );
    }
}
