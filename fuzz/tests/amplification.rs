//! The request parser's memory on the body shapes that cost it most per input byte, against the
//! bound the `request_body` target holds it to (`REQUEST_PARSE_FACTOR`): the fuzzer searches at
//! random, these are the known worst cases, 1 MiB each. Prints each ratio.
//!
//! The worst is a list of one-key objects: `serde_json` keeps every object in a B-tree whose
//! first node takes about 630 bytes, for 7 bytes of input (`{"":0},`): 99 bytes allocated per
//! byte sent (measured), so a body at the default `max_body_bytes` (8 MiB) costs its VM ~830 MB
//! while it is parsed (issue 11, item 1, replaces the tree by a budgeted parse; then this bound is that budget).

use kvroute::flow::parse::{parse_object, Endpoint};
use kvroute_fuzz::alloc::{linear_bound, peak_during};
use kvroute_fuzz::REQUEST_PARSE_FACTOR;

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
    let shapes = [
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
    for (name, (endpoint, bytes)) in shapes {
        let (parsed, peak) = peak_during(|| parse_object(endpoint, &bytes));
        let ratio = peak as f64 / bytes.len() as f64;
        println!(
            "{name}: {} bytes parse with {peak} bytes at most ({ratio:.1}x)",
            bytes.len()
        );
        assert!(parsed.is_ok(), "{name}: {:?}", parsed.err());
        assert!(
            peak <= linear_bound(bytes.len(), REQUEST_PARSE_FACTOR),
            "{name}: {ratio:.1}x"
        );
    }
}
