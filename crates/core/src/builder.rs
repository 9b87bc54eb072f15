//! Callback points as `ServiceBuilder` methods.

use std::future::Future;

use tower::ServiceBuilder;
use tower_layer::Stack;

use crate::agent::{AgentRequest, AgentResponse};
use crate::callback::{
    AfterLayer, AgentNext, AroundLayer, BeforeLayer, Flow, ModelNext, ObserveLayer, ToolNext,
    after_agent, after_model, after_tool, around_agent, around_model, around_tool, before_agent,
    before_model, before_tool,
};
use crate::context::RunContext;
use crate::error::Error;
use crate::model::{ModelRequest, ModelResponse};
use crate::tool::{ToolRequest, ToolResponse};

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Adds the callback points to [`tower::ServiceBuilder`], in the order the calls are
/// written (the first call is the outermost layer).
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_agent_core::{Error, Flow, ModelRequest, ModelResponse, RunContext, ServiceBuilderExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ServiceBuilder::new()
///     .after_model(|res: ModelResponse, _: RunContext| async move {
///         let text = res.message.text().to_uppercase();
///         Ok(ModelResponse::text(text))
///     })
///     .before_model(|mut req: ModelRequest| async move {
///         req.append_system("be loud");
///         Ok(Flow::Continue(req))
///     })
///     .service(service_fn(|req: ModelRequest| async move {
///         Ok::<_, Error>(ModelResponse::text(req.system.as_deref().unwrap_or_default()))
///     }));
/// let res = model.oneshot(ModelRequest::new(vec![])).await?;
/// assert_eq!(res.message.text(), "BE LOUD");
/// # Ok(())
/// # }
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed + Sized {
    /// Add a [`before_model`] callback.
    fn before_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(ModelRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<ModelRequest, ModelResponse>, Error>>;

    /// Add an [`after_model`] callback.
    fn after_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(ModelResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<ModelResponse, Error>>;

    /// Add a [`before_tool`] callback.
    fn before_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(ToolRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<ToolRequest, ToolResponse>, Error>>;

    /// Add an [`after_tool`] callback.
    fn after_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(ToolResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<ToolResponse, Error>>;

    /// Add a [`before_agent`] callback.
    fn before_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(AgentRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<AgentRequest, AgentResponse>, Error>>;

    /// Add an [`after_agent`] callback.
    fn after_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(AgentResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<AgentResponse, Error>>;

    /// Add an [`around_model`] callback.
    fn around_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(ModelRequest, ModelNext) -> Fut + Clone,
        Fut: Future<Output = Result<ModelResponse, Error>>;

    /// Add an [`around_tool`] callback.
    fn around_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(ToolRequest, ToolNext) -> Fut + Clone,
        Fut: Future<Output = Result<ToolResponse, Error>>;

    /// Add an [`around_agent`] callback.
    fn around_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(AgentRequest, AgentNext) -> Fut + Clone,
        Fut: Future<Output = Result<AgentResponse, Error>>;

    /// Add an observer (see [`ObserveLayer`]); call it first so that it is outermost.
    fn observe<OnReq, OnRes>(
        self,
        layer: ObserveLayer<OnReq, OnRes>,
    ) -> ServiceBuilder<Stack<ObserveLayer<OnReq, OnRes>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn before_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(ModelRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<ModelRequest, ModelResponse>, Error>>,
    {
        self.layer(before_model(f))
    }

    fn after_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(ModelResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<ModelResponse, Error>>,
    {
        self.layer(after_model(f))
    }

    fn before_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(ToolRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<ToolRequest, ToolResponse>, Error>>,
    {
        self.layer(before_tool(f))
    }

    fn after_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(ToolResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<ToolResponse, Error>>,
    {
        self.layer(after_tool(f))
    }

    fn before_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<BeforeLayer<F>, L>>
    where
        F: FnMut(AgentRequest) -> Fut + Clone,
        Fut: Future<Output = Result<Flow<AgentRequest, AgentResponse>, Error>>,
    {
        self.layer(before_agent(f))
    }

    fn after_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AfterLayer<F>, L>>
    where
        F: FnMut(AgentResponse, RunContext) -> Fut + Clone,
        Fut: Future<Output = Result<AgentResponse, Error>>,
    {
        self.layer(after_agent(f))
    }

    fn around_model<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(ModelRequest, ModelNext) -> Fut + Clone,
        Fut: Future<Output = Result<ModelResponse, Error>>,
    {
        self.layer(around_model(f))
    }

    fn around_tool<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(ToolRequest, ToolNext) -> Fut + Clone,
        Fut: Future<Output = Result<ToolResponse, Error>>,
    {
        self.layer(around_tool(f))
    }

    fn around_agent<F, Fut>(self, f: F) -> ServiceBuilder<Stack<AroundLayer<F>, L>>
    where
        F: FnMut(AgentRequest, AgentNext) -> Fut + Clone,
        Fut: Future<Output = Result<AgentResponse, Error>>,
    {
        self.layer(around_agent(f))
    }

    fn observe<OnReq, OnRes>(
        self,
        layer: ObserveLayer<OnReq, OnRes>,
    ) -> ServiceBuilder<Stack<ObserveLayer<OnReq, OnRes>, L>> {
        self.layer(layer)
    }
}
