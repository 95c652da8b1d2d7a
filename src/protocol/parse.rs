//! The view of an inference request that routing needs: which model, and the prefix-relevant prompt
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
//! left for the default load balancer. A Responses API request (`/v1/responses`) renders as the
//! chat messages vLLM makes of it: `tools`, `instructions` as a system message, then its `input`
//! (see `responses`), so the same conversation renders alike through either API. An Anthropic
//! Messages request (`/v1/messages`) renders as the chat request vLLM makes of it (see
//! `messages`). SGLang's `/generate` (`text` or `input_ids`) and vLLM's token-in
//! `/inference/v1/generate` (`token_ids`) render as a completion's prompt does, after what changes
//! the prompt anywhere (an adapter's `lora_path`, media data, multimodal `features`); they may
//! name no model.
//!
//! **How, and in how much memory.** No JSON tree is built (one costs up to ~100 bytes per byte of
//! a hostile body: a list of `{"":0}` objects). One pass of serde_json's deserializer reads the
//! body, with a visitor per shape that renders straight into the prompt bytes (`json::Sink`);
//! members routing does not read are checked and dropped as they pass. The body is refused as
//! invalid JSON exactly when `serde_json::Value` refused it (`json::Validate`), and a member
//! repeated counts by its last occurrence, as in a parsed object. What the parse holds (the
//! prompt, and what it holds while re-ordering a message or object whose members came out of
//! rendering order) is bounded by a budget (`max_parse_bytes`): past it nothing more is kept, the
//! body is still checked, and a body that would have been routed is refused
//! ([`ParseError::OverBudget`]).

/// The arms of a visitor whose value says whether it found what it renders: an object is checked
/// and skipped, a number, boolean or null is not it (`false`). Serde's defaults would refuse them
/// as invalid types instead.
macro_rules! false_otherwise {
    () => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
            skip_map(map, self.depth).map(|_| false)
        }
        fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
    };
}

mod chat;
pub(crate) mod json;
mod messages;
mod pyjson;
#[cfg(any(test, feature = "testing"))]
pub mod reference;
mod responses;
mod scan;
mod top;

use serde::de::DeserializeSeed;

/// Paths kvroute routes; anything else passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
    /// The OpenAI Responses API.
    Responses,
    /// The Anthropic Messages API, as vLLM serves it.
    Messages,
    /// SGLang's native `/generate` (`text` or `input_ids`).
    Generate,
    /// vLLM's token-in API, `/inference/v1/generate` (`token_ids`).
    TokenGenerate,
}

impl Endpoint {
    /// Whether a streamed response carries `usage` (what the pod's cache served): the
    /// OpenAI-style completions send it only when `stream_options` asks (`asked`; vLLM, SGLang,
    /// llama.cpp alike); the Responses API (`response.completed`), Messages (`message_start`)
    /// and the generate APIs (`meta_info`, the final output) always do.
    pub fn stream_reports_usage(self, asked: bool) -> bool {
        match self {
            Endpoint::Completions | Endpoint::ChatCompletions => asked,
            _ => true,
        }
    }

    /// Matches the path as the engines' servers may read it (`super::path::normalize`: no query,
    /// percent-decoded, no empty or dot segments), without `prefix` (the configured
    /// `api_path_prefix`, `""` for none) where it starts with it.
    pub fn from_path(path: &str, prefix: &str) -> Option<Endpoint> {
        let path = super::path::normalize(path);
        match without_prefix(&path, prefix) {
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            "/generate" => Some(Endpoint::Generate),
            "/inference/v1/generate" => Some(Endpoint::TokenGenerate),
            _ => None,
        }
    }

    /// Whether inline P/D can split it: the KV handle is read from the prefill pod's answer, which
    /// vLLM gives for completions and chat only.
    pub fn splits_inline(self) -> bool {
        matches!(self, Endpoint::Completions | Endpoint::ChatCompletions)
    }

    /// Whether the body may name no model: SGLang's `/generate` has no such field and vLLM's
    /// token-in API makes it optional (the pod serves its one model).
    fn model_optional(self) -> bool {
        matches!(self, Endpoint::Generate | Endpoint::TokenGenerate)
    }
}

/// `path` without `prefix` (the configured `api_path_prefix`) where it starts with it at a path
/// segment's boundary; `path` itself otherwise. Pods serve the unprefixed paths (the route strips
/// the prefix, or the server serves both, as vLLM's `--root-path` does), so kvroute's own calls
/// to them use those.
pub fn without_prefix<'p>(path: &'p str, prefix: &str) -> &'p str {
    match path.strip_prefix(prefix) {
        Some(rest) if !prefix.is_empty() && rest.starts_with('/') => rest,
        _ => path,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    /// Empty when the body names none where it need not ([`Endpoint::TokenGenerate`],
    /// [`Endpoint::Generate`]): any pod of the pool may serve it.
    pub model: String,
    pub stream: bool,
    /// The response carries `usage` even when streamed ([`Endpoint::stream_reports_usage`]).
    pub stream_usage: bool,
    /// `max_completion_tokens`, else `max_tokens` (`max_output_tokens` for the Responses API,
    /// `sampling_params.max_new_tokens` for SGLang's `/generate`, `sampling_params.max_tokens` for
    /// vLLM's token-in API).
    pub max_tokens: Option<u64>,
    pub cache_salt: Option<String>,
    /// The Responses API: the stored response this one continues, and whether the server is to
    /// store this one (`store`, default true).
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// Canonical prompt bytes (role-tagged for chat).
    pub prompt: Vec<u8>,
}

/// Why a body was not routed by prefix; each becomes a pass-through with a counted reason, but
/// `OverBudget`, which is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    NotJson,
    NotAnObject,
    MissingModel,
    MissingPrompt,
    /// A routable body whose parse needs more than the budget.
    OverBudget,
}

impl ParseError {
    pub fn as_str(&self) -> &'static str {
        match self {
            ParseError::NotJson => "body is not valid JSON",
            ParseError::NotAnObject => "body is not a JSON object",
            ParseError::MissingModel => "`model` is missing or not a string",
            ParseError::MissingPrompt => {
                "no `prompt` / `messages` / `input` / `text` / `input_ids` / `token_ids` to route on"
            }
            ParseError::OverBudget => {
                "reading the body for routing needs more than max_parse_bytes"
            }
        }
    }
}

/// A parse's outcome, and what the body held that kvroute must not pass on.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub view: Result<RequestView, ParseError>,
    /// The body is an object with a `kv_transfer_params` member (whatever its value).
    pub owned_field: bool,
}

/// Between a part's tag and its text.
const ROLE_SEP: u8 = 0x1f;
/// Ends a message (or a leading part). Public for the tokenizer, which memoizes per message.
pub(crate) const MESSAGE_END: u8 = 0x1e;
/// Opens a further field of a message (`name`, `tool_call_id`, a tool call).
const FIELD_SEP: u8 = 0x1d;

/// [`parse_request`] without a budget.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<RequestView, ParseError> {
    parse_request(endpoint, body, usize::MAX).view
}

/// Parses `body`, holding at most `budget` bytes for the prompt and what re-ordering it needs.
pub fn parse_request(endpoint: Endpoint, body: &[u8], budget: usize) -> Parsed {
    let mut sink = json::Sink::new(body.len(), budget);
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = top::TopSeed {
        endpoint,
        sink: &mut sink,
    }
    .deserialize(&mut de);
    let top = match top.and_then(|t| de.end().map(|_| t)) {
        Ok(top) => top,
        Err(_) => {
            return Parsed {
                view: Err(ParseError::NotJson),
                owned_field: false,
            }
        }
    };
    let owned_field = top.owned_field;
    let model = match top.model {
        None if endpoint.model_optional() => Some(std::borrow::Cow::Borrowed("")),
        model => model,
    };
    let view = if !top.object {
        Err(ParseError::NotAnObject)
    } else if let Some(model) = model {
        if !top.prompt {
            Err(ParseError::MissingPrompt)
        } else if sink.over() {
            Err(ParseError::OverBudget)
        } else {
            Ok(RequestView {
                model: model.into_owned(),
                stream: top.stream.unwrap_or(false),
                stream_usage: endpoint.stream_reports_usage(top.stream_usage),
                max_tokens: match top.max_completion_tokens {
                    Some(max) => max,
                    None => top.max_tokens,
                },
                cache_salt: top.cache_salt.map(|s| s.into_owned()),
                previous_response_id: top.previous_response_id.map(|s| s.into_owned()),
                store: top.store.unwrap_or(true),
                prompt: sink.into_bytes(),
            })
        }
    } else {
        Err(ParseError::MissingModel)
    };
    Parsed { view, owned_field }
}

#[cfg(test)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stream_reports_usage_where_its_api_always_does_or_the_client_asked() {
        let stream = |endpoint, body: serde_json::Value| {
            parse(endpoint, body.to_string().as_bytes())
                .map(|v| v.stream_usage)
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        let chat = |options| {
            json!({"model": "m", "stream": true, "stream_options": options,
                   "messages": [{"role": "user", "content": "hi"}]})
        };
        let ep = Endpoint::ChatCompletions;
        assert!(!stream(ep, chat(json!(null))));
        assert!(!stream(ep, chat(json!({"include_usage": "yes"}))));
        assert!(!stream(ep, chat(json!({"include_usage": false}))));
        assert!(stream(ep, chat(json!({"include_usage": true}))));
        assert!(stream(ep, chat(json!({"continuous_usage_stats": true}))));
        let completion = json!({"model": "m", "prompt": "p", "stream": true,
                                "stream_options": {"include_usage": true}});
        assert!(stream(Endpoint::Completions, completion));
        let responses = json!({"model": "m", "input": "hi", "stream": true});
        assert!(
            stream(Endpoint::Responses, responses),
            "response.completed carries it"
        );
        // A malformed member is refused as any other.
        let bad = br#"{"model":"m","stream_options":{"include_usage":tru},"prompt":"p"}"#;
        assert!(parse(Endpoint::Completions, bad).is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(
            Endpoint::from_path("/v1/completions", ""),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions?x=1", ""),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(Endpoint::from_path("/v1/models", ""), None);
        assert_eq!(Endpoint::from_path("/metrics", ""), None);
        assert_eq!(
            Endpoint::from_path("/v1/messages", ""),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            Endpoint::from_path("/generate/", ""),
            Some(Endpoint::Generate)
        );
        assert_eq!(
            Endpoint::from_path("/inference/v1/generate", ""),
            Some(Endpoint::TokenGenerate)
        );
    }

    #[test]
    fn a_configured_prefix_is_stripped_and_nothing_else_is() {
        let prefix = "/openai";
        assert_eq!(
            Endpoint::from_path("/openai/v1/chat/completions?x=1", prefix),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            Endpoint::from_path("/openai/v1/messages/", prefix),
            Some(Endpoint::Messages)
        );
        assert_eq!(
            Endpoint::from_path("/v1/completions", prefix),
            Some(Endpoint::Completions),
            "the unprefixed path still routes"
        );
        assert_eq!(
            Endpoint::from_path("/openaiv1/completions", prefix),
            None,
            "a prefix ends at a path segment"
        );
        assert_eq!(Endpoint::from_path("/other/v1/completions", prefix), None);
        assert_eq!(
            Endpoint::from_path("/openai/v1/completions", ""),
            None,
            "no prefix configured"
        );
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
    fn sglang_generate_renders_its_text_or_ids_as_a_completion_prompt() {
        let text = parse(
            Endpoint::Generate,
            br#"{"text":"hello there","sampling_params":{"max_new_tokens":9,"temperature":0},"stream":true}"#,
        )
        .unwrap();
        let completion = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hello there"}"#,
        )
        .unwrap();
        assert_eq!(text.prompt, completion.prompt);
        assert_eq!(
            (text.model.as_str(), text.max_tokens, text.stream),
            ("", Some(9), true),
            "no model named: any pod of the pool serves it"
        );
        let ids = parse(
            Endpoint::Generate,
            br#"{"model":"m","input_ids":[1,2,3],"sampling_params":{"max_tokens":4}}"#,
        )
        .unwrap();
        let completion_ids =
            parse(Endpoint::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.prompt, completion_ids.prompt);
        assert_eq!(ids.model, "m");
        assert_eq!(ids.max_tokens, None, "SGLang's limit is max_new_tokens");
        let batch = parse(Endpoint::Generate, br#"{"text":["a","b"]}"#).unwrap();
        assert_eq!(batch.prompt, b"a\x1eb");
        // What changes the prompt anywhere leads it: another adapter or image shares nothing.
        let adapter = |name: &str, image: &str| {
            let body =
                serde_json::json!({"text": "hello there", "lora_path": name, "image_data": image});
            parse(Endpoint::Generate, body.to_string().as_bytes())
                .unwrap()
                .prompt
        };
        assert_ne!(adapter("sql", "a.png")[0], b'h');
        assert_ne!(adapter("sql", "a.png"), adapter("chat", "a.png"));
        assert_ne!(adapter("sql", "a.png"), adapter("sql", "b.png"));
        assert_eq!(adapter("sql", "a.png"), adapter("sql", "a.png"));
        assert_eq!(
            parse(Endpoint::Generate, br#"{"input_embeds":[[0.1]]}"#),
            Err(ParseError::MissingPrompt)
        );
    }

    #[test]
    fn vllm_token_generate_renders_its_ids_as_a_completion_prompt() {
        let view = parse(
            Endpoint::TokenGenerate,
            br#"{"token_ids":[1,2,3],"sampling_params":{"max_tokens":8,"max_new_tokens":1},"cache_salt":"t","request_id":"r"}"#,
        )
        .unwrap();
        let completion =
            parse(Endpoint::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(view.prompt, completion.prompt);
        assert_eq!(
            (
                view.model.as_str(),
                view.max_tokens,
                view.cache_salt.as_deref()
            ),
            ("", Some(8), Some("t"))
        );
        let named = parse(
            Endpoint::TokenGenerate,
            br#"{"model":"m","token_ids":[1,2,3],"sampling_params":{}}"#,
        )
        .unwrap();
        assert_eq!((named.model.as_str(), named.max_tokens), ("m", None));
        let with_features = parse(
            Endpoint::TokenGenerate,
            br#"{"token_ids":[1,2,3],"features":{"mm_hashes":["h1"]}}"#,
        )
        .unwrap();
        assert_ne!(with_features.prompt, view.prompt);
        assert!(with_features.prompt.ends_with(&view.prompt));
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

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
mod equivalence;
