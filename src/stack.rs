//! An agent that places its built-ins: each in its canonical slot, on every stack it acts at.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::{BoxCloneService, BoxCloneSyncService};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, DescribeTools, Error, ModelRequest, ModelResponse,
    ToolRequest, ToolResponse, ToolSpec,
};
use tower_agent_layers::approval::ApprovalLayer;
use tower_agent_layers::checkpoint::CheckpointLayer;
use tower_agent_layers::evict::EvictLayer;
use tower_agent_layers::instructions::InstructionsLayer;
use tower_agent_layers::limits::CallLimitsLayer;
use tower_agent_layers::memory::MemoryLayer;
use tower_agent_layers::patch::PatchDanglingLayer;
use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
use tower_agent_layers::summarize::SummarizeLayer;
use tower_agent_loop::AgentBuilder;

/// A model service with its layers, boxed: what [`Builtins`] builds on.
pub type BoxModel = BoxCloneService<ModelRequest, ModelResponse, Error>;

/// An agent service with its layers, boxed: what [`Builtins::build`] returns. It is
/// `Clone + Send`, so one value serves many sessions at once.
pub type BoxAgent = BoxCloneService<AgentRequest, AgentResponse, Error>;

/// A tool service with its layers, boxed, that still says which tools it serves.
#[derive(Clone)]
pub struct BoxTools {
    inner: BoxCloneSyncService<ToolRequest, ToolResponse, Error>,
    specs: Arc<dyn Fn() -> Arc<[ToolSpec]> + Send + Sync>,
}

impl BoxTools {
    /// Box `tools`, keeping what it reports (asked again every time: a tool service may
    /// change what it serves).
    pub fn new<T>(tools: T) -> Self
    where
        T: Service<ToolRequest, Response = ToolResponse>
            + DescribeTools
            + Clone
            + Send
            + Sync
            + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send + 'static,
    {
        let probe = tools.clone();
        Self {
            inner: BoxCloneSyncService::new(tools.map_err(into_error)),
            specs: Arc::new(move || probe.tool_specs()),
        }
    }
}

impl fmt::Debug for BoxTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = (self.specs)().iter().map(|s| s.name.clone()).collect();
        f.debug_struct("BoxTools").field("tools", &names).finish()
    }
}

impl DescribeTools for BoxTools {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        (self.specs)()
    }
}

impl Service<ToolRequest> for BoxTools {
    type Response = ToolResponse;
    type Error = Error;
    type Future =
        <BoxCloneSyncService<ToolRequest, ToolResponse, Error> as Service<ToolRequest>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        self.inner.call(request)
    }
}

type Wrap<S> = Arc<dyn Fn(S) -> S + Send + Sync>;

/// The built-ins of an agent, each placed in its canonical slot on every stack it acts at
/// (`docs/ordering.md`), and the host's own layers in named places. Start it from
/// [`Agent::builder()`](tower_agent_loop::Agent::builder) with any built-in method
/// ([`BuiltinsExt`]).
///
/// ```text
/// agent:  memory → patch → [agent_layer] → the loop
/// model:  limits → memory → instructions → summarize → [model_layer] → patch → retry
///         → [provider_layer] → the provider
/// tools:  evict → limits → checkpoint → approval → [tool_layer] → the tools
/// ```
///
/// A built-in that acts at two services is one value placed on both (memory, patch, limits).
/// Every service is boxed, so the agent's type is one name ([`BoxAgent`]) whatever it holds.
///
/// ```
/// use serde_json::json;
/// use tower_agent::prelude::*;
/// use tower_agent::layers::limits::{CallLimitsLayer, Limit};
/// use tower_agent::layers::retry::RetryPolicy;
/// use tower_agent_test::{ScriptedModel, StubTool};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ScriptedModel::new([
///     ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))]),
///     ModelResponse::text("It is noon."),
/// ]);
/// let tools = ToolSet::new().tool(StubTool::returning("clock", "12:00"));
/// let agent = Agent::builder()
///     .system("Be brief.")
///     .patch()
///     .limits(CallLimitsLayer::new().model_calls(Limit::per_run(10)))
///     .retry(RetryPolicy::new())
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
    memory: Option<MemoryLayer>,
    patch: Option<PatchDanglingLayer>,
    limits: Option<CallLimitsLayer>,
    instructions: Option<InstructionsLayer>,
    summarize: Option<SummarizeLayer>,
    retry: Option<RetryPolicy>,
    approval: Option<ApprovalLayer>,
    checkpoint: Option<CheckpointLayer>,
    evict: Option<EvictLayer>,
    agent_layers: Vec<Wrap<BoxAgent>>,
    model_layers: Vec<Wrap<BoxModel>>,
    provider_layers: Vec<Wrap<BoxModel>>,
    tool_layers: Vec<Wrap<BoxTools>>,
}

impl fmt::Debug for Builtins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builtins")
            .field("agent", &self.agent)
            .field("order", &self.order())
            .finish_non_exhaustive()
    }
}

impl Builtins {
    /// No built-in, the loop configured by `agent`.
    pub fn new(agent: AgentBuilder) -> Self {
        Self {
            agent,
            ..Self::default()
        }
    }

    /// Memory files, loaded once per run at the agent and shown to the model.
    pub fn memory(mut self, memory: MemoryLayer) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Dangling-call patching, at the agent (the loaded session) and at the model (innermost
    /// but for the retry).
    pub fn patch(mut self) -> Self {
        self.patch = Some(PatchDanglingLayer::new());
        self
    }

    /// Call limits, on the model and the tool stacks.
    pub fn limits(mut self, limits: CallLimitsLayer) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Instruction blocks in the system prompt.
    pub fn instructions(mut self, instructions: InstructionsLayer) -> Self {
        self.instructions = Some(instructions);
        self
    }

    /// Summarization of older messages, and recovery from a context overflow.
    pub fn summarize(mut self, summarize: SummarizeLayer) -> Self {
        self.summarize = Some(summarize);
        self
    }

    /// Retry of the provider's transient failures, right around the provider.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Human approval of gated tool calls.
    pub fn approval(mut self, approval: ApprovalLayer) -> Self {
        self.approval = Some(approval);
        self
    }

    /// The tool-budget checkpoint.
    pub fn checkpoint(mut self, checkpoint: CheckpointLayer) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Large-result eviction (its read tool is served and offered with the tools).
    pub fn evict(mut self, evict: EvictLayer) -> Self {
        self.evict = Some(evict);
        self
    }

    /// A layer of the host's on the agent service, inside the built-ins (it sees the repaired
    /// session); the first one added is the outermost.
    pub fn agent_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxAgent> + Send + Sync + 'static,
        L::Service: Service<AgentRequest, Response = AgentResponse> + Clone + Send + 'static,
        <L::Service as Service<AgentRequest>>::Error: Into<BoxError>,
        <L::Service as Service<AgentRequest>>::Future: Send + 'static,
    {
        self.agent_layers.push(Arc::new(move |inner| {
            BoxCloneService::new(layer.layer(inner).map_err(into_error))
        }));
        self
    }

    /// A layer of the host's on the model service, inside the built-ins that shape the
    /// request (it sees the final system prompt and the summarized history) and outside the
    /// patch and the retry; the first one added is the outermost.
    pub fn model_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxModel> + Send + Sync + 'static,
        L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ModelRequest>>::Future: Send + 'static,
    {
        self.model_layers.push(wrap_model(layer));
        self
    }

    /// A layer of the host's right around the provider, inside the retry (a fallback to
    /// another model, a timeout per attempt); the first one added is the outermost.
    pub fn provider_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxModel> + Send + Sync + 'static,
        L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ModelRequest>>::Future: Send + 'static,
    {
        self.provider_layers.push(wrap_model(layer));
        self
    }

    /// A layer of the host's on the tool service, inside the built-ins (it sees only the
    /// calls they let through, and the tools' own results); the first one added is the
    /// outermost. Its service must say which tools it serves: every tower-agent layer does.
    pub fn tool_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxTools> + Send + Sync + 'static,
        L::Service: Service<ToolRequest, Response = ToolResponse>
            + DescribeTools
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<ToolRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ToolRequest>>::Future: Send + 'static,
    {
        self.tool_layers
            .push(Arc::new(move |inner| BoxTools::new(layer.layer(inner))));
        self
    }

    /// The order the stacks are built in, outside in, by the names of their slots: what the
    /// diagram above shows, for the slots in use.
    pub fn order(&self) -> [(&'static str, Vec<&'static str>); 3] {
        let on = |set: bool, name: &'static str| set.then_some(name);
        let agent = [
            on(self.memory.is_some(), "memory"),
            on(self.patch.is_some(), "patch"),
            on(!self.agent_layers.is_empty(), "agent_layer"),
            Some("loop"),
        ];
        let model = [
            on(self.limits.is_some(), "limits"),
            on(self.memory.is_some(), "memory"),
            on(self.instructions.is_some(), "instructions"),
            on(self.summarize.is_some(), "summarize"),
            on(!self.model_layers.is_empty(), "model_layer"),
            on(self.patch.is_some(), "patch"),
            on(self.retry.is_some(), "retry"),
            on(!self.provider_layers.is_empty(), "provider_layer"),
            Some("provider"),
        ];
        let tools = [
            on(self.evict.is_some(), "evict"),
            on(self.limits.is_some(), "limits"),
            on(self.checkpoint.is_some(), "checkpoint"),
            on(self.approval.is_some(), "approval"),
            on(!self.tool_layers.is_empty(), "tool_layer"),
            Some("tools"),
        ];
        let names = |slots: &[Option<&'static str>]| slots.iter().flatten().copied().collect();
        [
            ("agent", names(&agent)),
            ("model", names(&model)),
            ("tools", names(&tools)),
        ]
    }

    /// The agent over `model` and `tools` with every built-in in its slot. The model is
    /// offered the tools the tool stack reports (the eviction layer's read tool among them).
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
        // Inside out: each slot wraps what is built so far.
        let mut model: BoxModel = BoxCloneService::new(model.map_err(into_error));
        for layer in self.provider_layers.iter().rev() {
            model = layer(model);
        }
        model = boxed(model, self.retry.clone().map(RetryLayer::new));
        model = boxed(model, self.patch);
        for layer in self.model_layers.iter().rev() {
            model = layer(model);
        }
        model = boxed(model, self.summarize.clone());
        model = boxed(model, self.instructions.clone());
        model = boxed(model, self.memory.clone());
        model = boxed(model, self.limits.clone());

        let mut tools = BoxTools::new(tools);
        for layer in self.tool_layers.iter().rev() {
            tools = layer(tools);
        }
        tools = boxed_tools(tools, self.approval.clone());
        tools = boxed_tools(tools, self.checkpoint.clone());
        tools = boxed_tools(tools, self.limits.clone());
        tools = boxed_tools(tools, self.evict.clone());

        let mut agent: BoxAgent = BoxCloneService::new(self.agent.build(model, tools));
        for layer in self.agent_layers.iter().rev() {
            agent = layer(agent);
        }
        agent = boxed(agent, self.patch);
        boxed(agent, self.memory)
    }
}

fn into_error(error: impl Into<BoxError>) -> Error {
    Error::from_boxed(error.into())
}

fn wrap_model<L>(layer: L) -> Wrap<BoxModel>
where
    L: Layer<BoxModel> + Send + Sync + 'static,
    L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
    <L::Service as Service<ModelRequest>>::Future: Send + 'static,
{
    Arc::new(move |inner| BoxCloneService::new(layer.layer(inner).map_err(into_error)))
}

/// `service` under `layer`, if there is one, boxed again.
fn boxed<Req, Res, L>(
    service: BoxCloneService<Req, Res, Error>,
    layer: Option<L>,
) -> BoxCloneService<Req, Res, Error>
where
    Req: 'static,
    Res: 'static,
    L: Layer<BoxCloneService<Req, Res, Error>>,
    L::Service: Service<Req, Response = Res> + Clone + Send + 'static,
    <L::Service as Service<Req>>::Error: Into<BoxError>,
    <L::Service as Service<Req>>::Future: Send + 'static,
{
    match layer {
        Some(layer) => BoxCloneService::new(
            ServiceBuilder::new()
                .layer(layer)
                .service(service)
                .map_err(into_error),
        ),
        None => service,
    }
}

/// `tools` under `layer`, if there is one, boxed again.
fn boxed_tools<L>(tools: BoxTools, layer: Option<L>) -> BoxTools
where
    L: Layer<BoxTools>,
    L::Service: Service<ToolRequest, Response = ToolResponse>
        + DescribeTools
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as Service<ToolRequest>>::Error: Into<BoxError>,
    <L::Service as Service<ToolRequest>>::Future: Send + 'static,
{
    match layer {
        Some(layer) => BoxTools::new(layer.layer(tools)),
        None => tools,
    }
}

/// The built-in methods on [`AgentBuilder`]: `Agent::builder().patch().limits(..)...` starts
/// a [`Builtins`].
pub trait BuiltinsExt: Sized {
    /// The builder as a [`Builtins`], with no built-in yet.
    fn builtins(self) -> Builtins;

    /// [`Builtins::memory`].
    fn memory(self, memory: MemoryLayer) -> Builtins {
        self.builtins().memory(memory)
    }

    /// [`Builtins::patch`].
    fn patch(self) -> Builtins {
        self.builtins().patch()
    }

    /// [`Builtins::limits`].
    fn limits(self, limits: CallLimitsLayer) -> Builtins {
        self.builtins().limits(limits)
    }

    /// [`Builtins::instructions`].
    fn instructions(self, instructions: InstructionsLayer) -> Builtins {
        self.builtins().instructions(instructions)
    }

    /// [`Builtins::summarize`].
    fn summarize(self, summarize: SummarizeLayer) -> Builtins {
        self.builtins().summarize(summarize)
    }

    /// [`Builtins::retry`].
    fn retry(self, policy: RetryPolicy) -> Builtins {
        self.builtins().retry(policy)
    }

    /// [`Builtins::approval`].
    fn approval(self, approval: ApprovalLayer) -> Builtins {
        self.builtins().approval(approval)
    }

    /// [`Builtins::checkpoint`].
    fn checkpoint(self, checkpoint: CheckpointLayer) -> Builtins {
        self.builtins().checkpoint(checkpoint)
    }

    /// [`Builtins::evict`].
    fn evict(self, evict: EvictLayer) -> Builtins {
        self.builtins().evict(evict)
    }
}

impl BuiltinsExt for AgentBuilder {
    fn builtins(self) -> Builtins {
        Builtins::new(self)
    }
}
