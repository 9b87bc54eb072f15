//! The machinery every provider shares: one HTTP call, streamed or not, its span, its errors.

use std::sync::Arc;
use std::time::SystemTime;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use std::borrow::Cow;
use tower_agent_core::event::BoxFuture;

use tower_agent_core::{
    ContentPart, Error, ErrorKind, Event, FinishReason, Message, ModelRequest, ModelResponse,
};
use tracing::Instrument;

use crate::classify::classify;
use crate::encode::{self, Frame};
use crate::key::ApiKey;

/// A piece of a streamed answer, for the run's event sink.
#[derive(Debug)]
pub(crate) enum Delta {
    Text(String),
    Reasoning(String),
}

/// Assembles one streamed answer from its server-sent events.
pub(crate) trait StreamDecoder: Send {
    /// Take one event (`event` is its `event:` name, empty when none); push what should reach
    /// the event sink now to `deltas`.
    ///
    /// # Errors
    ///
    /// A chunk that is not what the provider sends (invalid JSON), or an error event.
    fn feed(&mut self, event: &str, data: &str, deltas: &mut Vec<Delta>) -> Result<(), Error>;

    /// Whether the provider said the answer is complete.
    fn is_done(&self) -> bool;

    /// The complete answer.
    ///
    /// # Errors
    ///
    /// The stream ended before the provider said the answer is complete.
    fn finish(self: Box<Self>) -> Result<ModelResponse, Error>;
}

/// One provider's wire format.
pub(crate) trait Wire: Send + Sync + 'static {
    /// The provider's name, as in `gen_ai.provider.name`.
    const PROVIDER: &'static str;

    fn model(&self) -> &str;
    fn key(&self) -> Option<&ApiKey>;
    fn url(&self, stream: bool) -> String;
    /// Headers beyond `content-type`, the key's among them (marked sensitive).
    fn headers(&self) -> HeaderMap;

    /// The key of a turn's item list, for providers whose messages are turns of items
    /// (`content` for Anthropic, `parts` for Gemini).
    const TURN_ITEMS: &'static str = "content";

    /// The body around the messages (model, system prompt, tools, options).
    ///
    /// # Errors
    ///
    /// A request this provider cannot express.
    fn frame(&self, req: &ModelRequest, stream: bool) -> Result<Frame, Error>;

    /// Append one message's items to `out` (comma-separated, nothing when it has none), and
    /// say which turn they belong to (`None`: they stand alone in the array). Must depend on
    /// the message only: the bytes are reused across rounds and requests of a run.
    ///
    /// # Errors
    ///
    /// A message this provider cannot express.
    fn encode_message(
        &self,
        message: &Message,
        out: &mut Vec<u8>,
    ) -> Result<Option<&'static str>, Error>;

    /// A whole (not streamed) response body.
    ///
    /// # Errors
    ///
    /// A body that is not what the provider sends.
    fn decode(&self, body: &[u8]) -> Result<ModelResponse, Error>;

    fn decoder(&self) -> Box<dyn StreamDecoder>;
}

/// A key header value the HTTP stack will not log.
pub(crate) fn secret_header(name: &'static str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    let mut value = HeaderValue::from_str(value).ok()?;
    value.set_sensitive(true);
    Some((HeaderName::from_static(name), value))
}

/// A provider's client: its wire format, the HTTP client, and whether to stream.
#[derive(Debug, Clone)]
pub(crate) struct Client<W> {
    pub(crate) wire: W,
    pub(crate) http: reqwest::Client,
    pub(crate) stream: bool,
    /// Headers the host adds to every request (OpenRouter's `HTTP-Referer`, a test id).
    pub(crate) extra: HeaderMap,
}

/// One model call.
pub(crate) fn call<W: Wire>(
    client: Arc<Client<W>>,
    req: ModelRequest,
) -> BoxFuture<'static, Result<ModelResponse, Error>> {
    let span = tracing::info_span!(
        "chat",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = W::PROVIDER,
        gen_ai.request.model = client.wire.model(),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let record = span.clone();
    Box::pin(
        async move {
            let result = send(&client, &req).await;
            match &result {
                Ok(res) => {
                    record.record("gen_ai.usage.input_tokens", res.usage.input_tokens);
                    record.record("gen_ai.usage.output_tokens", res.usage.output_tokens);
                    record.record(
                        "gen_ai.response.finish_reasons",
                        finish_reason_name(&res.finish_reason),
                    );
                }
                Err(error) => {
                    record.record("error.type", tracing::field::debug(error.kind()));
                }
            }
            result
        }
        .instrument(span),
    )
}

async fn send<W: Wire>(client: &Client<W>, req: &ModelRequest) -> Result<ModelResponse, Error> {
    // A cancelled run sends nothing (a retry waking up after a cancellation, say).
    if req.ctx.is_cancelled() {
        return Err(Error::cancelled());
    }
    let wire = &client.wire;
    let body = encode::body(wire, req, client.stream, true)?;
    let response = client
        .http
        .post(wire.url(client.stream))
        .headers(client.extra.clone())
        .headers(wire.headers())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| transport_error(W::PROVIDER, e))?;
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        return Err(classify(
            W::PROVIDER,
            status,
            &headers,
            &body,
            wire.key(),
            SystemTime::now(),
        ));
    }
    if !client.stream {
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport_error(W::PROVIDER, e))?;
        return wire.decode(&bytes);
    }
    let mut events = response.bytes_stream().eventsource();
    let mut decoder = wire.decoder();
    let mut deltas = Vec::new();
    let round = req.ctx.round();
    let listening = req.ctx.events().is_enabled();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(e) => transport_error(W::PROVIDER, e),
            other => Error::new(
                ErrorKind::Server,
                format!("{}: the event stream is not valid: {other}", W::PROVIDER),
            ),
        })?;
        decoder.feed(&event.event, &event.data, &mut deltas)?;
        for delta in deltas.drain(..) {
            if !listening {
                continue;
            }
            let event = match delta {
                Delta::Text(delta) => Event::TextDelta { round, delta },
                Delta::Reasoning(delta) => Event::ReasoningDelta { round, delta },
            };
            req.ctx.emit(event).await?;
        }
        if decoder.is_done() {
            break;
        }
    }
    decoder.finish()
}

/// A failure to talk to the server at all, without the URL (a key may hide in a URL).
pub(crate) fn transport_error(provider: &'static str, error: reqwest::Error) -> Error {
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else if error.is_builder() {
        ErrorKind::BadRequest
    } else {
        ErrorKind::Server
    };
    let what = if error.is_connect() {
        "cannot connect"
    } else if error.is_body() || error.is_decode() {
        "the response broke off"
    } else {
        "the request failed"
    };
    let error = error.without_url();
    let mut message = format!("{provider}: {what}: {error}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    Error::new(kind, message)
}

/// The error of a body that is not what the provider sends.
pub(crate) fn invalid(provider: &'static str, what: &str, error: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Server,
        format!("{provider}: {what} is not valid: {error}"),
    )
}

/// The error of a stream that ended before the provider said the answer was complete.
pub(crate) fn truncated(provider: &'static str) -> Error {
    Error::new(
        ErrorKind::Server,
        format!("{provider}: the stream ended before the answer was complete"),
    )
}

/// The OpenTelemetry name of a finish reason.
pub(crate) fn finish_reason_name(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other(other) => other,
    }
}

/// The HTTP client every provider builds by default: rustls, a connect timeout, no overall
/// timeout (a stream may run for minutes: put tower's `Timeout` around the service instead).
pub(crate) fn default_http() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// The text parts of `message`, borrowed when there is one.
pub(crate) fn text_of(message: &Message) -> Cow<'_, str> {
    let mut texts = message.content.iter().filter_map(|p| match p {
        ContentPart::Text { text } => Some(text.as_str()),
        _ => None,
    });
    match (texts.next(), texts.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(one), None) => Cow::Borrowed(one),
        (Some(first), Some(second)) => {
            let mut all = format!("{first}{second}");
            all.extend(texts);
            Cow::Owned(all)
        }
    }
}

/// A provider's configuration for `Debug`: the base URL without its query (a key may hide
/// there), and whether a key is set, never the key.
pub(crate) fn debug_wire(
    f: &mut std::fmt::Formatter<'_>,
    model: &str,
    base_url: &str,
    key: Option<&ApiKey>,
) -> std::fmt::Result {
    f.debug_struct("Config")
        .field("model", &model)
        .field("base_url", &base_url.split('?').next().unwrap_or_default())
        .field("key", &key)
        .finish()
}

/// Add a header for every request; an invalid name or value is refused.
pub(crate) fn add_header(extra: &mut HeaderMap, name: &str, value: &str) -> Result<(), Error> {
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| Error::bad_request(format!("invalid header name `{name}`: {e}")))?;
    let value = HeaderValue::from_str(value)
        .map_err(|e| Error::bad_request(format!("invalid value for header `{name}`: {e}")))?;
    extra.insert(name, value);
    Ok(())
}

/// The body `client` would send for `req`.
pub(crate) fn request_body<W: Wire>(
    client: &Client<W>,
    req: &ModelRequest,
) -> Result<Vec<u8>, Error> {
    encode::body(&client.wire, req, client.stream, true)
}

/// The response a recorded body gives: a server-sent event stream when `client` streams, a
/// whole JSON body otherwise. No event is emitted.
pub(crate) fn parse_recorded<W: Wire>(
    client: &Client<W>,
    body: &[u8],
) -> Result<ModelResponse, Error> {
    use futures_util::FutureExt;
    if !client.stream {
        return client.wire.decode(body);
    }
    // In pieces, as a network delivers them: the SSE parser keeps what it has not parsed yet,
    // and one huge piece would make it copy the rest after every event.
    let chunks = futures_util::stream::iter(
        body.chunks(8 * 1024)
            .map(|piece| Ok::<_, std::convert::Infallible>(piece.to_vec())),
    );
    let mut events = chunks.eventsource();
    let mut decoder = client.wire.decoder();
    let mut deltas = Vec::new();
    while let Some(Some(event)) = events.next().now_or_never() {
        let event = event.map_err(|e| invalid(W::PROVIDER, "the event stream", e))?;
        decoder.feed(&event.event, &event.data, &mut deltas)?;
        deltas.clear();
        if decoder.is_done() {
            break;
        }
    }
    decoder.finish()
}

/// The configuration methods and the `Service` impl every provider shares, for a provider
/// type `$provider` holding `client: Arc<Client<$wire>>`. The methods go inside its
/// `impl` block; the provider's own (`new`, `base_url`, `api_key`, ...) stay beside them.
macro_rules! provider_methods {
    ($wire:ty) => {
        fn edit(mut self, f: impl FnOnce(&mut $crate::http::Client<$wire>)) -> Self {
            f(::std::sync::Arc::make_mut(&mut self.client));
            self
        }

        /// Stream the answer (the default) or not.
        pub fn streaming(self, stream: bool) -> Self {
            self.edit(|c| c.stream = stream)
        }

        /// The reqwest client to use (proxies, timeouts, TLS roots).
        pub fn http_client(self, http: reqwest::Client) -> Self {
            self.edit(|c| c.http = http)
        }

        /// Send `name: value` with every request (e.g. OpenRouter's `HTTP-Referer`).
        ///
        /// # Errors
        ///
        /// `BadRequest` when the name or the value is not valid in a header.
        pub fn header(mut self, name: &str, value: &str) -> Result<Self, tower_agent_core::Error> {
            $crate::http::add_header(
                &mut ::std::sync::Arc::make_mut(&mut self.client).extra,
                name,
                value,
            )?;
            Ok(self)
        }

        /// The request body this service sends for `req` (streamed or not, as configured):
        /// for logging, tests and benchmarks. Like a call, it reuses the bytes of the
        /// messages it encoded before for the same run (`req.ctx`).
        ///
        /// # Errors
        ///
        /// A request this provider cannot express.
        pub fn request_body(
            &self,
            req: &tower_agent_core::ModelRequest,
        ) -> Result<Vec<u8>, tower_agent_core::Error> {
            $crate::http::request_body(&self.client, req)
        }

        /// The response a recorded body gives, as a call would return it: a server-sent
        /// event stream when the service streams, a whole JSON body otherwise. No event is
        /// emitted.
        ///
        /// # Errors
        ///
        /// As a call: a broken stream, an error event, invalid JSON.
        pub fn parse_response(
            &self,
            body: &[u8],
        ) -> Result<tower_agent_core::ModelResponse, tower_agent_core::Error> {
            $crate::http::parse_recorded(&self.client, body)
        }

        /// The model's name.
        pub fn model(&self) -> &str {
            &self.client.wire.model
        }
    };
}

/// `Service<ModelRequest>` for a provider type holding `client: Arc<Client<_>>`: always
/// ready, each call one HTTP exchange ([`call`]).
macro_rules! provider_service {
    ($provider:ty) => {
        impl tower_service::Service<tower_agent_core::ModelRequest> for $provider {
            type Response = tower_agent_core::ModelResponse;
            type Error = tower_agent_core::Error;
            type Future = tower_agent_core::event::BoxFuture<
                'static,
                Result<tower_agent_core::ModelResponse, tower_agent_core::Error>,
            >;

            fn poll_ready(
                &mut self,
                _cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<Result<(), tower_agent_core::Error>> {
                ::std::task::Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: tower_agent_core::ModelRequest) -> Self::Future {
                $crate::http::call(::std::sync::Arc::clone(&self.client), req)
            }
        }
    };
}

pub(crate) use {provider_methods, provider_service};
