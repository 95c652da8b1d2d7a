//! The OpenAI Responses API (`POST /v1/responses`) as vLLM serves it: the request's `instructions`
//! and `input` become the chat messages vLLM builds from them (`construct_input_messages` in
//! `vllm/entrypoints/openai/serving_responses.py`), rendered and cached like a chat request, and the
//! answer is a `response` object or, streamed, the event sequence `response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta` per token, `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, `response.completed` (each as `event: <type>` plus `data: <json>`),
//! with `usage` (`input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`) in the
//! final response.
//!
//! Input items: a string is one user message; a message item keeps its role and its content (a
//! string, or parts: `input_text` / `output_text` as text, `input_image` by its `image_url`); a
//! `function_call` item becomes a tool call of an assistant message (merged into the assistant
//! message before it when that one has no tool calls yet); a `function_call_output` item a tool
//! message answering its `call_id`; `reasoning` items are not rendered.

use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Mutex;

use super::request::BadRequest;

/// The chat request body vLLM's template sees for a Responses request.
pub fn to_chat(obj: &Map<String, Value>) -> Result<Map<String, Value>, BadRequest> {
    let mut messages: Vec<Value> = Vec::new();
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(BadRequest("'instructions' must be a string".into())),
    }
    match obj.get("input") {
        None | Some(Value::Null) => return Err(BadRequest("Field 'input' is required".into())),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut messages, i, item)?;
            }
        }
        Some(_) => {
            return Err(BadRequest(
                "'input' must be a string or a list of items".into(),
            ))
        }
    }
    if messages.is_empty() {
        return Err(BadRequest("'input' must not be empty".into()));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), tools.clone());
    }
    Ok(chat)
}

fn push_item(messages: &mut Vec<Value>, i: usize, item: &Value) -> Result<(), BadRequest> {
    let Some(obj) = item.as_object() else {
        return Err(BadRequest(format!("input[{i}] must be an object")));
    };
    let text = |key: &str| {
        obj.get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("function_call") => {
            let call = json!({"type": "function", "id": text("call_id"),
                "function": {"name": text("name"), "arguments": text("arguments")}});
            let merge = messages.last_mut().filter(|m| {
                m["role"] == "assistant" && m.get("tool_calls").is_none_or(Value::is_null)
            });
            match merge {
                Some(last) => last["tool_calls"] = json!([call]),
                None => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => messages.push(json!({
            "role": "tool", "tool_call_id": text("call_id"), "content": text("output"),
        })),
        Some("reasoning") => {}
        _ => {
            let Some(role) = obj.get("role").and_then(Value::as_str) else {
                return Err(BadRequest(format!("input[{i}].role is required")));
            };
            let content = match obj.get("content") {
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => Value::Array(
                    parts
                        .iter()
                        .map(|p| match p.get("type").and_then(Value::as_str) {
                            Some("input_text" | "output_text") => {
                                json!({"type": "text", "text": p.get("text").cloned().unwrap_or(Value::Null)})
                            }
                            Some("input_image") => json!({"type": "image_url",
                                "image_url": {"url": p.get("image_url").cloned().unwrap_or(Value::Null)}}),
                            _ => p.clone(),
                        })
                        .collect(),
                ),
                None | Some(Value::Null) => Value::Null,
                Some(_) => {
                    return Err(BadRequest(format!(
                        "input[{i}].content must be a string or a list of parts"
                    )))
                }
            };
            messages.push(json!({"role": role, "content": content}));
        }
    }
    Ok(())
}

/// The `usage` of a Responses answer.
pub fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    })
}

/// The `response` object; `text` and `usage` once it is complete.
pub fn response(id: &str, created: u64, model: &str, text: Option<&str>, usage: Value) -> Value {
    let done = text.is_some();
    let output = match text {
        Some(t) => json!([message(id, Some(t))]),
        None => json!([]),
    };
    json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": if done { "completed" } else { "in_progress" },
        "output": output,
        "usage": if done { usage } else { Value::Null },
        "error": null,
        "incomplete_details": null,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
    })
}

/// The one output message; its text once it is done.
pub fn message(id: &str, text: Option<&str>) -> Value {
    json!({
        "type": "message",
        "id": format!("msg_{id}"),
        "role": "assistant",
        "status": if text.is_some() { "completed" } else { "in_progress" },
        "content": match text {
            Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
            None => json!([]),
        },
    })
}

/// One server-sent event of a streamed response: Anthropic's event shape (`event:` line, `type`
/// in the data) plus the Responses API's `sequence_number`.
pub fn event(kind: &str, sequence: usize, mut data: Value) -> bytes::Bytes {
    if let Some(obj) = data.as_object_mut() {
        obj.insert("sequence_number".into(), json!(sequence));
    }
    super::anthropic::event(kind, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(v: Value) -> Value {
        Value::Object(to_chat(v.as_object().unwrap()).unwrap())
    }

    #[test]
    fn input_becomes_chat_messages() {
        let c = chat_of(json!({"instructions": "be brief", "input": "hi"}));
        assert_eq!(
            c["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        let c = chat_of(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]}));
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["content"][0]["text"], "weather?");
        assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "get");
        assert_eq!(m[2]["tool_call_id"], "c1");
        assert!(to_chat(json!({"input": 3}).as_object().unwrap()).is_err());
        assert!(to_chat(json!({}).as_object().unwrap()).is_err());
    }
}

/// Answers this pod stored, as vLLM keeps them in memory (`response_store` and `msg_store`, with
/// `VLLM_ENABLE_RESPONSES_API_STORE`): id → the conversation so far as input items (without the
/// instructions) and the answer's text once it is complete. Only this pod knows them: another pod
/// answers a `previous_response_id` or a retrieval with 404, as vLLM does.
#[derive(Debug, Default)]
pub struct Stored {
    items: Mutex<HashMap<String, StoredResponse>>,
}

#[derive(Debug, Clone)]
struct StoredResponse {
    input: Vec<Value>,
    answer: Option<String>,
    cancelled: bool,
}

/// vLLM's answer for an id it does not hold (`_make_not_found_error`).
pub fn not_found_message(id: &str) -> String {
    format!("Response with id '{id}' not found.")
}

fn input_items(obj: &Map<String, Value>) -> Vec<Value> {
    match obj.get("input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    }
}

impl Stored {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StoredResponse>> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request as the engine runs it: a `previous_response_id` puts the stored conversation
    /// and its answer before the new input (vLLM's `construct_input_messages`). `Err(id)`: this
    /// pod does not hold that response.
    pub fn continued(&self, obj: &mut Map<String, Value>) -> Result<(), String> {
        let Some(previous) = obj.get("previous_response_id").and_then(Value::as_str) else {
            return Ok(());
        };
        let previous = previous.to_string();
        let stored = self.lock().get(&previous).cloned();
        let Some(stored) = stored else {
            return Err(previous);
        };
        let mut items = stored.input;
        if let Some(answer) = stored.answer {
            items.push(json!({"role": "assistant", "content": answer}));
        }
        items.extend(input_items(obj));
        obj.insert("input".into(), Value::Array(items));
        Ok(())
    }

    /// Stores the (continued) request under `id` unless it says `store: false`.
    pub fn begin(&self, id: &str, obj: &Map<String, Value>) {
        if obj.get("store").and_then(Value::as_bool) == Some(false) {
            return;
        }
        let input = input_items(obj);
        self.lock().insert(
            id.to_string(),
            StoredResponse {
                input,
                answer: None,
                cancelled: false,
            },
        );
    }

    pub fn complete(&self, id: &str, text: &str) {
        if let Some(r) = self.lock().get_mut(id) {
            r.answer = Some(text.to_string());
        }
    }

    /// `GET /v1/responses/{id}` (and `cancel`): the stored response object, if this pod holds it.
    pub fn retrieve(&self, id: &str, model: &str, cancel: bool) -> Option<Value> {
        let mut items = self.lock();
        let r = items.get_mut(id)?;
        r.cancelled |= cancel && r.answer.is_none();
        let mut object = response(id, 0, model, r.answer.as_deref(), Value::Null);
        let status = match (&r.answer, r.cancelled) {
            (_, true) => "cancelled",
            (Some(_), _) => "completed",
            (None, _) => "in_progress",
        };
        object["status"] = json!(status);
        Some(object)
    }
}
