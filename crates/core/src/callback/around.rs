//! The around-callback middleware: the request, a [`Next`] to call zero, one or many times,
//! and the `Result`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{BoxError, Error};
use crate::event::BoxFuture;

/// An around callback: gets the request and the rest of the stack as [`Next`], and returns
/// the response, or an error.
///
/// It may call `next` zero times (answer itself), once, or several times (retry, fallback):
/// [`Next::run`] as often as needed, or [`Next::oneshot`] once. It sees the inner service's
/// `Result`, so it may turn an error into a response or a response into an error.
///
/// Implemented for every `FnMut(Req, BoxNext<Req, Res>) -> impl Future<Output = Result<Res,
/// Error>>` (the closure form: the rest of the stack is boxed, since a closure cannot be
/// generic). Implement it by hand for a configurable built-in: it is generic over the inner
/// service `S` and boxes nothing, unless it boxes its own future. Without a box:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tower_agent_core::{AroundCallback, ModelRequest, Next, NextFuture};
/// use tower_service::Service;
///
/// /// Counts model calls, then passes them on.
/// #[derive(Clone, Debug, Default)]
/// struct CountCalls(Arc<AtomicU64>);
///
/// impl<S: Service<ModelRequest>> AroundCallback<S, ModelRequest> for CountCalls {
///     type Future = NextFuture<S, ModelRequest>;
///
///     fn around(&mut self, req: ModelRequest, next: Next<S>) -> Self::Future {
///         self.0.fetch_add(1, Ordering::Relaxed);
///         next.oneshot(req)
///     }
/// }
/// ```
///
/// With a box, for an `async` body:
///
/// ```
/// use std::future::Future;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{AroundCallback, AroundLayer, Error, ModelRequest, ModelResponse, Next};
/// use tower_service::Service;
///
/// /// Calls the model again, once, when it failed with a transient error.
/// #[derive(Clone, Debug)]
/// struct RetryOnce;
///
/// impl<S> AroundCallback<S, ModelRequest> for RetryOnce
/// where
///     S: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
///     S::Future: Send,
/// {
///     type Future = std::pin::Pin<Box<dyn Future<Output = Result<ModelResponse, Error>> + Send>>;
///
///     fn around(&mut self, req: ModelRequest, mut next: Next<S>) -> Self::Future {
///         Box::pin(async move {
///             match next.run(req.clone()).await {
///                 Err(e) if e.is_transient() => next.run(req).await,
///                 other => other,
///             }
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let seen = calls.clone();
/// let model = service_fn(move |_req: ModelRequest| {
///     let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     async move {
///         if n == 0 {
///             Err(Error::rate_limited(None, "slow down"))
///         } else {
///             Ok(ModelResponse::text("ok"))
///         }
///     }
/// });
/// let model = ServiceBuilder::new().layer(AroundLayer::new(RetryOnce)).service(model);
/// let res = model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(res.message.text(), "ok");
/// assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
/// # Ok(())
/// # }
/// ```
pub trait AroundCallback<S, Req>
where
    S: Service<Req>,
{
    /// The future of the response.
    type Future: Future<Output = Result<S::Response, S::Error>>;

    /// Handle `request`, calling `next` as often as needed.
    fn around(&mut self, request: Req, next: Next<S>) -> Self::Future;
}

impl<F, Fut, S, Req> AroundCallback<S, Req> for F
where
    F: FnMut(Req, BoxNext<Req, S::Response>) -> Fut,
    Fut: Future<Output = Result<S::Response, Error>>,
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + From<Error>,
    Req: 'static,
{
    type Future = ErrInto<Fut, S::Error>;

    fn around(&mut self, request: Req, next: Next<S>) -> Self::Future {
        ErrInto {
            future: self(request, next.boxed()),
            _error: PhantomData,
        }
    }
}

/// The rest of the stack, as an around callback sees it: [`Next::run`] sends a request on, as
/// often as needed; [`Next::oneshot`] sends one and gives `next` up (for a future that must
/// own it, as a strategy's may).
///
/// The first call uses the service that was made ready for this call; every later call drives
/// the same service to readiness again first, as tower's `Retry` does, so a capacity-limited
/// service inside (a concurrency limit of one, say) serves retries one after the other. A
/// clone of `Next` drives its own clone of the service to readiness: use clones only for calls
/// that should run side by side, since the original keeps the capacity it reserved while it
/// lives (see "Be careful when cloning inner services" in `tower-service`).
pub struct Next<S> {
    inner: S,
    ready: bool,
}

/// [`Next`] with the rest of the stack boxed: what closure callbacks get.
pub type BoxNext<Req, Res> = Next<NextService<Req, Res>>;

impl<S> Next<S> {
    /// The rest of the stack, `inner`, already ready for one call.
    fn ready(inner: S) -> Self {
        Self { inner, ready: true }
    }

    /// The rest of the stack, `inner`, not yet driven to readiness.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            ready: false,
        }
    }

    /// Send `request` through the rest of the stack; call again to retry.
    pub fn run<Req>(&mut self, request: Req) -> NextFuture<&mut S, Req>
    where
        S: Service<Req>,
    {
        let ready = std::mem::replace(&mut self.ready, false);
        NextFuture::new(&mut self.inner, ready, request)
    }

    /// Send `request` through the rest of the stack, once: the future owns the service.
    pub fn oneshot<Req>(self, request: Req) -> NextFuture<S, Req>
    where
        S: Service<Req>,
    {
        NextFuture::new(self.inner, self.ready, request)
    }

    /// Box the rest of the stack.
    fn boxed<Req, Res>(self) -> BoxNext<Req, Res>
    where
        S: Service<Req, Response = Res> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        Req: 'static,
    {
        Next {
            inner: NextService::new(self.inner),
            ready: self.ready,
        }
    }
}

impl<S: Clone> Clone for Next<S> {
    /// Another call: the clone is not ready yet and will be driven to readiness first.
    fn clone(&self) -> Self {
        Self::new(self.inner.clone())
    }
}

impl<S> fmt::Debug for Next<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Next")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future of [`Next::run`] (`S` is `&mut` the service) and [`Next::oneshot`].
    pub struct NextFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: NextState<S, Req, S::Future>,
    }
}

pin_project! {
    #[project = NextStateProj]
    enum NextState<S, Req, F> {
        Readying { service: Option<S>, request: Option<Req> },
        Calling { #[pin] future: F },
    }
}

impl<S: Service<Req>, Req> NextFuture<S, Req> {
    fn new(mut service: S, ready: bool, request: Req) -> Self {
        let state = if ready {
            NextState::Calling {
                future: service.call(request),
            }
        } else {
            NextState::Readying {
                service: Some(service),
                request: Some(request),
            }
        };
        Self { state }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for NextFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NextFuture").finish_non_exhaustive()
    }
}

impl<S: Service<Req>, Req> Future for NextFuture<S, Req> {
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                NextStateProj::Readying { service, request } => {
                    let Some(svc) = service.as_mut() else {
                        panic!("`NextFuture` polled after completion");
                    };
                    ready!(svc.poll_ready(cx))?;
                    let (Some(mut svc), Some(request)) = (service.take(), request.take()) else {
                        panic!("`NextFuture` polled after completion");
                    };
                    let future = svc.call(request);
                    this.state.set(NextState::Calling { future });
                }
                NextStateProj::Calling { future } => return future.poll(cx),
            }
        }
    }
}

/// The rest of the stack behind a [`BoxNext`]: boxed, cloneable, `Send` (not `Sync`), failing
/// with [`Error`] (the inner service's error converted with [`Error::from_boxed`], so tower's
/// `Elapsed` arrives as [`ErrorKind::Timeout`](crate::ErrorKind::Timeout); an error the
/// closure returns leaves the layer as an [`Error`]). Unlike tower's `BoxService` it is
/// `Clone` and its error type is fixed.
pub struct NextService<Req, Res> {
    inner: Box<dyn CloneService<Req, Res> + Send>,
}

impl<Req, Res> NextService<Req, Res> {
    /// Box `service`.
    pub fn new<S>(service: S) -> Self
    where
        S: Service<Req, Response = Res> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        Req: 'static,
    {
        Self {
            inner: Box::new(service),
        }
    }
}

impl<Req, Res> Clone for NextService<Req, Res> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone_box(),
        }
    }
}

impl<Req, Res> fmt::Debug for NextService<Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NextService").finish_non_exhaustive()
    }
}

impl<Req, Res> Service<Req> for NextService<Req, Res> {
    type Response = Res;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Res, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready_boxed(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.inner.call_boxed(request)
    }
}

trait CloneService<Req, Res> {
    fn poll_ready_boxed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>>;
    fn call_boxed(&mut self, request: Req) -> BoxFuture<'static, Result<Res, Error>>;
    fn clone_box(&self) -> Box<dyn CloneService<Req, Res> + Send>;
}

impl<S, Req, Res> CloneService<Req, Res> for S
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    Req: 'static,
{
    fn poll_ready_boxed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.poll_ready(cx)
            .map_err(|error| Error::from_boxed(error.into()))
    }

    fn call_boxed(&mut self, request: Req) -> BoxFuture<'static, Result<Res, Error>> {
        let future = self.call(request);
        Box::pin(async move {
            future
                .await
                .map_err(|error| Error::from_boxed(error.into()))
        })
    }

    fn clone_box(&self) -> Box<dyn CloneService<Req, Res> + Send> {
        Box::new(self.clone())
    }
}

pin_project! {
    /// A closure callback's future, its [`Error`] turned into the service's error type.
    pub struct ErrInto<F, E> {
        #[pin]
        future: F,
        _error: PhantomData<fn() -> E>,
    }
}

impl<F, E> fmt::Debug for ErrInto<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrInto").finish_non_exhaustive()
    }
}

impl<F, Res, E> Future for ErrInto<F, E>
where
    F: Future<Output = Result<Res, Error>>,
    E: From<Error>,
{
    type Output = Result<Res, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().future.poll(cx).map_err(E::from)
    }
}

/// Runs an [`AroundCallback`] around the inner service; see the [module docs](super).
#[derive(Clone, Copy, Default)]
pub struct AroundLayer<C> {
    callback: C,
}

impl<C> AroundLayer<C> {
    /// A layer running `callback`.
    pub fn new(callback: C) -> Self {
        Self { callback }
    }
}

impl<C> fmt::Debug for AroundLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AroundLayer")
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C: Clone> Layer<S> for AroundLayer<C> {
    type Service = Around<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Around::new(inner, self.callback.clone())
    }
}

/// The service of [`AroundLayer`].
///
/// Readiness: `poll_ready` drives the inner service; `call` hands that ready service to the
/// callback inside [`Next`] and keeps a fresh clone for the next call.
#[derive(Clone)]
pub struct Around<S, C> {
    inner: S,
    callback: C,
}

impl<S, C> Around<S, C> {
    /// Wrap `inner`.
    pub fn new(inner: S, callback: C) -> Self {
        Self { inner, callback }
    }

    /// A layer for this service.
    pub fn layer(callback: C) -> AroundLayer<C> {
        AroundLayer::new(callback)
    }

    crate::inner_service_accessors!();
}

impl<S: fmt::Debug, C> fmt::Debug for Around<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Around")
            .field("inner", &self.inner)
            .field("callback", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for Around<S, C>
where
    S: Service<Req> + Clone,
    C: AroundCallback<S, Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<C::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            future: self.callback.around(request, Next::ready(ready)),
        }
    }
}

pin_project! {
    /// The response future of [`Around`].
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F: Future> Future for ResponseFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().future.poll(cx)
    }
}
