//! Read-only observation of requests and responses at a callback point.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::context::RunContext;
use crate::error::{BoxError, Error};

/// A hook called with every request before it goes in.
pub trait OnRequest<Req> {
    /// Look at `request`.
    fn on_request(&mut self, request: &Req);
}

impl<Req> OnRequest<Req> for () {
    fn on_request(&mut self, _: &Req) {}
}

impl<F, Req> OnRequest<Req> for F
where
    F: FnMut(&Req),
{
    fn on_request(&mut self, request: &Req) {
        self(request)
    }
}

/// A hook called with every outcome (response or error) on the way out.
///
/// Implemented for every `FnMut(Result<&Res, &Error>, &RunContext)`, whatever error type the
/// service at that place has ([`ObservedError`]: [`Error`], [`BoxError`], `Infallible`): the
/// same closure works inside tower's `timeout` (where the error is [`Error`]) and outside it
/// (where it is [`BoxError`]). For a service with another error type, implement this trait on
/// a type of your own: it gets the `Result` as the service returned it.
pub trait OnResponse<Res, E> {
    /// Look at `result`, produced for a request of the run `ctx`.
    fn on_response(&mut self, result: &Result<Res, E>, ctx: &RunContext);
}

impl<Res, E> OnResponse<Res, E> for () {
    fn on_response(&mut self, _: &Result<Res, E>, _: &RunContext) {}
}

impl<F, Res, E> OnResponse<Res, E> for F
where
    F: FnMut(Result<&Res, &Error>, &RunContext),
    E: ObservedError,
{
    fn on_response(&mut self, result: &Result<Res, E>, ctx: &RunContext) {
        match result {
            Ok(response) => self(Ok(response), ctx),
            Err(error) => self(Err(&error.observed()), ctx),
        }
    }
}

/// An error an observer reads as an [`Error`]: tower-agent's own, or the [`BoxError`] that
/// tower's middleware (`timeout`, `load_shed`, `buffer`) return, classified like
/// [`Error::from_boxed`] does.
pub trait ObservedError {
    /// The error as an [`Error`], borrowed when it is one.
    fn observed(&self) -> Cow<'_, Error>;
}

impl ObservedError for Error {
    fn observed(&self) -> Cow<'_, Error> {
        Cow::Borrowed(self)
    }
}

impl ObservedError for std::convert::Infallible {
    fn observed(&self) -> Cow<'_, Error> {
        match *self {}
    }
}

impl ObservedError for BoxError {
    fn observed(&self) -> Cow<'_, Error> {
        match self.downcast_ref::<Error>() {
            Some(error) => Cow::Borrowed(error),
            None => Cow::Owned(Error::describe(&**self)),
        }
    }
}

/// Observes every request and every outcome at its point, and changes nothing.
///
/// An observer changes nothing: placed outermost at its point it sees every request and every
/// final response, whichever layer answered or replaced it.
/// Use it for logging, audit and metrics. Hooks are synchronous: hand slow work to a channel
/// or a task. A call whose future is dropped before it completes (its run was cancelled)
/// reaches no response hook; the run's events record the cancellation.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{
///     Error, ModelRequest, ModelResponse, ObserveLayer, RunContext,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let audit = Arc::new(Mutex::new(Vec::new()));
/// let log = audit.clone();
/// let model = ServiceBuilder::new()
///     .layer(ObserveLayer::new().on_response(
///         move |res: Result<&ModelResponse, &Error>, ctx: &RunContext| {
///             let line = match res {
///                 Ok(r) => format!("round {}: {}", ctx.round(), r.message.text()),
///                 Err(e) => format!("round {}: failed: {e}", ctx.round()),
///             };
///             log.lock().unwrap().push(line);
///         },
///     ))
///     .service(service_fn(|_req: ModelRequest| async {
///         Ok::<_, Error>(ModelResponse::text("hi"))
///     }));
/// model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(*audit.lock().unwrap(), ["round 0: hi"]);
/// # Ok(())
/// # }
/// ```
///
/// Outside tower's `timeout` the stack fails with tower's `BoxError`; the same hook signature
/// works there, and a timeout reaches it as [`ErrorKind::Timeout`](crate::ErrorKind::Timeout):
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{Error, ErrorKind, ModelRequest, ModelResponse, ObserveLayer, RunContext};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let kinds = Arc::new(Mutex::new(Vec::new()));
/// let log = kinds.clone();
/// let model = ServiceBuilder::new()
///     .layer(ObserveLayer::new().on_response(
///         move |res: Result<&ModelResponse, &Error>, _: &RunContext| {
///             log.lock().unwrap().push(res.err().map(Error::kind));
///         },
///     ))
///     .timeout(Duration::from_millis(1))
///     .service(service_fn(|_req: ModelRequest| async {
///         tokio::time::sleep(Duration::from_secs(60)).await;
///         Ok::<_, Error>(ModelResponse::text("late"))
///     }));
/// let res: Result<ModelResponse, BoxError> = model.oneshot(ModelRequest::new(vec![])).await;
/// assert!(res.is_err());
/// assert_eq!(*kinds.lock().unwrap(), [Some(ErrorKind::Timeout)]);
/// # }
/// ```
#[derive(Clone, Copy, Default)]
pub struct ObserveLayer<OnReq = (), OnRes = ()> {
    on_request: OnReq,
    on_response: OnRes,
}

impl ObserveLayer {
    /// An observer with no-op hooks.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<OnReq, OnRes> ObserveLayer<OnReq, OnRes> {
    /// Set the request hook.
    pub fn on_request<T>(self, hook: T) -> ObserveLayer<T, OnRes> {
        ObserveLayer {
            on_request: hook,
            on_response: self.on_response,
        }
    }

    /// Set the response hook.
    pub fn on_response<T>(self, hook: T) -> ObserveLayer<OnReq, T> {
        ObserveLayer {
            on_request: self.on_request,
            on_response: hook,
        }
    }
}

impl<OnReq, OnRes> fmt::Debug for ObserveLayer<OnReq, OnRes> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObserveLayer")
            .field("on_request", &std::any::type_name::<OnReq>())
            .field("on_response", &std::any::type_name::<OnRes>())
            .finish()
    }
}

impl<S, OnReq: Clone, OnRes: Clone> Layer<S> for ObserveLayer<OnReq, OnRes> {
    type Service = Observe<S, OnReq, OnRes>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe {
            inner,
            on_request: self.on_request.clone(),
            on_response: self.on_response.clone(),
        }
    }
}

/// The service of [`ObserveLayer`].
#[derive(Clone, Copy)]
pub struct Observe<S, OnReq = (), OnRes = ()> {
    inner: S,
    on_request: OnReq,
    on_response: OnRes,
}

impl<S> Observe<S> {
    /// A layer for this service.
    pub fn layer() -> ObserveLayer {
        ObserveLayer::new()
    }
}

impl<S, OnReq, OnRes> Observe<S, OnReq, OnRes> {
    crate::inner_service_accessors!();
}

impl<S: fmt::Debug, OnReq, OnRes> fmt::Debug for Observe<S, OnReq, OnRes> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observe")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, OnReq, OnRes, Req> Service<Req> for Observe<S, OnReq, OnRes>
where
    Req: AsRef<RunContext>,
    S: Service<Req>,
    OnReq: OnRequest<Req>,
    OnRes: OnResponse<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, OnRes>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.on_request.on_request(&request);
        let ctx = request.as_ref().clone();
        ResponseFuture {
            future: self.inner.call(request),
            hook: Some((self.on_response.clone(), ctx)),
        }
    }
}

pin_project! {
    /// The response future of [`Observe`].
    pub struct ResponseFuture<F, OnRes> {
        #[pin]
        future: F,
        hook: Option<(OnRes, RunContext)>,
    }
}

impl<F, OnRes> fmt::Debug for ResponseFuture<F, OnRes> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, OnRes, Res, E> Future for ResponseFuture<F, OnRes>
where
    F: Future<Output = Result<Res, E>>,
    OnRes: OnResponse<Res, E>,
{
    type Output = Result<Res, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.future.poll(cx));
        if let Some((mut hook, ctx)) = this.hook.take() {
            hook.on_response(&result, &ctx);
        }
        Poll::Ready(result)
    }
}
