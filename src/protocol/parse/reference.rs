//! The whole-tree parser kvroute used before (a `serde_json::Value` of the body), kept only to
//! check the streaming parser against: both must give the same view, or the same refusal, for
//! every body (the unit tests here and the `request_body` fuzz target). Chat and completions only
//! (the Responses API came after it).

use super::{Endpoint, ParseError, RequestView};
use serde_json::Value;

/// Between a part's tag and its text.
const ROLE_SEP: u8 = 0x1f;
/// Ends a message (or a leading part).
const MESSAGE_END: u8 = 0x1e;
/// Opens a further field of a message (`name`, `tool_call_id`, a tool call).
const FIELD_SEP: u8 = 0x1d;
/// Request fields a chat template may read anywhere in the prompt.
const TEMPLATE_FIELDS: [&str; 3] = ["chat_template", "chat_template_kwargs", "documents"];

/// The old parser's view of a body (`None` for an endpoint it did not know).
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Option<Result<RequestView, ParseError>> {
    matches!(endpoint, Endpoint::Completions | Endpoint::ChatCompletions)
        .then(|| parse_object(endpoint, body).map(|(view, _)| view))
}

pub fn parse_object(
    endpoint: Endpoint,
    body: &[u8],
) -> Result<(RequestView, serde_json::Map<String, Value>), ParseError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| ParseError::NotJson)?;
    let Value::Object(object) = value else {
        return Err(ParseError::NotAnObject);
    };
    let view = view_of(endpoint, &object, body.len())?;
    Ok((view, object))
}

fn view_of(
    endpoint: Endpoint,
    obj: &serde_json::Map<String, Value>,
    body_len: usize,
) -> Result<RequestView, ParseError> {
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or(ParseError::MissingModel)?
        .to_string();
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let max_tokens = obj
        .get("max_completion_tokens")
        .or_else(|| obj.get("max_tokens"))
        .and_then(Value::as_u64);
    let cache_salt = obj
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string);
    let responses = endpoint == Endpoint::Responses;
    let previous_response_id = obj
        .get("previous_response_id")
        .and_then(Value::as_str)
        .filter(|_| responses)
        .map(str::to_string);
    let store = !responses || obj.get("store").and_then(Value::as_bool).unwrap_or(true);
    let mut prompt = Vec::with_capacity(body_len);
    match endpoint {
        Endpoint::Completions => render_completion_prompt(obj.get("prompt"), &mut prompt)?,
        _ => render_chat_prompt(obj, &mut prompt)?,
    }
    let asked = obj
        .get("stream_options")
        .and_then(Value::as_object)
        .is_some_and(|o| {
            ["include_usage", "continuous_usage_stats"]
                .iter()
                .any(|k| o.get(*k).and_then(Value::as_bool) == Some(true))
        });
    Ok(RequestView {
        model,
        stream,
        stream_usage: endpoint.stream_reports_usage(asked),
        max_tokens,
        cache_salt,
        previous_response_id,
        store,
        prompt,
    })
}

fn push_part(out: &mut Vec<u8>, role: &str, content: &[u8]) {
    out.extend_from_slice(role.as_bytes());
    out.push(ROLE_SEP);
    out.extend_from_slice(content);
    out.push(MESSAGE_END);
}

fn render_completion_prompt(prompt: Option<&Value>, out: &mut Vec<u8>) -> Result<(), ParseError> {
    match prompt {
        Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        // A list of strings is a batch; its first prompt leads the shared prefix. Token-id lists are
        // rendered as their decimal ids so identical id sequences still share blocks.
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(MESSAGE_END);
                }
                match item {
                    Value::String(s) => out.extend_from_slice(s.as_bytes()),
                    other => out.extend_from_slice(other.to_string().as_bytes()),
                }
            }
        }
        _ => return Err(ParseError::MissingPrompt),
    }
    Ok(())
}

fn render_chat_prompt(
    obj: &serde_json::Map<String, Value>,
    out: &mut Vec<u8>,
) -> Result<(), ParseError> {
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or(ParseError::MissingPrompt)?;
    let template: serde_json::Map<String, Value> = TEMPLATE_FIELDS
        .iter()
        .filter_map(|&k| Some((k.to_string(), obj.get(k).filter(|v| !v.is_null())?.clone())))
        .collect();
    if !template.is_empty() {
        // serde_json's maps are sorted by key: the same fields render the same whatever their order.
        push_part(
            out,
            "template",
            Value::Object(template).to_string().as_bytes(),
        );
    }
    if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
        push_part(out, "tools", tools.to_string().as_bytes());
    }
    for message in messages {
        render_message(message, out);
    }
    Ok(())
}

fn render_message(message: &Value, out: &mut Vec<u8>) {
    let text = |key: &str| message.get(key).filter(|v| !v.is_null());
    out.extend_from_slice(
        message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .as_bytes(),
    );
    for key in ["name", "tool_call_id"] {
        if let Some(value) = text(key) {
            push_field(out, key, value);
        }
    }
    out.push(ROLE_SEP);
    render_content(message.get("content"), out);
    if let Some(Value::Array(calls)) = text("tool_calls") {
        for call in calls {
            // A call is its function's name and arguments (a JSON string, or an object some
            // clients send); the call's `id` is not rendered by templates, only referenced.
            let function = call.get("function").unwrap_or(call);
            out.push(FIELD_SEP);
            out.extend_from_slice(b"tool_call");
            out.push(ROLE_SEP);
            push_scalar(out, function.get("name").unwrap_or(&Value::Null));
            out.push(ROLE_SEP);
            push_scalar(out, function.get("arguments").unwrap_or(&Value::Null));
        }
    } else if let Some(other) = text("tool_calls") {
        push_field(out, "tool_calls", other);
    }
    out.push(MESSAGE_END);
}

fn push_field(out: &mut Vec<u8>, key: &str, value: &Value) {
    out.push(FIELD_SEP);
    out.extend_from_slice(key.as_bytes());
    out.push(ROLE_SEP);
    push_scalar(out, value);
}

/// A string as its text, anything else as its JSON.
fn push_scalar(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Null => {}
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// Message content: a string, or content parts. Text parts are joined by a newline, as vLLM joins
/// them for string-content templates; a media part renders as its kind and its URL or data (an
/// engine's cache keys a media part by its content, which one URL or data string stands for); any
/// other part as its JSON.
fn render_content(content: Option<&Value>, out: &mut Vec<u8>) {
    match content {
        Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        Some(Value::Array(parts)) => {
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push(b'\n');
                }
                render_part(part, out);
            }
        }
        Some(Value::Null) | None => {}
        Some(other) => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

fn render_part(part: &Value, out: &mut Vec<u8>) {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(text) = part.get("text").and_then(Value::as_str) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    // `{"type": "image_url", "image_url": {"url": ..}}`, `{"type": "input_audio", "input_audio":
    // {"data": .., "format": ..}}`, `video_url`, `audio_url`, `file` (`file_data` or `file_id`).
    let media = part.get(kind).filter(|_| !kind.is_empty());
    let source = media.and_then(|m| match m {
        Value::String(_) => Some(m),
        _ => ["url", "data", "file_data", "file_id"]
            .iter()
            .find_map(|k| m.get(*k).filter(|v| v.is_string())),
    });
    match source {
        Some(source) => {
            out.push(FIELD_SEP);
            out.extend_from_slice(kind.as_bytes());
            out.push(ROLE_SEP);
            push_scalar(out, source);
            out.push(FIELD_SEP);
        }
        None => out.extend_from_slice(part.to_string().as_bytes()),
    }
}
