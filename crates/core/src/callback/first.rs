//! One point, several callbacks, the first word wins: [`first`] runs them in order and stops at
//! the first that answers (before) or replaces (after); the others are not called. A missing
//! side (`None`) lets everything through. These are the rules of adk-deepagents'
//! `_compose_callbacks(builtin, extra)`, which a plain onion of after layers cannot write: an
//! outer after callback always runs on an inner one's replacement.

use std::future::Future;

use crate::error::Error;
use crate::event::BoxFuture;

use super::{AfterCallback, BeforeCallback, Flow, RunContext};

/// What a callback of [`first`] did with a response: kept it (the next one is asked), or
/// replaced it (the answer of the point; the next ones are not asked).
#[derive(Debug, Clone, PartialEq)]
pub enum Kept<Res> {
    /// Kept as it was, or changed in passing: the next callback gets it.
    Kept(Res),
    /// Replaced: this is the point's response.
    Replaced(Res),
}

impl<Res> Kept<Res> {
    /// The response, kept or replaced.
    pub fn into_inner(self) -> Res {
        match self {
            Kept::Kept(response) | Kept::Replaced(response) => response,
        }
    }
}

/// An after callback for [`first`]: look at a response and keep it or replace it.
///
/// Implemented for every
/// `FnMut(Res, RunContext) -> impl Future<Output = Result<Kept<Res>, Error>>`, for
/// [`First`] of two of them, and for `Option` of one (`None` keeps every response).
pub trait ReplaceCallback<Res> {
    /// The future of its decision.
    type Future: Future<Output = Result<Kept<Res>, Error>>;

    /// Keep or replace `response`, produced for a request of the run `ctx`.
    fn decide(&mut self, response: Res, ctx: RunContext) -> Self::Future;
}

impl<F, Fut, Res> ReplaceCallback<Res> for F
where
    F: FnMut(Res, RunContext) -> Fut,
    Fut: Future<Output = Result<Kept<Res>, Error>>,
{
    type Future = Fut;

    fn decide(&mut self, response: Res, ctx: RunContext) -> Fut {
        self(response, ctx)
    }
}

/// Two callbacks of one point, the first word winning: see [`first`].
#[derive(Debug, Clone)]
pub struct First<A, B> {
    first: A,
    then: B,
}

/// Run `first`, and `then` only if `first` let the request (or the response) through: at a
/// before point, `then` is not called when `first` answers; at an after point, `then` is not
/// called when `first` replaces (a [`ReplaceCallback`]: it says [`Kept::Replaced`]). Either may
/// be `None`: the other alone. Nest them for more: `first(a, first(b, c))`.
///
/// Put the pair in a [`BeforeLayer`](super::BeforeLayer) or an [`AfterLayer`](super::AfterLayer)
/// like any callback:
///
/// ```
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_agent_core::callback::{Kept, first};
/// use tower_agent_core::{AfterLayer, Error, ModelRequest, ModelResponse, RunContext};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// // A built-in replaces an empty answer; the user's extra callback runs only on the others.
/// let builtin = |res: ModelResponse, _: RunContext| async move {
///     Ok(match res.message.text().is_empty() {
///         true => Kept::Replaced(ModelResponse::text("(no answer)")),
///         false => Kept::Kept(res),
///     })
/// };
/// let extra = |res: ModelResponse, _: RunContext| async move {
///     let text = res.message.text().to_uppercase();
///     Ok(Kept::Replaced(ModelResponse::text(text)))
/// };
/// let layer = AfterLayer::new(first(builtin, Some(extra)));
/// let model = |text: &'static str| {
///     layer.layer(service_fn(move |_: ModelRequest| async move {
///         Ok::<_, Error>(ModelResponse::text(text))
///     }))
/// };
/// let empty = model("").oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(empty.message.text(), "(no answer)", "the built-in's word, the extra not asked");
/// let some = model("hi").oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(some.message.text(), "HI");
/// # Ok(())
/// # }
/// ```
pub fn first<A, B>(first: A, then: B) -> First<A, B> {
    First { first, then }
}

impl<Req, Res, A, B> BeforeCallback<Req> for First<A, B>
where
    A: BeforeCallback<Req, Response = Res>,
    A::Future: Send + 'static,
    B: BeforeCallback<Req, Response = Res> + Clone + Send + 'static,
    B::Future: Send,
    Req: Send + 'static,
    Res: Send + 'static,
{
    type Response = Res;
    type Future = BoxFuture<'static, Result<Flow<Req, Res>, Error>>;

    fn before(&mut self, request: Req) -> Self::Future {
        let decided = self.first.before(request);
        let mut then = self.then.clone();
        Box::pin(async move {
            match decided.await? {
                Flow::Answer(response) => Ok(Flow::Answer(response)),
                Flow::Continue(request) => then.before(request).await,
            }
        })
    }
}

impl<Res, A, B> ReplaceCallback<Res> for First<A, B>
where
    A: ReplaceCallback<Res>,
    A::Future: Send + 'static,
    B: ReplaceCallback<Res> + Clone + Send + 'static,
    B::Future: Send,
    Res: Send + 'static,
{
    type Future = BoxFuture<'static, Result<Kept<Res>, Error>>;

    fn decide(&mut self, response: Res, ctx: RunContext) -> Self::Future {
        let decided = self.first.decide(response, ctx.clone());
        let mut then = self.then.clone();
        Box::pin(async move {
            match decided.await? {
                Kept::Replaced(response) => Ok(Kept::Replaced(response)),
                Kept::Kept(response) => then.decide(response, ctx).await,
            }
        })
    }
}

/// The pair at an after point: the response the first replacement (or none) leaves.
impl<Res, A, B> AfterCallback<Res> for First<A, B>
where
    First<A, B>: ReplaceCallback<Res>,
    <First<A, B> as ReplaceCallback<Res>>::Future: Send + 'static,
    Res: Send + 'static,
{
    type Future = BoxFuture<'static, Result<Res, Error>>;

    fn after(&mut self, response: Res, ctx: RunContext) -> Self::Future {
        let decided = self.decide(response, ctx);
        Box::pin(async move { decided.await.map(Kept::into_inner) })
    }
}

/// A missing before callback lets every request through.
impl<Req, C> BeforeCallback<Req> for Option<C>
where
    C: BeforeCallback<Req>,
    C::Future: Send + 'static,
    Req: Send + 'static,
    C::Response: Send + 'static,
{
    type Response = C::Response;
    type Future = BoxFuture<'static, Result<Flow<Req, C::Response>, Error>>;

    fn before(&mut self, request: Req) -> Self::Future {
        match self {
            Some(callback) => Box::pin(callback.before(request)),
            None => Box::pin(std::future::ready(Ok(Flow::Continue(request)))),
        }
    }
}

/// A missing after callback keeps every response.
impl<Res, C> ReplaceCallback<Res> for Option<C>
where
    C: ReplaceCallback<Res>,
    C::Future: Send + 'static,
    Res: Send + 'static,
{
    type Future = BoxFuture<'static, Result<Kept<Res>, Error>>;

    fn decide(&mut self, response: Res, ctx: RunContext) -> Self::Future {
        match self {
            Some(callback) => Box::pin(callback.decide(response, ctx)),
            None => Box::pin(std::future::ready(Ok(Kept::Kept(response)))),
        }
    }
}
