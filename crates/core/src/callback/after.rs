//! The after-callback middleware.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::AfterCallback;
use crate::context::RunContext;
use crate::error::Error;

/// Runs an [`AfterCallback`] on the inner service's response; see the [module docs](super).
#[derive(Clone, Copy, Default)]
pub struct AfterLayer<C> {
    callback: C,
}

impl<C> AfterLayer<C> {
    /// A layer running `callback`.
    pub fn new(callback: C) -> Self {
        Self { callback }
    }
}

impl<C> fmt::Debug for AfterLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AfterLayer")
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C: Clone> Layer<S> for AfterLayer<C> {
    type Service = After<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        After::new(inner, self.callback.clone())
    }
}

/// The service of [`AfterLayer`].
///
/// It calls the inner service directly (no clone needed) and runs the callback on every `Ok`
/// response: errors pass through untouched.
#[derive(Clone, Copy)]
pub struct After<S, C> {
    inner: S,
    callback: C,
}

impl<S, C> After<S, C> {
    /// Wrap `inner`.
    pub fn new(inner: S, callback: C) -> Self {
        Self { inner, callback }
    }

    /// A layer for this service.
    pub fn layer(callback: C) -> AfterLayer<C> {
        AfterLayer::new(callback)
    }

    crate::inner_service_accessors!();
}

impl<S: fmt::Debug, C> fmt::Debug for After<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("After")
            .field("inner", &self.inner)
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for After<S, C>
where
    Req: AsRef<RunContext>,
    S: Service<Req>,
    S::Error: From<Error>,
    C: AfterCallback<S::Response> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let ctx = request.as_ref().clone();
        ResponseFuture {
            state: State::Calling {
                future: self.inner.call(request),
            },
            pending: Some((self.callback.clone(), ctx)),
        }
    }
}

pin_project! {
    /// The response future of [`After`].
    pub struct ResponseFuture<F, C, Res>
    where
        C: AfterCallback<Res>,
    {
        #[pin]
        state: State<F, C::Future>,
        pending: Option<(C, RunContext)>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, D> {
        Calling { #[pin] future: F },
        Deciding { #[pin] decision: D },
    }
}

impl<F, C, Res> fmt::Debug for ResponseFuture<F, C, Res>
where
    C: AfterCallback<Res>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Deciding { .. } => "deciding",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, C, Res, E> Future for ResponseFuture<F, C, Res>
where
    F: Future<Output = Result<Res, E>>,
    C: AfterCallback<Res>,
    E: From<Error>,
{
    type Output = Result<Res, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let response = ready!(future.poll(cx))?;
                    let Some((mut callback, ctx)) = this.pending.take() else {
                        panic!("`After` response future polled after completion");
                    };
                    let decision = callback.after(response, ctx);
                    this.state.set(State::Deciding { decision });
                }
                StateProj::Deciding { decision } => {
                    return Poll::Ready(ready!(decision.poll(cx)).map_err(E::from));
                }
            }
        }
    }
}
