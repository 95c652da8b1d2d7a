//! Parsing OpenAI-style request bodies into what the engine needs, with vLLM's validation errors.
//!
//! Every malformed input must come back as a clear 400, never a panic, because the router under test
//! forwards whatever clients send. Accepted shapes:
//! * `/v1/completions`: `prompt` as a string or a list of token ids (one prompt), or a list of
//!   strings or of token-id lists (a batch: one sequence per prompt, as vLLM runs them, and `n`
//!   choices for each).
//! * `/v1/chat/completions`: `messages` with `content` as a string, null, or an array of content parts
//!   (text parts joined by newlines as vLLM joins them; a media part as a placeholder and its URL or
//!   data; other parts as their JSON); `name`, `tool_call_id`, `tool_calls` (function name and
//!   arguments), `tools`, `chat_template`, `chat_template_kwargs` and `documents` reach the prompt;
//!   `add_generation_prompt` (default true) ends it with the assistant's turn.
//! * `/v1/responses`: `instructions` and `input` as the chat messages vLLM makes of them
//!   (`super::responses`), `max_output_tokens`; one choice, usage always in the final event.
//! * `/v1/messages` (Anthropic, as vLLM serves it): the chat request vLLM makes of it
//!   (`super::anthropic`), `max_tokens` required.
//! * `/generate` (SGLang): `text` (a string, or a list: a batch) or `input_ids` (token ids, or a
//!   list of them), `sampling_params.max_new_tokens` (SGLang's default 128); no `model`.
//! * `/inference/v1/generate` (vLLM's token-in API): `token_ids`, `sampling_params` (required;
//!   `max_tokens`, default 16), an optional `model`; not streamed here.

use serde_json::{Map, Value};

use super::tokens::{render_chat, tokenize, ChatMessage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
    Responses,
    Messages,
    Generate,
    TokenGenerate,
}

/// SGLang's `max_new_tokens` when `sampling_params` does not set it.
pub const SGLANG_DEFAULT_MAX_NEW_TOKENS: usize = 128;

#[derive(Debug, Clone)]
pub struct InferenceRequest {
    pub endpoint: Endpoint,
    /// `None` = the first served model (vLLM's `model` field is optional).
    pub model: Option<String>,
    /// Prompt token ids as the server counts them (the first prompt of a batch).
    pub tokens: Vec<u64>,
    /// Every prompt of the request, `tokens` first (a batch of several only on `/v1/completions`).
    pub batch: Vec<Vec<u64>>,
    /// Choices per prompt (`n`).
    pub n: usize,
    pub max_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub kv_transfer: Option<KvTransferParams>,
    /// vLLM's `cache_salt`: requests with different salts never share cached blocks.
    pub cache_salt: Option<String>,
    /// The body as received, for forwarding to a prefill pod.
    pub body: Map<String, Value>,
}

/// The NixlConnector fields the simulator acts on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvTransferParams {
    pub do_remote_decode: bool,
    pub do_remote_prefill: bool,
    pub remote_block_ids: Option<Vec<u64>>,
    pub raw: Value,
}

impl KvTransferParams {
    pub fn from_value(v: &Value) -> Option<Self> {
        let obj = v.as_object()?;
        let flag = |k: &str| obj.get(k).and_then(Value::as_bool).unwrap_or(false);
        let remote_block_ids = obj
            .get("remote_block_ids")
            .and_then(Value::as_array)
            .map(|ids| ids.iter().filter_map(Value::as_u64).collect());
        Some(Self {
            do_remote_decode: flag("do_remote_decode"),
            do_remote_prefill: flag("do_remote_prefill"),
            remote_block_ids,
            raw: v.clone(),
        })
    }
}

/// A 400 with vLLM's message.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRequest(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, BadRequest> {
    Err(BadRequest(msg.into()))
}

pub const DEFAULT_MAX_TOKENS: usize = 16;

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<InferenceRequest, BadRequest> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad(format!("JSON decode error: {e}")),
    };
    let Value::Object(obj) = value else {
        return bad("Request body must be a JSON object");
    };

    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return bad("'model' must be a string"),
    };

    let batch = match endpoint {
        Endpoint::Completions => completion_prompts(&obj)?,
        Endpoint::Chat => vec![tokenize(&chat_text(&obj)?)],
        Endpoint::Responses => vec![tokenize(&chat_text(&super::responses::to_chat(&obj)?)?)],
        Endpoint::Messages => vec![tokenize(&chat_text(&super::anthropic::to_chat(&obj)?)?)],
        Endpoint::Generate => generate_prompts(&obj)?,
        Endpoint::TokenGenerate => match obj.get("token_ids").and_then(Value::as_array) {
            Some(ids) => match token_ids(ids) {
                Some(ids) => vec![ids],
                None => return bad("'token_ids' must be a list of token ids"),
            },
            None => return bad("Field 'token_ids' is required"),
        },
    };
    if batch.iter().any(Vec::is_empty) {
        return bad("The prompt cannot be empty");
    }
    let tokens = batch.first().cloned().unwrap_or_default();
    let n = optional_count(&obj, "n")?.unwrap_or(1);
    if n == 0 {
        return bad("n must be at least 1, got 0.");
    }

    let max_tokens = match endpoint {
        Endpoint::Chat => {
            optional_count(&obj, "max_completion_tokens")?.or(optional_count(&obj, "max_tokens")?)
        }
        Endpoint::Completions => optional_count(&obj, "max_tokens")?,
        Endpoint::Responses => optional_count(&obj, "max_output_tokens")?,
        Endpoint::Messages => match optional_count(&obj, "max_tokens")? {
            Some(max) => Some(max),
            None => return bad("Field 'max_tokens' is required"),
        },
        Endpoint::Generate => {
            Some(sampling_count(&obj, "max_new_tokens")?.unwrap_or(SGLANG_DEFAULT_MAX_NEW_TOKENS))
        }
        Endpoint::TokenGenerate => {
            if !obj.get("sampling_params").is_some_and(Value::is_object) {
                return bad("Field 'sampling_params' is required");
            }
            sampling_count(&obj, "max_tokens")?
        }
    }
    .unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 {
        return bad("max_tokens must be at least 1, got 0.");
    }

    let stream = optional_bool(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(opts)) => {
            if !stream {
                return bad("Stream options can only be defined when `stream=True`.");
            }
            optional_bool(opts, "include_usage")?.unwrap_or(false)
        }
        Some(_) => return bad("'stream_options' must be an object"),
    };
    // `ignore_eos` is accepted and has no effect: the simulator never emits EOS.
    optional_bool(&obj, "ignore_eos")?;

    let kv_transfer = match obj.get("kv_transfer_params") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => KvTransferParams::from_value(v),
        Some(_) => return bad("'kv_transfer_params' must be an object"),
    };

    let cache_salt = match obj.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => return bad("'cache_salt' must be a non-empty string"),
    };

    Ok(InferenceRequest {
        endpoint,
        cache_salt,
        model,
        tokens,
        batch,
        n,
        max_tokens,
        stream,
        include_usage,
        kv_transfer,
        body: obj,
    })
}

fn optional_count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, BadRequest> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            None => bad(format!("'{key}' must be a non-negative integer, got {v}")),
        },
    }
}

/// A count in `sampling_params` (SGLang's and vLLM's generate APIs).
fn sampling_count(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, BadRequest> {
    match obj.get("sampling_params") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(params)) => optional_count(params, key),
        Some(_) => bad("'sampling_params' must be an object"),
    }
}

/// SGLang's `text` or `input_ids`: one prompt or a batch.
fn generate_prompts(obj: &Map<String, Value>) -> Result<Vec<Vec<u64>>, BadRequest> {
    match (obj.get("text"), obj.get("input_ids")) {
        (Some(Value::String(s)), None) => Ok(vec![tokenize(s)]),
        (Some(Value::Array(texts)), None) => texts
            .iter()
            .map(|t| t.as_str().map(tokenize))
            .collect::<Option<Vec<_>>>()
            .map_or_else(|| bad("'text' must be a string or a list of strings"), Ok),
        (None, Some(Value::Array(ids))) => match token_ids(ids) {
            Some(ids) => Ok(vec![ids]),
            None => ids
                .iter()
                .map(|one| one.as_array().and_then(|a| token_ids(a)))
                .collect::<Option<Vec<_>>>()
                .map_or_else(|| bad("'input_ids' must be token ids or lists of them"), Ok),
        },
        (Some(_), Some(_)) => bad("Either text or input_ids should be provided, not both"),
        _ => bad("Either text or input_ids should be provided"),
    }
}

fn optional_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, BadRequest> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => bad(format!("'{key}' must be a boolean, got {v}")),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u64>> {
    items.iter().map(Value::as_u64).collect()
}

fn completion_prompts(obj: &Map<String, Value>) -> Result<Vec<Vec<u64>>, BadRequest> {
    match obj.get("prompt") {
        None | Some(Value::Null) => bad("Field 'prompt' is required"),
        Some(Value::String(s)) => Ok(vec![tokenize(s)]),
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return bad("The prompt cannot be empty");
            }
            if items.iter().all(Value::is_string) {
                return Ok(items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(tokenize)
                    .collect());
            }
            if let Some(ids) = token_ids(items) {
                return Ok(vec![ids]);
            }
            let mut all = Vec::new();
            for item in items {
                match item.as_array().and_then(|a| token_ids(a)) {
                    Some(ids) => all.push(ids),
                    None => {
                        return bad(
                            "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
                        )
                    }
                }
            }
            Ok(all)
        }
        Some(_) => bad("'prompt' must be a string or a list"),
    }
}

fn chat_text(obj: &Map<String, Value>) -> Result<String, BadRequest> {
    let messages = match obj.get("messages") {
        None | Some(Value::Null) => return bad("Field 'messages' is required"),
        Some(Value::Array(m)) => m,
        Some(_) => return bad("'messages' must be a list"),
    };
    if messages.is_empty() {
        return bad("'messages' must contain at least one message");
    }
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(m) = m.as_object() else {
            return bad(format!("messages[{i}] must be an object"));
        };
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return bad(format!(
                "messages[{i}].role is required and must be a string"
            ));
        };
        let mut header = role.to_string();
        for key in ["name", "tool_call_id"] {
            match m.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(v)) => header.push_str(&format!(" {key}={v}")),
                Some(_) => return bad(format!("messages[{i}].{key} must be a string")),
            }
        }
        let mut content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                // vLLM joins a message's parts with newlines for string-content templates.
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    texts.push(content_part(i, part)?);
                }
                texts.join("\n")
            }
            Some(_) => {
                return bad(format!(
                    "messages[{i}].content must be a string or a list of content parts"
                ))
            }
        };
        match m.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                // Templates render each call's function name and arguments, not its id.
                for call in calls {
                    let function = call.get("function").unwrap_or(call);
                    let Some(name) = function.get("name").and_then(Value::as_str) else {
                        return bad(format!("messages[{i}]: a tool call needs function.name"));
                    };
                    let arguments = match function.get("arguments") {
                        Some(Value::String(a)) => a.clone(),
                        None | Some(Value::Null) => String::new(),
                        Some(other) => other.to_string(),
                    };
                    content.push_str(&format!("\n<|tool_call|> {name} {arguments}"));
                }
            }
            Some(_) => return bad(format!("messages[{i}].tool_calls must be a list")),
        }
        rendered.push(ChatMessage {
            role: header,
            content,
        });
    }
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => Some(v.to_string()),
        Some(_) => return bad("'tools' must be a list"),
    };
    let mut template = Map::new();
    for key in ["chat_template", "chat_template_kwargs", "documents"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            template.insert(key.to_string(), v.clone());
        }
    }
    let template = (!template.is_empty()).then(|| Value::Object(template).to_string());
    let generation_prompt = optional_bool(obj, "add_generation_prompt")?.unwrap_or(true);
    Ok(render_chat(
        &rendered,
        tools.as_deref(),
        template.as_deref(),
        generation_prompt,
    ))
}

/// One content part as the template sees it: text as itself, a media part as a placeholder and
/// what identifies its content (vLLM keys a media item's cache entries by the item's content).
fn content_part(i: usize, part: &Value) -> Result<String, BadRequest> {
    let Some(kind) = part.get("type").and_then(Value::as_str) else {
        return bad(format!("messages[{i}]: content parts need 'type'"));
    };
    if kind == "text" {
        return match part.get("text").and_then(Value::as_str) {
            Some(t) => Ok(t.to_string()),
            None => bad(format!("messages[{i}]: a text part needs 'text'")),
        };
    }
    let media = part.get(kind);
    let source = media.and_then(|m| match m {
        Value::String(s) => Some(s.as_str()),
        _ => ["url", "data", "file_data", "file_id"]
            .iter()
            .find_map(|k| m.get(*k).and_then(Value::as_str)),
    });
    Ok(match source {
        Some(source) => format!("<|{kind}|> {source}"),
        None => part.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(ep: Endpoint, s: &str) -> Result<InferenceRequest, BadRequest> {
        parse(ep, s.as_bytes())
    }

    #[test]
    fn completions_shapes() {
        let r = parse_str(Endpoint::Completions, r#"{"prompt":"a b c"}"#).unwrap();
        assert_eq!(r.tokens.len(), 3);
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        let r = parse_str(Endpoint::Completions, r#"{"prompt":["a b", " c"],"n":2}"#).unwrap();
        assert_eq!(
            (r.tokens.len(), r.batch.len(), r.n),
            (2, 2, 2),
            "a batch of two prompts"
        );
        let r = parse_str(
            Endpoint::Completions,
            r#"{"prompt":[1,2,3],"max_tokens":4}"#,
        )
        .unwrap();
        assert_eq!(r.tokens, vec![1, 2, 3]);
        assert_eq!(r.max_tokens, 4);
        let r = parse_str(Endpoint::Completions, r#"{"prompt":[[1],[2,3]]}"#).unwrap();
        assert_eq!(r.batch, vec![vec![1], vec![2, 3]]);
        assert_eq!(r.n, 1);
    }

    #[test]
    fn errors_are_bad_requests() {
        for body in [
            "{",
            "[]",
            r#"{"prompt":""}"#,
            r#"{"prompt":5}"#,
            r#"{"prompt":"x","max_tokens":-1}"#,
            r#"{"prompt":"x","max_tokens":0}"#,
            r#"{"prompt":"x","n":0}"#,
            r#"{"prompt":["x",""]}"#,
            r#"{"prompt":"x","stream":"yes"}"#,
            r#"{"prompt":"x","stream_options":{"include_usage":true}}"#,
            r#"{"prompt":[{"a":1}]}"#,
            r#"{"model":3,"prompt":"x"}"#,
        ] {
            assert!(parse_str(Endpoint::Completions, body).is_err(), "{body}");
        }
        for body in [
            r#"{"messages":[]}"#,
            r#"{"messages":[{"content":"x"}]}"#,
            r#"{"messages":[{"role":"user","content":7}]}"#,
            r#"{"messages":[{"role":"user","content":[{"text":"x"}]}]}"#,
            r#"{"prompt":"x"}"#,
        ] {
            assert!(parse_str(Endpoint::Chat, body).is_err(), "{body}");
        }
    }

    #[test]
    fn chat_roles_tools_and_parts_change_the_prompt() {
        let user = parse_str(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"hi there"}]}"#,
        )
        .unwrap();
        let system = parse_str(
            Endpoint::Chat,
            r#"{"messages":[{"role":"system","content":"hi there"}]}"#,
        )
        .unwrap();
        assert_ne!(user.tokens, system.tokens);
        let parts = parse_str(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}]}"#,
        )
        .unwrap();
        assert_eq!(user.tokens, parts.tokens);
        let tools = parse_str(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"hi there"}],"tools":[{"type":"function"}]}"#,
        )
        .unwrap();
        assert!(tools.tokens.len() > user.tokens.len());
        let r = parse_str(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":5}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, 5);
    }
}
