//! What a model server's response says about its prefix cache: vLLM (and SGLang, TRT-LLM behind the
//! OpenAI API) report `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, in a
//! non-streamed body and in a stream's final usage chunk (`stream_options.include_usage`). The
//! Responses API names them `usage.input_tokens` and `usage.input_tokens_details.cached_tokens`
//! (in the response object, and in the stream's `response.completed` event).
//!
//! Scanned, not parsed: the filter looks at response chunks as they pass (it never buffers or
//! changes them), so this finds the two numbers by their keys in whatever bytes it is given. A
//! body without them, or with a value that is not a plain integer, yields `None`.

/// `(cached_tokens, prompt_tokens)` when both appear in `bytes`.
pub fn cache_report(bytes: &[u8]) -> Option<(u64, u64)> {
    let cached = number_after(bytes, b"\"cached_tokens\"")?;
    let prompt = number_after(bytes, b"\"prompt_tokens\"")
        .or_else(|| number_after(bytes, b"\"input_tokens\""))?;
    Some((cached, prompt))
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
