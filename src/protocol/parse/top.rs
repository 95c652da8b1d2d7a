//! The request object's top level: the few members routing reads, each the last of its key (as in
//! a JSON object), and where in the sink each prompt-bearing member was rendered. The members
//! render as they come (an Anthropic Messages request's once the object has been read, see
//! `messages`); the prompt is put in its order (template fields, tools, instructions or system,
//! messages) at the end, in place.

use super::chat::Messages;
use super::json::{
    enter, skip_map, skip_seq, sub_parse, validate_raw, Canonical, Form, Piece, Sink, StrVisitor,
    Validate,
};
use super::messages;
use super::responses::{push_message, Input};
use super::scan::{scan, StringOrNone};
use super::{Endpoint, MESSAGE_END, ROLE_SEP};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// What the top level held.
#[derive(Debug, Default)]
pub struct Top<'de> {
    pub object: bool,
    pub model: Option<Cow<'de, str>>,
    pub stream: Option<bool>,
    /// `stream_options.include_usage` or `.continuous_usage_stats` is true: the stream is to
    /// carry `usage` (the OpenAI-style APIs send it only then).
    pub stream_usage: bool,
    /// `max_completion_tokens` (or the Responses API's `max_output_tokens`): present, and its
    /// value when an unsigned integer. It wins over `max_tokens` whenever present.
    pub max_completion_tokens: Option<Option<u64>>,
    pub max_tokens: Option<u64>,
    pub cache_salt: Option<Cow<'de, str>>,
    /// The Responses API's `previous_response_id` and `store`.
    pub previous_response_id: Option<Cow<'de, str>>,
    pub store: Option<bool>,
    /// `kv_transfer_params` was in the body (whatever its value).
    pub owned_field: bool,
    /// The prompt member was there in a routable form (a prompt, non-empty messages, an input).
    pub prompt: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Model,
    Stream,
    StreamOptions,
    MaxTokens,
    MaxCompletionTokens,
    CacheSalt,
    PreviousResponseId,
    Store,
    Prompt,
    Messages,
    Input,
    Instructions,
    Tools,
    /// A field of [`template_fields`], by its index there.
    Template(usize),
    KvTransferParams,
    /// SGLang's and vLLM's `sampling_params` (where their generate APIs keep the token limit).
    SamplingParams,
    /// A Messages request's `system`, `messages` and `tools`, captured for `messages::render`.
    AnthropicSystem,
    AnthropicMessages,
    AnthropicTools,
    Other,
}

/// Request fields that change the prompt anywhere (a chat template may read them anywhere; media
/// data fills placeholders in the text; an adapter has its own cache), in key order. They are
/// rendered first, so requests that differ in them never share a prefix.
fn template_fields(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &["chat_template", "chat_template_kwargs", "documents"],
        Endpoint::Messages => &["chat_template_kwargs"],
        Endpoint::Generate => &["audio_data", "image_data", "lora_path", "video_data"],
        Endpoint::TokenGenerate => &["features"],
        Endpoint::Completions | Endpoint::Responses => &[],
    }
}

/// The most fields [`template_fields`] names for one endpoint.
const MAX_TEMPLATE_FIELDS: usize = 4;

fn classify(endpoint: Endpoint, key: &str) -> Field {
    use Endpoint::*;
    match (endpoint, key) {
        (_, "model") => Field::Model,
        (_, "stream") => Field::Stream,
        (Completions | ChatCompletions, "stream_options") => Field::StreamOptions,
        (_, "cache_salt") => Field::CacheSalt,
        (_, "kv_transfer_params") => Field::KvTransferParams,
        (Completions | ChatCompletions | Messages, "max_tokens") => Field::MaxTokens,
        (Completions | ChatCompletions, "max_completion_tokens") => Field::MaxCompletionTokens,
        (Responses, "max_output_tokens") => Field::MaxCompletionTokens,
        (Completions, "prompt") => Field::Prompt,
        (Generate, "text" | "input_ids") => Field::Prompt,
        (TokenGenerate, "token_ids") => Field::Prompt,
        (Generate | TokenGenerate, "sampling_params") => Field::SamplingParams,
        (ChatCompletions, "messages") => Field::Messages,
        (ChatCompletions | Responses, "tools") => Field::Tools,
        (Responses, "input") => Field::Input,
        (Responses, "instructions") => Field::Instructions,
        (Responses, "previous_response_id") => Field::PreviousResponseId,
        (Responses, "store") => Field::Store,
        (Messages, "system") => Field::AnthropicSystem,
        (Messages, "messages") => Field::AnthropicMessages,
        (Messages, "tools") => Field::AnthropicTools,
        (_, k) => match template_fields(endpoint).iter().position(|t| *t == k) {
            Some(i) => Field::Template(i),
            None => Field::Other,
        },
    }
}

/// Reads the body's top level into [`Top`], rendering the prompt into `sink`.
pub struct TopSeed<'s> {
    pub endpoint: Endpoint,
    pub sink: &'s mut Sink,
}

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = Top<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

/// An unsigned integer, or `None` for anything else (checked).
struct U64OrNone;

impl<'de> DeserializeSeed<'de> for U64OrNone {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

/// A boolean, or `None` for anything else (checked).
struct BoolOrNone;

impl<'de> DeserializeSeed<'de> for BoolOrNone {
    type Value = Option<bool>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<bool>, D::Error> {
        d.deserialize_any(self)
    }
}

/// The scalar-or-`None` visitors' common arms: containers are checked, other scalars are `None`.
macro_rules! none_otherwise {
    ($t:ty) => {
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<$t, A::Error> {
            skip_seq(seq, 1).map(|_| None)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<$t, A::Error> {
            skip_map(map, 1).map(|_| None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$t, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$t, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<$t, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<$t, E> {
            Ok(None)
        }
    };
}

impl<'de> Visitor<'de> for U64OrNone {
    type Value = Option<u64>;
    none_otherwise!(Option<u64>);
    fn visit_u64<E>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(Some(v))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }
}

impl<'de> Visitor<'de> for BoolOrNone {
    type Value = Option<bool>;
    none_otherwise!(Option<bool>);
    fn visit_u64<E>(self, _: u64) -> Result<Option<bool>, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Option<bool>, E> {
        Ok(Some(v))
    }
}

/// A routable prompt member: `prompt` (completions), `messages` (chat) or `input` (Responses).
fn read_prompt<'de, A: MapAccess<'de>>(
    map: &mut A,
    field: Field,
    sink: &mut Sink,
    depth: usize,
) -> Result<bool, A::Error> {
    match field {
        Field::Prompt => map.next_value_seed(CompletionPrompt { sink, depth }),
        Field::Messages => map.next_value_seed(Messages { sink, depth }),
        _ => map.next_value_seed(Input { sink, depth }),
    }
}

/// The `max_tokens` of a generate request's `sampling_params` (SGLang's `max_new_tokens`).
fn sampling_max_tokens(
    params: &RawValue,
    endpoint: Endpoint,
    depth: usize,
) -> Result<Option<u64>, serde_json::Error> {
    validate_raw(params, depth)?;
    let key = match endpoint {
        Endpoint::Generate => "max_new_tokens",
        _ => "max_tokens",
    };
    let found = scan(params, depth, &[], &[key])?;
    match found.raw(key) {
        Some(max) => sub_parse(max, U64OrNone),
        None => Ok(None),
    }
}

/// Whether `stream_options` asks for `usage` in the stream (vLLM: `include_usage`, or
/// `continuous_usage_stats` in every chunk).
fn asks_stream_usage(options: &RawValue, depth: usize) -> Result<bool, serde_json::Error> {
    validate_raw(options, depth)?;
    const KEYS: [&str; 2] = ["include_usage", "continuous_usage_stats"];
    let found = scan(options, depth, &[], &KEYS)?;
    for key in KEYS {
        if let Some(raw) = found.raw(key) {
            if sub_parse(raw, BoolOrNone)? == Some(true) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Where each prompt-bearing member was rendered (the last of its key; `None`: absent or null).
#[derive(Default)]
struct Regions {
    template: [Option<(usize, usize)>; MAX_TEMPLATE_FIELDS],
    tools: Option<(usize, usize)>,
    instructions: Option<(usize, usize)>,
    /// `prompt`, `messages` or `input`.
    prompt: Option<(usize, usize)>,
}

impl Regions {
    /// Where a `tools` or template member was rendered.
    fn record(&mut self, field: Field, region: Option<(usize, usize)>) {
        match field {
            Field::Template(i) => {
                if let Some(slot) = self.template.get_mut(i) {
                    *slot = region;
                }
            }
            _ => self.tools = region,
        }
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = Top<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
        // Only the top object encloses its members.
        let depth = enter(0)?;
        let sink = self.sink;
        let mut top = Top {
            object: true,
            ..Top::default()
        };
        let mut regions = Regions::default();
        let mut anthropic = messages::Captured::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let at = sink.len();
            match classify(self.endpoint, &key) {
                Field::Model => top.model = map.next_value_seed(StringOrNone { depth })?,
                Field::CacheSalt => top.cache_salt = map.next_value_seed(StringOrNone { depth })?,
                Field::Stream => top.stream = map.next_value_seed(BoolOrNone)?,
                Field::StreamOptions => {
                    let options: &'de RawValue = map.next_value()?;
                    top.stream_usage =
                        asks_stream_usage(options, depth).map_err(de::Error::custom)?;
                }
                Field::PreviousResponseId => {
                    top.previous_response_id = map.next_value_seed(StringOrNone { depth })?
                }
                Field::Store => top.store = map.next_value_seed(BoolOrNone)?,
                Field::MaxTokens => top.max_tokens = map.next_value_seed(U64OrNone)?,
                Field::MaxCompletionTokens => {
                    top.max_completion_tokens = Some(map.next_value_seed(U64OrNone)?);
                }
                Field::KvTransferParams => {
                    top.owned_field = true;
                    map.next_value_seed(Validate { depth })?;
                }
                field @ (Field::Prompt | Field::Messages | Field::Input) => {
                    top.prompt = read_prompt(&mut map, field, sink, depth)?;
                    regions.prompt = Some((at, sink.len()));
                }
                Field::Instructions => {
                    let text = map.next_value_seed(StringOrNone { depth })?;
                    regions.instructions = text.filter(|t| !t.is_empty()).map(|text| {
                        push_message(sink, "system", &text);
                        (at, sink.len())
                    });
                }
                field @ (Field::Tools | Field::Template(_)) => {
                    let null = map.next_value_seed(Canonical::json(&mut *sink, depth))?;
                    if null {
                        sink.truncate(at);
                    }
                    regions.record(field, (!null).then(|| (at, sink.len())));
                }
                Field::SamplingParams => {
                    let params: &'de RawValue = map.next_value()?;
                    top.max_tokens = sampling_max_tokens(params, self.endpoint, depth)
                        .map_err(de::Error::custom)?;
                }
                Field::AnthropicSystem | Field::AnthropicMessages | Field::AnthropicTools => {
                    let raw: &'de RawValue = map.next_value()?;
                    validate_raw(raw, depth).map_err(de::Error::custom)?;
                    let slot = match classify(self.endpoint, &key) {
                        Field::AnthropicSystem => &mut anthropic.system,
                        Field::AnthropicMessages => &mut anthropic.messages,
                        _ => &mut anthropic.tools,
                    };
                    *slot = Some(raw);
                }
                Field::Other => map.next_value_seed(Validate { depth })?,
            }
        }
        if self.endpoint == Endpoint::Messages {
            let rendered = messages::render(sink, anthropic, depth).map_err(de::Error::custom)?;
            regions.tools = rendered.tools;
            regions.instructions = rendered.system;
            regions.prompt = rendered.messages;
            top.prompt = rendered.routable;
        }
        assemble(sink, &regions, template_fields(self.endpoint));
        Ok(top)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top<'de>, A::Error> {
        skip_seq(seq, 0).map(|_| Top::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
    fn visit_unit<E>(self) -> Result<Top<'de>, E> {
        Ok(Top::default())
    }
}

/// Puts the rendered members in prompt order and drops what a later duplicate replaced:
/// `template ROLE_SEP {fields} MESSAGE_END`, `tools ROLE_SEP tools MESSAGE_END`, the instructions
/// (or system) message, then the prompt. `fields`: the names of the template regions.
fn assemble(sink: &mut Sink, regions: &Regions, fields: &'static [&'static str]) {
    let mut pieces: Vec<Piece> = Vec::with_capacity(16);
    if regions.template.iter().any(Option::is_some) {
        pieces.extend([
            Piece::Bytes(b"template"),
            Piece::Bytes(&[ROLE_SEP]),
            Piece::Bytes(b"{"),
        ]);
        let mut first = true;
        for (key, region) in fields.iter().zip(&regions.template) {
            if let Some((s, e)) = region {
                if !first {
                    pieces.push(Piece::Bytes(b","));
                }
                first = false;
                pieces.extend([
                    Piece::Bytes(b"\""),
                    Piece::Bytes(key.as_bytes()),
                    Piece::Bytes(b"\":"),
                    Piece::Range(*s, *e),
                ]);
            }
        }
        pieces.extend([Piece::Bytes(b"}"), Piece::Bytes(&[MESSAGE_END])]);
    }
    if let Some((s, e)) = regions.tools {
        pieces.extend([
            Piece::Bytes(b"tools"),
            Piece::Bytes(&[ROLE_SEP]),
            Piece::Range(s, e),
            Piece::Bytes(&[MESSAGE_END]),
        ]);
    }
    for (s, e) in [regions.instructions, regions.prompt].into_iter().flatten() {
        pieces.push(Piece::Range(s, e));
    }
    if let [Piece::Range(0, e)] = pieces.as_slice() {
        if *e == sink.len() {
            return; // the usual case: only the prompt, nothing else rendered
        }
    }
    sink.arrange(0, &pieces);
}

/// A top-level key, without allocating unless it had escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(StrVisitor)
    }
}

/// A completion's `prompt`: a string as itself; a non-empty list item by item (strings as their
/// text, anything else as its JSON: token ids) separated by `MESSAGE_END`. Its value: whether it
/// was one of those.
struct CompletionPrompt<'s> {
    sink: &'s mut Sink,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for CompletionPrompt<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CompletionPrompt<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.sink.extend(v.as_bytes());
        Ok(true)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let depth = enter(self.depth)?;
        let mut any = false;
        loop {
            let at = self.sink.len();
            if any {
                self.sink.push(MESSAGE_END);
            }
            let item = Canonical {
                sink: &mut *self.sink,
                depth,
                form: Form::Text,
            };
            if seq.next_element_seed(item)?.is_none() {
                self.sink.truncate(at);
                return Ok(any);
            }
            any = true;
        }
    }
    false_otherwise!();
}
