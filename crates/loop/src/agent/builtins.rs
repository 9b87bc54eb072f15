//! An agent with its built-ins and the host's layers, each in its slot on every stack it acts
//! at.

use std::fmt;
use std::sync::Arc;

use tower::util::BoxCloneService;
use tower::{Service, ServiceExt};
use tower_agent_core::{
    BoxAgent, BoxError, BoxTools, DescribeTools, Error, GenerationOptions, ModelRequest,
    ModelResponse, ToolRequest, ToolResponse, ToolSpec,
};

use crate::stack::{
    AgentLayer, AgentSlot, Builtin, ModelLayer, ModelSlot, Stacks, ToolLayer, ToolSlot,
};

use super::{AgentBuilder, Truncation};

/// An agent's loop settings, its built-ins and the host's own layers, each layer in its slot
/// on every stack it acts at ([`Stacks`]; the order is in `docs/ordering.md` and
/// [`Builtins::order`]). Start it from [`Agent::builder()`](crate::Agent::builder) with
/// [`AgentBuilder::with`] or a host slot; the loop's settings go before or after alike.
///
/// A built-in that acts at several services is one value placed on each (redaction,
/// guardrails, memory, patching, limits). Every service is boxed, so the agent's type is one
/// name ([`BoxAgent`]) whatever it holds.
///
/// ```
/// use serde_json::json;
/// use tower::ServiceExt;
/// use tower_agent_core::{AgentRequest, Error, ModelResponse, Session, ToolCall, around_model};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::{ScriptedModel, StubTool};
/// use tower_agent_tools::ToolSet;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ScriptedModel::new([
///     ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))]),
///     ModelResponse::text("It is noon."),
/// ]);
/// let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
/// let agent = Agent::builder()
///     .model_layer(around_model(|req, mut next| async move { next.run(req).await }))
///     .system("Be brief.")
///     .build(model.clone(), tools);
///
/// let res = agent.oneshot(AgentRequest::new(Session::new(), "What time is it?")).await?;
/// assert_eq!(res.text().as_deref(), Some("It is noon."));
/// assert_eq!(model.requests()[0].tools[0].name, "clock", "the tools describe themselves");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Builtins {
    agent: AgentBuilder,
    stacks: Stacks,
}

impl fmt::Debug for Builtins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builtins")
            .field("agent", &self.agent)
            .field("order", &self.order())
            .finish()
    }
}

impl Builtins {
    /// No built-in, the loop configured by `agent`.
    pub fn new(agent: AgentBuilder) -> Self {
        Self {
            agent,
            stacks: Stacks::default(),
        }
    }

    /// A built-in, in the slots it takes ([`Builtin::place`]).
    pub fn with(mut self, builtin: impl Builtin) -> Self {
        builtin.place(&mut self.stacks);
        self
    }

    /// [`AgentBuilder::system`].
    pub fn system(mut self, system: impl Into<Arc<str>>) -> Self {
        self.agent = self.agent.system(system);
        self
    }

    /// [`AgentBuilder::max_rounds`].
    pub fn max_rounds(mut self, max_rounds: u32) -> Self {
        self.agent = self.agent.max_rounds(max_rounds);
        self
    }

    /// [`AgentBuilder::sequential_tools`].
    pub fn sequential_tools(mut self) -> Self {
        self.agent = self.agent.sequential_tools();
        self
    }

    /// [`AgentBuilder::concurrent_tools`].
    pub fn concurrent_tools(mut self, limit: usize) -> Self {
        self.agent = self.agent.concurrent_tools(limit);
        self
    }

    /// [`AgentBuilder::concurrent_reads`].
    pub fn concurrent_reads(mut self, limit: usize) -> Self {
        self.agent = self.agent.concurrent_reads(limit);
        self
    }

    /// [`AgentBuilder::dedupe_calls`].
    pub fn dedupe_calls(mut self, dedupe: bool) -> Self {
        self.agent = self.agent.dedupe_calls(dedupe);
        self
    }

    /// [`AgentBuilder::tool_specs`].
    pub fn tool_specs(mut self, specs: impl Into<Arc<[ToolSpec]>>) -> Self {
        self.agent = self.agent.tool_specs(specs);
        self
    }

    /// [`AgentBuilder::options`].
    pub fn options(mut self, options: GenerationOptions) -> Self {
        self.agent = self.agent.options(options);
        self
    }

    /// [`AgentBuilder::early_tool_start`].
    pub fn early_tool_start(mut self, early: bool) -> Self {
        self.agent = self.agent.early_tool_start(early);
        self
    }

    /// [`AgentBuilder::when_truncated`].
    pub fn when_truncated(mut self, truncation: Truncation) -> Self {
        self.agent = self.agent.when_truncated(truncation);
        self
    }

    /// [`AgentBuilder::name`].
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.agent = self.agent.name(name);
        self
    }

    /// A layer of the host's on the agent service, inside the built-ins (it sees the repaired
    /// session); the first one added is the outermost.
    pub fn agent_layer(mut self, layer: impl AgentLayer) -> Self {
        self.stacks.agent(AgentSlot::Host, layer);
        self
    }

    /// A layer of the host's on the model service, inside the built-ins that shape the
    /// request (it sees the final system prompt and the summarized history) and outside the
    /// patch and the retry; the first one added is the outermost.
    ///
    /// A layer made for another stack is refused where it is added:
    ///
    /// ```compile_fail
    /// use tower_agent_core::{Flow, ToolRequest, before_tool};
    /// use tower_agent_loop::Agent;
    /// // A tool callback on the model stack does not compile.
    /// let gate = before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) });
    /// let _ = Agent::builder().model_layer(gate);
    /// ```
    ///
    /// The same callback on the tool stack does:
    ///
    /// ```
    /// use tower_agent_core::{Flow, ToolRequest, before_tool};
    /// use tower_agent_loop::Agent;
    /// let gate = before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) });
    /// let _ = Agent::builder().tool_layer(gate);
    /// ```
    pub fn model_layer(mut self, layer: impl ModelLayer) -> Self {
        self.stacks.model(ModelSlot::Host, layer);
        self
    }

    /// A layer of the host's right around the provider, inside the retry (a timeout per
    /// attempt, a durable journal), and around each model of the fallback chain; the first one
    /// added is the outermost.
    pub fn provider_layer(mut self, layer: impl ModelLayer) -> Self {
        self.stacks.model(ModelSlot::Provider, layer);
        self
    }

    /// A layer of the host's on the tool service, inside the built-ins (it sees only the
    /// calls they let through, and the tools' own results); the first one added is the
    /// outermost. Its service must say which tools it serves: every tower-agent layer does.
    pub fn tool_layer(mut self, layer: impl ToolLayer) -> Self {
        self.stacks.tools(ToolSlot::Host, layer);
        self
    }

    /// The order the stacks are built in, outside in, by the names of the slots in use (read
    /// from the slot lists, [`AgentSlot`], [`ModelSlot`], [`ToolSlot`]).
    pub fn order(&self) -> [(&'static str, Vec<&'static str>); 3] {
        self.stacks.order()
    }

    /// The agent over `model` and `tools` with every layer in its slot. The model is offered
    /// the tools the tool stack reports (the eviction layer's read tool among them). A tool
    /// service that does not describe itself (one boxed by tower) goes in
    /// [`BoxTools::with_specs`].
    pub fn build<M, T>(self, model: M, tools: T) -> BoxAgent
    where
        M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        M::Error: Into<BoxError>,
        M::Future: Send + 'static,
        T: Service<ToolRequest, Response = ToolResponse>
            + DescribeTools
            + Clone
            + Send
            + Sync
            + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send + 'static,
    {
        let model = BoxCloneService::new(model.map_err(|e| Error::from_boxed(e.into())));
        let model = self.stacks.wrap_model(model);
        let tools = self.stacks.wrap_tools(BoxTools::new(tools));
        let agent = BoxCloneService::new(self.agent.build(model, tools));
        self.stacks.wrap_agent(agent)
    }
}

impl AgentBuilder {
    /// A built-in, in the slots it takes: the builder becomes a [`Builtins`], with every
    /// setting of this one.
    pub fn with(self, builtin: impl Builtin) -> Builtins {
        Builtins::new(self).with(builtin)
    }

    /// [`Builtins::agent_layer`]: a host slot needs no built-in before it.
    pub fn agent_layer(self, layer: impl AgentLayer) -> Builtins {
        Builtins::new(self).agent_layer(layer)
    }

    /// [`Builtins::model_layer`].
    pub fn model_layer(self, layer: impl ModelLayer) -> Builtins {
        Builtins::new(self).model_layer(layer)
    }

    /// [`Builtins::provider_layer`].
    pub fn provider_layer(self, layer: impl ModelLayer) -> Builtins {
        Builtins::new(self).provider_layer(layer)
    }

    /// [`Builtins::tool_layer`].
    pub fn tool_layer(self, layer: impl ToolLayer) -> Builtins {
        Builtins::new(self).tool_layer(layer)
    }
}
