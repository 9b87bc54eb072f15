//! An agent that places its built-ins: each in its canonical slot, on every stack it acts at.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::{BoxCloneService, BoxCloneSyncService};
use tower::{Layer, Service, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, DescribeTools, Error, ModelRequest, ModelResponse,
    ToolRequest, ToolResponse, ToolSpec,
};
use tower_agent_layers::approval::ApprovalLayer;
use tower_agent_layers::budget::BudgetLayer;
#[cfg(feature = "cache")]
use tower_agent_layers::cache::ToolCacheLayer;
use tower_agent_layers::checkpoint::CheckpointLayer;
use tower_agent_layers::clear::ClearToolResultsLayer;
use tower_agent_layers::evict::EvictLayer;
use tower_agent_layers::fallback::FallbackLayer;
use tower_agent_layers::guardrail::GuardrailLayer;
use tower_agent_layers::instructions::InstructionsLayer;
use tower_agent_layers::limits::CallLimitsLayer;
use tower_agent_layers::memory::MemoryLayer;
use tower_agent_layers::patch::PatchDanglingLayer;
use tower_agent_layers::redact::RedactLayer;
use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
use tower_agent_layers::select::ToolSelectLayer;
#[cfg(feature = "structured")]
use tower_agent_layers::structured::StructuredLayer;
use tower_agent_layers::summarize::SummarizeLayer;
use tower_agent_loop::AgentBuilder;
#[cfg(feature = "sessions")]
use tower_agent_sessions::{SessionStore, StoreLayer};

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
/// agent:  store → patch → redact → guardrail → memory → [agent_layer] → the loop
/// model:  redact → guardrail → limits → memory → instructions → select → summarize → clear
///         → [model_layer] → patch → structured → budget → fallback → retry → [provider_layer] → the provider
/// tools:  evict → redact → guardrail → limits → checkpoint → approval → cache → [tool_layer]
///         → the tools
/// ```
///
/// A built-in that acts at several services is one value placed on each (redact, guardrail,
/// memory, patch, limits).
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
    #[cfg(feature = "sessions")]
    store: Option<StoreLayer>,
    memory: Option<MemoryLayer>,
    patch: Option<PatchDanglingLayer>,
    limits: Option<CallLimitsLayer>,
    instructions: Option<InstructionsLayer>,
    select: Option<ToolSelectLayer>,
    summarize: Option<SummarizeLayer>,
    clear: Option<ClearToolResultsLayer>,
    budget: Option<BudgetLayer>,
    retry: Option<RetryPolicy>,
    fallback: Option<FallbackLayer>,
    #[cfg(feature = "structured")]
    structured: Option<StructuredLayer>,
    redact: Option<RedactLayer>,
    guardrail: Option<GuardrailLayer>,
    approval: Option<ApprovalLayer>,
    #[cfg(feature = "cache")]
    cache: Option<ToolCacheLayer>,
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

    /// [`AgentBuilder::system`]: the loop's settings go before or after the built-ins alike.
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

    /// [`AgentBuilder::tool_specs`].
    pub fn tool_specs(mut self, specs: impl Into<Arc<[tower_agent_core::ToolSpec]>>) -> Self {
        self.agent = self.agent.tool_specs(specs);
        self
    }

    /// [`AgentBuilder::options`].
    pub fn options(mut self, options: tower_agent_core::GenerationOptions) -> Self {
        self.agent = self.agent.options(options);
        self
    }

    /// [`AgentBuilder::early_tool_start`].
    pub fn early_tool_start(mut self, early: bool) -> Self {
        self.agent = self.agent.early_tool_start(early);
        self
    }

    /// [`AgentBuilder::when_truncated`].
    pub fn when_truncated(mut self, truncation: tower_agent_loop::Truncation) -> Self {
        self.agent = self.agent.when_truncated(truncation);
        self
    }

    /// [`AgentBuilder::name`].
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.agent = self.agent.name(name);
        self
    }

    /// Keep the runs' sessions in `store`: a request names its session by id, and the run
    /// saves it at every step (see [`StoreLayer`]). Outermost at the agent: every built-in sees
    /// the stored session, and what each did is saved.
    #[cfg(feature = "sessions")]
    pub fn store(mut self, store: impl SessionStore) -> Self {
        self.store = Some(StoreLayer::new(store));
        self
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

    /// Older tool results replaced by a placeholder in each model request once it is large,
    /// right inside summarization: the summarizer folds the whole results, the model is sent
    /// the cleared ones (context editing).
    pub fn clear_tool_results(mut self, clear: ClearToolResultsLayer) -> Self {
        self.clear = Some(clear);
        self
    }

    /// Tool selection: each model call offered the tools a closure or a cheap model chooses,
    /// right inside the instructions, so that summarization counts only the tools offered.
    /// The agent still routes any call to every tool.
    pub fn tool_select(mut self, select: ToolSelectLayer) -> Self {
        self.select = Some(select);
        self
    }

    /// Cost budgets, each model call's worst case reserved before it is sent: right inside
    /// structured output, outside the fallback and the retry (one reservation per call,
    /// however many attempts; a summary's and a repair's calls reserved too).
    pub fn budget(mut self, budget: BudgetLayer) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Retry of the provider's transient failures, right around the provider.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Fallback to the next model of a chain, outside the retry: each model of the chain gets
    /// the same retry and provider layers as the provider.
    pub fn fallback(mut self, fallback: FallbackLayer) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// Structured output checked against the request's response format, and the answers that
    /// do not match sent back with what is wrong (bounded): inside the patch, outside the
    /// fallback and the retry (each repair is a call of its own); the host's model layers
    /// and the guardrails see only the answer that matched.
    #[cfg(feature = "structured")]
    pub fn structured(mut self, structured: StructuredLayer) -> Self {
        self.structured = Some(structured);
        self
    }

    /// Redaction of the run's input, of the model's input and output and of tool results: on
    /// the agent right inside the store (the input is redacted before the run saves it first,
    /// and every other layer sees it redacted), outermost on the model stack (the summarizer
    /// sees redacted text), and on the tool stack inside the eviction (a result is stored
    /// redacted).
    pub fn redact(mut self, redact: RedactLayer) -> Self {
        self.redact = Some(redact);
        self
    }

    /// Guardrails on the run's input, the model's output and tool results: inside the
    /// redaction on every stack, so a guardrail reads the redacted input the model reads, but
    /// the model's output and tool results before they are redacted (a classifier model among
    /// the guardrails sees them too); a trip ends the run. The input is checked on the agent,
    /// before the run saves anything (in parallel with the first model call on the model
    /// stack with [`GuardrailLayer::parallel`]); a tripped input is not appended.
    pub fn guardrail(mut self, guardrail: GuardrailLayer) -> Self {
        self.guardrail = Some(guardrail);
        self
    }

    /// Human approval of gated tool calls.
    pub fn approval(mut self, approval: ApprovalLayer) -> Self {
        self.approval = Some(approval);
        self
    }

    /// A cache of read-only tools' results: right inside approval, so the calls it answers
    /// are still counted by the call limits and asked for approval, and outside your
    /// `tool_layer`, which runs only for the calls that reach the tools.
    #[cfg(feature = "cache")]
    pub fn tool_cache(mut self, cache: ToolCacheLayer) -> Self {
        self.cache = Some(cache);
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
        self.agent_layers.push(wrap(layer));
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
        self.model_layers.push(wrap(layer));
        self
    }

    /// A layer of the host's right around the provider, inside the retry (a timeout per
    /// attempt, a durable journal), and around each model of the fallback chain; the first one
    /// added is the outermost.
    pub fn provider_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxModel> + Send + Sync + 'static,
        L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ModelRequest>>::Future: Send + 'static,
    {
        self.provider_layers.push(wrap(layer));
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
        self.tool_layers.push(wrap_tools(layer));
        self
    }

    /// The order the stacks are built in, outside in, by the names of their slots: what the
    /// diagram above shows, for the slots in use. It is read from the lists [`Builtins::build`]
    /// builds from.
    pub fn order(&self) -> [(&'static str, Vec<&'static str>); 3] {
        fn names<S>(slots: &[Slot<S>], innermost: &'static str) -> Vec<&'static str> {
            let used = slots.iter().filter(|(_, wraps)| !wraps.is_empty());
            used.map(|(name, _)| *name).chain([innermost]).collect()
        }
        [
            ("agent", names(&self.agent_slots(), "loop")),
            ("model", names(&self.model_slots(), "provider")),
            ("tools", names(&self.tool_slots(), "tools")),
        ]
    }

    /// The agent service's slots, outside in.
    fn agent_slots(&self) -> Vec<Slot<BoxAgent>> {
        vec![
            #[cfg(feature = "sessions")]
            ("store", self.store.clone().map(wrap).into_iter().collect()),
            ("patch", self.patch.clone().map(wrap).into_iter().collect()),
            (
                "redact",
                self.redact.clone().map(wrap).into_iter().collect(),
            ),
            (
                "guardrail",
                self.guardrail.clone().map(wrap).into_iter().collect(),
            ),
            (
                "memory",
                self.memory.clone().map(wrap).into_iter().collect(),
            ),
            ("agent_layer", self.agent_layers.clone()),
        ]
    }

    /// The model service's slots, outside in.
    fn model_slots(&self) -> Vec<Slot<BoxModel>> {
        let retry = self.retry.clone().map(RetryLayer::new);
        // Around the provider, and around each model the fallback layer may call.
        let around_provider: Vec<Slot<BoxModel>> = vec![
            ("retry", retry.map(wrap).into_iter().collect()),
            ("provider_layer", self.provider_layers.clone()),
        ];
        let fallback = self
            .fallback
            .clone()
            .map(|fallback| fallback.map_models(|model| wrap_in(&around_provider, model)));
        let mut slots = vec![
            (
                "redact",
                self.redact.clone().map(wrap).into_iter().collect(),
            ),
            (
                "guardrail",
                self.guardrail.clone().map(wrap).into_iter().collect(),
            ),
            (
                "limits",
                self.limits.clone().map(wrap).into_iter().collect(),
            ),
            (
                "memory",
                self.memory.clone().map(wrap).into_iter().collect(),
            ),
            (
                "instructions",
                self.instructions.clone().map(wrap).into_iter().collect(),
            ),
            (
                "select",
                self.select.clone().map(wrap).into_iter().collect(),
            ),
            (
                "summarize",
                self.summarize.clone().map(wrap).into_iter().collect(),
            ),
            ("clear", self.clear.clone().map(wrap).into_iter().collect()),
            ("model_layer", self.model_layers.clone()),
            ("patch", self.patch.clone().map(wrap).into_iter().collect()),
            #[cfg(feature = "structured")]
            (
                "structured",
                self.structured.map(wrap).into_iter().collect(),
            ),
            (
                "budget",
                self.budget.clone().map(wrap).into_iter().collect(),
            ),
            ("fallback", fallback.map(wrap).into_iter().collect()),
        ];
        slots.extend(around_provider);
        slots
    }

    /// The tool service's slots, outside in.
    fn tool_slots(&self) -> Vec<Slot<BoxTools>> {
        vec![
            (
                "evict",
                self.evict.clone().map(wrap_tools).into_iter().collect(),
            ),
            (
                "redact",
                self.redact.clone().map(wrap_tools).into_iter().collect(),
            ),
            (
                "guardrail",
                self.guardrail.clone().map(wrap_tools).into_iter().collect(),
            ),
            (
                "limits",
                self.limits.clone().map(wrap_tools).into_iter().collect(),
            ),
            (
                "checkpoint",
                self.checkpoint
                    .clone()
                    .map(wrap_tools)
                    .into_iter()
                    .collect(),
            ),
            (
                "approval",
                self.approval.clone().map(wrap_tools).into_iter().collect(),
            ),
            #[cfg(feature = "cache")]
            (
                "cache",
                self.cache.clone().map(wrap_tools).into_iter().collect(),
            ),
            ("tool_layer", self.tool_layers.clone()),
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
        let model = wrap_in(
            &self.model_slots(),
            BoxCloneService::new(model.map_err(into_error)),
        );
        let tools = wrap_in(&self.tool_slots(), BoxTools::new(tools));
        let agent = BoxCloneService::new(self.agent.clone().build(model, tools));
        wrap_in(&self.agent_slots(), agent)
    }
}

/// A slot of a stack: its name, and the layers in it (outermost first).
type Slot<S> = (&'static str, Vec<Wrap<S>>);

/// `service` inside every layer of `slots` (outside in).
fn wrap_in<S>(slots: &[Slot<S>], service: S) -> S {
    let layers = slots.iter().rev().flat_map(|(_, wraps)| wraps.iter().rev());
    layers.fold(service, |service, layer| layer(service))
}

fn into_error(error: impl Into<BoxError>) -> Error {
    Error::from_boxed(error.into())
}

/// A layer over a boxed service, boxing again what it makes.
fn wrap<Req, Res, L>(layer: L) -> Wrap<BoxCloneService<Req, Res, Error>>
where
    Req: 'static,
    Res: 'static,
    L: Layer<BoxCloneService<Req, Res, Error>> + Send + Sync + 'static,
    L::Service: Service<Req, Response = Res> + Clone + Send + 'static,
    <L::Service as Service<Req>>::Error: Into<BoxError>,
    <L::Service as Service<Req>>::Future: Send + 'static,
{
    Arc::new(move |inner| BoxCloneService::new(layer.layer(inner).map_err(into_error)))
}

/// A layer over the boxed tools, boxing again what it makes (which still says its tools).
fn wrap_tools<L>(layer: L) -> Wrap<BoxTools>
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
    Arc::new(move |inner| BoxTools::new(layer.layer(inner)))
}

/// The built-in methods on [`AgentBuilder`]: `Agent::builder().patch().limits(..)...` starts
/// a [`Builtins`].
pub trait BuiltinsExt: Sized {
    /// The builder as a [`Builtins`], with no built-in yet.
    fn builtins(self) -> Builtins;

    /// [`Builtins::store`].
    #[cfg(feature = "sessions")]
    fn store(self, store: impl SessionStore) -> Builtins {
        self.builtins().store(store)
    }

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

    /// [`Builtins::clear_tool_results`].
    fn clear_tool_results(self, clear: ClearToolResultsLayer) -> Builtins {
        self.builtins().clear_tool_results(clear)
    }

    /// [`Builtins::tool_select`].
    fn tool_select(self, select: ToolSelectLayer) -> Builtins {
        self.builtins().tool_select(select)
    }

    /// [`Builtins::budget`].
    fn budget(self, budget: BudgetLayer) -> Builtins {
        self.builtins().budget(budget)
    }

    /// [`Builtins::retry`].
    fn retry(self, policy: RetryPolicy) -> Builtins {
        self.builtins().retry(policy)
    }

    /// [`Builtins::fallback`].
    fn fallback(self, fallback: FallbackLayer) -> Builtins {
        self.builtins().fallback(fallback)
    }

    /// [`Builtins::structured`].
    #[cfg(feature = "structured")]
    fn structured(self, structured: StructuredLayer) -> Builtins {
        self.builtins().structured(structured)
    }

    /// [`Builtins::redact`].
    fn redact(self, redact: RedactLayer) -> Builtins {
        self.builtins().redact(redact)
    }

    /// [`Builtins::guardrail`].
    fn guardrail(self, guardrail: GuardrailLayer) -> Builtins {
        self.builtins().guardrail(guardrail)
    }

    /// [`Builtins::approval`].
    fn approval(self, approval: ApprovalLayer) -> Builtins {
        self.builtins().approval(approval)
    }

    /// [`Builtins::tool_cache`].
    #[cfg(feature = "cache")]
    fn tool_cache(self, cache: ToolCacheLayer) -> Builtins {
        self.builtins().tool_cache(cache)
    }

    /// [`Builtins::checkpoint`].
    fn checkpoint(self, checkpoint: CheckpointLayer) -> Builtins {
        self.builtins().checkpoint(checkpoint)
    }

    /// [`Builtins::evict`].
    fn evict(self, evict: EvictLayer) -> Builtins {
        self.builtins().evict(evict)
    }

    /// [`Builtins::agent_layer`]: a host slot needs no built-in before it.
    fn agent_layer<L>(self, layer: L) -> Builtins
    where
        L: Layer<BoxAgent> + Send + Sync + 'static,
        L::Service: Service<AgentRequest, Response = AgentResponse> + Clone + Send + 'static,
        <L::Service as Service<AgentRequest>>::Error: Into<BoxError>,
        <L::Service as Service<AgentRequest>>::Future: Send + 'static,
    {
        self.builtins().agent_layer(layer)
    }

    /// [`Builtins::model_layer`].
    fn model_layer<L>(self, layer: L) -> Builtins
    where
        L: Layer<BoxModel> + Send + Sync + 'static,
        L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ModelRequest>>::Future: Send + 'static,
    {
        self.builtins().model_layer(layer)
    }

    /// [`Builtins::provider_layer`].
    fn provider_layer<L>(self, layer: L) -> Builtins
    where
        L: Layer<BoxModel> + Send + Sync + 'static,
        L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
        <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ModelRequest>>::Future: Send + 'static,
    {
        self.builtins().provider_layer(layer)
    }

    /// [`Builtins::tool_layer`].
    fn tool_layer<L>(self, layer: L) -> Builtins
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
        self.builtins().tool_layer(layer)
    }
}

impl BuiltinsExt for AgentBuilder {
    fn builtins(self) -> Builtins {
        Builtins::new(self)
    }
}
