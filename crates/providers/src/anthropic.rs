//! Anthropic Messages.
//!
//! Mapping:
//!
//! | tower-agent | Messages API |
//! |---|---|
//! | `ModelRequest::system`, system messages | `system` (joined by blank lines) |
//! | user text, tool results (tool messages) | `user` turns; consecutive ones merged into one turn |
//! | a tool result | a `tool_result` block with `is_error` |
//! | assistant text, calls | an `assistant` turn with `text` and `tool_use` blocks (arguments that are not a JSON object are sent as `{"_arguments": "<text>"}`) |
//! | reasoning with a signature | a `thinking` block, sent back unchanged (the API requires it during tool use) |
//! | reasoning whose signature starts with `redacted_thinking:` | a `redacted_thinking` block |
//! | reasoning without a signature (from another provider) | not sent |
//! | `GenerationOptions` | `max_tokens` (required: [`Anthropic::max_tokens`] when the request has none, default 4096), `temperature`, `top_p`, `stop_sequences`, `tool_choice` |
//! | `usage` | `input_tokens` = input + cache reads + cache writes; `cached_input_tokens` = cache reads |
//!
//! Streaming (the default): `text_delta` and `thinking_delta` go to the run's event sink as
//! they arrive, `input_json_delta` fragments are joined per block, the response is the whole
//! message. An `error` event inside the HTTP 200 stream (`overloaded_error`) is a typed error
//! (`Overloaded`); a stream that ends before `message_stop` is an error.
//!
//! ```no_run
//! use tower::ServiceExt;
//! use tower_agent_core::{Error, Message, ModelRequest};
//! use tower_agent_providers::Anthropic;
//!
//! # async fn demo() -> Result<(), Error> {
//! let model = Anthropic::new("claude-sonnet-4-5"); // the key from ANTHROPIC_API_KEY
//! let res = model.oneshot(ModelRequest::new(vec![Message::user("hi")])).await?;
//! println!("{}", res.message.text());
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};

use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    ContentPart, Error, FinishReason, Message, ModelRequest, ModelResponse, Role, ToolCall,
    ToolChoice, Usage,
};
use tower_service::Service;

use crate::classify::stream_error;
use crate::encode::{self, Frame};
use crate::http::{
    self, Client, Delta, StreamDecoder, Wire, invalid, secret_header, text_of, truncated,
};
use crate::key::ApiKey;

const PROVIDER: &str = "anthropic";

/// The prefix of a reasoning part's signature that marks a `redacted_thinking` block.
pub const REDACTED: &str = "redacted_thinking:";

/// A model service over Anthropic Messages; see the [module docs](self).
///
/// Cloning is cheap. `poll_ready` is always ready.
#[derive(Clone, Debug)]
pub struct Anthropic {
    client: Arc<Client<AnthropicWire>>,
}

#[derive(Clone)]
struct AnthropicWire {
    model: String,
    base_url: String,
    key: Option<ApiKey>,
    max_tokens: u32,
}

impl Anthropic {
    /// The default base URL.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";
    /// The `anthropic-version` header sent.
    pub const VERSION: &'static str = "2023-06-01";

    /// A service for `model`, streaming, with the key from `ANTHROPIC_API_KEY` and the base URL
    /// from `ANTHROPIC_BASE_URL` when set.
    pub fn new(model: impl Into<String>) -> Self {
        let base_url = std::env::var("ANTHROPIC_BASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| Self::DEFAULT_BASE_URL.to_owned());
        Self {
            client: Arc::new(Client {
                wire: AnthropicWire {
                    model: model.into(),
                    base_url: base_url.trim_end_matches('/').to_owned(),
                    key: ApiKey::from_env("ANTHROPIC_API_KEY"),
                    max_tokens: 4096,
                },
                http: http::default_http(),
                stream: true,
                extra: HeaderMap::new(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Client<AnthropicWire>)) -> Self {
        f(Arc::make_mut(&mut self.client));
        self
    }

    /// The server's base URL (without `/v1`).
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.edit(|c| c.wire.base_url = url.trim_end_matches('/').to_owned())
    }

    /// The API key (instead of `ANTHROPIC_API_KEY`).
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.wire.key = Some(key))
    }

    /// `max_tokens` for requests that do not set it (the API requires one). Default 4096.
    pub fn max_tokens(self, max_tokens: u32) -> Self {
        self.edit(|c| c.wire.max_tokens = max_tokens)
    }

    /// Stream the answer (the default) or not.
    pub fn streaming(self, stream: bool) -> Self {
        self.edit(|c| c.stream = stream)
    }

    /// The reqwest client to use.
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

impl Service<ModelRequest> for Anthropic {
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

impl std::fmt::Debug for AnthropicWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        http::debug_wire(f, &self.model, &self.base_url, self.key.as_ref())
    }
}

impl Wire for AnthropicWire {
    const PROVIDER: &'static str = PROVIDER;

    fn model(&self) -> &str {
        &self.model
    }

    fn key(&self) -> Option<&ApiKey> {
        self.key.as_ref()
    }

    fn url(&self, _stream: bool) -> String {
        format!("{}/v1/messages", self.base_url)
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.key {
            headers.extend(secret_header("x-api-key", key.expose()));
        }
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(Anthropic::VERSION),
        );
        headers
    }

    fn frame(&self, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
        frame(self, req, stream)
    }

    fn encode_message(
        &self,
        message: &Message,
        out: &mut Vec<u8>,
    ) -> Result<Option<&'static str>, Error> {
        if message.role == Role::System {
            // In the system prompt (see `frame`).
            return Ok(None);
        }
        let (role, blocks) = blocks_of(message);
        let mut first = true;
        for block in &blocks {
            encode::item(out, &mut first, block, PROVIDER)?;
        }
        Ok(Some(role))
    }

    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        let response: WireResponse =
            serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
        let parts = response
            .content
            .into_iter()
            .filter_map(block_part)
            .collect();
        let mut res = ModelResponse::from_parts(parts).with_usage(response.usage.into());
        res.finish_reason = finish_reason(response.stop_reason.as_deref());
        Ok(res)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}

// ------------------------------------------------------------------------------- request

#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    system: String,
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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

fn frame(wire: &AnthropicWire, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
    // System messages of the history join the system prompt.
    let mut system = req.system.as_deref().unwrap_or_default().to_owned();
    for message in req.messages.iter().filter(|m| m.role == Role::System) {
        let text = text_of(message);
        if !text.is_empty() {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&text);
        }
    }
    let head = Head {
        model: &wire.model,
        max_tokens: req.options.max_tokens.unwrap_or(wire.max_tokens),
        system,
    };
    Frame::around(&head, "messages", &rest(req, stream), PROVIDER)
}

fn rest(req: &ModelRequest, stream: bool) -> Rest<'_> {
    let options = &req.options;
    Rest {
        tools: req
            .tools
            .iter()
            .map(|spec| WireTool {
                name: &spec.name,
                description: &spec.description,
                input_schema: &spec.parameters,
            })
            .collect(),
        tool_choice: options.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => serde_json::json!({ "type": "auto" }),
            ToolChoice::None => serde_json::json!({ "type": "none" }),
            ToolChoice::Required => serde_json::json!({ "type": "any" }),
            ToolChoice::Tool(name) => serde_json::json!({ "type": "tool", "name": name }),
        }),
        temperature: options.temperature,
        top_p: options.top_p,
        stop_sequences: &options.stop,
        stream,
    }
}

/// The role and the blocks of one message.
fn blocks_of(message: &Message) -> (&'static str, Vec<Block<'_>>) {
    let role = if message.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    let mut blocks = Vec::with_capacity(message.content.len());
    // Results open a user turn: the API wants them before any text of the turn.
    for result in message.tool_results() {
        blocks.push(Block::ToolResult {
            tool_use_id: &result.call_id,
            content: &result.content,
            is_error: result.is_error,
        });
    }
    for part in &message.content {
        match part {
            ContentPart::Text { text } if !text.is_empty() => blocks.push(Block::Text { text }),
            ContentPart::Reasoning {
                text,
                signature: Some(signature),
            } if role == "assistant" => match signature.strip_prefix(REDACTED) {
                Some(data) => blocks.push(Block::RedactedThinking { data }),
                None => blocks.push(Block::Thinking {
                    thinking: text,
                    signature,
                }),
            },
            ContentPart::ToolCall(call) if role == "assistant" => blocks.push(Block::ToolUse {
                id: &call.id,
                name: &call.name,
                input: input_of(call),
            }),
            _ => {}
        }
    }
    (role, blocks)
}

/// A call's arguments as the JSON object the API requires.
fn input_of(call: &ToolCall) -> Value {
    match call.parse_arguments::<Value>() {
        Ok(value @ Value::Object(_)) => value,
        _ => serde_json::json!({ "_arguments": call.arguments }),
    }
}

// ------------------------------------------------------------------------------ response

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    content: Vec<WireBlock>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        let input = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
        Usage::new(input, u.output_tokens).with_cached(u.cache_read_input_tokens)
    }
}

fn block_part(block: WireBlock) -> Option<ContentPart> {
    match block {
        WireBlock::Text { text } if !text.is_empty() => Some(ContentPart::Text { text }),
        WireBlock::Thinking {
            thinking,
            signature,
        } => Some(ContentPart::Reasoning {
            text: thinking,
            signature: (!signature.is_empty()).then_some(signature),
        }),
        WireBlock::RedactedThinking { data } => Some(ContentPart::Reasoning {
            text: String::new(),
            signature: Some(format!("{REDACTED}{data}")),
        }),
        WireBlock::ToolUse { id, name, input } => {
            let arguments = match input {
                Value::Null => "{}".to_owned(),
                input => input.to_string(),
            };
            Some(ContentPart::ToolCall(ToolCall::raw(id, name, arguments)))
        }
        _ => None,
    }
}

fn finish_reason(reason: Option<&str>) -> FinishReason {
    match reason {
        None | Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("tool_use") => FinishReason::ToolCalls,
        Some("max_tokens") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}

// ------------------------------------------------------------------------------- stream

/// A block being streamed.
enum Open {
    Text(String),
    Thinking(String, String),
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
        start: Value,
    },
    Other,
}

#[derive(Default)]
struct Decoder {
    blocks: Vec<(usize, Open)>,
    usage: WireUsage,
    stop_reason: Option<String>,
    done: bool,
}

impl Decoder {
    fn block(&mut self, index: usize) -> Option<&mut Open> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, block)| block)
    }
}

fn index_of(value: &Value) -> usize {
    value
        .get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0)
}

fn str_of<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if data.trim().is_empty() {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream event", e))?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "message_start" => {
                if let Some(usage) = value.pointer("/message/usage") {
                    self.usage = WireUsage::deserialize(usage)
                        .map_err(|e| invalid(PROVIDER, "the usage", e))?;
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let open = match str_of(block, "type") {
                    "text" => {
                        let text = str_of(block, "text").to_owned();
                        if !text.is_empty() {
                            deltas.push(Delta::Text(text.clone()));
                        }
                        Open::Text(text)
                    }
                    "thinking" => Open::Thinking(
                        str_of(block, "thinking").to_owned(),
                        str_of(block, "signature").to_owned(),
                    ),
                    "redacted_thinking" => Open::Redacted(str_of(block, "data").to_owned()),
                    "tool_use" => Open::ToolUse {
                        id: str_of(block, "id").to_owned(),
                        name: str_of(block, "name").to_owned(),
                        json: String::new(),
                        start: block.get("input").cloned().unwrap_or(Value::Null),
                    },
                    _ => Open::Other,
                };
                self.blocks.push((index_of(&value), open));
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                let index = index_of(&value);
                let Some(block) = self.block(index) else {
                    return Err(invalid(
                        PROVIDER,
                        "the stream",
                        format!("a delta for block {index}, which never started"),
                    ));
                };
                match (str_of(delta, "type"), block) {
                    ("text_delta", Open::Text(text)) => {
                        let piece = str_of(delta, "text");
                        text.push_str(piece);
                        deltas.push(Delta::Text(piece.to_owned()));
                    }
                    ("thinking_delta", Open::Thinking(text, _)) => {
                        let piece = str_of(delta, "thinking");
                        text.push_str(piece);
                        deltas.push(Delta::Reasoning(piece.to_owned()));
                    }
                    ("signature_delta", Open::Thinking(_, signature)) => {
                        signature.push_str(str_of(delta, "signature"));
                    }
                    ("input_json_delta", Open::ToolUse { json, .. }) => {
                        json.push_str(str_of(delta, "partial_json"));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(output) = value
                    .pointer("/usage/output_tokens")
                    .and_then(Value::as_u64)
                {
                    self.usage.output_tokens = output;
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(stream_error(PROVIDER, data, None)),
            _ => {}
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if !self.done {
            return Err(truncated(PROVIDER));
        }
        let mut blocks = self.blocks;
        blocks.sort_by_key(|(index, _)| *index);
        let mut parts = Vec::with_capacity(blocks.len());
        for (_, block) in blocks {
            let part = match block {
                Open::Text(text) => WireBlock::Text { text },
                Open::Thinking(thinking, signature) => WireBlock::Thinking {
                    thinking,
                    signature,
                },
                Open::Redacted(data) => WireBlock::RedactedThinking { data },
                Open::ToolUse {
                    id,
                    name,
                    json,
                    start,
                } => {
                    if !json.trim().is_empty() {
                        // The arguments as the model wrote them, valid JSON or not: the tool
                        // service reports malformed arguments to the model.
                        parts.push(ContentPart::ToolCall(ToolCall::raw(id, name, json)));
                        continue;
                    }
                    WireBlock::ToolUse {
                        id,
                        name,
                        input: start,
                    }
                }
                Open::Other => continue,
            };
            parts.extend(block_part(part));
        }
        let mut res = ModelResponse::from_parts(parts).with_usage(self.usage.into());
        res.finish_reason = finish_reason(self.stop_reason.as_deref());
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tower_agent_core::{ErrorKind, ToolResult};

    fn wire() -> AnthropicWire {
        AnthropicWire {
            model: "claude".into(),
            base_url: "http://x".into(),
            key: None,
            max_tokens: 1000,
        }
    }

    #[test]
    fn turns_alternate_and_thinking_goes_back() {
        let call = ToolCall::new("t1", "ls", json!({}));
        let bad = ToolCall::raw("t2", "ls", "[1,2]");
        let mut req = ModelRequest::new(vec![
            Message::user("list"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::Reasoning {
                        text: "let me look".into(),
                        signature: Some("sig".into()),
                    },
                    ContentPart::Reasoning {
                        text: String::new(),
                        signature: Some(format!("{REDACTED}xyz")),
                    },
                    ContentPart::Reasoning {
                        text: "from another provider".into(),
                        signature: None,
                    },
                    ContentPart::ToolCall(call.clone()),
                    ContentPart::ToolCall(bad.clone()),
                ],
            },
            Message::tool_result(ToolResult::success(&call, "a.txt")),
            Message::tool_result(ToolResult::error(&bad, "bad args")),
            Message::user("and?"),
            Message::system("be brief"),
        ]);
        req.system = Some("sys".into());
        let body: Value =
            serde_json::from_slice(&encode::body(&wire(), &req, false, false).expect("encodes"))
                .expect("json");
        assert_eq!(
            body,
            json!({
                "model": "claude",
                "max_tokens": 1000,
                "system": "sys\n\nbe brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "list"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "let me look", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "xyz"},
                        {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                        {"type": "tool_use", "id": "t2", "name": "ls", "input": {"_arguments": "[1,2]"}}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                        {"type": "tool_result", "tool_use_id": "t2", "content": "bad args", "is_error": true},
                        {"type": "text", "text": "and?"}
                    ]}
                ]
            })
        );
    }

    #[test]
    fn a_streamed_answer_with_thinking_and_a_call() {
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        let mut deltas = Vec::new();
        for (event, data) in [
            (
                "message_start",
                r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me"}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"ls","input":{}}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"src\"}"}}"#,
            ),
            ("ping", r#"{"type":"ping"}"#),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":42}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ] {
            decoder.feed(event, data, &mut deltas).expect("valid");
        }
        assert_eq!(deltas.len(), 2);
        let res = decoder.finish().expect("complete");
        assert_eq!(
            res.message.content,
            vec![
                ContentPart::Reasoning {
                    text: "hmm".into(),
                    signature: Some("SIG".into())
                },
                ContentPart::Text {
                    text: "Let me".into()
                },
                ContentPart::ToolCall(ToolCall::raw("toolu_1", "ls", r#"{"path":"src"}"#)),
            ]
        );
        assert_eq!(res.usage, Usage::new(15, 42).with_cached(5));
        assert_eq!(res.finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn an_error_event_inside_a_200_stream_is_typed() {
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        let err = decoder
            .feed(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                &mut Vec::new(),
            )
            .expect_err("an error event");
        assert!(matches!(err.kind(), ErrorKind::Overloaded { .. }));
        let decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        assert_eq!(
            decoder.finish().expect_err("never stopped").kind(),
            ErrorKind::Server
        );
    }
}
