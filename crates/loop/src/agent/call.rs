//! Calling a service: readiness, panics, cancellation and spans.

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;

use futures_util::FutureExt;
use tower_agent_core::{BoxError, CancellationToken, Error, ToolCall};
use tower_service::Service;
use tracing::Instrument;

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
/// `None`: not started because the run was already cancelled, or dropped when the run was
/// cancelled while it was pending.
pub(super) async fn call<S, Req>(
    service: &mut S,
    request: Req,
    token: &CancellationToken,
    span: tracing::Span,
) -> Option<Result<S::Response, CallFailure>>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    if token.is_cancelled() {
        return None;
    }
    let call = async {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(failed)?;
        service.call(request).await.map_err(failed)
    };
    let mut call = pin!(AssertUnwindSafe(call).catch_unwind().instrument(span));
    let mut cancelled = pin!(token.cancelled());
    // The call first: the run waits for cancellation only while the call is pending. Once the
    // run is cancelled, the call is not polled again.
    let outcome = poll_fn(|cx| {
        if token.is_cancelled() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(outcome) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(outcome));
        }
        cancelled.as_mut().poll(cx).map(|()| None)
    });
    match outcome.await? {
        Ok(result) => Some(result),
        Err(panic) => Some(Err(panicked(&*panic))),
    }
}

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

pub(super) fn tool_span(call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
    )
}
