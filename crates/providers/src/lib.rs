//! Model services over reqwest (rustls, no OpenSSL): one module and one cargo feature per
//! provider.
//!
//! | service | feature | API | key from |
//! |---|---|---|---|
//! | [`OpenAi`] | `openai` | Chat Completions, any base URL (vLLM, llama.cpp, Ollama, LM Studio, OpenRouter) | `OPENAI_API_KEY` (base URL `OPENAI_BASE_URL`) |
//! | [`Anthropic`] | `anthropic` | Messages | `ANTHROPIC_API_KEY` |
//! | [`Gemini`] | `gemini` | `generateContent` | `GEMINI_API_KEY` |
//!
//! Each is one type, [`Provider`], over the provider's wire format (`OpenAi` is
//! `Provider<OpenAiWire>`): the methods are written once, a provider's own options sit in its
//! module. Each is a `Service<ModelRequest, Response = ModelResponse, Error = Error>`: wrap it
//! in the model layers like any model service. Each streams by default (server-sent events, parsed by
//! `eventsource-stream`): text and reasoning deltas reach the run's event sink as they arrive,
//! and the response that goes back through the layers is the whole message. A broken stream
//! is an error, never a half message.
//!
//! Failures are classified into the core [`ErrorKind`](tower_agent_core::ErrorKind)s from the
//! status, the headers and the body, with the wait the provider asked for (see `classify`
//! below). Keys are sent in headers marked sensitive, never in URLs, and never appear in
//! `Debug` output or errors ([`ApiKey`]).
//!
//! A provider sends the whole history every round. Each message is encoded once per run: its
//! bytes are kept in the run's context with a mark of the history
//! ([`HistoryMark`](tower_agent_core::HistoryMark)), and later rounds reuse them for the
//! messages their history still starts with, encoding only the new ones. At 1,000 messages a
//! later round's body costs about a twentieth of a fresh encoding.
//!
//! Every call runs in a `tracing` span named `chat` (`otel.name` `chat {model}`, of kind
//! client) with the attributes of the OpenTelemetry GenAI semantic conventions, as of version 1.41.0
//! ([`SEMCONV_SCHEMA_URL`](tower_agent_core::SEMCONV_SCHEMA_URL)): `gen_ai.operation.name`, `gen_ai.provider.name`,
//! `gen_ai.request.model` (and `max_tokens`, `temperature`, `top_p` when set), `server.address`,
//! `server.port`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.usage.cache_read.input_tokens`, `gen_ai.response.finish_reasons`, and `error.type`
//! on failure. The messages go on it only when asked ([`Provider::capture_content`]). With the
//! `otel` feature each call also records the conventions' client metrics on the global meter
//! provider (`opentelemetry::global`): `gen_ai.client.operation.duration` (seconds) and
//! `gen_ai.client.token.usage` (per `gen_ai.token.type`), with the advised buckets. The
//! conventions are still marked in development; a version of this crate follows one version of
//! them.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod key;
mod price;

#[cfg(feature = "http")]
pub mod classify;
#[cfg(all(test, feature = "openai", feature = "anthropic", feature = "gemini"))]
mod classify_each;
#[cfg(feature = "http")]
mod encode;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod provider;
#[cfg(feature = "http")]
mod telemetry;
#[cfg(feature = "http")]
mod wire;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "gemini")]
pub mod gemini;
#[cfg(feature = "openai")]
pub mod openai;

pub use key::ApiKey;
pub use price::PriceTable;
#[cfg(feature = "http")]
pub use provider::{Provider, Wire};

#[cfg(feature = "anthropic")]
pub use anthropic::Anthropic;
#[cfg(feature = "gemini")]
pub use gemini::Gemini;
#[cfg(feature = "openai")]
pub use openai::OpenAi;
