//! The callback points as tower layers, and read-only observers.
//!
//! | point | wraps | built from |
//! |---|---|---|
//! | `before_agent` | the agent service | [`before_agent`] or [`BeforeLayer::new`] |
//! | `after_agent` | the agent service | [`after_agent`] or [`AfterLayer::new`] |
//! | `around_agent` | the agent service | [`around_agent`] or [`AroundLayer::new`] |
//! | `before_model` | the model service | [`before_model`] or [`BeforeLayer::new`] |
//! | `after_model` | the model service | [`after_model`] or [`AfterLayer::new`] |
//! | `around_model` | the model service | [`around_model`] or [`AroundLayer::new`] |
//! | `before_tool` | the tool service | [`before_tool`] or [`BeforeLayer::new`] |
//! | `after_tool` | the tool service | [`after_tool`] or [`AfterLayer::new`] |
//! | `around_tool` | the tool service | [`around_tool`] or [`AroundLayer::new`] |
//!
//! A **before** callback gets the request and returns [`Flow::Continue`] with the request
//! (changed or not), or [`Flow::Answer`] with a response: answering short-circuits, so the
//! inner layers and the service are not called.
//!
//! An **after** callback gets the response and the run context, and returns the response,
//! changed, replaced or as it was. Errors from the inner service pass through after callbacks
//! untouched.
//!
//! An **around** callback gets the request and [`Next`], the rest of the stack, which it may
//! run zero times (answer itself), once, or several times (retry, fallback); it sees the
//! `Result` and may turn an error into a response or the reverse.
//!
//! The onion is plain: a layer always sees what the layers inside it returned, and what it
//! returns is what the layers outside it see. Which of two layers has the last word is a
//! matter of position: the outer one.
//!
//! An **observer** ([`ObserveLayer`]) is not an interceptor: it cannot change anything and it
//! always runs. Put it outermost at its point and it sees every request and every final
//! response, whoever answered. The ordering rules are in `docs/ordering.md`.
//!
//! Each callback is a strategy ([`BeforeCallback`], [`AfterCallback`], [`AroundCallback`])
//! with a blanket impl for closures, so a user's `async` closure and a built-in layer's
//! configurable struct go through one mechanism. Letting a request through a before or after
//! callback allocates nothing and boxes nothing; an around *closure* boxes the rest of the
//! stack ([`BoxNext`]), an [`AroundCallback`] implemented by hand boxes nothing.

mod after;
mod around;
mod before;
mod first;
mod observe;

use std::future::Future;
use std::sync::Arc;

pub use after::{After, AfterLayer, ResponseFuture as AfterFuture};
pub use around::{
    Around, AroundCallback, AroundLayer, BoxNext, ErrInto, Next, NextFuture, NextService,
    ResponseFuture as AroundFuture,
};
pub use before::{Before, BeforeLayer, ResponseFuture as BeforeFuture};
pub use first::{First, Kept, ReplaceCallback, first};
pub use observe::{
    Observe, ObserveLayer, ObservedError, OnRequest, OnResponse, ResponseFuture as ObserveFuture,
};

use crate::agent::{AgentRequest, AgentResponse};
use crate::context::RunContext;
use crate::error::Error;
use crate::model::{ModelRequest, ModelResponse, ToolSpec};
use crate::tool::{DescribeTools, ToolRequest, ToolResponse};

/// What a before callback decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Flow<C, A> {
    /// Let it go on to the inner service, changed or not.
    Continue(C),
    /// Answer here with this response: the inner service is not called.
    Answer(A),
}

/// A before callback: look at a request, let it continue or answer it.
///
/// Implemented for every `FnMut(Req) -> impl Future<Output = Result<Flow<Req, Res>, Error>>`.
/// Implement it by hand for a configurable built-in:
///
/// ```
/// use std::future::{ready, Ready};
/// use tower_agent_core::{BeforeCallback, BeforeLayer, Error, Flow, ToolRequest, ToolResponse};
///
/// /// Refuses calls to the tools it names.
/// #[derive(Clone, Debug)]
/// struct Deny(Vec<String>);
///
/// impl BeforeCallback<ToolRequest> for Deny {
///     type Response = ToolResponse;
///     type Future = Ready<Result<Flow<ToolRequest, ToolResponse>, Error>>;
///
///     fn before(&mut self, req: ToolRequest) -> Self::Future {
///         ready(Ok(if self.0.contains(&req.call.name) {
///             Flow::Answer(ToolResponse::error(&req.call, "this tool is disabled"))
///         } else {
///             Flow::Continue(req)
///         }))
///     }
/// }
///
/// let layer = BeforeLayer::new(Deny(vec!["rm".into()]));
/// # let _ = layer;
/// ```
pub trait BeforeCallback<Req> {
    /// The response it can answer with: the service's response.
    type Response;
    /// The future of its decision.
    type Future: Future<Output = Result<Flow<Req, Self::Response>, Error>>;

    /// Decide about `request`.
    fn before(&mut self, request: Req) -> Self::Future;
}

impl<F, Fut, Req, Res> BeforeCallback<Req> for F
where
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Flow<Req, Res>, Error>>,
{
    type Response = Res;
    type Future = Fut;

    fn before(&mut self, request: Req) -> Fut {
        self(request)
    }
}

/// An after callback: look at a response, keep it, change it or replace it.
///
/// Implemented for every
/// `FnMut(Res, RunContext) -> impl Future<Output = Result<Res, Error>>`.
pub trait AfterCallback<Res> {
    /// The future of the response it passes on.
    type Future: Future<Output = Result<Res, Error>>;

    /// Look at `response`, produced for a request of the run `ctx`, and pass it on.
    fn after(&mut self, response: Res, ctx: RunContext) -> Self::Future;
}

impl<F, Fut, Res> AfterCallback<Res> for F
where
    F: FnMut(Res, RunContext) -> Fut,
    Fut: Future<Output = Result<Res, Error>>,
{
    type Future = Fut;

    fn after(&mut self, response: Res, ctx: RunContext) -> Fut {
        self(response, ctx)
    }
}

/// A `before_model` layer from an async closure.
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{before_model, Error, Flow, ModelRequest, ModelResponse};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ServiceBuilder::new()
///     .layer(before_model(|mut req: ModelRequest| async move {
///         req.append_system("Answer in one word.");
///         Ok(Flow::Continue(req))
///     }))
///     .service(service_fn(|req: ModelRequest| async move {
///         Ok::<_, Error>(ModelResponse::text(req.system.as_deref().unwrap_or_default()))
///     }));
///
/// let res = model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(res.message.text(), "Answer in one word.");
/// # Ok(())
/// # }
/// ```
pub fn before_model<F, Fut>(f: F) -> BeforeLayer<F>
where
    F: FnMut(ModelRequest) -> Fut + Clone,
    Fut: Future<Output = Result<Flow<ModelRequest, ModelResponse>, Error>>,
{
    BeforeLayer::new(f)
}

/// A `before_tool` layer from an async closure.
///
/// ```
/// use serde_json::json;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{before_tool, Error, Flow, RunContext, ToolCall, ToolRequest, ToolResponse};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let tools = ServiceBuilder::new()
///     .layer(before_tool(|req: ToolRequest| async move {
///         if req.call.name == "delete_everything" {
///             return Ok(Flow::Answer(ToolResponse::error(&req.call, "not allowed")));
///         }
///         Ok(Flow::Continue(req))
///     }))
///     .service(service_fn(|req: ToolRequest| async move {
///         Ok::<_, Error>(ToolResponse::success(&req.call, "done"))
///     }));
///
/// let call = ToolCall::new("1", "delete_everything", json!({}));
/// let res = tools.oneshot(ToolRequest::new(call, RunContext::new())).await?;
/// assert!(res.result.is_error);
/// # Ok(())
/// # }
/// ```
pub fn before_tool<F, Fut>(f: F) -> BeforeLayer<F>
where
    F: FnMut(ToolRequest) -> Fut + Clone,
    Fut: Future<Output = Result<Flow<ToolRequest, ToolResponse>, Error>>,
{
    BeforeLayer::new(f)
}

/// A `before_agent` layer from an async closure.
pub fn before_agent<F, Fut>(f: F) -> BeforeLayer<F>
where
    F: FnMut(AgentRequest) -> Fut + Clone,
    Fut: Future<Output = Result<Flow<AgentRequest, AgentResponse>, Error>>,
{
    BeforeLayer::new(f)
}

/// An `after_model` layer from an async closure.
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{after_model, Error, ModelRequest, ModelResponse, RunContext};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ServiceBuilder::new()
///     .layer(after_model(|res: ModelResponse, _ctx: RunContext| async move {
///         if res.message.text().contains("password") {
///             // `map_text` keeps the tool calls, usage and finish reason.
///             return Ok(res.map_text(|_| "[redacted]".into()));
///         }
///         Ok(res)
///     }))
///     .service(service_fn(|_req: ModelRequest| async move {
///         Ok::<_, Error>(ModelResponse::text("the password is hunter2"))
///     }));
///
/// let res = model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(res.message.text(), "[redacted]");
/// # Ok(())
/// # }
/// ```
pub fn after_model<F, Fut>(f: F) -> AfterLayer<F>
where
    F: FnMut(ModelResponse, RunContext) -> Fut + Clone,
    Fut: Future<Output = Result<ModelResponse, Error>>,
{
    AfterLayer::new(f)
}

/// An `after_tool` layer from an async closure.
pub fn after_tool<F, Fut>(f: F) -> AfterLayer<F>
where
    F: FnMut(ToolResponse, RunContext) -> Fut + Clone,
    Fut: Future<Output = Result<ToolResponse, Error>>,
{
    AfterLayer::new(f)
}

/// An `after_agent` layer from an async closure.
pub fn after_agent<F, Fut>(f: F) -> AfterLayer<F>
where
    F: FnMut(AgentResponse, RunContext) -> Fut + Clone,
    Fut: Future<Output = Result<AgentResponse, Error>>,
{
    AfterLayer::new(f)
}

/// What an [`around_model`] closure gets as `next`.
pub type ModelNext = BoxNext<ModelRequest, ModelResponse>;
/// What an [`around_tool`] closure gets as `next`.
pub type ToolNext = BoxNext<ToolRequest, ToolResponse>;
/// What an [`around_agent`] closure gets as `next`.
pub type AgentNext = BoxNext<AgentRequest, AgentResponse>;

/// An `around_model` layer from an async closure: the request, the rest of the stack as
/// `next`, and the `Result`.
///
/// The closure sees errors as [`Error`] whatever the inner service fails with (tower's
/// `BoxError` is converted with [`Error::from_boxed`]: a timeout is
/// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout)), and what it returns leaves the layer as
/// an `Error`.
///
/// ```
/// use std::time::Instant;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{around_model, Error, ErrorKind, ModelRequest, ModelResponse};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ServiceBuilder::new()
///     .layer(around_model(|req, mut next| async move {
///         let started = Instant::now();
///         let result = next.run(req).await;
///         let _elapsed = started.elapsed(); // timing needs the request and the result
///         match result {
///             // An error the model service raised becomes an answer.
///             Err(e) if e.kind() == ErrorKind::ContextTooLong => {
///                 Ok(ModelResponse::text("that was too long"))
///             }
///             other => other,
///         }
///     }))
///     .service(service_fn(|_req: ModelRequest| async {
///         Err::<ModelResponse, _>(Error::new(ErrorKind::ContextTooLong, "413"))
///     }));
///
/// let res = model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(res.message.text(), "that was too long");
/// # Ok(())
/// # }
/// ```
pub fn around_model<F, Fut>(f: F) -> AroundLayer<F>
where
    F: FnMut(ModelRequest, ModelNext) -> Fut + Clone,
    Fut: Future<Output = Result<ModelResponse, Error>>,
{
    AroundLayer::new(f)
}

/// An `around_tool` layer from an async closure.
///
/// ```
/// use serde_json::json;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{around_tool, Error, RunContext, ToolCall, ToolRequest, ToolResponse};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let tools = ServiceBuilder::new()
///     // Try the call twice before giving up.
///     .layer(around_tool(|req: ToolRequest, mut next| async move {
///         match next.run(req.clone()).await {
///             Err(_) => next.run(req).await,
///             ok => ok,
///         }
///     }))
///     .service(service_fn(|req: ToolRequest| async move {
///         Ok::<_, Error>(ToolResponse::success(&req.call, "done"))
///     }));
/// let call = ToolCall::new("1", "t", json!({}));
/// let res = tools.oneshot(ToolRequest::new(call, RunContext::new())).await?;
/// assert_eq!(res.result.content, "done");
/// # Ok(())
/// # }
/// ```
pub fn around_tool<F, Fut>(f: F) -> AroundLayer<F>
where
    F: FnMut(ToolRequest, ToolNext) -> Fut + Clone,
    Fut: Future<Output = Result<ToolResponse, Error>>,
{
    AroundLayer::new(f)
}

/// An `around_agent` layer from an async closure: answer the run, run it and look at (or
/// replace) the result, turn its error into a response.
///
/// Run the agent at most once per request: a run closes the request's event stream when it
/// ends and shares its run context (state, cancellation) with any second run. To try a run
/// again, start a new request from the session the error carries.
pub fn around_agent<F, Fut>(f: F) -> AroundLayer<F>
where
    F: FnMut(AgentRequest, AgentNext) -> Fut + Clone,
    Fut: Future<Output = Result<AgentResponse, Error>>,
{
    AroundLayer::new(f)
}

/// A callback layer passes on the tools of the service inside it.
macro_rules! describe_inner {
    ($($ty:ident<S $(, $param:ident)*>),*) => {$(
        impl<S: DescribeTools, $($param),*> DescribeTools for $ty<S $(, $param)*> {
            fn tool_specs(&self) -> Arc<[ToolSpec]> {
                self.get_ref().tool_specs()
            }
        }
    )*};
}

describe_inner!(Before<S, C>, After<S, C>, Around<S, C>, Observe<S, OnReq, OnRes>);
