//! Calling a service: readiness, panics, cancellation and spans.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFuture;
use tower::ServiceExt;
use tower_agent_core::{
    BoxError, CancellationToken, Error, ModelRequest, ModelResponse, ToolCall, ToolRequest,
    ToolResponse,
};
use tower_service::Service;

use super::tools::ToolOutcome;

/// Why a service call produced no response.
enum CallFailure {
    Failed(Error),
    Panicked(String),
}

/// Drive `service` to readiness and call it; an error or a panic becomes a `CallFailure`
/// instead of failing or unwinding through the loop.
async fn call_service<S, Req>(service: &mut S, request: Req) -> Result<S::Response, CallFailure>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    let call = AssertUnwindSafe(async move {
        let ready = service.ready().await.map_err(Into::into)?;
        ready.call(request).await.map_err(Into::into)
    });
    match call.catch_unwind().await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(CallFailure::Failed(Error::from_boxed(error))),
        Err(panic) => Err(CallFailure::Panicked(panic_message(&*panic))),
    }
}

pub(super) async fn call_model<M>(
    model: &mut M,
    request: ModelRequest,
) -> Result<ModelResponse, Error>
where
    M: Service<ModelRequest, Response = ModelResponse>,
    M::Error: Into<BoxError>,
{
    call_service(model, request)
        .await
        .map_err(|failure| match failure {
            CallFailure::Failed(error) => error,
            CallFailure::Panicked(message) => {
                Error::other(format!("the model service panicked: {message}"))
            }
        })
}

pub(super) async fn call_tool<T>(tools: &mut T, request: ToolRequest) -> ToolOutcome
where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
    match call_service(tools, request).await {
        Ok(response) => ToolOutcome::Response(response),
        Err(CallFailure::Failed(error)) => ToolOutcome::Failed(error),
        Err(CallFailure::Panicked(message)) => ToolOutcome::Panicked(message),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

pin_project! {
    /// `token.run_until_cancelled(future)`, as tokio-util has it (`None`: not started because
    /// the run was already cancelled, or dropped when cancelled while pending; when both are
    /// ready the future wins), built so that the hot path stays cheap: the cancellation
    /// future is created only once `future` is pending, and nothing is moved into an extra
    /// `async fn`. tokio-util's `run_until_cancelled` and `with_cancellation_token` cost
    /// 1,100–1,300 more instructions per round here (`benches/instructions.sh`).
    pub(super) struct Cancellable<'a, F> {
        #[pin]
        future: F,
        token: &'a CancellationToken,
        started: bool,
        #[pin]
        wait: Option<WaitForCancellationFuture<'a>>,
    }
}

pub(super) fn cancellable<F: Future>(token: &CancellationToken, future: F) -> Cancellable<'_, F> {
    Cancellable {
        future,
        token,
        started: false,
        wait: None,
    }
}

impl<F: Future> Future for Cancellable<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.started {
            if this.token.is_cancelled() {
                return Poll::Ready(None);
            }
            *this.started = true;
        }
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Some(output));
        }
        if this.wait.is_none() {
            this.wait.set(Some(this.token.cancelled()));
        }
        match this.wait.as_pin_mut() {
            Some(wait) => wait.poll(cx).map(|()| None),
            None => Poll::Pending,
        }
    }
}

pub(super) fn tool_span(call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
    )
}
