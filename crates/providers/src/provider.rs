//! The one provider type: [`Provider`], generic over a provider's [`Wire`] format.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, ModelPrice, ModelRequest, ModelResponse};
use tower_service::Service;

use crate::PriceTable;
use crate::http::{self, Client};
use crate::key::ApiKey;
use crate::wire::{Endpoint, Format};

/// A provider's wire format: [`OpenAiWire`](crate::openai::OpenAiWire),
/// [`AnthropicWire`](crate::anthropic::AnthropicWire) or
/// [`GeminiWire`](crate::gemini::GeminiWire). Sealed: the formats are this crate's.
pub trait Wire: Format {}

impl<W: Format> Wire for W {}

/// A model service over one provider's HTTP API: [`OpenAi`](crate::OpenAi),
/// [`Anthropic`](crate::Anthropic) and [`Gemini`](crate::Gemini) are this type over their
/// [`Wire`] format. Every method here works for each of them; a provider's own options are
/// in its module (`Anthropic::prompt_cache`).
///
/// A `Service<ModelRequest, Response = ModelResponse, Error = Error>`. Cloning is cheap (the
/// configuration and the HTTP client are shared). `poll_ready` is always ready: put tower's
/// `ConcurrencyLimit` or `RateLimit` around it to bound calls. Each call is one HTTP
/// exchange, streamed by default.
pub struct Provider<W> {
    client: Arc<Client<W>>,
}

impl<W> Clone for Provider<W> {
    fn clone(&self) -> Self {
        Self {
            client: Arc::clone(&self.client),
        }
    }
}

/// The provider's name, model, base URL and options; never the key's value.
impl<W: Wire> fmt::Debug for Provider<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(W::SPEC.name)
            .field("client", &self.client)
            .finish()
    }
}

#[cfg(feature = "gemini")]
impl<W> Provider<W> {
    /// Its configuration, for what this crate builds from a provider (Gemini's context cache).
    pub(crate) fn client(&self) -> &Client<W> {
        &self.client
    }
}

impl<W: Wire> Provider<W> {
    /// The base URL when none is given (and the provider's environment variable is not set).
    pub const DEFAULT_BASE_URL: &'static str = W::SPEC.default_base_url;

    /// A service for `model`, streaming. The key comes from the provider's environment
    /// variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`), and so does the
    /// base URL when it is set (`OPENAI_BASE_URL`, ...).
    pub fn new(model: impl Into<String>) -> Self {
        let base_url = std::env::var(W::SPEC.base_url_env)
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| W::SPEC.default_base_url.to_owned());
        let endpoint = Endpoint {
            model: model.into(),
            base_url: W::base_url_of(&base_url),
            key: ApiKey::from_env(W::SPEC.key_env),
            max_tokens: crate::http::DEFAULT_MAX_TOKENS,
        };
        Self {
            client: Arc::new(Client::new(W::default(), endpoint)),
        }
    }

    /// The server's base URL, with or without the API's version path: each provider's module
    /// says which forms it takes (`http://127.0.0.1:8080/v1` for an OpenAI-compatible server,
    /// `https://api.anthropic.com`, `https://generativelanguage.googleapis.com/v1beta`).
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = W::base_url_of(&url.into());
        self.edit(|c| c.endpoint.base_url = url)
    }

    /// The API key (instead of the provider's environment variable). Sent in a header marked
    /// sensitive, never in the URL.
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.endpoint.key = Some(key))
    }

    /// Stream the answer (the default) or not.
    pub fn streaming(self, stream: bool) -> Self {
        self.edit(|c| c.stream = stream)
    }

    /// The reqwest client to use (proxies, timeouts, TLS roots). The default one has a
    /// connect timeout of 10 s; a client of your own brings its own.
    pub fn http_client(self, http: reqwest::Client) -> Self {
        self.edit(|c| c.http = http)
    }

    /// The longest wait for the next byte of a streamed answer, its head included (120 s by
    /// default): a stalled server fails the call with
    /// [`ErrorKind::Timeout`](tower_agent_core::ErrorKind::Timeout), which the retry policy
    /// retries. A whole answer (not streamed) is not bounded while it is generated; a model
    /// that thinks for minutes before its first token needs a longer wait. There is no
    /// whole-request timeout by default (it would cut long streams): put tower's `Timeout`
    /// around the service for one.
    pub fn idle_timeout(self, timeout: Duration) -> Self {
        self.edit(|c| c.idle_timeout = timeout)
    }

    /// Put the messages of each call on its `chat` span (off by default): the system prompt as
    /// `gen_ai.system_instructions`, the history as `gen_ai.input.messages` and the answer as
    /// `gen_ai.output.messages`, in the JSON form of the GenAI semantic conventions. They may
    /// hold what users and tools wrote, personal data included: turn this on where the trace
    /// store may keep it (the conventions' own switch is the environment variable
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`, which the host can read and pass
    /// here). The key is never captured.
    pub fn capture_content(self, capture: bool) -> Self {
        self.edit(|c| c.capture_content = capture)
    }

    /// Price every call at `price`: each response's [`Usage::cost`](tower_agent_core::Usage)
    /// (and a failed call's partial usage) says what it cost, and the run's usage adds them up.
    ///
    /// ```
    /// use tower_agent_core::ModelPrice;
    /// use tower_agent_providers::Anthropic;
    ///
    /// let model = Anthropic::new("claude-sonnet-4-5").price(ModelPrice::per_million(3.0, 0.3, 15.0));
    /// # let _ = model;
    /// ```
    pub fn price(self, price: ModelPrice) -> Self {
        self.edit(|c| c.price = Some(price))
    }

    /// Price every call at this model's entry of `table` ([`PriceTable::get`]: its own name,
    /// or the longest name it starts with); a model the table does not have is not priced.
    ///
    /// ```
    /// use tower_agent_providers::PriceTable;
    /// use tower_agent_providers::OpenAi;
    ///
    /// let table = PriceTable::from_json(r#"{"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}"#)?;
    /// let model = OpenAi::new("gpt-4o-mini-2024-07-18").prices(&table);
    /// assert!(format!("{model:?}").contains("price: Some"));
    /// # Ok::<(), tower_agent_core::Error>(())
    /// ```
    pub fn prices(self, table: &PriceTable) -> Self {
        let price = table.get(&self.client.endpoint.model);
        self.edit(|c| c.price = price)
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
        &self.client.endpoint.model
    }

    /// The `max_tokens` of a request whose options set none (default 4096, for every
    /// provider): a first run without one could stream for minutes to the end of the
    /// model's context. A request's own `max_tokens` wins. An answer that reaches it ends
    /// cut off ([`FinishReason::Length`](tower_agent_core::FinishReason::Length)), which the
    /// agent never acts on as complete.
    pub fn max_tokens(self, max_tokens: u32) -> Self {
        self.edit(|c| c.endpoint.max_tokens = max_tokens.max(1))
    }

    /// Fields added to every request body, for what this library does not model: OpenAI's
    /// `parallel_tool_calls`, a server's `top_k`, llama.cpp's `cache_prompt`. They go after
    /// the library's own fields; a field the library sets too is then sent twice, and most
    /// servers keep the last (yours). Its `Debug` shows only the fields' names.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_providers::OpenAi;
    ///
    /// let model = OpenAi::new("local")
    ///     .base_url("http://127.0.0.1:8080/v1")
    ///     .extra_body(json!({"cache_prompt": true, "top_k": 40}))
    ///     .expect("an object");
    /// # let _ = model;
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::BadRequest`](tower_agent_core::ErrorKind::BadRequest) when `fields` is
    /// not a JSON object.
    pub fn extra_body(self, fields: serde_json::Value) -> Result<Self, Error> {
        let extra = http::ExtraBody::of(fields)?;
        Ok(self.edit(|c| c.extra_body = extra))
    }

    /// Change the configuration (copied first if a clone shares it).
    pub(crate) fn edit(mut self, f: impl FnOnce(&mut Client<W>)) -> Self {
        f(Arc::make_mut(&mut self.client));
        self
    }
}

impl<W: Wire> Service<ModelRequest> for Provider<W> {
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
