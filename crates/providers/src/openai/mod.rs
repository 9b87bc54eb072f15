//! OpenAI Chat Completions, and every server that speaks it: vLLM, llama.cpp's
//! `llama-server`, Ollama, LM Studio, OpenRouter. Point [`Provider::base_url`] at it.
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

use crate::classify::{ErrorWords, Quota, Resets};
use crate::wire::Spec;
use reqwest::header::HeaderMap;
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};

use crate::http;
use crate::provider::Provider;
use crate::wire::{Endpoint, Format, Frame, Items, StreamDecoder, secret_header};

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

use request::{encode_message, frame};
use response::decode;
use stream::Decoder;

const PROVIDER: &str = "openai";

/// What OpenAI's error bodies say (and those of servers that copy its API: vLLM, Ollama).
pub(crate) const ERRORS: ErrorWords = ErrorWords {
    overflow: &[
        "maximum context length",
        "context length exceeded",
        // Ollama
        "context window",
    ],
    overflow_codes: &["context_length_exceeded"],
    quota: Quota::Codes(&["insufficient_quota"]),
    resets: Resets::Durations(&["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]),
};

/// A model service over OpenAI Chat Completions; see the [module docs](self) and
/// [`Provider`] for its methods.
///
/// [`Provider::base_url`]: a URL with no path gets `/v1` (`http://127.0.0.1:11434` is
/// Ollama's `http://127.0.0.1:11434/v1`); any other path is kept as it is (OpenRouter's
/// `https://openrouter.ai/api/v1`).
pub type OpenAi = Provider<OpenAiWire>;

/// The wire format of OpenAI Chat Completions: see [`OpenAi`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenAiWire {
    /// Send `prompt_cache_key`: `None`, only to OpenAI's own API.
    cache_key: Option<bool>,
}

impl Provider<OpenAiWire> {
    /// Send the session's id as `prompt_cache_key`, which routes a session's requests to the
    /// servers that hold its cached prefix. By default only to OpenAI's own API: a compatible
    /// server may refuse fields it does not know. OpenAI caches prefixes of 1,024 tokens and
    /// more by itself; the key raises the hit rate.
    pub fn prompt_cache_key(self, send: bool) -> Self {
        self.edit(|c| c.wire.cache_key = Some(send))
    }
}

/// Whether `base_url` is OpenAI's own API, not Azure's.
fn is_openai_api(base_url: &str) -> bool {
    host(base_url) == "api.openai.com"
}

fn host(base_url: &str) -> &str {
    base_url
        .split("://")
        .nth(1)
        .unwrap_or(base_url)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
}

/// Whether `base_url` is OpenAI's own API (or Azure's), which takes the length limit as
/// `max_completion_tokens` (its reasoning models refuse `max_tokens`).
fn is_openai(base_url: &str) -> bool {
    let host = host(base_url);
    host == "api.openai.com" || host.ends_with(".openai.azure.com")
}

/// A base URL as the requests need it: `/v1` added to a URL with no path.
fn base_url_of(url: &str) -> String {
    match http::split_base(url) {
        (url, "") => format!("{url}/v1"),
        (url, _) => url.to_owned(),
    }
}

impl Format for OpenAiWire {
    const SPEC: Spec = Spec {
        name: "OpenAi",
        provider: PROVIDER,
        gen_ai_provider: "openai",
        base_url_hint: "OpenAI's ends in /v1 (https://api.openai.com/v1), and \
        so does a server's of its own (http://127.0.0.1:8080/v1)",
        default_base_url: "https://api.openai.com/v1",
        key_env: "OPENAI_API_KEY",
        base_url_env: "OPENAI_BASE_URL",
        list_headers: &[],
        turn_items: "content",
        errors: ERRORS,
    };

    fn base_url_of(url: &str) -> String {
        base_url_of(url)
    }

    fn url(&self, endpoint: &Endpoint, _stream: bool) -> String {
        format!("{}/chat/completions", endpoint.base_url)
    }

    fn headers(&self, endpoint: &Endpoint) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &endpoint.key {
            let bearer = format!("Bearer {}", key.expose());
            headers.extend(secret_header("authorization", &bearer));
        }
        headers
    }

    fn frame(&self, endpoint: &Endpoint, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
        let cache_key = self
            .cache_key
            .unwrap_or_else(|| is_openai_api(&endpoint.base_url));
        frame(
            &endpoint.model,
            endpoint.max_tokens(req),
            req,
            stream,
            is_openai(&endpoint.base_url),
            cache_key,
        )
    }

    fn encode_message(message: &Message, out: &mut Vec<u8>) -> Result<Items, Error> {
        encode_message(message, out)
    }

    fn decode(body: &[u8]) -> Result<ModelResponse, Error> {
        decode(body)
    }

    fn decoder() -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}
