//! The Responses API's `input`, rendered as the chat messages vLLM makes of it
//! (`construct_input_messages`), so a conversation renders the same through `/v1/responses` as
//! through `/v1/chat/completions`:
//!
//! * a string is one user message;
//! * a list of items: a `function_call` item is a tool call (its `name` and `arguments`) added to
//!   the assistant message before it, or one of its own; a `function_call_output` item is a tool
//!   message (`call_id` as its `tool_call_id`, `output` as its content); an assistant message
//!   renders its content string or its first part's `text`, into the assistant message before it
//!   when that one has no content yet; a `reasoning` item opens an assistant message when the one
//!   before is not one (reasoning itself is not rendered, as in chat); any other item is a chat
//!   message (`input_text` / `output_text` parts are text, an `input_image` its `image_url`).

use super::chat::{push_call, Content, Dialect, Message};
use super::json::{enter, skip_map, sub_parse, Canonical, Form, Sink};
use super::scan::{scan, Scan, StringOrNone};
use super::{FIELD_SEP, MESSAGE_END, ROLE_SEP};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The `input` field. Its value: whether it is a string or a non-empty list.
pub struct Input<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for Input<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

/// The message last rendered, as the next item may extend it.
#[derive(Debug, Clone, Copy)]
struct Last {
    assistant: bool,
    content_none: bool,
    content_at: usize,
    calls_mergeable: bool,
    reasoning: bool,
}

impl<'de> Visitor<'de> for Input<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or a list of items")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        push_message(self.sink, "user", v);
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        let mut last: Option<Last> = None;
        let mut any = false;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            any = true;
            render_item(self.sink, item, depth, &mut last).map_err(de::Error::custom)?;
        }
        Ok(any)
    }
    false_otherwise!();
}

/// `role ROLE_SEP text MESSAGE_END`.
pub fn push_message(sink: &mut Sink, role: &str, text: &str) {
    sink.extend(role.as_bytes());
    sink.push(ROLE_SEP);
    sink.extend(text.as_bytes());
    sink.push(MESSAGE_END);
}

/// Opens a new assistant message (`assistant ROLE_SEP`); returns where its content goes.
fn open_assistant(sink: &mut Sink) -> usize {
    sink.extend(b"assistant");
    sink.push(ROLE_SEP);
    sink.len()
}

/// Re-opens the message just rendered (drops its end), for more of it to be written.
fn reopen(sink: &mut Sink) -> bool {
    if sink.over() || sink.bytes().last() != Some(&MESSAGE_END) {
        return false;
    }
    sink.truncate(sink.len() - 1);
    true
}

fn render_item(
    sink: &mut Sink,
    item: &RawValue,
    depth: usize,
    last: &mut Option<Last>,
) -> Result<(), serde_json::Error> {
    let found = scan(
        item,
        depth,
        &["type", "role"],
        &["content", "call_id", "name", "arguments", "output"],
    )?;
    let inner = depth + 1;
    match found.string("type") {
        Some("function_call") => return render_function_call(sink, &found, inner, last),
        Some("reasoning") => {
            render_reasoning(sink, last);
            return Ok(());
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            return render_call_output(sink, &found, inner, last);
        }
        _ => {}
    }
    if found.string("role") == Some("assistant") {
        if let Some(text) = assistant_text(found.raw("content"))? {
            return render_assistant_text(sink, text, inner, last);
        }
    }
    let info = sub_parse(
        item,
        Message {
            sink,
            depth,
            dialect: Dialect::Responses,
        },
    )?;
    *last = Some(Last {
        assistant: info.assistant,
        content_none: info.content_none,
        content_at: info.content_at,
        calls_mergeable: info.calls_mergeable,
        reasoning: false,
    });
    Ok(())
}

/// A `function_call` item: a tool call, merged into the assistant message before it where vLLM
/// merges it.
fn render_function_call(
    sink: &mut Sink,
    found: &Scan<'_>,
    inner: usize,
    last: &mut Option<Last>,
) -> Result<(), serde_json::Error> {
    let (name, arguments) = (found.raw("name"), found.raw("arguments"));
    let prev_assistant = last.filter(|l| l.assistant);
    if prev_assistant.is_some_and(|l| l.calls_mergeable) && reopen(sink) {
        push_call(sink, name, arguments, inner)?;
        sink.push(MESSAGE_END);
    } else {
        let content_at = open_assistant(sink);
        push_call(sink, name, arguments, inner)?;
        sink.push(MESSAGE_END);
        *last = Some(Last {
            assistant: true,
            content_none: true,
            content_at,
            calls_mergeable: true,
            reasoning: false,
        });
    }
    Ok(())
}

/// A `reasoning` item: marks the assistant message before it, or opens an empty one.
fn render_reasoning(sink: &mut Sink, last: &mut Option<Last>) {
    match last.as_mut().filter(|l| l.assistant && !l.reasoning) {
        Some(l) => l.reasoning = true,
        None => {
            let content_at = open_assistant(sink);
            sink.push(MESSAGE_END);
            *last = Some(Last {
                assistant: true,
                content_none: true,
                content_at,
                calls_mergeable: true,
                reasoning: true,
            });
        }
    }
}

/// A tool call's output: a tool message with its call id.
fn render_call_output(
    sink: &mut Sink,
    found: &Scan<'_>,
    inner: usize,
    last: &mut Option<Last>,
) -> Result<(), serde_json::Error> {
    sink.extend(b"tool");
    if let Some(call_id) = found.raw("call_id") {
        let at = sink.len();
        sink.push(FIELD_SEP);
        sink.extend(b"tool_call_id");
        sink.push(ROLE_SEP);
        let null = sub_parse(
            call_id,
            Canonical {
                sink: &mut *sink,
                depth: inner,
                form: Form::Scalar,
            },
        )?;
        if null {
            sink.truncate(at);
        }
    }
    let content_at = sink.len() + 1;
    sink.push(ROLE_SEP);
    let content_none = match found.raw("output") {
        Some(output) => sub_parse(
            output,
            Content {
                sink: &mut *sink,
                depth: inner,
                dialect: Dialect::Responses,
            },
        )?,
        None => true,
    };
    sink.push(MESSAGE_END);
    *last = Some(Last {
        assistant: false,
        content_none,
        content_at,
        calls_mergeable: true,
        reasoning: false,
    });
    Ok(())
}

/// An assistant item's text: the content of the assistant message before it when that has none,
/// else a new assistant message.
fn render_assistant_text(
    sink: &mut Sink,
    text: &RawValue,
    inner: usize,
    last: &mut Option<Last>,
) -> Result<(), serde_json::Error> {
    let content = |sink: &mut Sink| {
        sub_parse(
            text,
            Content {
                sink,
                depth: inner,
                dialect: Dialect::Responses,
            },
        )
    };
    match last.as_mut().filter(|l| l.assistant && l.content_none) {
        Some(l) => {
            let at = sink.len();
            content(sink)?;
            sink.move_tail_to(l.content_at, sink.len() - at);
            l.content_none = false;
        }
        None => {
            let content_at = open_assistant(sink);
            content(sink)?;
            sink.push(MESSAGE_END);
            *last = Some(Last {
                assistant: true,
                content_none: false,
                content_at,
                calls_mergeable: true,
                reasoning: false,
            });
        }
    }
    Ok(())
}

/// An assistant item's text as vLLM takes it: its content when a string, else its first part's
/// `text` (not null).
fn assistant_text(content: Option<&RawValue>) -> Result<Option<&RawValue>, serde_json::Error> {
    let Some(content) = content else {
        return Ok(None);
    };
    if sub_parse(content, StringOrNone { depth: 0 })?.is_some() {
        return Ok(Some(content));
    }
    struct FirstText;
    impl<'de> DeserializeSeed<'de> for FirstText {
        type Value = Option<&'de RawValue>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for FirstText {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<&'de RawValue>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    let Some(first) = sub_parse(content, FirstText)? else {
        return Ok(None);
    };
    let text = scan(first, 0, &[], &["text"])?.raw("text");
    Ok(text.filter(|t| t.get() != "null"))
}
