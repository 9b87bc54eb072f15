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
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};
use tower_service::Service;

use crate::encode::Frame;
use crate::http::{self, Client, StreamDecoder, Wire, secret_header};
use crate::key::ApiKey;

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

use request::{encode_message, frame};
use response::decode;
use stream::Decoder;

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
        encode_message(message, out)
    }

    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        decode(body)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}
