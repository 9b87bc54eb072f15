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

use std::sync::Arc;

use reqwest::header::HeaderMap;
use tower_agent_core::{Error, Message, ModelRequest, ModelResponse};

use crate::http::{self, Client};
use crate::key::ApiKey;
use crate::wire::{Frame, StreamDecoder, Wire, secret_header};

mod request;
mod response;
#[cfg(test)]
mod tests;

use request::{encode_message, frame};
use response::{Decoder, decode};

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
            client: Arc::new(Client::new(GeminiWire {
                model: model.into(),
                base_url: base_url_of(&base_url),
                key: ApiKey::from_env("GEMINI_API_KEY"),
            })),
        }
    }

    /// The server's base URL, up to the API version
    /// (`https://generativelanguage.googleapis.com/v1beta`). A URL with no path gets
    /// `/v1beta`; any other path is kept as it is.
    pub fn base_url(self, url: impl Into<String>) -> Self {
        let url = base_url_of(&url.into());
        self.edit(|c| c.wire.base_url = url)
    }

    /// The API key (instead of `GEMINI_API_KEY`). Sent in the `x-goog-api-key` header, never
    /// in the URL.
    pub fn api_key(self, key: impl Into<ApiKey>) -> Self {
        let key = key.into();
        self.edit(|c| c.wire.key = Some(key))
    }

    http::provider_methods!(GeminiWire);
}

http::provider_service!(Gemini);

impl std::fmt::Debug for GeminiWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        http::debug_wire(f, &self.model, &self.base_url, self.key.as_ref())
    }
}

/// A base URL as the requests need it: `/v1beta` added to a URL with no path.
fn base_url_of(url: &str) -> String {
    match http::split_base(url) {
        (url, "") => format!("{url}/v1beta"),
        (url, _) => url.to_owned(),
    }
}

impl Wire for GeminiWire {
    const PROVIDER: &'static str = PROVIDER;
    const BASE_URL_HINT: &'static str = "Gemini's ends in the API version \
        (https://generativelanguage.googleapis.com/v1beta)";

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
        encode_message(message, out)
    }

    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error> {
        decode(body)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::<Decoder>::default()
    }
}
