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
//! | `GenerationOptions` | `max_tokens` (required: [`Provider::max_tokens`](Provider#method.max_tokens) when the request has none, default 4096, as for every provider), `temperature`, `top_p`, `stop_sequences`, `tool_choice` |
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

use crate::classify::{ErrorWords, Quota, Resets};
use crate::wire::Spec;
use reqwest::header::{HeaderMap, HeaderValue};
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

const PROVIDER: &str = "anthropic";

/// What Anthropic's error bodies say.
pub(crate) const ERRORS: ErrorWords = ErrorWords {
    overflow: &["prompt is too long", "too many total tokens"],
    overflow_codes: &[],
    quota: Quota::Codes(&["insufficient_quota"]),
    resets: Resets::Instants {
        prefix: "anthropic-ratelimit-",
        suffix: "-reset",
    },
};

/// The prefix of a reasoning part's signature that marks a `redacted_thinking` block.
pub const REDACTED: &str = "redacted_thinking:";

/// A model service over Anthropic Messages; see the [module docs](self) and [`Provider`] for
/// its methods.
///
/// [`Provider::base_url`] takes `https://api.anthropic.com` or `http://127.0.0.1:8080`; the
/// requests go to `{base}/v1/messages`. A URL ending in `/v1` (the form OpenAI's base URLs
/// take) is accepted too.
pub type Anthropic = Provider<AnthropicWire>;

/// The wire format of Anthropic Messages, with its options: see [`Anthropic`].
#[derive(Clone, Debug)]
pub struct AnthropicWire {
    cache: Option<CacheTtl>,
}

impl Default for AnthropicWire {
    fn default() -> Self {
        Self {
            cache: Some(CacheTtl::FiveMinutes),
        }
    }
}

/// How long Anthropic keeps a cached prompt prefix after its last use. Writing to the cache
/// costs 1.25× the input price for five minutes, 2× for an hour; reading it, 0.1×.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CacheTtl {
    /// Five minutes (the API's default).
    #[default]
    FiveMinutes,
    /// An hour: for sessions whose turns are further apart. The requests carry the
    /// `anthropic-beta: extended-cache-ttl-2025-04-11` header.
    OneHour,
}

impl Provider<AnthropicWire> {
    /// The `anthropic-version` header sent.
    pub const VERSION: &'static str = "2023-06-01";

    /// The `anthropic-beta` header sent with [`CacheTtl::OneHour`].
    pub const EXTENDED_CACHE_TTL_BETA: &'static str = "extended-cache-ttl-2025-04-11";

    /// Prompt caching: cache markers with this lifetime (the default, five minutes), or none.
    /// Up to four: on the system prompt's last stable blocks (each block keeps the blank line
    /// after it; a block of whitespace is not sent), on the last block of the history and on
    /// the last block of the run's previous request (not when a volatile block is in the
    /// system prompt, nor on a thinking block), as the request's
    /// [`PromptCache`](tower_agent_core::PromptCache) says; on the last tool when the system
    /// prompt has no stable block. See the facade's `docs/cost.md`.
    pub fn prompt_cache(self, ttl: Option<CacheTtl>) -> Self {
        self.edit(|c| c.wire.cache = ttl)
    }
}

/// A base URL as the requests need it: without a trailing `/v1`.
fn base_url_of(url: &str) -> String {
    let (url, _) = http::split_base(url);
    url.strip_suffix("/v1").unwrap_or(url).to_owned()
}

impl Format for AnthropicWire {
    const SPEC: Spec = Spec {
        name: "Anthropic",
        provider: PROVIDER,
        gen_ai_provider: "anthropic",
        base_url_hint: "Anthropic's is https://api.anthropic.com; the requests go to \
            {base}/v1/messages",
        default_base_url: "https://api.anthropic.com",
        key_env: "ANTHROPIC_API_KEY",
        base_url_env: "ANTHROPIC_BASE_URL",
        list_headers: &["anthropic-beta"],
        turn_items: "content",
        errors: ERRORS,
    };

    fn base_url_of(url: &str) -> String {
        base_url_of(url)
    }

    fn url(&self, endpoint: &Endpoint, _stream: bool) -> String {
        format!("{}/v1/messages", endpoint.base_url)
    }

    fn headers(&self, endpoint: &Endpoint) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &endpoint.key {
            headers.extend(secret_header("x-api-key", key.expose()));
        }
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(Anthropic::VERSION),
        );
        if self.cache == Some(CacheTtl::OneHour) {
            // The hour-long cache came in behind this beta; the API still takes the header.
            headers.insert(
                "anthropic-beta",
                HeaderValue::from_static(Anthropic::EXTENDED_CACHE_TTL_BETA),
            );
        }
        headers
    }

    fn frame(&self, endpoint: &Endpoint, req: &ModelRequest, stream: bool) -> Result<Frame, Error> {
        frame(
            &endpoint.model,
            endpoint.max_tokens,
            self.cache,
            req,
            stream,
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
