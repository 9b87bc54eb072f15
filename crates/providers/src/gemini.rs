//! Gemini `generateContent` (and `streamGenerateContent?alt=sse`).
//!
//! Mapping:
//!
//! | tower-agent | Gemini API |
//! |---|---|
//! | `ModelRequest::system`, system messages | `systemInstruction` |
//! | user text, tool results | `user` contents (consecutive ones merged) |
//! | a tool result | a `functionResponse` part, `{"result": ..}` or, with the error flag, `{"error": ..}` |
//! | assistant text, calls | `model` contents with `text` and `functionCall` parts (ids sent when set) |
//! | a part's `thoughtSignature` | a reasoning part with empty text and the signature, right before the part; sent back on the same part |
//! | thought summaries (`thought: true`) | reasoning parts (sent back with their signature only) |
//! | tool specs | `functionDeclarations` with `parametersJsonSchema` (the full JSON Schema) |
//! | `GenerationOptions` | `generationConfig` (`temperature`, `topP`, `maxOutputTokens`, `stopSequences`), `toolConfig` |
//! | `usageMetadata` | input = `promptTokenCount`, output = `candidatesTokenCount` + `thoughtsTokenCount`, cached = `cachedContentTokenCount` |
//!
//! A response without candidates, or whose candidate has no parts, is an
//! [`ErrorKind::EmptyResponse`] error (retried by the retry layer with a changed prompt); a
//! prompt blocked by safety settings is a `BadRequest` naming the reason. A stream that ends
//! before a chunk with a `finishReason` is an error.
//!
//! ```no_run
//! use tower::ServiceExt;
//! use tower_agent_core::{Error, Message, ModelRequest};
//! use tower_agent_providers::Gemini;
//!
//! # async fn demo() -> Result<(), Error> {
//! let model = Gemini::new("gemini-2.5-flash"); // the key from GEMINI_API_KEY
//! let res = model.oneshot(ModelRequest::new(vec![Message::user("hi")])).await?;
//! println!("{}", res.message.text());
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
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

const PROVIDER: &str = "gemini";

/// A model service over Gemini `generateContent`; see the [module docs](self).
///
/// Cloning is cheap. `poll_ready` is always ready.
#[derive(Clone, Debug)]
pub struct Gemini {
    client: Arc<Client<GeminiWire>>,
}

#[derive(Clone)]
struct GeminiWire {
    model: String,
    base_url: String,
    key: Option<ApiKey>,
}

impl Gemini {
    /// The default base URL.
    pub const DEFAULT_BASE_URL: &'static str = "https://generativelanguage.googleapis.com/v1beta";

    /// A service for `model`, streaming, with the key from `GEMINI_API_KEY` and the base URL
    /// from `GEMINI_BASE_URL` when set.
    pub fn new(model: impl Into<String>) -> Self {
        let base_url = std::env::var("GEMINI_BASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| Self::DEFAULT_BASE_URL.to_owned());
        Self {
            client: Arc::new(Client {
                wire: GeminiWire {
                    model: model.into(),
                    base_url: base_url.trim_end_matches('/').to_owned(),
                    key: ApiKey::from_env("GEMINI_API_KEY"),
                },
                http: http::default_http(),
                stream: true,
                extra: HeaderMap::new(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Client<GeminiWire>)) -> Self {
        f(Arc::make_mut(&mut self.client));
        self
    }

    /// The server's base URL, up to the API version (`.../v1beta`).
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.edit(|c| c.wire.base_url = url.trim_end_matches('/').to_owned())
    }

    /// The API key (instead of `GEMINI_API_KEY`). Sent in the `x-goog-api-key` header, never
    /// in the URL.
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.wire.key = Some(key))
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

impl Service<ModelRequest> for Gemini {
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

impl std::fmt::Debug for GeminiWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        http::debug_wire(f, &self.model, &self.base_url, self.key.as_ref())
    }
}

impl Wire for GeminiWire {
    const PROVIDER: &'static str = PROVIDER;

    fn model(&self) -> &str {
        &self.model
    }

    fn key(&self) -> Option<&ApiKey> {
        self.key.as_ref()
    }

    fn url(&self, stream: bool) -> String {
        if stream {
            format!(
                "{}/models/{}:streamGenerateContent?alt=sse",
                self.base_url, self.model
            )
        } else {
            format!("{}/models/{}:generateContent", self.base_url, self.model)
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.key {
            headers.extend(secret_header("x-goog-api-key", key.expose()));
        }
        headers
    }

    const TURN_ITEMS: &'static str = "parts";

    fn frame(&self, req: &ModelRequest, _stream: bool) -> Result<Frame, Error> {
        frame(req)
    }

    fn encode_message(
        &self,
        message: &Message,
        out: &mut Vec<u8>,
    ) -> Result<Option<&'static str>, Error> {
        if message.role == Role::System {
            // In the system instruction (see `frame`).
            return Ok(None);
        }
        let model = message.role == Role::Assistant;
        let mut first = true;
        for part in parts_of(message, model) {
            encode::item(out, &mut first, &part, PROVIDER)?;
        }
        Ok(Some(if model { "model" } else { "user" }))
    }

    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        let chunk: Chunk =
            serde_json::from_slice(body).map_err(|e| invalid(PROVIDER, "the response", e))?;
        let mut decoder = Decoder::default();
        decoder.absorb(chunk, &mut Vec::new())?;
        Box::new(decoder).finish()
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}

// ------------------------------------------------------------------------------- request

fn frame(req: &ModelRequest) -> Result<Frame, Error> {
    // System messages of the history join the system instruction.
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
    Frame::around(&Map::new(), "contents", &rest(req, system), PROVIDER)
}

/// The fields after the contents.
fn rest(req: &ModelRequest, system: String) -> Value {
    let mut body = Map::new();
    if !system.is_empty() {
        body.insert(
            "systemInstruction".into(),
            json!({ "parts": [{ "text": system }] }),
        );
    }
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|spec| {
                json!({
                    "name": spec.name,
                    "description": spec.description,
                    "parametersJsonSchema": spec.parameters,
                })
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
    }
    let options = &req.options;
    if let Some(choice) = &options.tool_choice {
        let config = match choice {
            ToolChoice::Auto => json!({ "mode": "AUTO" }),
            ToolChoice::None => json!({ "mode": "NONE" }),
            ToolChoice::Required => json!({ "mode": "ANY" }),
            ToolChoice::Tool(name) => json!({ "mode": "ANY", "allowedFunctionNames": [name] }),
        };
        body.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": config }),
        );
    }
    let mut generation = Map::new();
    if let Some(t) = options.temperature {
        generation.insert("temperature".into(), json!(t));
    }
    if let Some(p) = options.top_p {
        generation.insert("topP".into(), json!(p));
    }
    if let Some(n) = options.max_tokens {
        generation.insert("maxOutputTokens".into(), json!(n));
    }
    if !options.stop.is_empty() {
        generation.insert("stopSequences".into(), json!(options.stop));
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    Value::Object(body)
}

/// One part of a content, as the API reads it.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    thought: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_call: Option<FunctionCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_response: Option<FunctionResponse<'a>>,
}

#[derive(Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    args: Value,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
}

#[derive(Serialize)]
struct FunctionResponse<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    response: Outcome<'a>,
}

/// `{"result": ..}` or, for a failed call, `{"error": ..}`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Outcome<'a> {
    Result(&'a str),
    Error(&'a str),
}

fn parts_of(message: &Message, model: bool) -> Vec<Part<'_>> {
    let mut parts = Vec::with_capacity(message.content.len());
    for result in message.tool_results() {
        parts.push(Part {
            function_response: Some(FunctionResponse {
                name: &result.name,
                id: &result.call_id,
                response: if result.is_error {
                    Outcome::Error(&result.content)
                } else {
                    Outcome::Result(&result.content)
                },
            }),
            ..Part::default()
        });
    }
    // A signature waiting for the part it belongs to.
    let mut signature: Option<&str> = None;
    for part in &message.content {
        let mut wire = match part {
            ContentPart::Reasoning {
                text,
                signature: sig,
            } if model => {
                if text.is_empty() {
                    signature = sig.as_deref();
                    continue;
                }
                let Some(sig) = sig else { continue };
                Part {
                    text: Some(text),
                    thought: true,
                    thought_signature: Some(sig),
                    ..Part::default()
                }
            }
            ContentPart::Text { text } if !text.is_empty() => Part {
                text: Some(text),
                ..Part::default()
            },
            ContentPart::ToolCall(call) if model => {
                let args = match call.parse_arguments::<Value>() {
                    Ok(value @ Value::Object(_)) => value,
                    _ => json!({ "_arguments": call.arguments }),
                };
                Part {
                    function_call: Some(FunctionCall {
                        name: &call.name,
                        args,
                        id: &call.id,
                    }),
                    ..Part::default()
                }
            }
            _ => continue,
        };
        if let Some(sig) = signature.take() {
            wire.thought_signature = Some(sig);
        }
        parts.push(wire);
    }
    parts
}

// ------------------------------------------------------------------------------ response

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    #[serde(default)]
    candidates: Vec<Candidate>,
    usage_metadata: Option<WireUsage>,
    prompt_feedback: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<WireContent>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireContent {
    #[serde(default)]
    parts: Vec<WirePart>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    #[serde(default)]
    thought: bool,
    thought_signature: Option<String>,
    function_call: Option<WireCall>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    args: Value,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        Usage::new(
            u.prompt_token_count,
            u.candidates_token_count + u.thoughts_token_count,
        )
        .with_cached(u.cached_content_token_count)
    }
}

fn finish_reason(reason: &str, has_calls: bool) -> FinishReason {
    match reason {
        "STOP" if has_calls => FinishReason::ToolCalls,
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::ContentFilter
        }
        other => FinishReason::Other(other.to_owned()),
    }
}

// ------------------------------------------------------------------------------- stream

/// Accumulates chunks: a streamed answer is the same response in pieces.
#[derive(Default)]
struct Decoder {
    parts: Vec<ContentPart>,
    usage: Option<WireUsage>,
    finish: Option<String>,
    blocked: Option<String>,
    calls: usize,
}

impl Decoder {
    fn absorb(&mut self, chunk: Chunk, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if chunk.usage_metadata.is_some() {
            self.usage = chunk.usage_metadata;
        }
        if let Some(reason) = chunk
            .prompt_feedback
            .as_ref()
            .and_then(|f| f.get("blockReason"))
            .and_then(Value::as_str)
        {
            self.blocked = Some(reason.to_owned());
        }
        let Some(candidate) = chunk.candidates.into_iter().next() else {
            return Ok(());
        };
        for part in candidate.content.map(|c| c.parts).unwrap_or_default() {
            self.part(part, deltas);
        }
        if candidate.finish_reason.is_some() {
            self.finish = candidate.finish_reason;
        }
        Ok(())
    }

    fn part(&mut self, part: WirePart, deltas: &mut Vec<Delta>) {
        if part.thought {
            let text = part.text.unwrap_or_default();
            if !text.is_empty() {
                deltas.push(Delta::Reasoning(text.clone()));
            }
            // Consecutive pieces of one thought are one reasoning part.
            if let Some(ContentPart::Reasoning {
                text: last,
                signature,
            }) = self.parts.last_mut()
            {
                if signature.is_none() && !last.is_empty() {
                    last.push_str(&text);
                    *signature = part.thought_signature;
                    return;
                }
            }
            self.parts.push(ContentPart::Reasoning {
                text,
                signature: part.thought_signature,
            });
            return;
        }
        if let Some(signature) = part.thought_signature {
            self.parts.push(ContentPart::Reasoning {
                text: String::new(),
                signature: Some(signature),
            });
        }
        if let Some(call) = part.function_call {
            self.calls += 1;
            let arguments = match call.args {
                Value::Null => "{}".to_owned(),
                args => args.to_string(),
            };
            self.parts.push(ContentPart::ToolCall(ToolCall::raw(
                call.id, call.name, arguments,
            )));
        } else if let Some(text) = part.text.filter(|t| !t.is_empty()) {
            deltas.push(Delta::Text(text.clone()));
            match self.parts.last_mut() {
                Some(ContentPart::Text { text: last }) => last.push_str(&text),
                _ => self.parts.push(ContentPart::Text { text }),
            }
        }
    }
}

impl StreamDecoder for Decoder {
    fn feed(&mut self, _event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error> {
        if data.trim().is_empty() {
            return Ok(());
        }
        let chunk: Chunk =
            serde_json::from_str(data).map_err(|e| invalid(PROVIDER, "a stream chunk", e))?;
        if chunk.error.is_some() {
            return Err(stream_error(PROVIDER, data, None));
        }
        self.absorb(chunk, deltas)
    }

    fn is_done(&self) -> bool {
        false
    }

    fn finish(self: Box<Self>) -> Result<ModelResponse, Error> {
        if let Some(reason) = self.blocked {
            return Err(Error::bad_request(format!(
                "{PROVIDER}: the prompt was blocked ({reason})"
            )));
        }
        let empty = !self
            .parts
            .iter()
            .any(|p| matches!(p, ContentPart::Text { .. } | ContentPart::ToolCall(_)));
        if self.finish.is_none() && !empty {
            return Err(truncated(PROVIDER));
        }
        if empty {
            return Err(Error::new(
                ErrorKind::EmptyResponse,
                format!(
                    "{PROVIDER}: the response has no content (finish reason {})",
                    self.finish.as_deref().unwrap_or("none")
                ),
            ));
        }
        let reason = finish_reason(self.finish.as_deref().unwrap_or("STOP"), self.calls > 0);
        let mut res = ModelResponse::from_parts(self.parts)
            .with_usage(self.usage.map(Into::into).unwrap_or_default());
        res.finish_reason = reason;
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_agent_core::ToolResult;

    #[test]
    fn signatures_go_back_on_their_part() {
        let call = ToolCall::new("c1", "ls", json!({"path": "."}));
        let req = ModelRequest::new(vec![
            Message::user("list"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::Reasoning {
                        text: String::new(),
                        signature: Some("SIG".into()),
                    },
                    ContentPart::ToolCall(call.clone()),
                ],
            },
            Message::tool_result(ToolResult::error(&call, "denied")),
        ]);
        let wire = GeminiWire {
            model: "g".into(),
            base_url: "http://x".into(),
            key: None,
        };
        let body: Value =
            serde_json::from_slice(&encode::body(&wire, &req, false, false).expect("encodes"))
                .expect("json");
        assert_eq!(
            body,
            json!({
                "contents": [
                    {"role": "user", "parts": [{"text": "list"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"path": "."}, "id": "c1"}, "thoughtSignature": "SIG"}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "ls", "id": "c1", "response": {"error": "denied"}}}]}
                ]
            })
        );
    }

    #[test]
    fn chunks_accumulate_into_one_message() {
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        let mut deltas = Vec::new();
        for data in [
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]}}]}"#,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"lo"}]}}]}"#,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"ls","args":{}},"thoughtSignature":"S"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":3,"thoughtsTokenCount":2}}"#,
        ] {
            decoder.feed("", data, &mut deltas).expect("valid");
        }
        let res = decoder.finish().expect("complete");
        assert_eq!(
            res.message.content,
            vec![
                ContentPart::Text {
                    text: "Hello".into()
                },
                ContentPart::Reasoning {
                    text: String::new(),
                    signature: Some("S".into())
                },
                ContentPart::ToolCall(ToolCall::raw("", "ls", "{}")),
            ]
        );
        assert_eq!(res.usage, Usage::new(7, 5));
        assert_eq!(res.finish_reason, FinishReason::ToolCalls);
        assert_eq!(deltas.len(), 2);
    }

    #[test]
    fn empty_candidates_and_cut_streams_are_errors() {
        let wire = GeminiWire {
            model: "g".into(),
            base_url: "http://x".into(),
            key: None,
        };
        let empty = wire.decode(br#"{"candidates":[],"usageMetadata":{"promptTokenCount":3}}"#);
        assert_eq!(empty.expect_err("empty").kind(), ErrorKind::EmptyResponse);
        let blocked = wire.decode(br#"{"promptFeedback":{"blockReason":"SAFETY"}}"#);
        assert_eq!(blocked.expect_err("blocked").kind(), ErrorKind::BadRequest);
        let mut decoder: Box<dyn StreamDecoder> = Box::<Decoder>::default();
        decoder
            .feed(
                "",
                r#"{"candidates":[{"content":{"parts":[{"text":"Hel"}]}}]}"#,
                &mut Vec::new(),
            )
            .expect("valid");
        assert_eq!(decoder.finish().expect_err("cut").kind(), ErrorKind::Server);
    }
}
