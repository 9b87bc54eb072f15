//! OpenAI Chat Completions, and every server that speaks it: vLLM, llama.cpp's
//! `llama-server`, Ollama, LM Studio, OpenRouter. Point [`OpenAi::base_url`] at it.
//!
//! Mapping:
//!
//! | tower-agent | Chat Completions |
//! |---|---|
//! | `ModelRequest::system`, system messages | `system` messages |
//! | user text | `user` message |
//! | assistant text and calls | `assistant` message with `content` and `tool_calls` |
//! | each tool result | a `tool` message with `tool_call_id` (the API has no error flag: the content says it) |
//! | reasoning parts | not sent (the API has no field for them) |
//! | `reasoning_content` / `reasoning` of a response (DeepSeek, vLLM, OpenRouter) | a reasoning part |
//! | `GenerationOptions` | `temperature`, `top_p`, `max_tokens`, `stop`, `tool_choice` |
//! | `usage.prompt_tokens_details.cached_tokens` | `Usage::cached_input_tokens` |
//!
//! Streaming (the default) asks for `stream_options.include_usage`; text and reasoning deltas
//! go to the run's event sink as they arrive, tool-call argument fragments are joined by
//! index, and the response is the whole message. A stream that ends before a `finish_reason`
//! or `[DONE]`, a chunk that is not JSON, or an `error` chunk is an error.
//!
//! ```no_run
//! use tower::ServiceExt;
//! use tower_agent_core::{Error, Message, ModelRequest};
//! use tower_agent_providers::OpenAi;
//!
//! # async fn demo() -> Result<(), Error> {
//! // A local llama-server; the key from OPENAI_API_KEY when set.
//! let model = OpenAi::new("qwen3").base_url("http://127.0.0.1:8080/v1");
//! let res = model.oneshot(ModelRequest::new(vec![Message::user("hi")])).await?;
//! println!("{}", res.message.text());
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    ContentPart, Error, ErrorKind, FinishReason, Message, ModelRequest, ModelResponse, Role,
    ToolCall, ToolChoice, Usage,
};
use tower_service::Service;

use crate::classify::stream_error;
use crate::encode::{self, Frame};
use crate::http::{
    self, Client, Delta, StreamDecoder, Wire, invalid, secret_header, text_of, truncated,
};
use crate::key::ApiKey;

const PROVIDER: &str = "openai";

/// A model service over OpenAI Chat Completions; see the [module docs](self).
///
/// Cloning is cheap (the configuration and the HTTP client are shared). `poll_ready` is always
/// ready: put tower's `ConcurrencyLimit` or `RateLimit` around it to bound calls.
#[derive(Clone, Debug)]
pub struct OpenAi {
    client: Arc<Client<OpenAiWire>>,
}

#[derive(Clone)]
struct OpenAiWire {
    model: String,
    base_url: String,
    key: Option<ApiKey>,
}

impl OpenAi {
    /// The default base URL.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// A service for `model`, streaming. The key comes from `OPENAI_API_KEY` and the base URL
    /// from `OPENAI_BASE_URL` when they are set.
    pub fn new(model: impl Into<String>) -> Self {
        let base_url = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| Self::DEFAULT_BASE_URL.to_owned());
        Self {
            client: Arc::new(Client {
                wire: OpenAiWire {
                    model: model.into(),
                    base_url: base_url.trim_end_matches('/').to_owned(),
                    key: ApiKey::from_env("OPENAI_API_KEY"),
                },
                http: http::default_http(),
                stream: true,
                extra: HeaderMap::new(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Client<OpenAiWire>)) -> Self {
        f(Arc::make_mut(&mut self.client));
        self
    }

    /// The server's base URL, up to and including `/v1`.
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.edit(|c| c.wire.base_url = url.trim_end_matches('/').to_owned())
    }

    /// The API key (instead of `OPENAI_API_KEY`).
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.wire.key = Some(key))
    }

    /// Stream the answer (the default) or not.
    pub fn streaming(self, stream: bool) -> Self {
        self.edit(|c| c.stream = stream)
    }

    /// The reqwest client to use (proxies, timeouts, TLS roots).
    pub fn http_client(self, http: reqwest::Client) -> Self {
        self.edit(|c| c.http = http)
    }

    /// Send `name: value` with every request (e.g. OpenRouter's `HTTP-Referer`).
    ///
    /// # Errors
    ///
    /// `BadRequest` when the name or the value is not valid in a header.
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, Error> {
        http::add_header(&mut Arc::make_mut(&mut self.client).extra, name, value)?;
        Ok(self)
    }

    /// The request body this service sends for `req` (streamed or not, as configured): for
    /// logging, tests and benchmarks. Like a call, it reuses the bytes of the messages it
    /// encoded before for the same run (`req.ctx`).
    ///
    /// # Errors
    ///
    /// A request this provider cannot express.
    pub fn request_body(&self, req: &ModelRequest) -> Result<Vec<u8>, Error> {
        http::request_body(&self.client, req)
    }

    /// The response a recorded body gives, as a call would return it: a server-sent event
    /// stream when the service streams, a whole JSON body otherwise. No event is emitted.
    ///
    /// # Errors
    ///
    /// As a call: a broken stream, an error event, invalid JSON.
    pub fn parse_response(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        http::parse_recorded(&self.client, body)
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.client.wire.model
    }
}

impl Service<ModelRequest> for OpenAi {
    type Response = ModelResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ModelResponse, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        http::call(Arc::clone(&self.client), req)
    }
}

impl std::fmt::Debug for OpenAiWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        http::debug_wire(f, &self.model, &self.base_url, self.key.as_ref())
    }
}

impl Wire for OpenAiWire {
    const PROVIDER: &'static str = PROVIDER;

    fn model(&self) -> &str {
        &self.model
    }

    fn key(&self) -> Option<&ApiKey> {
        self.key.as_ref()
    }

    fn url(&self, _stream: bool) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.key {
            let bearer = format!("Bearer {}", key.expose());
            headers.extend(secret_header("authorization", &bearer));
        }
        headers
    }

    fn frame(&self, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
        frame(&self.model, req, stream)
    }

    fn encode_message(
        &self,
        message: &Message,
        out: &mut Vec<u8>,
    ) -> Result<Option<&'static str>, Error> {
        let mut items = Vec::with_capacity(2);
        wire_messages(message, &mut items);
        let mut first = true;
        for item in &items {
            encode::item(out, &mut first, item, PROVIDER)?;
        }
        Ok(None)
    }

    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        let response: WireResponse =
            serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
        let usage = response.usage.map(Into::into).unwrap_or_default();
        let Some(choice) = response.choices.into_iter().next() else {
            return Err(Error::new(
                ErrorKind::EmptyResponse,
                format!("{PROVIDER}: the response has no choices"),
            ));
        };
        let message = choice.message;
        let reasoning = message.reasoning_content.or(message.reasoning);
        let calls = message
            .tool_calls
            .into_iter()
            .map(|c| ToolCall::raw(c.id, c.function.name, c.function.arguments));
        Ok(response_of(
            reasoning,
            message.content,
            calls,
            choice.finish_reason.as_deref(),
            usage,
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}

// ------------------------------------------------------------------------------- request

#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
}

/// The fields after the messages.
#[derive(Serialize)]
struct Rest<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: Cow<'a, str>,
    },
    Assistant {
        content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolSpec<'a>,
}

#[derive(Serialize)]
struct WireToolSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn frame(model: &str, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
    let mut frame = Frame::around(&Head { model }, "messages", &rest(req, stream), PROVIDER)?;
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        let system = WireMessage::System {
            content: Cow::Borrowed(system),
        };
        encode::item(&mut frame.head, &mut true, &system, PROVIDER)?;
        frame.head_has_items = true;
    }
    Ok(frame)
}

fn rest(req: &ModelRequest, stream: bool) -> Rest<'_> {
    let options = &req.options;
    Rest {
        tools: req
            .tools
            .iter()
            .map(|spec| WireTool {
                kind: "function",
                function: WireToolSpec {
                    name: &spec.name,
                    description: &spec.description,
                    parameters: &spec.parameters,
                },
            })
            .collect(),
        tool_choice: options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Tool(name) => {
                serde_json::json!({ "type": "function", "function": { "name": name } })
            }
        }),
        temperature: options.temperature,
        top_p: options.top_p,
        max_tokens: options.max_tokens,
        stop: &options.stop,
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
    }
}

fn wire_messages<'a>(message: &'a Message, out: &mut Vec<WireMessage<'a>>) {
    // Results first: a result in a user message (a stored Anthropic-style turn) answers the
    // calls before it.
    for result in message.tool_results() {
        out.push(WireMessage::Tool {
            tool_call_id: &result.call_id,
            content: &result.content,
        });
    }
    let text = text_of(message);
    match message.role {
        Role::System if !text.is_empty() => out.push(WireMessage::System { content: text }),
        Role::User if !text.is_empty() => out.push(WireMessage::User { content: text }),
        Role::Assistant => {
            let tool_calls: Vec<WireCall<'a>> = message
                .tool_calls()
                .map(|call| WireCall {
                    id: &call.id,
                    kind: "function",
                    function: WireFunction {
                        name: &call.name,
                        arguments: if call.arguments.trim().is_empty() {
                            "{}"
                        } else {
                            &call.arguments
                        },
                    },
                })
                .collect();
            if tool_calls.is_empty() && text.is_empty() {
                return;
            }
            out.push(WireMessage::Assistant {
                content: (!text.is_empty()).then_some(text),
                tool_calls,
            });
        }
        _ => {}
    }
}

// ------------------------------------------------------------------------------ response

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireResponseMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireResponseMessage {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireResponseCall>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct WireResponseCall {
    #[serde(default)]
    id: String,
    function: WireResponseFunction,
}

#[derive(Deserialize)]
struct WireResponseFunction {
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    prompt_tokens_details: Option<WireUsageDetails>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsageDetails {
    #[serde(default)]
    cached_tokens: u64,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Usage {
        Usage::new(usage.prompt_tokens, usage.completion_tokens)
            .with_cached(usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens))
    }
}

fn finish_reason(reason: Option<&str>, has_calls: bool) -> FinishReason {
    match reason {
        Some("stop") | None if !has_calls => FinishReason::Stop,
        Some("tool_calls" | "function_call") | None => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some("stop") => FinishReason::ToolCalls,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}

fn response_of(
    reasoning: Option<String>,
    text: Option<String>,
    calls: impl Iterator<Item = ToolCall>,
    reason: Option<&str>,
    usage: Usage,
) -> ModelResponse {
    let mut parts = Vec::new();
    if let Some(text) = reasoning.filter(|r| !r.is_empty()) {
        parts.push(ContentPart::Reasoning {
            text,
            signature: None,
        });
    }
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        parts.push(ContentPart::Text { text });
    }
    parts.extend(calls.map(ContentPart::ToolCall));
    let has_calls = parts.iter().any(|p| matches!(p, ContentPart::ToolCall(_)));
    let mut response = ModelResponse::from_parts(parts).with_usage(usage);
    response.finish_reason = finish_reason(reason, has_calls);
    response
}

// ------------------------------------------------------------------------------- stream

#[derive(Default)]
struct Decoder {
    text: String,
    reasoning: String,
    /// Calls by their stream index: id, name, argument fragments joined.
    calls: Vec<(usize, ToolCall)>,
    finish: Option<String>,
    usage: Option<WireUsage>,
    done: bool,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: ChunkDelta,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChunkDelta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ChunkCall>,
}

#[derive(Deserialize)]
struct ChunkCall {
    #[serde(default)]
    index: usize,
    id: Option<String>,
    function: Option<ChunkFunction>,
}

#[derive(Deserialize)]
struct ChunkFunction {
    name: Option<String>,
    arguments: Option<String>,
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, _event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Chunk =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream chunk", e))?;
        if chunk.error.is_some() {
            return Err(stream_error(PROVIDER, data, None));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            let delta = choice.delta;
            if let Some(text) = delta
                .reasoning_content
                .or(delta.reasoning)
                .filter(|t| !t.is_empty())
            {
                self.reasoning.push_str(&text);
                deltas.push(Delta::Reasoning(text));
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text.push_str(&text);
                deltas.push(Delta::Text(text));
            }
            for fragment in delta.tool_calls {
                let at = match self.calls.iter().position(|(i, _)| *i == fragment.index) {
                    Some(at) => at,
                    None => {
                        self.calls.push((fragment.index, ToolCall::raw("", "", "")));
                        self.calls.len() - 1
                    }
                };
                let call = &mut self.calls[at].1;
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name {
                        call.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                self.finish = choice.finish_reason;
            }
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if !self.done && self.finish.is_none() {
            return Err(truncated(PROVIDER));
        }
        let mut calls = self.calls;
        calls.sort_by_key(|(index, _)| *index);
        Ok(response_of(
            Some(self.reasoning),
            Some(self.text),
            calls.into_iter().map(|(_, call)| call),
            self.finish.as_deref(),
            self.usage.map(Into::into).unwrap_or_default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tower_agent_core::{ToolResult, ToolSpec};

    fn encoded(req: &ModelRequest) -> Value {
        let wire = OpenAiWire {
            model: "m".into(),
            base_url: "http://x/v1".into(),
            key: None,
        };
        serde_json::from_slice(&encode::body(&wire, req, true, false).expect("encodes"))
            .expect("json")
    }

    #[test]
    fn a_conversation_with_calls_and_results() {
        let call = ToolCall::new("c1", "add", json!({"a": 1}));
        let mut req = ModelRequest::new(vec![
            Message::user("add"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::Reasoning {
                        text: "hmm".into(),
                        signature: None,
                    },
                    ContentPart::ToolCall(call.clone()),
                ],
            },
            Message::tool_result(ToolResult::error(&call, "boom")),
        ]);
        req.system = Some("sys".into());
        req.tools = Arc::from(vec![ToolSpec::new(
            "add",
            "adds",
            json!({"type": "object"}),
        )]);
        req.options.max_tokens = Some(100);
        req.options.tool_choice = Some(ToolChoice::Tool("add".into()));
        assert_eq!(
            encoded(&req),
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "add"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "c1", "content": "boom"}
                ],
                "tools": [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "add"}},
                "max_tokens": 100,
                "stream": true,
                "stream_options": {"include_usage": true}
            })
        );
    }

    #[test]
    fn stream_fragments_are_joined_by_index() {
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        let mut deltas = Vec::new();
        for data in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"t2","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"t1","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#,
            "[DONE]",
        ] {
            decoder.feed("", data, &mut deltas).expect("a valid chunk");
        }
        assert!(decoder.is_done());
        assert_eq!(deltas.len(), 2);
        let res = decoder.finish().expect("complete");
        assert_eq!(res.message.text(), "Hello");
        let calls: Vec<_> = res
            .message
            .tool_calls()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("a", "t1", ""), ("b", "t2", "{\"x\":1}")]);
        assert_eq!(res.usage, Usage::new(9, 3).with_cached(4));
        assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn reasoning_of_compatible_servers_is_kept_first() {
        let wire = OpenAiWire {
            model: "deepseek-reasoner".into(),
            base_url: "http://x/v1".into(),
            key: None,
        };
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"42","reasoning_content":"6 times 7"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
        let res = wire.decode(body).expect("decodes");
        assert_eq!(
            res.message.content,
            vec![
                ContentPart::Reasoning {
                    text: "6 times 7".into(),
                    signature: None
                },
                ContentPart::Text { text: "42".into() },
            ]
        );
        let empty = wire.decode(br#"{"choices":[]}"#).expect_err("no choices");
        assert_eq!(empty.kind(), ErrorKind::EmptyResponse);
    }

    #[test]
    fn a_broken_stream_is_an_error() {
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        let mut deltas = Vec::new();
        decoder
            .feed(
                "",
                r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
                &mut deltas,
            )
            .expect("valid");
        assert_eq!(decoder.finish().expect_err("cut").kind(), ErrorKind::Server);
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        assert!(decoder.feed("", "{not json", &mut deltas).is_err());
        assert!(
            decoder
                .feed(
                    "",
                    r#"{"error":{"message":"boom","type":"server_error"}}"#,
                    &mut deltas
                )
                .is_err()
        );
    }
}
