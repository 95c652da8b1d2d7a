//! The Anthropic Messages API (`POST /v1/messages`), rendered as the chat request vLLM makes of it
//! (`AnthropicServingMessages._convert_anthropic_to_openai_request`), so a conversation renders
//! the same through `/v1/messages` as through `/v1/chat/completions` and shares its prefix across
//! the two wherever the chat template does:
//!
//! * `tools` as the OpenAI tools vLLM builds (`{"type": "function", "function": {name,
//!   description, parameters: input_schema}}`), rendered like a chat request's `tools`;
//! * one system message: the text of `system` (a string, or its non-empty `text` blocks) followed
//!   by that of every `system` message in `messages`, joined without a separator, as vLLM joins
//!   them; a block starting `x-anthropic-billing-header` is left out (vLLM drops it: it carries a
//!   per-request hash);
//! * every other message in order (roles `ctx` and `msg` read as `user`): string content as
//!   itself; blocks as chat content parts, `text` blocks as text, `image` blocks as an
//!   `image_url` part (a `url` source by its URL, a `base64` one as the data URL vLLM builds), a
//!   `tool_use` block as a tool call (its `name`, its `input` as `json.dumps` writes it), a
//!   `tool_result` block in a user message as a tool message of its own before that message
//!   (`tool_use_id` as its `tool_call_id`, text items joined by newlines; its images as a user
//!   message after it), elsewhere as the text `Tool result: …`; `thinking` blocks are not
//!   rendered (like chat's reasoning). A user message left with no content is dropped, as vLLM
//!   drops it.
//!
//! The three members are captured whole while the body is read (their order in the body does not
//! matter) and rendered here once it has been.

use super::chat::push_media;
use super::json::skip_map;
use super::json::{sub_parse, Canonical, Sink};
use super::pyjson::PyJson;
use super::responses::push_message;
use super::scan::{as_str, scan};
use super::{FIELD_SEP, MESSAGE_END, ROLE_SEP};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The members of a Messages request that reach the prompt, each the last of its key.
#[derive(Debug, Default, Clone, Copy)]
pub struct Captured<'de> {
    pub system: Option<&'de RawValue>,
    pub messages: Option<&'de RawValue>,
    pub tools: Option<&'de RawValue>,
}

/// Where each part was rendered in the sink.
#[derive(Debug, Default)]
pub struct Rendered {
    /// The tools' JSON (without its tag: the top level adds it).
    pub tools: Option<(usize, usize)>,
    pub system: Option<(usize, usize)>,
    pub messages: Option<(usize, usize)>,
    /// `messages` was a non-empty list.
    pub routable: bool,
}

/// Renders the captured members at the end of the sink. `depth`: containers around them (the
/// request object).
pub fn render(
    sink: &mut Sink,
    captured: Captured<'_>,
    depth: usize,
) -> Result<Rendered, serde_json::Error> {
    let mut rendered = Rendered::default();
    if let Some(tools) = captured.tools.filter(|t| t.get() != "null") {
        let at = sink.len();
        render_tools(sink, tools, depth)?;
        rendered.tools = Some((at, sink.len()));
    }
    let at = sink.len();
    if render_system(sink, captured.system, captured.messages, depth)? {
        rendered.system = Some((at, sink.len()));
    }
    if let Some(messages) = captured.messages {
        let at = sink.len();
        let mut any = false;
        for_each(messages, |message| {
            any = true;
            render_message(sink, message, depth + 1)
        })?;
        rendered.messages = Some((at, sink.len()));
        rendered.routable = any;
    }
    Ok(rendered)
}

/// Calls `each` on every element of `raw` when it is a list; its value: whether it was one.
fn for_each<'de, F>(raw: &'de RawValue, each: F) -> Result<bool, serde_json::Error>
where
    F: FnMut(&'de RawValue) -> Result<(), serde_json::Error>,
{
    /// `depth` is only for skipping what is not a list: the value was checked when captured.
    struct Each<F> {
        each: F,
        depth: usize,
    }
    impl<'de, F> DeserializeSeed<'de> for Each<F>
    where
        F: FnMut(&'de RawValue) -> Result<(), serde_json::Error>,
    {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de, F> Visitor<'de> for Each<F>
    where
        F: FnMut(&'de RawValue) -> Result<(), serde_json::Error>,
    {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<bool, A::Error> {
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                (self.each)(element).map_err(de::Error::custom)?;
            }
            Ok(true)
        }
        fn visit_str<E>(self, _: &str) -> Result<bool, E> {
            Ok(false)
        }
        false_otherwise!();
    }
    sub_parse(raw, Each { each, depth: 0 })
}

/// A JSON value as chat renders a member of the same value (`serde_json::Value`'s printing).
fn canonical(sink: &mut Sink, raw: &RawValue, depth: usize) -> Result<(), serde_json::Error> {
    sub_parse(raw, Canonical::json(sink, depth)).map(|_| ())
}

/// `[{"function":{"defer_loading":..,"description":..,"name":..,"parameters":..},"type":"function"}, ..]`
/// with members sorted as chat's canonical JSON sorts them, and absent or null ones left out.
fn render_tools(sink: &mut Sink, tools: &RawValue, depth: usize) -> Result<(), serde_json::Error> {
    let inner = depth + 2;
    let mut first = true;
    sink.push(b'[');
    let list = for_each(tools, |tool| {
        if !first {
            sink.push(b',');
        }
        first = false;
        let found = scan(
            tool,
            depth + 1,
            &[],
            &["defer_loading", "description", "name", "input_schema"],
        )?;
        sink.extend(b"{\"function\":{");
        let mut separator = false;
        for (key, from) in [
            ("defer_loading", "defer_loading"),
            ("description", "description"),
            ("name", "name"),
            ("parameters", "input_schema"),
        ] {
            let Some(value) = found.raw(from).filter(|v| v.get() != "null") else {
                continue;
            };
            if separator {
                sink.push(b',');
            }
            separator = true;
            sink.write_json(key);
            sink.push(b':');
            canonical(sink, value, inner)?;
        }
        sink.extend(b"},\"type\":\"function\"}");
        Ok(())
    })?;
    if list {
        sink.push(b']');
    } else {
        // Not a list (vLLM refuses it): its own JSON, so it still keys the prompt.
        sink.truncate(sink.len().saturating_sub(1));
        canonical(sink, tools, depth)?;
    }
    Ok(())
}

/// The text of `system`'s blocks that vLLM keeps.
fn push_system_blocks(
    sink: &mut Sink,
    blocks: &RawValue,
    depth: usize,
    any: &mut bool,
) -> Result<(), serde_json::Error> {
    for_each(blocks, |block| {
        let found = scan(block, depth + 1, &["type", "text"], &[])?;
        if let (Some("text"), Some(text)) = (found.string("type"), found.string("text")) {
            if !text.is_empty() && !text.starts_with("x-anthropic-billing-header") {
                sink.extend(text.as_bytes());
                *any = true;
            }
        }
        Ok(())
    })
    .map(|_| ())
}

/// The system message (see the module header); its value: whether there was one.
fn render_system(
    sink: &mut Sink,
    system: Option<&RawValue>,
    messages: Option<&RawValue>,
    depth: usize,
) -> Result<bool, serde_json::Error> {
    let at = sink.len();
    sink.extend(b"system");
    sink.push(ROLE_SEP);
    let mut any = false;
    if let Some(system) = system {
        match as_str(system) {
            Some(text) => {
                if !text.is_empty() {
                    sink.extend(text.as_bytes());
                    any = true;
                }
            }
            None => push_system_blocks(sink, system, depth, &mut any)?,
        }
    }
    if let Some(messages) = messages {
        for_each(messages, |message| {
            let found = scan(message, depth + 1, &["role"], &["content"])?;
            if found.string("role") != Some("system") {
                return Ok(());
            }
            let Some(content) = found.raw("content") else {
                return Ok(());
            };
            match as_str(content) {
                Some(text) => {
                    sink.extend(text.as_bytes());
                    any = true;
                }
                None => push_system_blocks(sink, content, depth + 2, &mut any)?,
            }
            Ok(())
        })?;
    }
    if any {
        sink.push(MESSAGE_END);
    } else {
        sink.truncate(at);
    }
    Ok(any)
}

/// An image block's source as the URL vLLM gives the chat request.
fn image_url(source: &RawValue, depth: usize) -> Result<String, serde_json::Error> {
    let found = scan(source, depth, &["type", "url", "media_type", "data"], &[])?;
    if found.string("type") == Some("url") {
        return Ok(found.string("url").unwrap_or("").to_string());
    }
    Ok(format!(
        "data:{};base64,{}",
        found.string("media_type").unwrap_or("image/jpeg"),
        found.string("data").unwrap_or("")
    ))
}

/// One message of `messages` (`depth`: containers around it).
fn render_message(
    sink: &mut Sink,
    message: &RawValue,
    depth: usize,
) -> Result<(), serde_json::Error> {
    let found = scan(message, depth, &["role"], &["content"])?;
    let role = match found.string("role") {
        Some("system") => return Ok(()),
        Some("ctx" | "msg") => "user",
        Some(role) => role,
        None => "",
    };
    let Some(content) = found.raw("content") else {
        push_message(sink, role, "");
        return Ok(());
    };
    if let Some(text) = as_str(content) {
        push_message(sink, role, &text);
        return Ok(());
    }
    let blocks = depth + 2;
    let user = role == "user";
    if user {
        for_each(content, |block| render_tool_result(sink, block, blocks))?;
    }
    let start = sink.len();
    sink.extend(role.as_bytes());
    sink.push(ROLE_SEP);
    let mut parts = 0usize;
    let list = for_each(content, |block| {
        let at = sink.len();
        if parts > 0 {
            sink.push(b'\n');
        }
        if render_part(sink, block, blocks, user)? {
            parts += 1;
        } else {
            sink.truncate(at);
        }
        Ok(())
    })?;
    if !list {
        // Neither a string nor blocks (vLLM refuses it): its own JSON.
        canonical(sink, content, depth + 1)?;
        parts += 1;
    }
    for_each(content, |block| {
        let found = scan(block, blocks, &["type", "name"], &["input"])?;
        if found.string("type") != Some("tool_use") {
            return Ok(());
        }
        sink.push(FIELD_SEP);
        sink.extend(b"tool_call");
        sink.push(ROLE_SEP);
        sink.extend(found.string("name").unwrap_or("").as_bytes());
        sink.push(ROLE_SEP);
        match found
            .raw("input")
            .filter(|i| !matches!(i.get(), "null" | "{}"))
        {
            Some(input) => {
                sub_parse(
                    input,
                    PyJson {
                        sink: &mut *sink,
                        depth: blocks + 1,
                    },
                )?;
            }
            None => sink.extend(b"{}"),
        }
        Ok(())
    })?;
    if user && parts == 0 {
        sink.truncate(start);
    } else {
        sink.push(MESSAGE_END);
    }
    Ok(())
}

/// A content block that becomes a content part; its value: whether it did.
fn render_part(
    sink: &mut Sink,
    block: &RawValue,
    depth: usize,
    user: bool,
) -> Result<bool, serde_json::Error> {
    let found = scan(block, depth, &["type", "text"], &["source", "content"])?;
    match found.string("type") {
        Some("text") => match found.string("text").filter(|t| !t.is_empty()) {
            Some(text) => {
                sink.extend(text.as_bytes());
                Ok(true)
            }
            None => Ok(false),
        },
        Some("image") => match found
            .raw("source")
            .filter(|s| !matches!(s.get(), "null" | "{}"))
        {
            Some(source) => {
                push_media(sink, "image_url", &image_url(source, depth + 1)?);
                Ok(true)
            }
            None => Ok(false),
        },
        Some("tool_result") if !user => {
            sink.extend(b"Tool result: ");
            if let Some(content) = found
                .raw("content")
                .filter(|c| !matches!(c.get(), "null" | "\"\"" | "[]"))
            {
                // vLLM writes Python's `str` of the content: a string as itself; a list is
                // written as its JSON here (Python's repr of it differs, but keys alike).
                match as_str(content) {
                    Some(text) => sink.extend(text.as_bytes()),
                    None => canonical(sink, content, depth + 1)?,
                }
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A user message's `tool_result` block as the tool message vLLM puts before that message (and
/// the user message of its images, and the tool message of its tool references, after it).
fn render_tool_result(
    sink: &mut Sink,
    block: &RawValue,
    depth: usize,
) -> Result<(), serde_json::Error> {
    let found = scan(block, depth, &["type", "tool_use_id"], &["content"])?;
    if found.string("type") != Some("tool_result") {
        return Ok(());
    }
    let call_id = found.string("tool_use_id").unwrap_or("");
    open_tool_message(sink, call_id);
    let content = found.raw("content");
    let items = depth + 2;
    if let Some(content) = content {
        match as_str(content) {
            Some(text) => sink.extend(text.as_bytes()),
            None => {
                let mut first = true;
                for_each(content, |item| {
                    let item_found = scan(item, items, &["type", "text"], &[])?;
                    if item_found.string("type") == Some("text") {
                        if !first {
                            sink.push(b'\n');
                        }
                        first = false;
                        sink.extend(item_found.string("text").unwrap_or("").as_bytes());
                    }
                    Ok(())
                })?;
            }
        }
    }
    sink.push(MESSAGE_END);
    let Some(content) = content else {
        return Ok(());
    };
    render_result_images(sink, content, items)?;
    render_tool_references(sink, content, items, call_id)
}

/// A tool message's opening: role, the call id it answers.
fn open_tool_message(sink: &mut Sink, call_id: &str) {
    sink.extend(b"tool");
    sink.push(FIELD_SEP);
    sink.extend(b"tool_call_id");
    sink.push(ROLE_SEP);
    sink.extend(call_id.as_bytes());
    sink.push(ROLE_SEP);
}

/// A tool result's images, as one user message of image parts (nothing without images).
fn render_result_images(
    sink: &mut Sink,
    content: &RawValue,
    items: usize,
) -> Result<(), serde_json::Error> {
    let at = sink.len();
    sink.extend(b"user");
    sink.push(ROLE_SEP);
    let mut images = 0usize;
    for_each(content, |item| {
        let item_found = scan(item, items, &["type"], &["source"])?;
        if item_found.string("type") == Some("image") {
            let url = match item_found.raw("source") {
                Some(source) => image_url(source, items + 1)?,
                None => "data:image/jpeg;base64,".to_string(),
            };
            if !url.is_empty() {
                if images > 0 {
                    sink.push(b'\n');
                }
                images += 1;
                push_media(sink, "image_url", &url);
            }
        }
        Ok(())
    })?;
    if images > 0 {
        sink.push(MESSAGE_END);
    } else {
        sink.truncate(at);
    }
    Ok(())
}

/// A tool result's tool references, as one tool message whose parts are
/// `{"name":..,"type":"tool_reference"}` (nothing without references).
fn render_tool_references(
    sink: &mut Sink,
    content: &RawValue,
    items: usize,
    call_id: &str,
) -> Result<(), serde_json::Error> {
    let at = sink.len();
    open_tool_message(sink, call_id);
    let mut references = 0usize;
    for_each(content, |item| {
        let item_found = scan(item, items, &["type", "tool_name", "name"], &[])?;
        if item_found.string("type") != Some("tool_reference") {
            return Ok(());
        }
        let name = item_found
            .string("tool_name")
            .filter(|n| !n.is_empty())
            .or(item_found.string("name"))
            .filter(|n| !n.is_empty());
        if let Some(name) = name {
            if references > 0 {
                sink.push(b'\n');
            }
            references += 1;
            sink.extend(b"{\"name\":");
            sink.write_json(name);
            sink.extend(b",\"type\":\"tool_reference\"}");
        }
        Ok(())
    })?;
    if references > 0 {
        sink.push(MESSAGE_END);
    } else {
        sink.truncate(at);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Endpoint};
    use serde_json::{json, Value};

    fn messages(body: Value) -> Vec<u8> {
        parse(Endpoint::Messages, body.to_string().as_bytes())
            .unwrap()
            .prompt
    }

    fn chat(body: Value) -> Vec<u8> {
        parse(Endpoint::ChatCompletions, body.to_string().as_bytes())
            .unwrap()
            .prompt
    }

    /// A Messages conversation and the chat request vLLM converts it to render alike (`json!`
    /// writes members sorted, so the tool input's `json.dumps` is in that order too).
    #[test]
    fn a_conversation_renders_as_the_chat_request_vllm_makes_of_it() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let anthropic = json!({
            "model": "m", "max_tokens": 5, "stream": true,
            "system": [{"type": "text", "text": "You are kind. "},
                       {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=9f3"},
                       {"type": "text", "text": "Be brief."}],
            "tools": [{"name": "weather", "description": "The weather", "input_schema": schema}],
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "The user wants weather.", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather",
                     "input": {"city": "Paris", "note": "café", "days": 2.0}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "12C"}]},
                    {"type": "text", "text": "and tomorrow?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
            ]
        });
        let openai = json!({
            "model": "m", "max_tokens": 5,
            "tools": [{"type": "function", "function": {"name": "weather", "description": "The weather",
                       "parameters": schema}}],
            "messages": [
                {"role": "system", "content": "You are kind. Be brief."},
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "reasoning": "The user wants weather.",
                 "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "weather",
                  "arguments": "{\"city\": \"Paris\", \"days\": 2.0, \"note\": \"caf\\u00e9\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "rain\n12C"},
                {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            ]
        });
        let view = parse(Endpoint::Messages, anthropic.to_string().as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&view.prompt),
            String::from_utf8_lossy(&chat(openai))
        );
        assert_eq!(
            (view.model.as_str(), view.max_tokens, view.stream),
            ("m", Some(5), true)
        );
    }

    #[test]
    fn system_messages_join_the_system_prompt_and_empty_user_turns_are_dropped() {
        let anthropic = json!({"model": "m", "max_tokens": 1,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": " and late"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "ls", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "a.txt",
                    "is_error": false}]},
                {"role": "ctx", "content": "context"}],
            "system": "Early"});
        let openai = json!({"model": "m", "messages": [
            {"role": "system", "content": "Early and late"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "t", "type": "function",
                "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t", "content": "a.txt"},
            {"role": "user", "content": "context"}]});
        assert_eq!(
            String::from_utf8_lossy(&messages(anthropic)),
            String::from_utf8_lossy(&chat(openai))
        );
    }

    /// Each row: two requests, and whether their renderings must be equal.
    #[test]
    fn what_reaches_the_prompt_changes_the_rendering_and_nothing_else_does() {
        let turn = |system: &str, input: Value, call_id: &str, extra: Value| {
            let mut body = json!({"model": "m", "max_tokens": 4, "system": system, "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "ls", "input": input}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
            ]});
            if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
                b.extend(e.clone());
            }
            messages(body)
        };
        let none = json!({});
        let base = turn("S", json!({"dir": "/"}), "t1", none.clone());
        let rows = [
            (
                "another system prompt",
                turn("T", json!({"dir": "/"}), "t1", none.clone()),
                false,
            ),
            (
                "the tool call's input",
                turn("S", json!({"dir": "/tmp"}), "t1", none.clone()),
                false,
            ),
            (
                "only the tool call's id",
                turn("S", json!({"dir": "/"}), "t2", none.clone()),
                true,
            ),
            (
                "sampling, tool_choice, metadata and stop sequences",
                turn(
                    "S",
                    json!({"dir": "/"}),
                    "t1",
                    json!({"temperature": 0.3, "top_k": 4,
                 "tool_choice": {"type": "any"}, "metadata": {"user_id": "u"}, "stop_sequences": ["x"]}),
                ),
                true,
            ),
            (
                "chat_template_kwargs",
                turn(
                    "S",
                    json!({"dir": "/"}),
                    "t1",
                    json!({"chat_template_kwargs": {"enable_thinking": false}}),
                ),
                false,
            ),
            (
                "tools",
                turn(
                    "S",
                    json!({"dir": "/"}),
                    "t1",
                    json!({"tools": [{"name": "ls", "input_schema": {"type": "object"}}]}),
                ),
                false,
            ),
        ];
        for (what, other, equal) in rows {
            assert_eq!(base == other, equal, "{what}");
        }
        let system_end = base.iter().position(|b| *b == super::MESSAGE_END).unwrap();
        assert_eq!(&base[..system_end], b"system\x1fS");
    }

    #[test]
    fn without_messages_there_is_nothing_to_route() {
        use super::super::ParseError;
        for body in [
            json!({"model": "m", "max_tokens": 1, "system": "s"}),
            json!({"model": "m", "max_tokens": 1, "messages": []}),
            json!({"model": "m", "max_tokens": 1, "messages": null}),
        ] {
            assert_eq!(
                parse(Endpoint::Messages, body.to_string().as_bytes()),
                Err(ParseError::MissingPrompt),
                "{body}"
            );
        }
    }
}
