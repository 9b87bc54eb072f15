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
//! | `GenerationOptions` | `temperature`, `top_p`, `max_tokens` (`max_completion_tokens` for OpenAI's own API and Azure's, whose reasoning models refuse `max_tokens`), `stop`, `tool_choice` |
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

use std::sync::Arc;

use reqwest::header::HeaderMap;
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};

use crate::http::{self, Client};
use crate::key::ApiKey;
use crate::wire::{Frame, StreamDecoder, Wire, secret_header};

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

use request::{encode_message, frame};
use response::decode;
use stream::Decoder;

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
            client: Arc::new(Client::new(OpenAiWire {
                model: model.into(),
                base_url: base_url_of(&base_url),
                key: ApiKey::from_env("OPENAI_API_KEY"),
            })),
        }
    }

    /// The server's base URL, up to and including `/v1` (`http://127.0.0.1:8080/v1`). A URL
    /// with no path gets `/v1` (`http://127.0.0.1:11434` is Ollama's
    /// `http://127.0.0.1:11434/v1`); any other path is kept as it is (OpenRouter's
    /// `https://openrouter.ai/api/v1`).
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = base_url_of(&url.into());
        self.edit(|c| c.wire.base_url = url)
    }

    /// The API key (instead of `OPENAI_API_KEY`).
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.wire.key = Some(key))
    }

    http::provider_methods!(OpenAiWire);
}

http::provider_service!(OpenAi);

impl std::fmt::Debug for OpenAiWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        http::debug_wire(f, &self.model, &self.base_url, self.key.as_ref())
    }
}

/// Whether `base_url` is OpenAI's own API (or Azure's), which takes the length limit as
/// `max_completion_tokens` (its reasoning models refuse `max_tokens`).
fn is_openai(base_url: &str) -> bool {
    let host = base_url
        .split("://")
        .nth(1)
        .unwrap_or(base_url)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    host == "api.openai.com" || host.ends_with(".openai.azure.com")
}

/// A base URL as the requests need it: `/v1` added to a URL with no path.
fn base_url_of(url: &str) -> String {
    match http::split_base(url) {
        (url, "") => format!("{url}/v1"),
        (url, _) => url.to_owned(),
    }
}

impl Wire for OpenAiWire {
    const PROVIDER: &'static str = PROVIDER;
    const BASE_URL_HINT: &'static str = "OpenAI's ends in /v1 (https://api.openai.com/v1), and \
        so does a server's of its own (http://127.0.0.1:8080/v1)";

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
        frame(&self.model, req, stream, is_openai(&self.base_url))
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
