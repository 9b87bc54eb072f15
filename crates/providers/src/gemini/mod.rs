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
//! | [`ContextCacheLayer`] | a `cachedContents` resource holding `systemInstruction`, `tools` and `toolConfig`, named by `cachedContent` |
//! | `usageMetadata` | input = `promptTokenCount`, output = `candidatesTokenCount` + `thoughtsTokenCount`, cached = `cachedContentTokenCount` |
//!
//! A response without candidates, or whose candidate has no parts, is an
//! [`ErrorKind::EmptyResponse`](tower_agent_core::ErrorKind::EmptyResponse) error (retried by
//! the retry layer with a changed prompt); a prompt blocked by safety settings is a
//! `BadRequest` naming the reason. A stream that ends before a chunk with a `finishReason` is
//! an error.
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

use crate::classify::{ErrorWords, Quota, Resets};
use crate::wire::Spec;

use reqwest::header::HeaderMap;
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};

use crate::http;
use crate::provider::Provider;
use crate::wire::{Endpoint, Format, Frame, Items, StreamDecoder, secret_header};

mod cache;
mod request;
mod response;
#[cfg(test)]
mod tests;

pub use cache::{ContextCacheLayer, ContextCached};
use request::{encode_message, frame};
use response::{Decoder, decode};

const PROVIDER: &str = "gemini";

/// What Gemini's error bodies say: a 429 without a retry delay that speaks of a quota is one
/// used up.
pub(crate) const ERRORS: ErrorWords = ErrorWords {
    overflow: &["exceeds the maximum number of tokens", "input token count"],
    overflow_codes: &[],
    quota: Quota::WordWithoutDelay("quota"),
    resets: Resets::None,
};

/// A model service over Gemini `generateContent`; see the [module docs](self) and
/// [`Provider`] for its methods.
///
/// [`Provider::base_url`] takes the URL up to the API version
/// (`https://generativelanguage.googleapis.com/v1beta`); a URL with no path gets `/v1beta`,
/// any other path is kept as it is. The key goes in the `x-goog-api-key` header, never in the
/// URL.
pub type Gemini = Provider<GeminiWire>;

/// The wire format of Gemini `generateContent`, with its options: see [`Gemini`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct GeminiWire {}

/// A base URL as the requests need it: `/v1beta` added to a URL with no path.
fn base_url_of(url: &str) -> String {
    match http::split_base(url) {
        (url, "") => format!("{url}/v1beta"),
        (url, _) => url.to_owned(),
    }
}

impl Format for GeminiWire {
    const SPEC: Spec = Spec {
        name: "Gemini",
        provider: PROVIDER,
        gen_ai_provider: "gcp.gemini",
        base_url_hint: "Gemini's ends in the API version \
        (https://generativelanguage.googleapis.com/v1beta)",
        default_base_url: "https://generativelanguage.googleapis.com/v1beta",
        key_env: "GEMINI_API_KEY",
        base_url_env: "GEMINI_BASE_URL",
        list_headers: &[],
        turn_items: "parts",
        errors: ERRORS,
    };

    fn base_url_of(url: &str) -> String {
        base_url_of(url)
    }

    fn url(&self, endpoint: &Endpoint, stream: bool) -> String {
        let Endpoint {
            base_url, model, ..
        } = endpoint;
        if stream {
            format!("{base_url}/models/{model}:streamGenerateContent?alt=sse")
        } else {
            format!("{base_url}/models/{model}:generateContent")
        }
    }

    fn headers(&self, endpoint: &Endpoint) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &endpoint.key {
            headers.extend(secret_header("x-goog-api-key", key.expose()));
        }
        headers
    }

    fn frame(
        &self,
        endpoint: &Endpoint,
        req: &ModelRequest,
        _stream: bool,
    ) -> Result<Frame, Error> {
        frame(req, endpoint.max_tokens(req))
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
