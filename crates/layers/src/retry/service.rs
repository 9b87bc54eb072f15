//! The retry layer: tower's `Retry` over a gate that calls nothing once the run is cancelled
//! and turns the inner service's errors into [`Error`]s the policy can classify.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_agent_core::{BoxError, Error};
use tower_layer::Layer;
use tower_service::Service;

use super::policy::Attempts;
use super::{RetryPolicy, Retryable};

/// Applies [`Retry`]: tower's `Retry` with a [`RetryPolicy`]; see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// Retry with `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::new(inner, self.policy.clone())
    }
}

/// Retries calls of `S` with a [`RetryPolicy`]: tower's `Retry` over a gate that calls `S`
/// only while the request's run is not cancelled, and turns `S`'s errors into [`Error`]s
/// ([`Error::from_boxed`]: tower's `Elapsed` is a `Timeout`). Its error is always [`Error`].
#[derive(Clone)]
pub struct Retry<S> {
    inner: tower::retry::Retry<Attempts, Gate<S>>,
}

impl<S> Retry<S> {
    /// Retry calls of `inner` with `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        let attempts = Attempts {
            policy,
            made: 0,
            failed: 0,
            unreached: 0,
        };
        Self {
            inner: tower::retry::Retry::new(attempts, Gate { inner }),
        }
    }

    /// A layer retrying with `policy`.
    pub fn layer(policy: RetryPolicy) -> RetryLayer {
        RetryLayer::new(policy)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner.get_ref().inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner.get_mut().inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", self.get_ref())
            .finish_non_exhaustive()
    }
}

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for Retry<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S, Req> Service<Req> for Retry<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: Retryable,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The response future of [`Retry`].
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        Req: Retryable,
    {
        #[pin]
        inner: tower::retry::future::ResponseFuture<Attempts, Gate<S>, Req>,
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Req: Retryable,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Req: Retryable,
{
    type Output = Result<S::Response, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

/// Calls the inner service only while the request's run is not cancelled; its errors become
/// [`Error`]s.
#[derive(Clone, Debug)]
pub(super) struct Gate<S> {
    inner: S,
}

impl<S, Req> Service<Req> for Gate<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Req: Retryable,
{
    type Response = S::Response;
    type Error = Error;
    type Future = GateFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if req.ctx().is_cancelled() {
            return GateFuture::Cancelled;
        }
        GateFuture::Called {
            future: self.inner.call(req),
        }
    }
}

pin_project! {
    #[project = GateProj]
    pub(super) enum GateFuture<F> {
        Called { #[pin] future: F },
        Cancelled,
    }
}

impl<F, T, E> Future for GateFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GateProj::Called { future } => {
                Poll::Ready(ready!(future.poll(cx)).map_err(|e| Error::from_boxed(e.into())))
            }
            GateProj::Cancelled => Poll::Ready(Err(Error::cancelled())),
        }
    }
}

/// The retry right around the provider, outside the host's provider layers.
impl tower_agent_loop::Builtin for RetryLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ModelSlot;
        stacks.model(ModelSlot::Retry, self);
    }
}
