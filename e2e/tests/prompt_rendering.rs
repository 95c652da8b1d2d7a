//! kvroute's canonical prompt rendering against the simulator's own tokenisation of the same
//! requests: conversations that differ only in a tool call, a name, a tool result's call id, an
//! image, the tools or the template's arguments must stop sharing a prefix at the same message in
//! both, and conversations that differ only in what never reaches the prompt must share all of it.
//! A router that renders less than the engine (one that ignores tool-call arguments, say) reports a
//! prefix the pod does not hold; one that renders more loses hits the pod would give.

use kvroute::affinity::{chain_seed, char_block_hashes};
use kvroute::protocol::parse::{parse, Endpoint};
use kvsim::{block_hashes, prompt_tokens};
use serde_json::{json, Value};

/// Where two requests' prompts part: nowhere, or inside message `i` (0 with the leading tools or
/// template fields).
#[derive(Debug, Clone, Copy)]
enum Shared {
    All,
    UpToMessage(usize),
}

struct Case {
    what: &'static str,
    a: Value,
    b: Value,
    shared: Shared,
}

fn words(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tag}{}", i % 37))
        .collect::<Vec<_>>()
        .join(" ")
}

fn body(messages: Value, extra: Value) -> Value {
    let mut b = json!({"model": "sim-model", "messages": messages});
    if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    b
}

fn with_messages(request: &Value, n: usize, generation_prompt: bool) -> Value {
    let mut r = request.clone();
    let messages: Vec<Value> = r["messages"]
        .as_array()
        .map(|m| m.iter().take(n).cloned().collect())
        .unwrap_or_default();
    r["messages"] = Value::Array(messages);
    if !generation_prompt {
        r["add_generation_prompt"] = json!(false);
    }
    r
}

fn kvroute_prompt(request: &Value) -> Vec<u8> {
    parse(Endpoint::ChatCompletions, request.to_string().as_bytes())
        .expect("kvroute parses it")
        .prompt
}

fn sim_tokens(request: &Value) -> Vec<u64> {
    prompt_tokens(true, request.to_string().as_bytes()).expect("the simulator accepts it")
}

fn common<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Length of request's rendering through its first `n` messages (0 = nothing).
fn kvroute_head(request: &Value, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let full = kvroute_prompt(request);
    let head = kvroute_prompt(&with_messages(request, n, false));
    assert!(full.starts_with(&head), "kvroute renders messages in order");
    head.len()
}

fn sim_head(request: &Value, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let full = sim_tokens(request);
    let head = sim_tokens(&with_messages(request, n, false));
    assert!(
        full.starts_with(&head),
        "the simulator renders messages in order"
    );
    head.len()
}

fn cases() -> Vec<Case> {
    let system = json!({"role": "system", "content": words("policy", 300)});
    let user = json!({"role": "user", "content": words("question", 120)});
    let call = |args: &str, id: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "search", "arguments": args}}]})
    };
    let result =
        |id: &str| json!({"role": "tool", "tool_call_id": id, "content": words("result", 200)});
    let agent = |args: &str, id: &str, result_id: &str| json!([system, user, call(args, id), result(result_id), {"role": "user", "content": words("followup", 80)}]);
    let image = |url: &str, detail: Option<&str>| {
        let mut image = json!({"url": url});
        if let Some(d) = detail {
            image["detail"] = json!(d);
        }
        json!([system, {"role": "user", "content": [
            {"type": "text", "text": words("look", 60)},
            {"type": "image_url", "image_url": image},
            {"type": "text", "text": words("describe", 60)}]}])
    };
    let tools = |name: &str| json!({"tools": [{"type": "function", "function": {"name": name, "description": words("tool", 100), "parameters": {"type": "object"}}}]});
    let none = json!({});
    vec![
        Case {
            what: "tool-call arguments",
            a: body(agent(r#"{"q":"paris weather"}"#, "c1", "c1"), none.clone()),
            b: body(agent(r#"{"q":"lyon weather"}"#, "c1", "c1"), none.clone()),
            shared: Shared::UpToMessage(2),
        },
        Case {
            what: "the tool call's id only (templates never render it)",
            a: body(agent("{}", "call_a", "c1"), none.clone()),
            b: body(agent("{}", "call_b", "c1"), none.clone()),
            shared: Shared::All,
        },
        Case {
            what: "the call a tool result answers",
            a: body(agent("{}", "c1", "c1"), none.clone()),
            b: body(agent("{}", "c1", "c2"), none.clone()),
            shared: Shared::UpToMessage(3),
        },
        Case {
            what: "the user's name",
            a: body(
                json!([system, {"role": "user", "name": "alice", "content": words("q", 100)}]),
                none.clone(),
            ),
            b: body(
                json!([system, {"role": "user", "name": "bob", "content": words("q", 100)}]),
                none.clone(),
            ),
            shared: Shared::UpToMessage(1),
        },
        Case {
            what: "the image",
            a: body(image("https://img/1.png", None), none.clone()),
            b: body(image("https://img/2.png", None), none.clone()),
            shared: Shared::UpToMessage(1),
        },
        Case {
            what: "an image's detail hint (not part of the image)",
            a: body(image("https://img/1.png", Some("low")), none.clone()),
            b: body(image("https://img/1.png", None), none.clone()),
            shared: Shared::All,
        },
        Case {
            what: "the tools",
            a: body(json!([system, user]), tools("search")),
            b: body(json!([system, user]), tools("browse")),
            shared: Shared::UpToMessage(0),
        },
        Case {
            what: "chat template arguments",
            a: body(
                json!([system, user]),
                json!({"chat_template_kwargs": {"enable_thinking": true}}),
            ),
            b: body(
                json!([system, user]),
                json!({"chat_template_kwargs": {"enable_thinking": false}}),
            ),
            shared: Shared::UpToMessage(0),
        },
        Case {
            what: "sampling, tool_choice and stream options (never in the prompt)",
            a: body(
                json!([system, user]),
                json!({"temperature": 0.1, "tool_choice": "auto", "stream": true, "stream_options": {"include_usage": true}}),
            ),
            b: body(
                json!([system, user]),
                json!({"temperature": 1.0, "seed": 7, "max_tokens": 3}),
            ),
            shared: Shared::All,
        },
        Case {
            what: "the next user turn",
            a: body(agent("{}", "c1", "c1"), none.clone()),
            b: body(
                json!([system, user, call("{}", "c1"), result("c1"), {"role": "user", "content": words("other", 80)}]),
                none,
            ),
            shared: Shared::UpToMessage(4),
        },
    ]
}

#[test]
fn kvroute_and_the_simulator_part_conversations_at_the_same_message() {
    for case in cases() {
        let (ka, kb) = (kvroute_prompt(&case.a), kvroute_prompt(&case.b));
        let (sa, sb) = (sim_tokens(&case.a), sim_tokens(&case.b));
        match case.shared {
            Shared::All => {
                assert_eq!(ka, kb, "{}: kvroute renders them differently", case.what);
                assert_eq!(
                    sa, sb,
                    "{}: the simulator renders them differently",
                    case.what
                );
            }
            Shared::UpToMessage(i) => {
                let (k, s) = (common(&ka, &kb), common(&sa, &sb));
                let k_range = kvroute_head(&case.a, i)..kvroute_head(&case.a, i + 1).max(1);
                let s_range = sim_head(&case.a, i)..sim_head(&case.a, i + 1).max(1);
                assert!(
                    k_range.contains(&k),
                    "{}: kvroute shares {k} bytes, message {i} spans {k_range:?}",
                    case.what
                );
                assert!(
                    s_range.contains(&s),
                    "{}: the simulator shares {s} tokens, message {i} spans {s_range:?}",
                    case.what
                );
            }
        }
        // In blocks, what the index would match against what the pod would find cached.
        let seed = chain_seed("sim-model", None);
        let (kha, khb) = (
            char_block_hashes(&ka, 64, seed, 100_000),
            char_block_hashes(&kb, 64, seed, 100_000),
        );
        let (sha, shb) = (
            block_hashes("sim-model", &sa, 16),
            block_hashes("sim-model", &sb, 16),
        );
        let k_share = common(&kha, &khb) as f64 / khb.len().max(1) as f64;
        let s_share = common(&sha, &shb) as f64 / shb.len().max(1) as f64;
        println!(
            "{:<60} kvroute {:>4}/{:<4} blocks  simulator {:>4}/{:<4} blocks",
            case.what,
            common(&kha, &khb),
            khb.len(),
            common(&sha, &shb),
            shb.len()
        );
        assert!(
            (k_share - s_share).abs() <= 0.1,
            "{}: kvroute would match {k_share:.2} of the prompt, the pod holds {s_share:.2}",
            case.what
        );
    }
}
