//! The view of an OpenAI request that routing needs: which model, and the prefix-relevant prompt
//! rendered canonically.
//!
//! The canonical rendering puts everything a chat template puts into the prompt into one byte
//! string, in the order templates put it, so two requests share a rendered prefix exactly when
//! their templated prompts would:
//!
//! 1. the request fields that change the template's output anywhere (`chat_template`,
//!    `chat_template_kwargs`, `documents`), first: where a template uses them is its own business,
//!    so requests that differ in them never share a prefix;
//! 2. `tools` (templates put the tool list in the system turn, before the conversation);
//! 3. per message: the role, `name` and `tool_call_id` (a tool result names the call it answers),
//!    the content, then an assistant's `tool_calls`, each as its function's name and arguments.
//!    Content is a string, or parts: text parts joined by a newline (as vLLM joins them), image,
//!    audio, video and file parts by their URL or data, so different images never share a prefix.
//!
//! Parts are tagged and separated by ASCII control characters, so a plain message renders as
//! `role 0x1f content 0x1e` and nothing a field adds can be mistaken for a neighbour's text. Not
//! rendered (they do not reach the prompt): sampling parameters, `response_format`, `tool_choice`,
//! a tool call's `id`, `reasoning_content`. Anything we do not recognise as an inference request is
//! left for the default load balancer.

use serde_json::Value;

/// Paths kvroute routes; anything else passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    /// Matches the path without its query string.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        let path = path.split('?').next().unwrap_or(path);
        match path.trim_end_matches('/') {
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    pub model: String,
    pub stream: bool,
    pub max_tokens: Option<u64>,
    pub cache_salt: Option<String>,
    /// Canonical prompt bytes (role-tagged for chat).
    pub prompt: Vec<u8>,
}

/// Why a body was not routed by prefix; each becomes a pass-through with a counted reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    NotJson,
    NotAnObject,
    MissingModel,
    MissingPrompt,
}

impl ParseError {
    pub fn as_str(&self) -> &'static str {
        match self {
            ParseError::NotJson => "body is not valid JSON",
            ParseError::NotAnObject => "body is not a JSON object",
            ParseError::MissingModel => "`model` is missing or not a string",
            ParseError::MissingPrompt => "no `prompt` / `messages` to route on",
        }
    }
}

/// Between a part's tag and its text.
const ROLE_SEP: u8 = 0x1f;
/// Ends a message (or a leading part).
const MESSAGE_END: u8 = 0x1e;
/// Opens a further field of a message (`name`, `tool_call_id`, a tool call).
const FIELD_SEP: u8 = 0x1d;
/// Request fields a chat template may read anywhere in the prompt.
const TEMPLATE_FIELDS: [&str; 3] = ["chat_template", "chat_template_kwargs", "documents"];

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RequestView, ParseError> {
    parse_object(endpoint, body).map(|(view, _)| view)
}

/// Parses once and keeps the JSON object too, for what must rewrite the body (inline P/D).
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
    let mut prompt = Vec::with_capacity(body_len);
    match endpoint {
        Endpoint::Completions => render_completion_prompt(obj.get("prompt"), &mut prompt)?,
        Endpoint::ChatCompletions => render_chat_prompt(obj, &mut prompt)?,
    }
    Ok(RequestView {
        model,
        stream,
        max_tokens,
        cache_salt,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            Endpoint::from_path("/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions?x=1"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(Endpoint::from_path("/v1/models"), None);
        assert_eq!(Endpoint::from_path("/metrics"), None);
    }

    #[test]
    fn chat_string_and_parts_render_alike() {
        let a = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":"You are kind.\nBe brief."},{"role":"user","content":"hi"}],"stream":true,"max_tokens":7}"#,
        )
        .unwrap();
        let b = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You are kind."},{"type":"text","text":"Be brief."}]},{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            a.prompt, b.prompt,
            "text parts join with a newline, as in vLLM"
        );
        assert!(a.stream);
        assert_eq!(a.max_tokens, Some(7));
        assert_eq!(
            a.prompt,
            b"system\x1fYou are kind.\nBe brief.\x1euser\x1fhi\x1e".to_vec()
        );
    }

    fn chat(messages: serde_json::Value, extra: serde_json::Value) -> Vec<u8> {
        let mut body = serde_json::json!({"model": "m", "messages": messages});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        parse(Endpoint::ChatCompletions, body.to_string().as_bytes())
            .unwrap()
            .prompt
    }

    fn call(name: &str, arguments: &str, id: &str) -> serde_json::Value {
        serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
    }

    /// Each row: two conversations, and whether their renderings must be equal.
    #[test]
    fn what_reaches_the_prompt_changes_the_rendering_and_nothing_else_does() {
        use serde_json::json;
        let user = json!({"role": "user", "content": "weather in Paris?"});
        let assistant = |calls: serde_json::Value| json!({"role": "assistant", "content": null, "tool_calls": calls});
        let tool = |id: &str, content: &str| json!({"role": "tool", "tool_call_id": id, "content": content});
        let none = json!({});
        let rows: Vec<(&str, Vec<u8>, Vec<u8>, bool)> = vec![
            (
                "tool-call arguments",
                chat(
                    json!([
                        user,
                        assistant(json!([call("weather", r#"{"city":"Paris"}"#, "c1")]))
                    ]),
                    none.clone(),
                ),
                chat(
                    json!([
                        user,
                        assistant(json!([call("weather", r#"{"city":"Lyon"}"#, "c1")]))
                    ]),
                    none.clone(),
                ),
                false,
            ),
            (
                "tool-call function name",
                chat(
                    json!([user, assistant(json!([call("weather", "{}", "c1")]))]),
                    none.clone(),
                ),
                chat(
                    json!([user, assistant(json!([call("forecast", "{}", "c1")]))]),
                    none.clone(),
                ),
                false,
            ),
            (
                "a call more",
                chat(
                    json!([user, assistant(json!([call("a", "{}", "c1")]))]),
                    none.clone(),
                ),
                chat(
                    json!([
                        user,
                        assistant(json!([call("a", "{}", "c1"), call("b", "{}", "c2")]))
                    ]),
                    none.clone(),
                ),
                false,
            ),
            (
                "only the call id (templates do not render it)",
                chat(
                    json!([user, assistant(json!([call("a", "{}", "call_1")]))]),
                    none.clone(),
                ),
                chat(
                    json!([user, assistant(json!([call("a", "{}", "call_2")]))]),
                    none.clone(),
                ),
                true,
            ),
            (
                "tool_call_id of a tool result",
                chat(json!([user, tool("c1", "18C")]), none.clone()),
                chat(json!([user, tool("c2", "18C")]), none.clone()),
                false,
            ),
            (
                "name",
                chat(
                    json!([{"role": "user", "name": "alice", "content": "hi"}]),
                    none.clone(),
                ),
                chat(
                    json!([{"role": "user", "name": "bob", "content": "hi"}]),
                    none.clone(),
                ),
                false,
            ),
            (
                "a name is not content",
                chat(
                    json!([{"role": "user", "name": "alice", "content": "hi"}]),
                    none.clone(),
                ),
                chat(
                    json!([{"role": "user", "content": "alicehi"}]),
                    none.clone(),
                ),
                false,
            ),
            (
                "tools",
                chat(
                    json!([user]),
                    json!({"tools": [{"type": "function", "function": {"name": "a"}}]}),
                ),
                chat(
                    json!([user]),
                    json!({"tools": [{"type": "function", "function": {"name": "b"}}]}),
                ),
                false,
            ),
            (
                "image by URL",
                chat(
                    json!([{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "https://x/1.png"}}]}]),
                    none.clone(),
                ),
                chat(
                    json!([{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "https://x/2.png"}}]}]),
                    none.clone(),
                ),
                false,
            ),
            (
                "image detail does not reach the KV cache key",
                chat(
                    json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]}]),
                    none.clone(),
                ),
                chat(
                    json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]),
                    none.clone(),
                ),
                true,
            ),
            (
                "audio by data",
                chat(
                    json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]),
                    none.clone(),
                ),
                chat(
                    json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "BBBB", "format": "wav"}}]}]),
                    none.clone(),
                ),
                false,
            ),
            (
                "chat template kwargs",
                chat(
                    json!([user]),
                    json!({"chat_template_kwargs": {"enable_thinking": true}}),
                ),
                chat(
                    json!([user]),
                    json!({"chat_template_kwargs": {"enable_thinking": false}}),
                ),
                false,
            ),
            (
                "sampling parameters and tool_choice",
                chat(
                    json!([user]),
                    json!({"temperature": 0.2, "tool_choice": "auto", "max_tokens": 5}),
                ),
                chat(json!([user]), json!({"temperature": 0.9, "seed": 3})),
                true,
            ),
            (
                "null fields are absent fields",
                chat(
                    json!([{"role": "user", "content": "hi", "name": null, "tool_calls": null}]),
                    json!({"tools": null}),
                ),
                chat(json!([{"role": "user", "content": "hi"}]), none.clone()),
                true,
            ),
        ];
        for (what, a, b, equal) in rows {
            assert_eq!(
                a == b,
                equal,
                "{what}: {:?} vs {:?}",
                String::from_utf8_lossy(&a),
                String::from_utf8_lossy(&b)
            );
        }
        // A difference in a message leaves everything before it shared.
        let a = chat(
            json!([
                user,
                assistant(json!([call("weather", r#"{"city":"Paris"}"#, "c1")])),
                tool("c1", "18C")
            ]),
            none.clone(),
        );
        let b = chat(
            json!([
                user,
                assistant(json!([call("weather", r#"{"city":"Lyon"}"#, "c1")])),
                tool("c1", "18C")
            ]),
            none,
        );
        let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let first = chat(json!([user]), json!({}));
        assert!(
            shared > first.len(),
            "the user turn and the call's name are shared"
        );
        assert_eq!(
            &a[first.len()..],
            b"assistant\x1f\x1dtool_call\x1fweather\x1f{\"city\":\"Paris\"}\x1etool\x1dtool_call_id\x1fc1\x1f18C\x1e"
        );
    }

    #[test]
    fn roles_matter() {
        let a = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":"x"}]}"#,
        )
        .unwrap();
        let b = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert_ne!(a.prompt, b.prompt);
    }

    #[test]
    fn tools_lead_the_prompt() {
        let v = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}],"cache_salt":"t1","max_completion_tokens":3,"max_tokens":9}"#,
        )
        .unwrap();
        assert!(v
            .prompt
            .starts_with(b"tools\x1f[{\"type\":\"function\"}]\x1e"));
        assert_eq!(v.cache_salt.as_deref(), Some("t1"));
        assert_eq!(v.max_tokens, Some(3));
    }

    #[test]
    fn completions_prompt_forms() {
        let s = parse(Endpoint::Completions, br#"{"model":"m","prompt":"hello"}"#).unwrap();
        assert_eq!(s.prompt, b"hello");
        let l = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":["a","b"]}"#,
        )
        .unwrap();
        assert_eq!(l.prompt, b"a\x1eb");
        let ids = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":[[1,2,3]]}"#,
        )
        .unwrap();
        assert_eq!(ids.prompt, b"[1,2,3]");
    }

    #[test]
    fn bad_bodies_say_why() {
        assert_eq!(
            parse(Endpoint::Completions, b"\xff\x00garbage"),
            Err(ParseError::NotJson)
        );
        assert_eq!(
            parse(Endpoint::Completions, b"[1,2]"),
            Err(ParseError::NotAnObject)
        );
        assert_eq!(
            parse(Endpoint::Completions, br#"{"prompt":"x"}"#),
            Err(ParseError::MissingModel)
        );
        assert_eq!(
            parse(Endpoint::Completions, br#"{"model":"m"}"#),
            Err(ParseError::MissingPrompt)
        );
        assert_eq!(
            parse(Endpoint::ChatCompletions, br#"{"model":"m","messages":[]}"#),
            Err(ParseError::MissingPrompt)
        );
    }
}
