//! The before-callback middleware.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{BeforeCallback, Flow};
use crate::error::Error;

/// Runs a [`BeforeCallback`] before the inner service; see the [module docs](super).
#[derive(Clone, Copy, Default)]
pub struct BeforeLayer<C> {
    callback: C,
}

impl<C> BeforeLayer<C> {
    /// A layer running `callback`.
    pub fn new(callback: C) -> Self {
        Self { callback }
    }
}

impl<C> fmt::Debug for BeforeLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeforeLayer")
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C: Clone> Layer<S> for BeforeLayer<C> {
    type Service = Before<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Before::new(inner, self.callback.clone())
    }
}

/// The service of [`BeforeLayer`].
///
/// Readiness: `poll_ready` drives the inner service; `call` moves that ready service into the
/// response future and keeps a fresh clone for the next call, because the inner call happens
/// only after the callback decided (see "Be careful when cloning inner services" in
/// `tower-service`).
#[derive(Clone, Copy)]
pub struct Before<S, C> {
    inner: S,
    callback: C,
}

impl<S, C> Before<S, C> {
    /// Wrap `inner`.
    pub fn new(inner: S, callback: C) -> Self {
        Self { inner, callback }
    }

    /// A layer for this service.
    pub fn layer(callback: C) -> BeforeLayer<C> {
        BeforeLayer::new(callback)
    }

    crate::inner_service_accessors!();
}

impl<S: fmt::Debug, C> fmt::Debug for Before<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Before")
            .field("inner", &self.inner)
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for Before<S, C>
where
    S: Service<Req> + Clone,
    S::Error: From<Error>,
    C: BeforeCallback<Req, Response = S::Response>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<C, S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Deciding {
                decision: self.callback.before(request),
            },
            inner: Some(ready),
        }
    }
}

pin_project! {
    /// The response future of [`Before`].
    pub struct ResponseFuture<C, S, Req>
    where
        C: BeforeCallback<Req>,
        S: Service<Req>,
    {
        #[pin]
        state: State<C::Future, S::Future>,
        inner: Option<S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<D, F> {
        Deciding { #[pin] decision: D },
        Calling { #[pin] future: F },
    }
}

impl<C, S, Req> fmt::Debug for ResponseFuture<C, S, Req>
where
    C: BeforeCallback<Req>,
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Deciding { .. } => "deciding",
            State::Calling { .. } => "calling",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<C, S, Req> Future for ResponseFuture<C, S, Req>
where
    C: BeforeCallback<Req, Response = S::Response>,
    S: Service<Req>,
    S::Error: From<Error>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { decision } => match ready!(decision.poll(cx)) {
                    Ok(Flow::Continue(request)) => {
                        let Some(mut inner) = this.inner.take() else {
                            panic!("`Before` response future polled after completion");
                        };
                        let future = inner.call(request);
                        this.state.set(State::Calling { future });
                    }
                    Ok(Flow::Answer(response)) => {
                        this.inner.take();
                        return Poll::Ready(Ok(response));
                    }
                    Err(error) => {
                        this.inner.take();
                        return Poll::Ready(Err(error.into()));
                    }
                },
                StateProj::Calling { future } => return future.poll(cx),
            }
        }
    }
}
