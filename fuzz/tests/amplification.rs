//! The request parser's memory on the body shapes that cost it most per input byte, against the
//! bound the `request_body` target holds it to (`REQUEST_PARSE_FACTOR`): the fuzzer searches at
//! random, these are the known worst cases, 1 MiB each. Prints each ratio.
//!
//! The parser builds no tree (the whole-tree parser it replaced took up to 99 bytes per byte sent
//! on a list of `{"":0}` objects: ~830 MB for an 8 MiB body): what it holds is the rendered prompt,
//! reserved at the body's size, so ignored members cost nothing and text about 1x. The costliest
//! shapes are numbers that print longer than they are written (`1e9` renders `1000000000.0`) and
//! members that come out of rendering order (re-ordered in place, the smaller pieces copied aside).

use kvroute::protocol::parse::{parse_request, Endpoint};
use kvroute_fuzz::alloc::{linear_bound, peak_during};
use kvroute_fuzz::REQUEST_PARSE_FACTOR;

/// What a parse holds at most with its budget at the body's size, per body byte.
const BUDGETED_PARSE_FACTOR: usize = 2;

fn body(endpoint: Endpoint, head: &str, item: &str, tail: &str) -> (Endpoint, Vec<u8>) {
    body_of(endpoint, head, |_| item.to_string(), tail)
}

fn body_of(
    endpoint: Endpoint,
    head: &str,
    item: impl Fn(usize) -> String,
    tail: &str,
) -> (Endpoint, Vec<u8>) {
    let mut b = head.as_bytes().to_vec();
    let mut i = 0;
    while b.len() < 1 << 20 {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(item(i).as_bytes());
        i += 1;
    }
    b.extend_from_slice(tail.as_bytes());
    (endpoint, b)
}

#[test]
fn the_costliest_body_shapes_stay_within_the_parse_bound() {
    let chat = Endpoint::ChatCompletions;
    let completions = Endpoint::Completions;
    let responses = Endpoint::Responses;
    let shapes = [
        (
            "exponent numbers in tools",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":["#,
                "1e9",
                "]}",
            ),
        ),
        (
            "the longest-printing numbers in tools",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":["#,
                "1e15",
                "]}",
            ),
        ),
        (
            "exponent numbers as content parts",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":["#,
                "1e9",
                "]}]}",
            ),
        ),
        (
            "unsorted tool objects",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":["#,
                r#"{"b":0,"a":0}"#,
                "]}",
            ),
        ),
        (
            "an unsorted object of many keys in tools",
            body_of(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":{"#,
                |i| format!(r#""{:x}":0"#, usize::MAX - i),
                "}}",
            ),
        ),
        (
            "messages with content first",
            body(
                chat,
                r#"{"model":"m","messages":["#,
                r#"{"content":"x","role":"u"}"#,
                "]}",
            ),
        ),
        (
            "escaped text",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":""#,
                r#"\n\u00e9"#,
                r#""}]}"#,
            ),
        ),
        (
            "responses function calls",
            body(
                responses,
                r#"{"model":"m","input":["#,
                r#"{"type":"function_call","name":"f","arguments":"{}","call_id":"c"}"#,
                "]}",
            ),
        ),
        (
            "responses input parts",
            body(
                responses,
                r#"{"model":"m","input":[{"role":"user","content":["#,
                r#"{"type":"input_text","text":"x"}"#,
                "]}]}",
            ),
        ),
        (
            "token ids",
            body(completions, r#"{"model":"m","prompt":[["#, "0", "]]}"),
        ),
        (
            "empty messages",
            body(chat, r#"{"model":"m","messages":["#, "{}", "]}"),
        ),
        (
            "tiny messages",
            body(
                chat,
                r#"{"model":"m","messages":["#,
                r#"{"role":"u","content":"x"}"#,
                "]}",
            ),
        ),
        (
            "empty content parts",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":["#,
                "{}",
                "]}]}",
            ),
        ),
        (
            "number content parts",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":["#,
                "1e9",
                "]}]}",
            ),
        ),
        (
            "tools",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":["#,
                "0",
                "]}",
            ),
        ),
        (
            "one-key objects",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"x":["#,
                r#"{"a":0}"#,
                "]}",
            ),
        ),
        (
            "one-key messages",
            body(chat, r#"{"model":"m","messages":["#, r#"{"a":0}"#, "]}"),
        ),
        (
            "smallest one-key objects",
            body(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"x":["#,
                r#"{"":0}"#,
                "]}",
            ),
        ),
        (
            "distinct keys",
            body_of(
                chat,
                r#"{"model":"m","messages":[{"role":"u","content":"x"}],"x":{"#,
                |i| format!(r#""{i:x}":0"#),
                "}}",
            ),
        ),
    ];
    let mut worst = 0.0f64;
    for (name, (endpoint, bytes)) in shapes {
        let (parsed, peak) = peak_during(|| parse_request(endpoint, &bytes, usize::MAX));
        let ratio = peak as f64 / bytes.len() as f64;
        println!(
            "{name}: {} bytes parse with {peak} bytes at most ({ratio:.2}x)",
            bytes.len()
        );
        assert!(parsed.view.is_ok(), "{name}: {:?}", parsed.view.err());
        worst = worst.max(ratio);
        // With the budget at the body's size (the default budget is `max_body_bytes`).
        let (bounded, bounded_peak) = peak_during(|| parse_request(endpoint, &bytes, bytes.len()));
        println!(
            "  budget = body size: {} with {bounded_peak} bytes at most ({:.2}x)",
            if bounded.view.is_ok() {
                "routed"
            } else {
                "refused, over budget"
            },
            bounded_peak as f64 / bytes.len() as f64
        );
        assert!(
            bounded_peak <= linear_bound(bytes.len(), BUDGETED_PARSE_FACTOR),
            "{name} within a budget"
        );
        assert!(
            peak <= linear_bound(bytes.len(), REQUEST_PARSE_FACTOR),
            "{name}: {ratio:.1}x"
        );
    }
}
