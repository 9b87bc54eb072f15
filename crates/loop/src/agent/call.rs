//! Calling a service: readiness, panics, cancellation and spans, in one future.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFuture;
use tower_agent_core::{BoxError, CancellationToken, Error, ToolCall};
use tower_service::Service;

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

pin_project! {
    /// One call of a service, as the loop makes it: drive the service to readiness, call it,
    /// and wait for the response inside `span`; an error or a panic (in `poll_ready`, `call` or
    /// the future) becomes a [`CallFailure`] instead of failing or unwinding through the loop.
    ///
    /// `None`: not started because the run was already cancelled, or dropped when cancelled
    /// while pending (when both are ready the response wins). This is
    /// `token.run_until_cancelled(..)` of tokio-util fused with the call, so the hot path moves
    /// no nested future around: the cancellation future is created (boxed) only once the call
    /// is pending, which keeps this future small on the path where the service answers at
    /// once. tokio-util's `run_until_cancelled` and an `async fn` per layer of this cost
    /// 1,100–1,300 more instructions per round (`benches/instructions.sh`).
    ///
    /// The request is made by a closure at the moment of the call, in the argument's place:
    /// a request built first is moved into this future and out again (about 60 instructions a
    /// call for a tool request), and a cancelled call never builds it.
    pub(super) struct ServiceCall<'a, S, Req, Make>
    where
        S: Service<Req>,
    {
        service: S,
        token: &'a CancellationToken,
        span: tracing::Span,
        #[pin]
        stage: Stage<Make, S::Future>,
        wait: Option<Pin<Box<WaitForCancellationFuture<'a>>>>,
        request: PhantomData<fn() -> Req>,
        // Finished: never polled again.
        done: bool,
    }
}

pin_project! {
    /// Where a [`ServiceCall`] stands.
    #[project = StageProj]
    enum Stage<Make, F> {
        /// Not polled yet: a cancelled run does not start it.
        New { make: Option<Make> },
        /// Waiting for the service to be ready.
        Readying { make: Option<Make> },
        /// The service was called.
        Calling { #[pin] future: F },
        /// Finished (or panicked): never polled again.
        Done,
    }
}

/// Call `service` (a `&mut S` works) with the request `make` makes, unless `token` is
/// cancelled first.
pub(super) fn call<S, Req, Make>(
    service: S,
    make: Make,
    token: &CancellationToken,
    span: tracing::Span,
) -> ServiceCall<'_, S, Req, Make>
where
    S: Service<Req>,
    Make: FnOnce() -> Req,
{
    call_checked(service, make, token, span, false)
}

/// [`call`], without the cancellation check before the start when `checked`: the caller
/// checked, and nothing ran since that could have cancelled the run.
pub(super) fn call_checked<S, Req, Make>(
    service: S,
    make: Make,
    token: &CancellationToken,
    span: tracing::Span,
    checked: bool,
) -> ServiceCall<'_, S, Req, Make>
where
    S: Service<Req>,
    Make: FnOnce() -> Req,
{
    let make = Some(make);
    ServiceCall {
        service,
        token,
        span,
        stage: if checked {
            Stage::Readying { make }
        } else {
            Stage::New { make }
        },
        wait: None,
        request: PhantomData,
        done: false,
    }
}

impl<S, Req, Make> Future for ServiceCall<'_, S, Req, Make>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Make: FnOnce() -> Req,
{
    type Output = Option<Result<S::Response, CallFailure>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.stage.as_mut().project() {
            _ if *this.done => panic!("`ServiceCall` polled after completion"),
            StageProj::Done => panic!("`ServiceCall` polled after completion"),
            // Not polled yet (or not ready yet): a cancelled run does not start it. It readies
            // from here, without a move to `Readying` (which costs a move of the request and a
            // drop).
            StageProj::New { .. } if this.token.is_cancelled() => {
                this.stage.set(Stage::Done);
                return Poll::Ready(None);
            }
            // Woken after it was pending: if the run was cancelled meanwhile, the call is not
            // polled again. A cancelled retry wait would otherwise end and make one more call
            // before the cancellation is seen.
            _ if this.wait.is_some() && this.token.is_cancelled() => {
                this.stage.set(Stage::Done);
                return Poll::Ready(None);
            }
            _ => {}
        }
        let entered = this.span.enter();
        // One unwind guard around readiness, the call and the future's poll.
        let polled = catch_unwind(AssertUnwindSafe(|| {
            loop {
                match this.stage.as_mut().project() {
                    StageProj::Calling { future } => return future.poll(cx).map_err(failed),
                    StageProj::New { make } | StageProj::Readying { make } => {
                        if let Err(error) = ready!(this.service.poll_ready(cx)) {
                            return Poll::Ready(Err(failed(error)));
                        }
                        let Some(make) = make.take() else {
                            unreachable!("a call is made once");
                        };
                        let future = this.service.call(make());
                        this.stage.set(Stage::Calling { future });
                    }
                    StageProj::Done => unreachable!("not done"),
                }
            }
        }));
        drop(entered);
        let output = match polled {
            Ok(Poll::Ready(output)) => output,
            Err(panic) => Err(panicked(&*panic)),
            Ok(Poll::Pending) => {
                // The call is pending: wait for cancellation too.
                let wait = this
                    .wait
                    .get_or_insert_with(|| Box::pin(this.token.cancelled()));
                ready!(wait.as_mut().poll(cx));
                return Poll::Ready(None);
            }
        };
        // Fused: a finished (or panicked) call is never polled again. The future is dropped
        // with the call, not here (dropping it in place costs a second drop of the stage).
        *this.done = true;
        Poll::Ready(Some(output))
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
