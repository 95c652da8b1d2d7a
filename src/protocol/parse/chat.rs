//! Chat messages rendered straight into the prompt (the rendering is described in `super`).
//!
//! A message's fields are written as they come, each where it lands; when they came in another
//! order than the rendering's (role, name, tool_call_id, content, tool calls), or a field came
//! twice (the last one counts, as in a JSON object), the message is re-arranged in place at its
//! end. A content part or a tool call is captured whole (a slice of the body) and read again, since
//! what it renders depends on a member that may come last (a part's `type`, a call's `function`).

use super::json::{
    enter, skip_map, skip_seq, sub_parse, Canonical, Form, Piece, Sink, StrVisitor, Validate,
};
use super::scan::{as_str, member, scan};
use super::{FIELD_SEP, MESSAGE_END, ROLE_SEP};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// Which API's content parts are read: the Responses API's `input_image` names its image by a
/// plain `image_url` string, rendered like a chat `image_url` part (vLLM reads both alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Chat,
    Responses,
}

/// The `messages` list. Its value: whether it was a non-empty list.
pub struct Messages<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for Messages<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        let mut any = false;
        while seq
            .next_element_seed(Message {
                sink: &mut *self.sink,
                depth,
                dialect: Dialect::Chat,
            })?
            .is_some()
        {
            any = true;
        }
        Ok(any)
    }
    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    false_otherwise!();
}

/// What the Responses API's input items need to know of a rendered message (vLLM merges an item
/// into the assistant message before it).
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageInfo {
    pub assistant: bool,
    /// Its content was absent or null.
    pub content_none: bool,
    /// Where its content goes: right after the role separator.
    pub content_at: usize,
    /// Its `tool_calls` were absent, null or a list (a call can be added to them).
    pub calls_mergeable: bool,
}

/// One message, rendered; anything but an object renders as an empty message.
pub struct Message<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
    pub dialect: Dialect,
}

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = MessageInfo;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<MessageInfo, D::Error> {
        d.deserialize_any(self)
    }
}

#[derive(Clone, Copy)]
enum MessageField {
    Role,
    Name,
    ToolCallId,
    Content,
    ToolCalls,
    Other,
}

impl<'de> de::Deserialize<'de> for MessageField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let key = d.deserialize_str(StrVisitor)?;
        Ok(match key.as_ref() {
            "role" => MessageField::Role,
            "name" => MessageField::Name,
            "tool_call_id" => MessageField::ToolCallId,
            "content" => MessageField::Content,
            "tool_calls" => MessageField::ToolCalls,
            _ => MessageField::Other,
        })
    }
}

impl Message<'_> {
    fn empty(self) -> MessageInfo {
        let content_at = self.sink.len() + 1;
        self.sink.push(ROLE_SEP);
        self.sink.push(MESSAGE_END);
        MessageInfo {
            assistant: false,
            content_none: true,
            content_at,
            calls_mergeable: true,
        }
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = MessageInfo;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MessageInfo, A::Error> {
        let depth = enter(self.depth)?;
        let sink = self.sink;
        let start = sink.len();
        // Each field's bytes in the sink, in rendering order: role, name, tool_call_id, content
        // (with the role separator in front), tool calls.
        let mut spans: [Option<(usize, usize)>; 5] = [None; 5];
        let mut info = MessageInfo {
            calls_mergeable: true,
            content_none: true,
            ..MessageInfo::default()
        };
        while let Some(field) = map.next_key::<MessageField>()? {
            let at = sink.len();
            match field {
                MessageField::Role => {
                    let role = map.next_value_seed(Role {
                        sink: &mut *sink,
                        depth,
                    })?;
                    info.assistant = role;
                    spans[0] = Some((at, sink.len()));
                }
                MessageField::Name | MessageField::ToolCallId => {
                    let (slot, key): (usize, &'static [u8]) = match field {
                        MessageField::Name => (1, b"name"),
                        _ => (2, b"tool_call_id"),
                    };
                    sink.push(FIELD_SEP);
                    sink.extend(key);
                    sink.push(ROLE_SEP);
                    let null = map.next_value_seed(Canonical {
                        sink: &mut *sink,
                        depth,
                        form: Form::Scalar,
                    })?;
                    if null {
                        sink.truncate(at);
                    }
                    if let Some(span) = spans.get_mut(slot) {
                        *span = (!null).then_some((at, sink.len()));
                    }
                }
                MessageField::Content => {
                    sink.push(ROLE_SEP);
                    info.content_none = map.next_value_seed(Content {
                        sink: &mut *sink,
                        depth,
                        dialect: self.dialect,
                    })?;
                    spans[3] = Some((at, sink.len()));
                }
                MessageField::ToolCalls => {
                    let calls = map.next_value_seed(ToolCalls {
                        sink: &mut *sink,
                        depth,
                    })?;
                    info.calls_mergeable = calls != Calls::Other;
                    spans[4] = (calls != Calls::None).then_some((at, sink.len()));
                }
                MessageField::Other => map.next_value_seed(Validate { depth })?,
            }
        }
        finish_message(sink, start, &spans, &mut info);
        Ok(info)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<MessageInfo, A::Error> {
        skip_seq(seq, self.depth)?;
        Ok(self.empty())
    }
    fn visit_bool<E>(self, _: bool) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
    fn visit_i64<E>(self, _: i64) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
    fn visit_u64<E>(self, _: u64) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
    fn visit_f64<E>(self, _: f64) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
    fn visit_str<E>(self, _: &str) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
    fn visit_unit<E>(self) -> Result<MessageInfo, E> {
        Ok(self.empty())
    }
}

/// Puts a message's fields in rendering order (they usually already are) and ends it.
fn finish_message(
    sink: &mut Sink,
    start: usize,
    spans: &[Option<(usize, usize)>; 5],
    info: &mut MessageInfo,
) {
    let mut at = start;
    let mut in_order = spans[3].is_some();
    for (s, e) in spans.iter().flatten() {
        in_order &= *s == at;
        at = *e;
    }
    in_order &= at == sink.len();
    let head: usize = spans[..3].iter().flatten().map(|(s, e)| e - s).sum();
    info.content_at = start + head + 1;
    if !in_order {
        let mut pieces: Vec<Piece> = Vec::with_capacity(6);
        for (i, span) in spans.iter().enumerate() {
            match (i, span) {
                (_, Some((s, e))) => pieces.push(Piece::Range(*s, *e)),
                (3, None) => pieces.push(Piece::Bytes(&[ROLE_SEP])),
                _ => {}
            }
        }
        sink.arrange(start, &pieces);
    }
    sink.push(MESSAGE_END);
}

/// A message's `role`: a string as its text, anything else as nothing. Its value: whether it is
/// `assistant`.
struct Role<'s> {
    sink: &'s mut Sink,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Role<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Role<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a role")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.sink.extend(v.as_bytes());
        Ok(v == "assistant")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        skip_seq(seq, self.depth).map(|_| false)
    }
    false_otherwise!();
}

/// Message content: a string as its text, parts joined by newlines, null as nothing, anything else
/// as its JSON. Its value: whether it was null.
pub struct Content<'s> {
    pub sink: &'s mut Sink,
    pub depth: usize,
    pub dialect: Dialect,
}

impl<'de> DeserializeSeed<'de> for Content<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Content<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("message content")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.sink.extend(v.as_bytes());
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        let mut first = true;
        while let Some(part) = seq.next_element::<&'de RawValue>()? {
            if !first {
                self.sink.push(b'\n');
            }
            first = false;
            render_part(self.sink, part, depth, self.dialect).map_err(de::Error::custom)?;
        }
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        Canonical::json(self.sink, self.depth).visit_map(map)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Canonical::json(self.sink, self.depth).visit_bool(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        Canonical::json(self.sink, self.depth).visit_i64(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        Canonical::json(self.sink, self.depth).visit_u64(v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        Canonical::json(self.sink, self.depth).visit_f64(v)
    }
}

/// A media part's source: the value itself when a string, else its `url`, `data`, `file_data`
/// or `file_id` (the first of them that is a string).
fn media_source(media: &RawValue) -> Result<Option<Cow<'_, str>>, serde_json::Error> {
    if let Some(s) = as_str(media) {
        return Ok(Some(s));
    }
    for key in ["url", "data", "file_data", "file_id"] {
        if let Some(source) = member(media, key)?.and_then(as_str) {
            return Ok(Some(source));
        }
    }
    Ok(None)
}

/// A content part: a `text` string as itself; a media part (`{"type": K, K: {"url": ..}}`, or its
/// `data`, `file_data`, `file_id`, or `K: "..."`) as its kind and source between field
/// separators; anything else as its JSON. `depth`: containers around the part.
pub fn render_part(
    sink: &mut Sink,
    part: &RawValue,
    depth: usize,
    dialect: Dialect,
) -> Result<(), serde_json::Error> {
    let found = scan(part, depth, &["type", "text"], &[])?;
    if let Some(text) = found.string("text") {
        sink.extend(text.as_bytes());
        return Ok(());
    }
    let kind = found.string("type").unwrap_or("");
    if dialect == Dialect::Responses && kind == "input_image" {
        if let Some(url) = member(part, "image_url")?.and_then(as_str) {
            push_media(sink, "image_url", &url);
            return Ok(());
        }
    }
    if !kind.is_empty() {
        if let Some(media) = member(part, kind)? {
            if let Some(source) = media_source(media)? {
                push_media(sink, kind, &source);
                return Ok(());
            }
        }
    }
    sub_parse(part, Canonical::json(sink, depth)).map(|_| ())
}

pub fn push_media(sink: &mut Sink, kind: &str, source: &str) {
    sink.push(FIELD_SEP);
    sink.extend(kind.as_bytes());
    sink.push(ROLE_SEP);
    sink.extend(source.as_bytes());
    sink.push(FIELD_SEP);
}

/// What a message's `tool_calls` were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// Absent or null.
    None,
    List,
    Other,
}

/// A message's `tool_calls`: a list renders each call; anything else but null as the field's JSON.
struct ToolCalls<'s> {
    sink: &'s mut Sink,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ToolCalls<'_> {
    type Value = Calls;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Calls, D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! calls_scalar {
    ($self:ident, $method:ident, $v:expr) => {{
        $self.sink.push(FIELD_SEP);
        $self.sink.extend(b"tool_calls");
        $self.sink.push(ROLE_SEP);
        Canonical {
            sink: $self.sink,
            depth: $self.depth,
            form: Form::Scalar,
        }
        .$method($v)?;
        Ok(Calls::Other)
    }};
}

impl<'de> Visitor<'de> for ToolCalls<'_> {
    type Value = Calls;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("tool calls")
    }
    fn visit_unit<E>(self) -> Result<Calls, E> {
        Ok(Calls::None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Calls, A::Error> {
        let depth = enter(self.depth)?;
        while let Some(call) = seq.next_element::<&'de RawValue>()? {
            render_call(self.sink, call, depth).map_err(de::Error::custom)?;
        }
        Ok(Calls::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Calls, A::Error> {
        calls_scalar!(self, visit_map, map)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Calls, E> {
        calls_scalar!(self, visit_str, v)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Calls, E> {
        calls_scalar!(self, visit_bool, v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Calls, E> {
        calls_scalar!(self, visit_i64, v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Calls, E> {
        calls_scalar!(self, visit_u64, v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Calls, E> {
        calls_scalar!(self, visit_f64, v)
    }
}

/// A tool call: its function's name and arguments (the call itself stands for its function when
/// it has none). `depth`: containers around the call.
fn render_call(sink: &mut Sink, call: &RawValue, depth: usize) -> Result<(), serde_json::Error> {
    let found = scan(call, depth, &[], &["function", "name", "arguments"])?;
    let (name, arguments) = match found.raw("function") {
        Some(function) => (member(function, "name")?, member(function, "arguments")?),
        None => (found.raw("name"), found.raw("arguments")),
    };
    push_call(sink, name, arguments, depth)
}

/// `FIELD_SEP tool_call ROLE_SEP name ROLE_SEP arguments`, each a scalar (already checked).
pub fn push_call(
    sink: &mut Sink,
    name: Option<&RawValue>,
    arguments: Option<&RawValue>,
    depth: usize,
) -> Result<(), serde_json::Error> {
    sink.push(FIELD_SEP);
    sink.extend(b"tool_call");
    for value in [name, arguments] {
        sink.push(ROLE_SEP);
        if let Some(value) = value {
            sub_parse(
                value,
                Canonical {
                    sink: &mut *sink,
                    depth,
                    form: Form::Scalar,
                },
            )?;
        }
    }
    Ok(())
}
