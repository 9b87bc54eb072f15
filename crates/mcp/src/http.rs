//! Streamable HTTP: rmcp's transport, watched so that a request the server refused because
//! its session is gone (it restarted), or that never left (the connection was refused), is
//! told apart from one whose outcome is unknown.
//!
//! rmcp's reqwest client keeps the HTTP status to itself: a `400` whose body is a JSON-RPC
//! error reaches the service as that error, and one without an `id` (server-everything's
//! "No valid session ID provided") is dropped, so the request waits forever. The worker here
//! stands between the service and rmcp's transport: it sends one message at a time (rmcp's
//! worker does anyway), so an error without an `id` that comes while a request is sent, or
//! queued before its send returned, is that request's.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorData, RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::worker::{Worker, WorkerConfig, WorkerContext, WorkerQuitReason};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{RoleClient, ServiceError};

/// Why a message was not sent, or not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The server refused the request because it does not know its session (HTTP 404, or a
    /// 400 that names the session): it did not run it.
    #[error("the server no longer knows the session: {0}")]
    SessionGone(String),
    /// The connection was refused: nothing was sent.
    #[error("the connection was refused, nothing was sent: {0}")]
    NotSent(String),
    /// The transport is closed.
    #[error("the transport is closed")]
    Closed,
    /// Anything else: the request may have reached the server.
    #[error(transparent)]
    Other(Box<dyn StdError + Send + Sync>),
}

/// Whether `error` (of a request) proves the server did not run the request: it refused it
/// for its session, or the connection was refused before anything was sent.
pub(crate) fn refused(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(error) = error else {
        return false;
    };
    matches!(
        error.error.downcast_ref::<HttpError>(),
        Some(HttpError::SessionGone(_) | HttpError::NotSent(_))
    )
}

/// The transport to `url`: rmcp's (its reqwest client: no connection pool, no redirects),
/// watched by [`Watched`].
pub(crate) fn transport(
    url: &str,
    bearer: Option<&str>,
) -> impl Worker<Role = RoleClient, Error = HttpError> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    // A broken event stream is resumed a few times (0.25 s, 0.5 s, 1 s), then the connection
    // counts as lost: rmcp's default retries forever, and a call would wait for a server that
    // is gone.
    let mut retry = ExponentialBackoff::default();
    retry.max_times = Some(3);
    retry.base_duration = Duration::from_millis(250);
    config.retry_config = Arc::new(retry);
    // A session the server forgot is started again by `McpTools` (which lists the tools again
    // too: a new deploy may have changed them), not inside rmcp.
    config.reinit_on_expired_session = false;
    if let Some(bearer) = bearer {
        config = config.auth_header(bearer.to_owned());
    }
    Watched {
        inner: StreamableHttpClientTransport::from_config(config),
    }
}

/// rmcp's HTTP transport, one message at a time, its errors classified (see the module).
struct Watched<C: StreamableHttpClient> {
    inner: StreamableHttpClientTransport<C>,
}

/// The message being sent.
struct Sending {
    /// Its id, when it is a request.
    id: Option<RequestId>,
    /// The server refused it for its session (an error in its answer said so).
    refused: Option<String>,
    responder: tokio::sync::oneshot::Sender<Result<(), HttpError>>,
}

impl<C: StreamableHttpClient> Worker for Watched<C> {
    type Error = HttpError;
    type Role = RoleClient;

    fn err_closed() -> Self::Error {
        HttpError::Closed
    }

    fn err_join(error: tokio::task::JoinError) -> Self::Error {
        HttpError::Other(Box::new(error))
    }

    fn config(&self) -> WorkerConfig {
        let mut config = WorkerConfig::default();
        config.name = Some("tower-agent-mcp streamable HTTP".to_owned());
        config
    }

    async fn run(
        self,
        mut context: WorkerContext<Self>,
    ) -> Result<(), WorkerQuitReason<Self::Error>> {
        let mut inner = self.inner;
        let cancelled = context.cancellation_token.clone();
        let mut sending: Option<Sending> = None;
        let mut sent: BoxFuture<'static, Result<(), StreamableHttpError<C::Error>>> =
            std::future::pending().boxed();
        // The `initialize` request until its answer comes: rmcp's worker returns from its
        // send before it reads the answer.
        let mut initializing: Option<RequestId> = None;
        let quit = loop {
            tokio::select! {
                biased;
                () = cancelled.cancelled() => break WorkerQuitReason::Cancelled,
                message = inner.receive() => {
                    let Some(message) = message else {
                        break WorkerQuitReason::TransportClosed;
                    };
                    if let Some(message) = take(message, sending.as_mut(), &mut initializing) {
                        context.send_to_handler(message).await?;
                    }
                }
                result = &mut sent, if sending.is_some() => {
                    sent = std::future::pending().boxed();
                    let Some(mut current) = sending.take() else {
                        continue;
                    };
                    // What the server answered before the send returned is queued already
                    // (the first of the queue, 16 at most): it is this message's. A fresh
                    // task budget first: a spent one would make the queue look empty.
                    tokio::task::yield_now().await;
                    let mut closed = false;
                    while let Some(next) = inner.receive().now_or_never() {
                        let Some(message) = next else {
                            closed = true;
                            break;
                        };
                        if let Some(message) = take(message, Some(&mut current), &mut initializing) {
                            context.send_to_handler(message).await?;
                        }
                    }
                    let result = match (current.refused.take(), result) {
                        (Some(why), _) => Err(HttpError::SessionGone(why)),
                        (None, Ok(())) => Ok(()),
                        (None, Err(error)) => Err(classify(error)),
                    };
                    let _ = current.responder.send(result);
                    if closed {
                        break WorkerQuitReason::TransportClosed;
                    }
                }
                request = context.recv_from_handler(), if sending.is_none() => {
                    let request = request?;
                    let id = match &request.message {
                        ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
                        _ => None,
                    };
                    if is_initialize(&request.message) {
                        initializing.clone_from(&id);
                    }
                    sent = inner.send(request.message).boxed();
                    sending = Some(Sending {
                        id,
                        refused: None,
                        responder: request.responder,
                    });
                }
            }
        };
        let _ = inner.close().await;
        Err(quit)
    }
}

fn is_initialize(message: &ClientJsonRpcMessage) -> bool {
    matches!(
        message,
        ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_))
    )
}

/// A message from the server while `current` is sent (or just was): passed on, or kept back
/// when it is `current`'s refusal for its session. An error without an `id` is the message
/// being sent's (or, when none is, the pending `initialize`'s): it gets that request's id, so
/// the request does not wait forever for an answer rmcp would drop.
fn take(
    mut message: ServerJsonRpcMessage,
    current: Option<&mut Sending>,
    initializing: &mut Option<RequestId>,
) -> Option<ServerJsonRpcMessage> {
    match &mut message {
        ServerJsonRpcMessage::Response(response) if initializing.as_ref() == Some(&response.id) => {
            *initializing = None;
        }
        ServerJsonRpcMessage::Error(error) => {
            match current {
                Some(current) => {
                    let theirs = error.id.is_none() || error.id == current.id;
                    if theirs && current.id.is_some() {
                        if refuses_session(error.id.is_none(), &error.error) {
                            current.refused = Some(error.error.message.to_string());
                            return None;
                        }
                        if error.id.is_none() {
                            error.id.clone_from(&current.id);
                        }
                    }
                }
                None => {
                    if error.id.is_none() {
                        error.id.clone_from(initializing);
                    }
                }
            }
            if error.id.is_some() && error.id == *initializing {
                *initializing = None;
            }
        }
        _ => {}
    }
    Some(message)
}

/// Whether a JSON-RPC error answering a request says the server does not know the session:
/// it names the session, and it is no answer of the request's own (it has no `id`: the
/// server did not even read the request) or it is the HTTP layer's "Bad Request" (the
/// TypeScript and Python SDKs' wording for a session they do not know).
fn refuses_session(without_id: bool, error: &ErrorData) -> bool {
    let message = error.message.to_lowercase();
    message.contains("session") && (without_id || message.starts_with("bad request"))
}

/// The error of a message rmcp's transport could not send, classified.
fn classify<E: StdError + Send + Sync + 'static>(error: StreamableHttpError<E>) -> HttpError {
    match error {
        // HTTP 404 with the session (rmcp's own check).
        StreamableHttpError::SessionExpired => {
            HttpError::SessionGone("HTTP 404 Not Found".to_owned())
        }
        // A status and a body that is not a JSON-RPC error: "HTTP 400 Bad Request: ...".
        StreamableHttpError::UnexpectedServerResponse(text) if http_refuses_session(&text) => {
            HttpError::SessionGone(text.into_owned())
        }
        StreamableHttpError::Client(error) if connection_refused(&error) => {
            HttpError::NotSent(error.to_string())
        }
        other => HttpError::Other(Box::new(other)),
    }
}

/// Whether rmcp's text of an unexpected HTTP answer is a 400 or 404 that names the session.
fn http_refuses_session(text: &str) -> bool {
    (text.starts_with("HTTP 400") || text.starts_with("HTTP 404"))
        && text.to_lowercase().contains("session")
}

/// Whether the connection was refused (an I/O error of that kind among the causes): nothing
/// was sent.
fn connection_refused(error: &(dyn StdError + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ErrorCode;

    fn error(code: i32, message: &'static str) -> ErrorData {
        ErrorData::new(ErrorCode(code), message, None)
    }

    #[test]
    fn a_session_refusal_is_told_from_a_tool_error() {
        // server-everything (no id), the TypeScript SDK's examples (the request's id).
        let bad = error(-32000, "Bad Request: No valid session ID provided");
        assert!(refuses_session(true, &bad));
        assert!(refuses_session(false, &bad));
        assert!(refuses_session(true, &error(-32001, "Session not found")));
        // A tool's own error that mentions a session is its answer: the tool ran.
        assert!(!refuses_session(
            false,
            &error(-32000, "Browser session not found")
        ));
        assert!(!refuses_session(true, &error(-32600, "Invalid Request")));
    }

    #[test]
    fn an_http_refusal_names_the_session() {
        assert!(http_refuses_session(
            "HTTP 400 Bad Request: Bad Request: No valid session ID provided"
        ));
        assert!(http_refuses_session("HTTP 404 Not Found: session gone"));
        assert!(!http_refuses_session("HTTP 400 Bad Request: bad JSON"));
        assert!(!http_refuses_session(
            "HTTP 500 Internal Server Error: session store down"
        ));
    }

    #[test]
    fn a_refused_connection_is_found_among_the_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("error sending request")]
        struct Outer(#[source] std::io::Error);
        let refused = Outer(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(connection_refused(&refused));
        let reset = Outer(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!connection_refused(&reset));
    }
}
