//! The machinery every provider shares: one HTTP call, streamed or not, its span, its errors.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tower_agent_core::event::BoxFuture;

use tower_agent_core::{Error, ErrorKind, ModelPrice, ModelRequest, ModelResponse};
use tracing::Instrument;

use crate::classify::classify;
use crate::encode;
use crate::telemetry;
use crate::wire::{Endpoint, Format, invalid};

/// A provider's client: its wire format, where its requests go, the HTTP client, and whether
/// to stream.
#[derive(Debug, Clone)]
pub(crate) struct Client<W> {
    pub(crate) wire: W,
    pub(crate) endpoint: Endpoint,
    pub(crate) http: reqwest::Client,
    pub(crate) stream: bool,
    /// Headers the host adds to every request (OpenRouter's `HTTP-Referer`, a test id).
    pub(crate) extra: HeaderMap,
    /// The longest wait for the next byte of a streamed answer (its head included).
    pub(crate) idle_timeout: Duration,
    /// Put the messages on the call's span (`gen_ai.input.messages`, ...).
    pub(crate) capture_content: bool,
    /// The model's prices: each call's usage gets its cost.
    pub(crate) price: Option<ModelPrice>,
    /// Where this provider keeps a run's encoded messages (its own, not another provider's).
    pub(crate) encoded: encode::KeptKey,
    /// Fields the host adds to every request body.
    pub(crate) extra_body: ExtraBody,
}

/// Fields added to every request body, encoded as `,"key":value` pairs; its `Debug` shows
/// only their names (a value may be a secret).
#[derive(Clone, Default)]
pub(crate) struct ExtraBody {
    names: Vec<String>,
    fields: Vec<u8>,
}

impl ExtraBody {
    /// The fields of `object`.
    pub(crate) fn of(object: serde_json::Value) -> Result<Self, Error> {
        let serde_json::Value::Object(map) = object else {
            return Err(Error::bad_request(
                "the extra body must be a JSON object of fields",
            ));
        };
        let mut extra = ExtraBody::default();
        for (name, value) in map {
            extra.fields.push(b',');
            let pair = serde_json::to_vec(&serde_json::json!({ &name: value }))
                .map_err(|e| Error::bad_request(format!("the extra body: {e}")))?;
            // `{"name":value}` without its braces.
            extra.fields.extend_from_slice(&pair[1..pair.len() - 1]);
            extra.names.push(name);
        }
        Ok(extra)
    }

    /// `body` (a JSON object) with the fields added at its end.
    fn add_to(&self, mut body: Vec<u8>) -> Vec<u8> {
        if self.fields.is_empty() || body.last() != Some(&b'}') {
            return body;
        }
        let end = body.len() - 1;
        // An empty object takes no leading comma.
        let fields = match body[..end].iter().rev().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => &self.fields[1..],
            _ => &self.fields[..],
        };
        body.splice(end..end, fields.iter().copied());
        body
    }
}

impl std::fmt::Debug for ExtraBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.names).finish()
    }
}

/// The `max_tokens` a provider sends when the request sets none: enough for a long answer,
/// short of a runaway that streams to the end of the context.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 4096;

impl<W> Client<W> {
    /// A streaming client of `wire` to `endpoint` with the default HTTP client and timeouts.
    pub(crate) fn new(wire: W, endpoint: Endpoint) -> Self {
        Self {
            wire,
            endpoint,
            http: default_http(),
            stream: true,
            extra: HeaderMap::new(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            capture_content: false,
            price: None,
            encoded: encode::KeptKey::new(),
            extra_body: ExtraBody::default(),
        }
    }
}

/// The longest wait for a TCP (and TLS) connection, in the default HTTP client.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest wait for the next byte of a streamed answer, by default.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// After the provider said the answer is complete, how long the rest of the body (the end of
/// the chunked encoding, usually in the same packet) is read, so the connection goes back to
/// the pool; and how much of it.
const DRAIN_WAIT: Duration = Duration::from_millis(250);
const DRAIN_EVENTS: usize = 64;

/// The most bytes handed to the event-stream parser at once: it copies what it has not parsed
/// yet after every line, so one large network read would cost time quadratic in its size.
const PIECE: usize = 1024;

/// One model call, in its span (and measured, with the `otel` feature).
pub(crate) fn call<W: Format>(
    client: Arc<Client<W>>,
    req: ModelRequest,
) -> BoxFuture<'static, Result<ModelResponse, Error>> {
    let span = telemetry::span::<W>(&client.endpoint, client.capture_content, &req);
    let record = span.clone();
    Box::pin(
        async move {
            #[cfg(feature = "otel")]
            let start = std::time::Instant::now();
            let result = priced(client.price, send(&client, &req).await);
            telemetry::record(&record, client.capture_content, &result);
            #[cfg(feature = "otel")]
            telemetry::measure::<W>(&client.endpoint, start.elapsed(), &result);
            result
        }
        .instrument(span),
    )
}

/// `result` with the cost of its usage at `price` (a failed call's partial usage too).
fn priced(
    price: Option<ModelPrice>,
    result: Result<ModelResponse, Error>,
) -> Result<ModelResponse, Error> {
    let Some(price) = price else {
        return result;
    };
    match result {
        Ok(mut response) => {
            response.usage.cost = price.cost(&response.usage);
            Ok(response)
        }
        Err(error) if !error.usage().is_zero() => {
            let usage = error.usage();
            Err(error.with_usage(usage.with_cost(price.cost(&usage))))
        }
        Err(error) => Err(error),
    }
}

async fn send<W: Format>(client: &Client<W>, req: &ModelRequest) -> Result<ModelResponse, Error> {
    // A cancelled run sends nothing (a retry waking up after a cancellation, say).
    if req.ctx.is_cancelled() {
        return Err(Error::cancelled());
    }
    let wire = &client.wire;
    let endpoint = &client.endpoint;
    let url = wire.url(endpoint, client.stream);
    let headers = request_headers(wire, endpoint, &client.extra);
    let body = encode::body(wire, endpoint, req, client.stream, Some(&client.encoded))?;
    let body = Bytes::from(client.extra_body.add_to(body));
    let post = || {
        let sent = client
            .http
            .post(&url)
            .headers(headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send();
        // A whole answer arrives once it is generated, however long that takes: only a
        // streamed one is bounded while it waits for its head.
        async {
            if client.stream {
                idle::<W, _>(client.idle_timeout, &url, sent).await
            } else {
                Ok(sent.await)
            }
        }
    };
    let response = match post().await? {
        // A kept connection the server closed while it waited in the pool (llama-server and
        // Node servers close after 5 s): once more at once, on a new one.
        Err(error) if closed_under_us(&error) => post().await?,
        other => other,
    }
    .map_err(|e| transport_error(W::SPEC.provider, &url, e))?;
    if !response.status().is_success() {
        return Err(refusal::<W>(client, &url, response).await);
    }
    if !client.stream {
        // Generated: the body follows its head at once.
        let bytes = idle::<W, _>(client.idle_timeout, &url, response.bytes())
            .await?
            .map_err(|e| transport_error(W::SPEC.provider, &url, e))?;
        return W::decode(&bytes);
    }
    let reads = idle_reads(Box::pin(response.bytes_stream()), client.idle_timeout);
    let mut events = std::pin::pin!(events(reads));
    let mut decoder = W::decoder();
    let mut deltas = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(Read::Failed(e)) => {
                transport_error(W::SPEC.provider, &url, e)
            }
            EventStreamError::Transport(Read::Idle) => idle_error::<W>(client.idle_timeout, &url),
            other => invalid(W::SPEC.provider, "the event stream", other),
        })?;
        decoder.feed(&event.event, &event.data, &mut deltas)?;
        for delta in deltas.drain(..) {
            // Up through the layers' filters: one may stop the stream (a guardrail).
            req.send_delta(delta).await?;
        }
        if decoder.is_done() {
            break;
        }
    }
    let done = decoder.is_done();
    let response = decoder.finish()?;
    // What the filters held back goes up before the drain.
    req.end_stream().await?;
    if done {
        // Read the body to its end, so the connection can serve the next call.
        let rest = events.by_ref().take(DRAIN_EVENTS).for_each(|_| async {});
        let _ = tokio::time::timeout(DRAIN_WAIT, rest).await;
    }
    Ok(response)
}

/// The events of a server-sent event stream, its reads cut in pieces (see [`pieces`]).
fn events<S, E>(
    body: S,
) -> impl Stream<Item = Result<eventsource_stream::Event, EventStreamError<E>>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    body.flat_map(|read| {
        let pieces: Vec<Result<Bytes, E>> = match read {
            Ok(bytes) => pieces(bytes).into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        };
        futures_util::stream::iter(pieces)
    })
    .eventsource()
}

/// `read` in pieces of at least [`PIECE`] bytes, each ending at a line's end (no copy: each
/// piece shares the read's buffer). The parser copies what it has not parsed after every line,
/// so a large read of many lines would cost time quadratic in its size; and it rescans an
/// unfinished line for every piece added to it, so a long line is never cut here.
fn pieces(read: Bytes) -> Vec<Bytes> {
    let mut pieces = Vec::with_capacity(read.len() / PIECE + 1);
    let mut start = 0;
    while read.len() - start > PIECE {
        match read[start + PIECE..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = start + PIECE + at + 1;
                pieces.push(read.slice(start..end));
                start = end;
            }
            None => break,
        }
    }
    if start < read.len() {
        pieces.push(read.slice(start..));
    }
    pieces
}

/// A network read of a streamed body, or why there was none.
enum Read {
    Failed(reqwest::Error),
    /// Nothing came for the idle timeout.
    Idle,
}

impl std::fmt::Display for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Read::Failed(error) => error.fmt(f),
            Read::Idle => f.write_str("nothing came for the idle timeout"),
        }
    }
}

/// The reads of `body`, ending with [`Read::Idle`] when one does not come within `limit`:
/// every byte counts, the comments a server sends to keep a quiet stream alive included.
fn idle_reads<S>(body: S, limit: Duration) -> impl Stream<Item = Result<Bytes, Read>>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
{
    futures_util::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(limit, body.next()).await {
            Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(body))),
            Ok(Some(Err(error))) => Some((Err(Read::Failed(error)), None)),
            Ok(None) => None,
            Err(_) => Some((Err(Read::Idle), None)),
        }
    })
}

/// Whether the connection closed before any answer: the server closed a kept connection as
/// the request went out on it (or reset it). Nothing was answered, so the request is sent
/// again at once.
fn closed_under_us(error: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(|e| e.is_incomplete_message() || e.is_canceled())
        {
            return true;
        }
        if cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        }) {
            return true;
        }
        source = cause.source();
    }
    false
}

/// `future`, or a [`ErrorKind::Timeout`] when nothing came for `limit`.
async fn idle<W: Format, F: std::future::Future>(
    limit: Duration,
    url: &str,
    future: F,
) -> Result<F::Output, Error> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| idle_error::<W>(limit, url))
}

/// The error of a server that sent nothing for `limit`.
fn idle_error<W: Format>(limit: Duration, url: &str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!(
            "{}: no byte from {} for {limit:?} (the idle timeout)",
            W::SPEC.provider,
            safe_url(url)
        ),
    )
}

/// The error a refused request gets: its status, headers and body classified; a 404 names
/// the URL and what the base URL should be.
async fn refusal<W: Format>(client: &Client<W>, url: &str, response: reqwest::Response) -> Error {
    let status = response.status();
    let headers = response.headers().clone();
    // An error's body is short; a server that stalls sending it gets what it sent so far
    // classified.
    let body = tokio::time::timeout(client.idle_timeout, response.text())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let error = classify(
        W::SPEC.provider,
        &W::SPEC.errors,
        status,
        &headers,
        &body,
        client.endpoint.key.as_ref(),
        SystemTime::now(),
    );
    if status != reqwest::StatusCode::NOT_FOUND {
        return error;
    }
    Error::new(
        error.kind(),
        format!(
            "{} (POST {}; check the base URL: {})",
            error.message(),
            safe_url(url),
            W::SPEC.base_url_hint
        ),
    )
}

/// The host's headers, then the format's: a format's header replaces the host's of the same
/// name, but for the list-valued ones ([`Format::LIST_HEADERS`]), where the format's values
/// are added to the host's (once each; sensitive when either is).
pub(crate) fn request_headers<W: Format>(
    wire: &W,
    endpoint: &Endpoint,
    extra: &HeaderMap,
) -> HeaderMap {
    let mut headers = extra.clone();
    // `HeaderMap`'s iterator names a header once, before all its values.
    let mut current: Option<HeaderName> = None;
    for (name, value) in wire.headers(endpoint) {
        let name = match name {
            Some(name) => name,
            None => match &current {
                Some(name) => {
                    headers.append(name.clone(), value);
                    continue;
                }
                None => continue,
            },
        };
        let value = if W::SPEC.list_headers.contains(&name.as_str()) && headers.contains_key(&name)
        {
            joined(&headers, &name, &value).unwrap_or(value)
        } else {
            value
        };
        headers.insert(name.clone(), value);
        current = Some(name);
    }
    headers
}

/// The host's values of the list header `name`, and `value` when none of them holds it, as one
/// comma-separated value.
fn joined(headers: &HeaderMap, name: &HeaderName, value: &HeaderValue) -> Option<HeaderValue> {
    let new = value.to_str().ok()?.trim();
    let mut tokens: Vec<&str> = Vec::new();
    let mut sensitive = value.is_sensitive();
    for host in headers.get_all(name) {
        sensitive |= host.is_sensitive();
        tokens.extend(
            host.to_str()
                .ok()?
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty()),
        );
    }
    if !tokens.contains(&new) {
        tokens.push(new);
    }
    let mut joined = HeaderValue::from_str(&tokens.join(",")).ok()?;
    joined.set_sensitive(sensitive);
    Some(joined)
}

/// `url` without a trailing `/`, and the path after its host (empty when it has none).
pub(crate) fn split_base(url: &str) -> (&str, &str) {
    let url = url.trim().trim_end_matches('/');
    let host_start = url.find("://").map_or(0, |at| at + 3);
    let path = url[host_start..]
        .find('/')
        .map_or("", |at| &url[host_start + at..]);
    (url, path)
}

/// `url` without what may hide a secret: its query and its user and password.
pub(crate) fn safe_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "(an invalid URL)".to_owned(),
    }
}

/// A failure to talk to the server at all, naming the URL (without its query and user), with
/// the cause as its source.
pub(crate) fn transport_error(provider: &'static str, url: &str, error: reqwest::Error) -> Error {
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else if error.is_connect() {
        ErrorKind::Unreachable
    } else if error.is_builder() {
        ErrorKind::BadRequest
    } else {
        ErrorKind::Server
    };
    let what = if error.is_connect() {
        "cannot connect to"
    } else if error.is_body() || error.is_decode() {
        "the response broke off from"
    } else {
        "the request failed to"
    };
    let error = error.without_url();
    let mut message = format!("{provider}: {what} {}: {error}", safe_url(url));
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    Error::new(kind, message).with_source(error)
}

/// The HTTP client every provider builds by default: rustls, a connect timeout, no overall
/// timeout (a stream may run for minutes; the provider's idle timeout bounds a stall).
pub(crate) fn default_http() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
        .build()
        .unwrap_or_default()
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
pub(crate) fn request_body<W: Format>(
    client: &Client<W>,
    req: &ModelRequest,
) -> Result<Vec<u8>, Error> {
    let across = Some(&client.encoded);
    let body = encode::body(&client.wire, &client.endpoint, req, client.stream, across)?;
    Ok(client.extra_body.add_to(body))
}

/// The response a recorded body gives: a server-sent event stream when `client` streams, a
/// whole JSON body otherwise. No event is emitted.
pub(crate) fn parse_recorded<W: Format>(
    client: &Client<W>,
    body: &[u8],
) -> Result<ModelResponse, Error> {
    use futures_util::FutureExt;
    if !client.stream {
        return W::decode(body);
    }
    let read = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
        Bytes::copy_from_slice(body),
    )]);
    let mut events = std::pin::pin!(events(read));
    let mut decoder = W::decoder();
    let mut deltas = Vec::new();
    while let Some(Some(event)) = events.next().now_or_never() {
        let event = event.map_err(|e| invalid(W::SPEC.provider, "the event stream", e))?;
        decoder.feed(&event.event, &event.data, &mut deltas)?;
        deltas.clear();
        if decoder.is_done() {
            break;
        }
    }
    decoder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_at_line_ends_and_never_cut_a_line() {
        // Many short lines: pieces of at least PIECE bytes, each ending a line.
        let lines: String = (0..200)
            .map(|i| format!("data: {{\"n\": {i}}}\n\n"))
            .collect();
        let read = Bytes::from(lines.clone());
        let cut = pieces(read);
        assert!(cut.len() > 1);
        assert_eq!(cut.concat(), lines.as_bytes());
        for piece in &cut[..cut.len() - 1] {
            assert!(
                piece.len() > PIECE && piece.ends_with(b"\n"),
                "{}",
                piece.len()
            );
        }
        // One long line: whole in one piece, whatever its size.
        let line = format!("data: {}\n", "x".repeat(100 * PIECE));
        let cut = pieces(Bytes::from(format!("{line}\n")));
        assert_eq!(cut[0], line.as_bytes());
        // A read that ends inside a line passes whole.
        let half = Bytes::from("x".repeat(10 * PIECE));
        assert_eq!(pieces(half.clone()), [half]);
        assert!(pieces(Bytes::new()).is_empty());
    }
}
