//! The streaming parser against the whole-tree one it replaced (`reference`): the same view or
//! the same refusal for every body, on generated request bodies of every shape the renderer knows
//! (and mutilated copies of them), written as text so keys repeat and come in any order.

use super::{parse, parse_request, reference, Endpoint, ParseError};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const STRINGS: &[&str] = &[
    r#""""#,
    r#""user""#,
    r#""assistant""#,
    r#""system""#,
    r#""tool""#,
    r#""text""#,
    r#""image_url""#,
    r#""input_audio""#,
    r#""hello there""#,
    r#""caf\u00e9 \"quoted\" \\ \n""#,
    r#""\ud83d\ude00 emoji""#,
    r#""é ü 中文""#,
    r#""https://x/1.png""#,
    r#""{\"city\":\"Paris\"}""#,
    r#""type""#,
    r#""url""#,
];
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "7",
    "1e9",
    "1E2",
    "-3.5",
    "0.1",
    "1e15",
    "18446744073709551615",
    "-9223372036854775808",
    "2.5e-3",
    "123456789012345678901234567890",
];
const KEYS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_call_id",
    "tool_calls",
    "type",
    "text",
    "image_url",
    "url",
    "data",
    "file_data",
    "file_id",
    "function",
    "arguments",
    "id",
    "input_audio",
    "detail",
    "",
    "z",
    "a",
    "\\u0072ole",
];

fn value(rng: &mut Rng, depth: usize, out: &mut String) {
    let kind = if depth > 4 {
        rng.below(4)
    } else {
        rng.below(7)
    };
    match kind {
        0 => out.push_str(rng.pick(STRINGS)),
        1 => out.push_str(rng.pick(NUMBERS)),
        2 => out.push_str(rng.pick(&["true", "false"])),
        3 => out.push_str("null"),
        4 | 5 => object(rng, depth, out, KEYS),
        _ => list(rng, depth, out, |rng, out| value(rng, depth + 1, out)),
    }
}

fn list(rng: &mut Rng, _depth: usize, out: &mut String, item: impl Fn(&mut Rng, &mut String)) {
    out.push('[');
    for i in 0..rng.below(4) {
        if i > 0 {
            out.push(',');
        }
        item(rng, out);
    }
    out.push(']');
}

fn object(rng: &mut Rng, depth: usize, out: &mut String, keys: &[&str]) {
    out.push('{');
    for i in 0..rng.below(5) {
        if i > 0 {
            out.push_str(if rng.chance(20) { " , " } else { "," });
        }
        out.push('"');
        out.push_str(rng.pick(keys));
        out.push_str("\":");
        value(rng, depth + 1, out);
    }
    out.push('}');
}

/// A content part: usually one of the shapes the renderer reads.
fn part(rng: &mut Rng, out: &mut String) {
    let kind = rng.pick(&[
        "text",
        "image_url",
        "input_audio",
        "video_url",
        "file",
        "input_text",
        "input_image",
        "odd",
    ]);
    match rng.below(6) {
        0 => value(rng, 3, out),
        1 => out.push_str(&format!(
            r#"{{"type":"{kind}","text":{}}}"#,
            rng.pick(STRINGS)
        )),
        2 => out.push_str(&format!(
            r#"{{"{kind}":{{"{}":{}}},"type":"{kind}"}}"#,
            rng.pick(&["url", "data", "file_data", "file_id", "detail"]),
            rng.pick(STRINGS)
        )),
        3 => out.push_str(&format!(
            r#"{{"type":"{kind}","{kind}":{},"image_url":{}}}"#,
            rng.pick(STRINGS),
            rng.pick(STRINGS)
        )),
        _ => object(rng, 3, out, &["type", "text", kind, "url", "image_url"]),
    }
}

fn message(rng: &mut Rng, out: &mut String) {
    if rng.chance(5) {
        value(rng, 2, out);
        return;
    }
    out.push('{');
    let fields = rng.below(6);
    for i in 0..fields {
        if i > 0 {
            out.push(',');
        }
        let key = rng.pick(&[
            "role",
            "content",
            "name",
            "tool_call_id",
            "tool_calls",
            "content",
            "role",
            "extra",
        ]);
        out.push_str(&format!("\"{key}\":"));
        match (key, rng.below(4)) {
            ("content", 0 | 1) => list(rng, 2, out, part),
            ("tool_calls", 0 | 1) => list(rng, 2, out, |rng, out| {
                if rng.chance(70) {
                    out.push_str(&format!(
                        r#"{{"id":"c1","type":"function","function":{{"arguments":{},"name":{}}}}}"#,
                        rng.pick(STRINGS),
                        rng.pick(STRINGS)
                    ))
                } else {
                    object(rng, 3, out, &["function", "name", "arguments", "id"])
                }
            }),
            ("role" | "content" | "name", 2) => out.push_str(rng.pick(STRINGS)),
            _ => value(rng, 2, out),
        }
    }
    out.push('}');
}

fn body(rng: &mut Rng, endpoint: Endpoint) -> String {
    let mut out = String::from("{");
    let keys: &[&str] = match endpoint {
        Endpoint::Completions => &[
            "model",
            "prompt",
            "max_tokens",
            "stream",
            "cache_salt",
            "x",
            "kv_transfer_params",
        ],
        _ => &[
            "model",
            "messages",
            "messages",
            "tools",
            "chat_template",
            "chat_template_kwargs",
            "documents",
            "max_tokens",
            "max_completion_tokens",
            "stream",
            "cache_salt",
            "x",
            "kv_transfer_params",
        ],
    };
    let n = 1 + rng.below(7);
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        let key = if i == 0 && rng.chance(85) {
            "model"
        } else {
            rng.pick(keys)
        };
        out.push_str(&format!("\"{key}\":"));
        match key {
            "model" if rng.chance(85) => out.push_str(r#""m""#),
            "messages" if rng.chance(85) => list(rng, 1, &mut out, message),
            "prompt" => match rng.below(4) {
                0 => out.push_str(rng.pick(STRINGS)),
                1 => list(rng, 1, &mut out, |rng, out| out.push_str(rng.pick(STRINGS))),
                2 => list(rng, 1, &mut out, |rng, out| {
                    list(rng, 2, out, |rng, out| out.push_str(rng.pick(NUMBERS)))
                }),
                _ => value(rng, 1, &mut out),
            },
            "max_tokens" | "max_completion_tokens" if rng.chance(60) => {
                out.push_str(rng.pick(NUMBERS))
            }
            "stream" if rng.chance(60) => out.push_str(rng.pick(&["true", "false"])),
            _ => value(rng, 1, &mut out),
        }
    }
    if rng.chance(30) && endpoint == Endpoint::ChatCompletions {
        out.push_str(r#","messages":[{"role":"user","content":"hi"}]"#);
    }
    out.push('}');
    out
}

/// A body broken the ways the fault matrix breaks them.
fn mutilate(rng: &mut Rng, body: &str) -> Vec<u8> {
    let mut bytes = body.as_bytes().to_vec();
    match rng.below(6) {
        0 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
        1 => {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] = [0xff, 0x00, b'"', b'\\', b',', b'}'][rng.below(6) as usize];
        }
        2 => bytes.extend_from_slice(b" x"),
        3 => {
            // Deep nesting inside a member, around serde_json's limit.
            let n = 120 + rng.below(12) as usize;
            let deep = format!(r#","x":{}{}"#, "[".repeat(n), "]".repeat(n));
            bytes.truncate(bytes.len() - 1);
            bytes.extend_from_slice(deep.as_bytes());
            bytes.push(b'}');
        }
        4 => {
            let n = 118 + rng.below(12) as usize;
            let deep = format!(
                r#","messages":[{{"role":"user","content":[{{"type":"x","x":{}{}}}]}}]"#,
                "[".repeat(n),
                "]".repeat(n)
            );
            bytes.truncate(bytes.len() - 1);
            bytes.extend_from_slice(deep.as_bytes());
            bytes.push(b'}');
        }
        _ => bytes.extend_from_slice(br#"{"a":"\ud800"}"#),
    }
    bytes
}

#[test]
fn the_streaming_parser_agrees_with_the_tree_parser_on_every_generated_body() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..40_000 {
        let endpoint = if i % 3 == 0 {
            Endpoint::Completions
        } else {
            Endpoint::ChatCompletions
        };
        let text = body(&mut rng, endpoint);
        let bytes = match rng.below(100) {
            0..=2 => {
                let mut other = String::new();
                list(&mut rng, 0, &mut other, |rng, out| value(rng, 1, out));
                other.into_bytes()
            }
            3..=27 => mutilate(&mut rng, &text),
            _ => text.into_bytes(),
        };
        let ours = parse(endpoint, &bytes);
        let theirs = reference::parse(endpoint, &bytes).unwrap();
        assert_eq!(
            ours,
            theirs,
            "body {i}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let key = match &ours {
            Ok(_) => "routed".to_string(),
            Err(e) => format!("{e:?}"),
        };
        *outcomes.entry(key).or_default() += 1;
    }
    // Every outcome is exercised, routed bodies most.
    for outcome in [
        "routed",
        "NotJson",
        "NotAnObject",
        "MissingModel",
        "MissingPrompt",
    ] {
        assert!(
            outcomes.get(outcome).copied().unwrap_or(0) > 100,
            "{outcomes:?}"
        );
    }
}

#[test]
fn nesting_is_refused_exactly_where_serde_json_refuses_it() {
    for n in [120usize, 121, 122, 123, 124, 125, 126, 127] {
        for (endpoint, body) in [
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"u","content":"x"}}],"x":{}{}}}"#,
                    "[".repeat(n),
                    "]".repeat(n)
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"u","content":[{}{}]}}]}}"#,
                    "[".repeat(n),
                    "]".repeat(n)
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"u","tool_calls":[{{"function":{{"name":{}{}}}}}]}}]}}"#,
                    "[".repeat(n),
                    "]".repeat(n)
                ),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"u","content":"x"}}],"tools":{}{}}}"#,
                    "[".repeat(n),
                    "]".repeat(n)
                ),
            ),
            (
                Endpoint::Completions,
                format!(
                    r#"{{"model":"m","prompt":[{}{}]}}"#,
                    "[".repeat(n),
                    "]".repeat(n)
                ),
            ),
        ] {
            assert_eq!(
                parse(endpoint, body.as_bytes()),
                reference::parse(endpoint, body.as_bytes()).unwrap(),
                "{n} deep: {}",
                &body[..60]
            );
        }
    }
}

#[test]
fn past_the_budget_a_routable_body_is_refused_and_anything_else_is_as_before() {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(10_000)
    );
    let chat = Endpoint::ChatCompletions;
    assert!(parse_request(chat, body.as_bytes(), 20_000).view.is_ok());
    assert_eq!(
        parse_request(chat, body.as_bytes(), 5_000).view,
        Err(ParseError::OverBudget)
    );
    // Bad JSON, a missing model or prompt: passed through as without a budget.
    let truncated = &body.as_bytes()[..body.len() - 2];
    assert_eq!(
        parse_request(chat, truncated, 5_000).view,
        Err(ParseError::NotJson)
    );
    let no_model = body.replacen(r#""model":"m","#, "", 1);
    assert_eq!(
        parse_request(chat, no_model.as_bytes(), 5_000).view,
        Err(ParseError::MissingModel)
    );
    // Tools rendered out of order are put in order within the budget too.
    let tools = r#"{"model":"m","messages":[{"role":"u","content":"x"}],"tools":[{"type":"function","function":{"name":"a","description":"d"}}]}"#;
    let want = reference::parse(chat, tools.as_bytes()).unwrap().unwrap();
    assert_eq!(
        parse_request(chat, tools.as_bytes(), 4096).view,
        Ok(want.clone())
    );
    assert_eq!(
        parse_request(chat, tools.as_bytes(), want.prompt.len() - 1).view,
        Err(ParseError::OverBudget)
    );
}

#[test]
fn a_kv_handle_is_noticed_whatever_becomes_of_the_body() {
    for (body, owned) in [
        (
            &br#"{"model":"m","prompt":"p","kv_transfer_params":null}"#[..],
            true,
        ),
        (
            br#"{"prompt":"p","kv_transfer_params":{"remote_host":"10.1.2.3"}}"#,
            true,
        ),
        (br#"{"model":"m","prompt":"p"}"#, false),
        (
            br#"{"model":"m","prompt":"p","x":{"kv_transfer_params":1}}"#,
            false,
        ),
    ] {
        assert_eq!(
            parse_request(Endpoint::Completions, body, usize::MAX).owned_field,
            owned
        );
    }
}

/// A Responses request renders as the chat request vLLM makes of it.
#[test]
fn responses_render_as_the_chat_messages_vllm_makes_of_them() {
    use serde_json::json;
    let chat = |messages: serde_json::Value| {
        parse(
            Endpoint::ChatCompletions,
            json!({"model": "m", "messages": messages})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
        .prompt
    };
    let responses = |body: serde_json::Value| {
        let mut b = json!({"model": "m"});
        b.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        parse(Endpoint::Responses, b.to_string().as_bytes()).unwrap()
    };
    let call = |name: &str, args: &str, id: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    let rows = [
        (
            "instructions and a string",
            json!({"input": "hi", "instructions": "Be brief."}),
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
        ),
        (
            "empty instructions are none",
            json!({"instructions": "", "input": "hi"}),
            json!([{"role": "user", "content": "hi"}]),
        ),
        (
            "message items with input_text parts",
            json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]}),
            json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]),
        ),
        (
            "an input_image is its image_url",
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "what?"}, {"type": "input_image", "image_url": "https://x/1.png"}]}]}),
            json!([{"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": "https://x/1.png"}}]}]),
        ),
        (
            "a function call and its output",
            json!({"input": [
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}", "id": "fc_1", "status": "completed"},
                {"type": "function_call_output", "call_id": "c1", "output": "18C"}
            ]}),
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [call("weather", "{\"city\":\"Paris\"}", "c1")]},
                {"role": "tool", "tool_call_id": "c1", "content": "18C"}
            ]),
        ),
        (
            "calls after an assistant message join it",
            json!({"input": [
                {"role": "user", "content": "go"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"}
            ]}),
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [call("a", "{}", "c1"), call("b", "{}", "c2")]}
            ]),
        ),
        (
            "reasoning, then a call, then the text: one assistant message",
            json!({"input": [
                {"role": "user", "content": "go"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"role": "assistant", "content": "Done."}
            ]}),
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "Done.", "tool_calls": [call("a", "{}", "c1")]}
            ]),
        ),
    ];
    for (what, request, messages) in rows {
        let view = responses(request);
        assert_eq!(
            String::from_utf8_lossy(&view.prompt),
            String::from_utf8_lossy(&chat(messages)),
            "{what}"
        );
    }
    let view = responses(
        json!({"input": "x", "stream": true, "max_output_tokens": 5, "max_tokens": 9, "cache_salt": "s"}),
    );
    assert!(view.stream);
    assert_eq!(view.max_tokens, Some(5));
    assert_eq!(view.cache_salt.as_deref(), Some("s"));
    let tools = responses(json!({"input": "x", "tools": [{"type": "function", "name": "f"}]}));
    assert!(tools
        .prompt
        .starts_with(b"tools\x1f[{\"name\":\"f\",\"type\":\"function\"}]\x1e"));
    for body in [
        json!({"model": "m"}),
        json!({"model": "m", "input": []}),
        json!({"model": "m", "input": 3}),
    ] {
        assert_eq!(
            parse(Endpoint::Responses, body.to_string().as_bytes()),
            Err(ParseError::MissingPrompt),
            "{body}"
        );
    }
    assert_eq!(
        parse(Endpoint::Responses, br#"{"input":"x"}"#),
        Err(ParseError::MissingModel)
    );
    assert_eq!(
        Endpoint::from_path("/v1/responses?x=1", ""),
        Some(Endpoint::Responses)
    );
}
