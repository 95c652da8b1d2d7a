//! The Anthropic Messages API (`POST /v1/messages`) as vLLM serves it: the request becomes the chat
//! request vLLM builds from it (`_convert_anthropic_to_openai_request` in
//! `vllm/entrypoints/anthropic/serving.py`), rendered and cached like a chat request, and the
//! answer is a `message` object or, streamed, the events `message_start`, `content_block_start`,
//! one `content_block_delta` (`text_delta`) per token, `content_block_stop`, `message_delta` and
//! `message_stop` (each as `event: <type>` plus `data: <json>`).
//!
//! Usage as vLLM reports it since its #40912: `input_tokens` is the prompt less what was read from
//! the cache, `cache_read_input_tokens` what was, `cache_creation_input_tokens` 0. Streamed, the
//! cache fields come in `message_delta` (vLLM's first chunk does not carry them yet).
//!
//! Conversion: `system` (a string or text blocks, a block starting `x-anthropic-billing-header`
//! dropped) and the text of `system` messages joined into one system message; string content as
//! itself; blocks: `text` as a text part, `image` as an `image_url` part (a `url` source's URL, a
//! `base64` one as a data URL), `tool_use` as a tool call whose arguments are Python's
//! `json.dumps` of its `input`, a user's `tool_result` as a tool message before that user message
//! (text items joined by newlines), `thinking` as reasoning (not rendered); a user message left
//! without content is dropped; `tools` as OpenAI function tools.

use serde_json::{json, Map, Value};

use super::request::BadRequest;

fn bad<T>(message: String) -> Result<T, BadRequest> {
    Err(BadRequest(message))
}

/// The chat request body vLLM's template sees for a Messages request.
pub fn to_chat(obj: &Map<String, Value>) -> Result<Map<String, Value>, BadRequest> {
    let Some(Value::Array(messages)) = obj.get("messages") else {
        return bad("Field 'messages' is required and must be a list".into());
    };
    let mut system = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => system.push(s.clone()),
        Some(Value::Array(blocks)) => system.extend(system_texts(blocks)),
        Some(_) => return bad("'system' must be a string or a list of blocks".into()),
    }
    for m in messages {
        if m.get("role").and_then(Value::as_str) == Some("system") {
            match m.get("content") {
                Some(Value::String(s)) => system.push(s.clone()),
                Some(Value::Array(blocks)) => system.extend(system_texts(blocks)),
                _ => {}
            }
        }
    }
    let mut chat_messages = Vec::new();
    if system.iter().any(|s| !s.is_empty()) {
        chat_messages.push(json!({"role": "system", "content": system.concat()}));
    }
    for (i, m) in messages.iter().enumerate() {
        convert_message(&mut chat_messages, i, m)?;
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(chat_messages));
    if let Some(Value::Array(tools)) = obj.get("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut function = Map::new();
                for (to, from) in [
                    ("name", "name"),
                    ("description", "description"),
                    ("parameters", "input_schema"),
                ] {
                    if let Some(v) = t.get(from).filter(|v| !v.is_null()) {
                        function.insert(to.into(), v.clone());
                    }
                }
                json!({"type": "function", "function": function})
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(kwargs) = obj.get("chat_template_kwargs").filter(|k| !k.is_null()) {
        chat.insert("chat_template_kwargs".into(), kwargs.clone());
    }
    Ok(chat)
}

fn system_texts(blocks: &[Value]) -> Vec<String> {
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .filter(|t| !t.is_empty() && !t.starts_with("x-anthropic-billing-header"))
        .map(str::to_string)
        .collect()
}

fn image_url(source: &Value) -> String {
    let text = |k: &str| source.get(k).and_then(Value::as_str);
    if text("type") == Some("url") {
        return text("url").unwrap_or("").to_string();
    }
    format!(
        "data:{};base64,{}",
        text("media_type").unwrap_or("image/jpeg"),
        text("data").unwrap_or("")
    )
}

fn convert_message(out: &mut Vec<Value>, i: usize, m: &Value) -> Result<(), BadRequest> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system") => return Ok(()),
        Some("ctx" | "msg") => "user",
        Some(role @ ("user" | "assistant")) => role,
        _ => {
            return bad(format!(
                "messages[{i}].role must be user, assistant or system"
            ))
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return bad(format!("messages[{i}].content must be a string or a list")),
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        let kind = block.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => {
                if let Some(t) = block
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    parts.push(json!({"type": "text", "text": t}));
                }
            }
            Some("image") => {
                if let Some(source) = block.get("source").filter(|s| !s.is_null()) {
                    parts.push(
                        json!({"type": "image_url", "image_url": {"url": image_url(source)}}),
                    );
                }
            }
            Some("tool_use") => {
                let input = block.get("input").cloned().unwrap_or(json!({}));
                calls.push(
                    json!({"id": block.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": block.get("name").and_then(Value::as_str).unwrap_or(""),
                                 "arguments": python_dumps(&input)}}),
                );
            }
            Some("tool_result") if role == "user" => {
                let text = match block.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .filter(|it| it.get("type").and_then(Value::as_str) == Some("text"))
                        .map(|it| it.get("text").and_then(Value::as_str).unwrap_or(""))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                out.push(json!({"role": "tool",
                    "tool_call_id": block.get("tool_use_id").and_then(Value::as_str).unwrap_or(""),
                    "content": text}));
            }
            Some("tool_result") => {
                let text = match block.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                };
                parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
            }
            _ => {}
        }
    }
    if role == "user" && parts.is_empty() {
        return Ok(());
    }
    let mut message = json!({"role": role,
        "content": if parts.is_empty() { Value::Null } else { Value::Array(parts) }});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    out.push(message);
    Ok(())
}

/// Python's `json.dumps` with its defaults (`", "`, `": "`, non-ASCII escaped), as vLLM writes
/// a tool call's arguments. Approximations: members in key order (the simulator's JSON maps are
/// sorted, where vLLM keeps the body's order) and floats as serde_json prints them.
fn python_dumps(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", python_string(k), python_dumps(v)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_dumps).collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(s) => python_string(s),
        other => other.to_string(),
    }
}

fn python_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// Anthropic's `usage` as vLLM reports it (see the module header).
pub fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    })
}

/// The `message` object; `content` and `stop_reason` once it is complete.
pub fn message(id: &str, model: &str, text: Option<&str>, usage: Value) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": match text {
            Some(t) => json!([{"type": "text", "text": t}]),
            None => json!([]),
        },
        "model": model,
        "stop_reason": if text.is_some() { json!("max_tokens") } else { Value::Null },
        "stop_sequence": null,
        "usage": usage,
    })
}

/// One server-sent event of a streamed answer.
pub fn event(kind: &str, mut data: Value) -> bytes::Bytes {
    if let Some(obj) = data.as_object_mut() {
        obj.insert("type".into(), json!(kind));
    }
    bytes::Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(v: Value) -> Value {
        Value::Object(to_chat(v.as_object().unwrap()).unwrap())
    }

    #[test]
    fn messages_become_the_chat_request_vllm_builds() {
        let c = chat_of(json!({"system": [{"type": "text", "text": "be "},
                {"type": "text", "text": "x-anthropic-billing-header: cch=1"}, {"type": "text", "text": "brief"}],
            "messages": [
                {"role": "user", "content": "ls?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls",
                    "input": {"dir": "/é"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "c"},
                    {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}]}));
        assert_eq!(
            c["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "ls?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function",
                    "function": {"name": "ls", "arguments": "{\"dir\": \"/\\u00e9\"}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "a\nb"},
                {"role": "tool", "tool_call_id": "t1", "content": "c"},
                {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
            ])
        );
        assert_eq!(
            c["tools"],
            json!([{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}])
        );
        assert!(to_chat(json!({"messages": "x"}).as_object().unwrap()).is_err());
        assert!(to_chat(
            json!({"messages": [{"role": "bot", "content": "x"}]})
                .as_object()
                .unwrap()
        )
        .is_err());
    }

    #[test]
    fn usage_counts_cache_reads_apart() {
        let u = usage(1660, 1616, 2);
        assert_eq!(u["input_tokens"], 44);
        assert_eq!(u["cache_read_input_tokens"], 1616);
    }
}
