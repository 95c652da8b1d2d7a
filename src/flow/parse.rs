//! The view of an OpenAI request that routing needs: which model, and the prefix-relevant prompt
//! rendered canonically.
//!
//! The canonical rendering puts every part that a chat template puts before the first generated
//! token (tools, then each message's role and content, in order) into one byte string with
//! separators that cannot occur in JSON-decoded text boundaries by accident, so two requests share a
//! rendered prefix exactly when their templated prompts would. Anything we do not recognise is not
//! an inference request and is left for the default load balancer.

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

const ROLE_SEP: u8 = 0x1f;
const MESSAGE_END: u8 = 0x1e;

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
        Endpoint::ChatCompletions => {
            if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
                push_part(&mut prompt, "tools", tools.to_string().as_bytes());
            }
            let messages = obj
                .get("messages")
                .and_then(Value::as_array)
                .filter(|m| !m.is_empty())
                .ok_or(ParseError::MissingPrompt)?;
            for message in messages {
                let role = message.get("role").and_then(Value::as_str).unwrap_or("");
                let mut content = Vec::new();
                render_content(message.get("content"), &mut content);
                push_part(&mut prompt, role, &content);
            }
        }
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

/// Message content: a string, or an array of content parts whose text parts count (images and other
/// parts contribute their JSON so that different images do not share a prefix).
fn render_content(content: Option<&Value>, out: &mut Vec<u8>) {
    match content {
        Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("text").and_then(Value::as_str) {
                    Some(text) => out.extend_from_slice(text.as_bytes()),
                    None => out.extend_from_slice(part.to_string().as_bytes()),
                }
            }
        }
        Some(Value::Null) | None => {}
        Some(other) => out.extend_from_slice(other.to_string().as_bytes()),
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
            br#"{"model":"m","messages":[{"role":"system","content":"You are kind."},{"role":"user","content":"hi"}],"stream":true,"max_tokens":7}"#,
        )
        .unwrap();
        let b = parse(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"You are "},{"type":"text","text":"kind."}]},{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(a.prompt, b.prompt);
        assert!(a.stream);
        assert_eq!(a.max_tokens, Some(7));
        assert_eq!(
            a.prompt,
            b"system\x1fYou are kind.\x1euser\x1fhi\x1e".to_vec()
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
