//! Calling a service: readiness, panics, cancellation and spans.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_util::FutureExt;
use futures_util::future::CatchUnwind;
use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFuture;
use tower::util::Oneshot;
use tower_agent_core::{BoxError, CancellationToken, Error, ToolCall, ToolResponse};
use tower_service::Service;
use tracing::Instrument;
use tracing::instrument::Instrumented;

/// Why a service call produced no response.
pub(super) enum CallFailure {
    Failed(Error),
    Panicked(String),
}

impl CallFailure {
    /// The error a failed model call fails the run with.
    pub(super) fn into_model_error(self) -> Error {
        match self {
            CallFailure::Failed(error) => error,
            CallFailure::Panicked(message) => {
                Error::other(format!("the model service panicked: {message}"))
            }
        }
    }
}

/// Drive `service` to readiness, call it with `request` and wait for the response inside
/// `span`. An error or a panic (in `poll_ready`, `call` or the future) becomes a
/// [`CallFailure`] instead of failing or unwinding through the loop.
///
/// `None`: not started because the run was already cancelled (the service is not even asked
/// whether it is ready), or dropped when the run was cancelled while it was pending. `after`
/// sees the outcome with the call's span (to record how it ended there).
///
/// A future made of parts, not an `async fn`: an `async fn` keeps its arguments for its whole
/// life, so the request would stay in every run's future beside the service's future that
/// took it (tower's `Oneshot` holds one, then the other).
pub(super) fn call<'a, S, Req>(
    service: &'a mut S,
    request: Req,
    token: &'a CancellationToken,
    span: tracing::Span,
    after: Outcome<S::Response>,
) -> Call<'a, Oneshot<&'a mut S, Req>, S::Response>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    Call {
        call: AssertUnwindSafe(Oneshot::new(service, request))
            .catch_unwind()
            .instrument(span),
        cancelled: token.cancelled(),
        token,
        after: Some(after),
    }
}

pin_project! {
    /// A service call that ends when the run is cancelled: see [`call`].
    pub(super) struct Call<'a, F, R> {
        #[pin]
        call: Instrumented<CatchUnwind<AssertUnwindSafe<F>>>,
        #[pin]
        cancelled: WaitForCancellationFuture<'a>,
        token: &'a CancellationToken,
        // Taken when the call ends: told once.
        after: Option<Outcome<R>>,
    }
}

impl<F, R, E> Future for Call<'_, F, R>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    type Output = Option<Result<R, CallFailure>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The call first: the run waits for cancellation only while the call is pending. Once
        // the run is cancelled, the call is not polled again.
        let outcome = if this.token.is_cancelled() {
            None
        } else {
            match this.call.as_mut().poll(cx) {
                Poll::Ready(Ok(result)) => Some(result.map_err(failed)),
                Poll::Ready(Err(panic)) => Some(Err(panicked(&*panic))),
                Poll::Pending => {
                    ready!(this.cancelled.poll(cx));
                    None
                }
            }
        };
        if let Some(after) = this.after.take() {
            after(this.call.span(), outcome.as_ref());
        }
        Poll::Ready(outcome)
    }
}

/// What [`call`] does with a call's outcome and its span once it ended (`None`: cancelled).
pub(super) type Outcome<R> = fn(&tracing::Span, Option<&Result<R, CallFailure>>);

/// Nothing: a model call's span is the provider's business.
pub(super) fn ignore<R>(_span: &tracing::Span, _outcome: Option<&Result<R, CallFailure>>) {}

fn failed(error: impl Into<BoxError>) -> CallFailure {
    CallFailure::Failed(Error::from_boxed(error.into()))
}

fn panicked(panic: &(dyn std::any::Any + Send)) -> CallFailure {
    let message = if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    };
    CallFailure::Panicked(message)
}

/// A span's `otel.name`, `{operation} {subject}`: written only when a subscriber records it.
struct SpanName<'a>(&'static str, &'a str);

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

/// A tool call's `execute_tool` span (`otel.name` `execute_tool {tool}`).
pub(super) fn tool_span(call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %SpanName("execute_tool", &call.name),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// A tool call's end on its span: `error.type` and an error status when it ended in an error
/// (an error result: `tool_error`; a failure: its kind's name; a panic; a cancellation).
pub(super) fn record_tool(
    span: &tracing::Span,
    outcome: Option<&Result<ToolResponse, CallFailure>>,
) {
    let error = match outcome {
        None => Some("cancelled"),
        Some(Ok(response)) if response.result.is_error => Some("tool_error"),
        Some(Ok(_)) => None,
        Some(Err(CallFailure::Failed(error))) => Some(error.kind().name()),
        Some(Err(CallFailure::Panicked(_))) => Some("panic"),
    };
    if let Some(error) = error {
        span.record("error.type", error);
        span.record("otel.status_code", "error");
    }
}
