//! What a model server's response says about its prefix cache: vLLM (and SGLang, TRT-LLM behind the
//! OpenAI API) report `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, in a
//! non-streamed body and in a stream's final usage chunk (`stream_options.include_usage`). The
//! Responses API names them `usage.input_tokens` and `usage.input_tokens_details.cached_tokens`
//! (in the response object, and in the stream's `response.completed` event). SGLang's native
//! `/generate` reports `meta_info.prompt_tokens` and `meta_info.cached_tokens` (in every streamed
//! chunk). The Anthropic Messages API reports `usage.cache_read_input_tokens` beside
//! `input_tokens`, which counts only the tokens neither read from nor written to the cache (vLLM
//! since #40912, as Anthropic does): the prompt is their sum with `cache_creation_input_tokens`;
//! streamed, in `message_start` (and `message_delta`).
//!
//! Scanned, not parsed: the filter looks at response chunks as they pass (it never buffers or
//! changes them), so this finds the numbers by their keys in whatever bytes it is given. A body
//! without them, with a value that is not a plain integer, or ending inside the number (the rest
//! of it may come in the next chunk), yields `None`.
//!
//! A report is only believed when it is possible ([`plausible`]): a pod's numbers are outside
//! bytes, and one `cached_tokens: 1e18` would otherwise outweigh every honest report in
//! `kvroute_cache_reported_tokens_total` and teach the index an eviction that did not happen.

/// `(cached_tokens, prompt_tokens)` when both appear in `bytes`.
pub fn cache_report(bytes: &[u8]) -> Option<(u64, u64)> {
    if let Some(cached) = number_after(bytes, b"\"cached_tokens\"") {
        let prompt = number_after(bytes, b"\"prompt_tokens\"")
            .or_else(|| number_after(bytes, b"\"input_tokens\""))?;
        return Some((cached, prompt));
    }
    let read = number_after(bytes, b"\"cache_read_input_tokens\"")?;
    let uncached = number_after(bytes, b"\"input_tokens\"")?;
    let written = number_after(bytes, b"\"cache_creation_input_tokens\"").unwrap_or(0);
    Some((read, uncached.checked_add(read)?.checked_add(written)?))
}

/// More prompt tokens than any model's context window (the longest are about 10^7): a report
/// claiming more is not a real prompt.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// Whether a `(cached_tokens, prompt_tokens)` report can be true: no more cached than prompt
/// tokens, and a prompt some model could take. The caller counts and ignores any other.
pub fn plausible(cached: u64, prompt: u64) -> bool {
    cached <= prompt && prompt <= MAX_PROMPT_TOKENS
}

/// The integer after the last `key` `:` in `bytes` (the usage chunk comes last), when something
/// follows it.
fn number_after(bytes: &[u8], key: &[u8]) -> Option<u64> {
    let at = bytes.windows(key.len()).rposition(|w| w == key)?;
    let rest = bytes.get(at + key.len()..)?;
    let rest = skip_spaces(rest);
    let rest = skip_spaces(rest.strip_prefix(b":")?);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits == rest.len() {
        return None;
    }
    // `parse` refuses what overflows; a count of digits would refuse leading zeros too.
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}

/// `bytes` after its leading ASCII whitespace (also for `crate::stored_responses`' id scan).
pub(crate) fn skip_spaces(bytes: &[u8]) -> &[u8] {
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
    fn finds_anthropic_and_sglang_usage() {
        // vLLM's /v1/messages answer: input_tokens is what was not read from the cache.
        let message = br#"{"id":"msg_1","type":"message","usage":{"input_tokens":44,"output_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":1616}}"#;
        assert_eq!(cache_report(message), Some((1616, 1660)));
        let written = br#"{"usage":{"input_tokens":4,"cache_creation_input_tokens":96,"cache_read_input_tokens":0}}"#;
        assert_eq!(cache_report(written), Some((0, 100)));
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],\"usage\":{\"input_tokens\":32,\"cache_read_input_tokens\":1632,\"output_tokens\":0}}}\n\n";
        assert_eq!(cache_report(start), Some((1632, 1664)));
        assert_eq!(
            cache_report(br#"{"usage":{"input_tokens":1660,"output_tokens":2}}"#),
            None,
            "without the cache field nothing is known"
        );
        let sglang = b"data: {\"text\":\"a b\",\"meta_info\":{\"id\":\"x\",\"prompt_tokens\":390,\"completion_tokens\":2,\"cached_tokens\":374}}\n\n";
        assert_eq!(cache_report(sglang), Some((374, 390)));
    }

    #[test]
    fn a_number_cut_by_the_chunk_end_waits_for_the_rest() {
        let whole = br#"{"usage":{"input_tokens":32,"cache_read_input_tokens":1632}}"#;
        let cut = whole.len() - 4; // ends in `16`
        assert_eq!(cache_report(&whole[..cut]), None);
        assert_eq!(cache_report(whole), Some((1632, 1664)));
        assert_eq!(
            cache_report(br#"{"prompt_tokens":12,"cached_tokens":7"#),
            None
        );
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
