//! Where the built-ins go: the canonical order of the three stacks, as one list of slots per
//! stack ([`AgentSlot`], [`ModelSlot`], [`ToolSlot`]), and the [`Builtin`] trait by which each
//! built-in says, next to its own code, which slots it takes.
//!
//! The agent's builder collects the built-ins in a [`Stacks`] and wraps each service in the
//! layers of its slots, outside in. A built-in that acts on several services takes a slot on
//! each (redaction: the agent, the model and the tools). The host's own layers have named slots
//! of their own (`agent_layer`, `model_layer`, `provider_layer`, `tool_layer`).
//!
//! The slot lists are the one place the order is written down: the builder's `order()` and
//! the diagram in the ordering guide are read from them (a test keeps the guide in step).

use std::fmt;
use std::sync::Arc;

use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxAgent, BoxError, BoxModel, BoxTools, DescribeTools, Error,
    ModelRequest, ModelResponse, ToolRequest, ToolResponse,
};

/// Declares an ordered slot list: the enum, its `ALL` (outside in) and each slot's name.
macro_rules! slots {
    ($(#[$doc:meta])* $name:ident, innermost: $innermost:literal, {
        $($(#[$slot_doc:meta])* $slot:ident = $slot_name:literal,)*
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$slot_doc])* $slot,)*
        }

        impl $name {
            /// Every slot, outside in.
            pub const ALL: &'static [Self] = &[$(Self::$slot,)*];

            /// What the slots wrap, innermost.
            pub const INNERMOST: &'static str = $innermost;

            /// The slot's name, as `order()` and the ordering guide show it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$slot => $slot_name,)*
                }
            }
        }
    };
}

slots!(
    /// The slots of the agent service, outside in: the order is the enum's.
    AgentSlot, innermost: "loop", {
        /// The session store: outermost, so every built-in sees the stored session and what
        /// each did is saved.
        Store = "store",
        /// Dangling-call patching of the loaded session.
        Patch = "patch",
        /// Redaction of the run's input, before the run saves it first.
        Redact = "redact",
        /// Guardrails on the run's input (the redacted one), before anything is saved.
        Guardrail = "guardrail",
        /// Memory files, loaded once per run.
        Memory = "memory",
        /// The host's own agent layers: they see the repaired, redacted session.
        Host = "agent_layer",
    }
);

slots!(
    /// The slots of the model service, outside in: the order is the enum's.
    ModelSlot, innermost: "provider", {
        /// Redaction of the model's input and output: the summarizer sees redacted text.
        Redact = "redact",
        /// Guardrails on the model's input and output, inside the redaction.
        Guardrail = "guardrail",
        /// Model-call limits: a call refused here reaches nothing below.
        Limits = "limits",
        /// Memory files shown to the model.
        Memory = "memory",
        /// Instruction blocks in the system prompt.
        Instructions = "instructions",
        /// Tool selection, inside the instructions, so summarization counts only the tools
        /// offered.
        Select = "select",
        /// Summarization of older messages.
        Summarize = "summarize",
        /// Older tool results cleared in the request (context editing), inside summarization:
        /// the summarizer folds the whole results.
        Clear = "clear",
        /// The host's own model layers: they see the final system prompt and the summarized
        /// history.
        Host = "model_layer",
        /// Dangling-call patching of the request, innermost but for the retry.
        Patch = "patch",
        /// Structured output checked and repaired: each repair is a call of its own.
        Structured = "structured",
        /// Cost budgets, one reservation per call however many attempts.
        Budget = "budget",
        /// Fallback to the next model of a chain; each model of the chain gets the slots
        /// inside this one.
        Fallback = "fallback",
        /// Retry of the provider's transient failures.
        Retry = "retry",
        /// The host's own layers right around the provider, inside the retry (a timeout per
        /// attempt, a durable journal).
        Provider = "provider_layer",
    }
);

slots!(
    /// The slots of the tool service, outside in: the order is the enum's.
    ToolSlot, innermost: "tools", {
        /// Large results moved to storage: outermost, so a result is stored as the model
        /// would see it.
        Evict = "evict",
        /// Redaction of tool results (stored redacted).
        Redact = "redact",
        /// Guardrails on tool results, before they are redacted.
        Guardrail = "guardrail",
        /// Tool-call limits.
        Limits = "limits",
        /// A policy on each call (allow, deny, revise), inside the limits: a denied call
        /// counts; outside the checkpoint and approval: a human sees only what may run.
        Guard = "tool_guard",
        /// The checkpoint.
        Checkpoint = "checkpoint",
        /// Human approval of gated calls.
        Approval = "approval",
        /// A cache of read-only tools' results, inside approval and the limits.
        Cache = "cache",
        /// The host's own tool layers: they see only the calls the built-ins let through.
        Host = "tool_layer",
    }
);

/// A layer for the agent service, as [`Stacks::agent`] and the builder's `agent_layer` take
/// it: any `tower::Layer` over [`BoxAgent`] whose service answers agent requests.
pub trait AgentLayer:
    Layer<
        BoxAgent,
        Service: Service<
            AgentRequest,
            Response = AgentResponse,
            Error: Into<BoxError>,
            Future: Send + 'static,
        > + Clone
                     + Send
                     + 'static,
    > + Send
    + Sync
    + 'static
{
}

impl<L> AgentLayer for L
where
    L: Layer<BoxAgent> + Send + Sync + 'static,
    L::Service: Service<AgentRequest, Response = AgentResponse> + Clone + Send + 'static,
    <L::Service as Service<AgentRequest>>::Error: Into<BoxError>,
    <L::Service as Service<AgentRequest>>::Future: Send + 'static,
{
}

/// A layer for the model service, as [`Stacks::model`] and the builder's `model_layer` and
/// `provider_layer` take it: any `tower::Layer` over [`BoxModel`] whose service answers model
/// requests.
pub trait ModelLayer:
    Layer<
        BoxModel,
        Service: Service<
            ModelRequest,
            Response = ModelResponse,
            Error: Into<BoxError>,
            Future: Send + 'static,
        > + Clone
                     + Send
                     + 'static,
    > + Send
    + Sync
    + 'static
{
}

impl<L> ModelLayer for L
where
    L: Layer<BoxModel> + Send + Sync + 'static,
    L::Service: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    <L::Service as Service<ModelRequest>>::Error: Into<BoxError>,
    <L::Service as Service<ModelRequest>>::Future: Send + 'static,
{
}

/// A layer for the tool service, as [`Stacks::tools`] and the builder's `tool_layer` take it:
/// any `tower::Layer` over [`BoxTools`] whose service answers tool requests and says which
/// tools it serves (every tower-agent layer does).
pub trait ToolLayer:
    Layer<
        BoxTools,
        Service: Service<
            ToolRequest,
            Response = ToolResponse,
            Error: Into<BoxError>,
            Future: Send + 'static,
        > + DescribeTools
                     + Clone
                     + Send
                     + Sync
                     + 'static,
    > + Send
    + Sync
    + 'static
{
}

impl<L> ToolLayer for L
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
}

/// A built-in: a value that takes its slots on the agent's stacks.
///
/// Each built-in implements it next to its own code; the agent's builder calls
/// [`place`](Builtin::place) and builds the stacks in the slots' order.
///
/// ```
/// use tower_agent_core::around_model;
/// use tower_agent_loop::{Builtin, ModelSlot, Stacks};
///
/// /// Logs each model call's message count, where the host's model layers go.
/// #[derive(Clone)]
/// struct CountMessages;
///
/// impl Builtin for CountMessages {
///     fn place(self, stacks: &mut Stacks) {
///         stacks.model(ModelSlot::Host, around_model(|req, mut next| async move {
///             println!("{} messages", req.messages.len());
///             next.run(req).await
///         }));
///     }
/// }
///
/// let mut stacks = Stacks::default();
/// CountMessages.place(&mut stacks);
/// assert_eq!(stacks.order()[1].1, ["model_layer", "provider"]);
/// ```
pub trait Builtin {
    /// Take this built-in's slots on `stacks`.
    fn place(self, stacks: &mut Stacks);
}

type Wrap<S> = Arc<dyn Fn(S) -> S + Send + Sync>;

/// A model layer that wraps other models in the slots inside its own (the fallback's chain).
type ModelWrap = Arc<dyn Fn(BoxModel, &Inside<'_>) -> BoxModel + Send + Sync>;

/// The built-ins and host layers of an agent, by slot. Within one slot, the layer placed first
/// is the outermost.
#[derive(Clone, Default)]
pub struct Stacks {
    agent: Vec<(AgentSlot, Wrap<BoxAgent>)>,
    model: Vec<(ModelSlot, ModelWrap)>,
    tools: Vec<(ToolSlot, Wrap<BoxTools>)>,
}

impl fmt::Debug for Stacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stacks")
            .field("order", &self.order())
            .finish()
    }
}

/// The model slots inside one slot, to wrap other models in (see [`Stacks::model_with`]).
pub struct Inside<'a> {
    layers: &'a [(ModelSlot, ModelWrap)],
    slot: ModelSlot,
}

impl Inside<'_> {
    /// `model` inside every layer placed in the slots inside this one.
    pub fn wrap(&self, model: BoxModel) -> BoxModel {
        let inner: Vec<_> = self
            .layers
            .iter()
            .filter(|(slot, _)| *slot > self.slot)
            .cloned()
            .collect();
        wrap_model(&inner, model)
    }
}

impl fmt::Debug for Inside<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inside").field("slot", &self.slot).finish()
    }
}

impl Stacks {
    /// `layer` in `slot` of the agent service.
    pub fn agent(&mut self, slot: AgentSlot, layer: impl AgentLayer) {
        self.agent.push((
            slot,
            Arc::new(move |inner| BoxCloneService::new(layer.layer(inner).map_err(into_error))),
        ));
    }

    /// `layer` in `slot` of the model service.
    pub fn model(&mut self, slot: ModelSlot, layer: impl ModelLayer) {
        self.model.push((
            slot,
            Arc::new(move |inner, _: &Inside<'_>| {
                BoxCloneService::new(layer.layer(inner).map_err(into_error))
            }),
        ));
    }

    /// A model layer in `slot` made at build time, given the slots inside it to wrap other
    /// models in: the fallback gives each model of its chain the retry and the provider layers.
    pub fn model_with<F, L>(&mut self, slot: ModelSlot, make: F)
    where
        F: Fn(&Inside<'_>) -> L + Send + Sync + 'static,
        L: ModelLayer,
    {
        self.model.push((
            slot,
            Arc::new(move |inner, inside: &Inside<'_>| {
                BoxCloneService::new(make(inside).layer(inner).map_err(into_error))
            }),
        ));
    }

    /// `layer` in `slot` of the tool service.
    pub fn tools(&mut self, slot: ToolSlot, layer: impl ToolLayer) {
        self.tools.push((
            slot,
            Arc::new(move |inner| BoxTools::new(layer.layer(inner))),
        ));
    }

    /// The order the stacks are built in, outside in, by the names of the slots in use: for
    /// the agent, the model and the tools.
    pub fn order(&self) -> [(&'static str, Vec<&'static str>); 3] {
        fn names<S: Copy + Ord, W>(
            placed: &[(S, W)],
            name: fn(S) -> &'static str,
            innermost: &'static str,
        ) -> Vec<&'static str> {
            let mut slots: Vec<S> = placed.iter().map(|(slot, _)| *slot).collect();
            slots.sort();
            slots.dedup();
            slots.into_iter().map(name).chain([innermost]).collect()
        }
        [
            (
                "agent",
                names(&self.agent, AgentSlot::name, AgentSlot::INNERMOST),
            ),
            (
                "model",
                names(&self.model, ModelSlot::name, ModelSlot::INNERMOST),
            ),
            (
                "tools",
                names(&self.tools, ToolSlot::name, ToolSlot::INNERMOST),
            ),
        ]
    }

    /// `agent` inside every agent layer, in the slots' order.
    pub fn wrap_agent(&self, agent: BoxAgent) -> BoxAgent {
        sorted(&self.agent)
            .into_iter()
            .rev()
            .fold(agent, |service, (_, wrap)| wrap(service))
    }

    /// `model` inside every model layer, in the slots' order, with a probe above the stack
    /// and below each slot's layers: when the prompt cache's prefix moves between two model
    /// calls of an observed run, the probe at the provider says which place moved it
    /// ([`PrefixMoved`](crate::PrefixMoved)).
    pub fn wrap_model(&self, model: BoxModel) -> BoxModel {
        let layers = sorted(&self.model);
        let probes = crate::probe::Probes::new();
        let innermost = layers.last().map(|(slot, _)| *slot);
        let mut service = model;
        for (index, (slot, wrap)) in layers.iter().enumerate().rev() {
            // Below the last layer of each slot: where that slot's work shows.
            if layers.get(index + 1).is_none_or(|(next, _)| next != slot) {
                service = probes.probe(service, slot.name(), Some(*slot) == innermost);
            }
            let inside = Inside {
                layers: &layers,
                slot: *slot,
            };
            service = wrap(service, &inside);
        }
        probes.probe(service, "session", innermost.is_none())
    }

    /// `tools` inside every tool layer, in the slots' order.
    pub fn wrap_tools(&self, tools: BoxTools) -> BoxTools {
        sorted(&self.tools)
            .into_iter()
            .rev()
            .fold(tools, |service, (_, wrap)| wrap(service))
    }
}

/// The layers in slot order; within a slot, in the order they were placed (a stable sort).
fn sorted<S: Copy + Ord, W: Clone>(placed: &[(S, W)]) -> Vec<(S, W)> {
    let mut placed = placed.to_vec();
    placed.sort_by_key(|(slot, _)| *slot);
    placed
}

/// `model` inside `layers` (sorted, outside in).
fn wrap_model(layers: &[(ModelSlot, ModelWrap)], model: BoxModel) -> BoxModel {
    let layers = sorted(layers);
    layers.iter().rev().fold(model, |service, (slot, wrap)| {
        let inside = Inside {
            layers: &layers,
            slot: *slot,
        };
        wrap(service, &inside)
    })
}

fn into_error(error: impl Into<BoxError>) -> Error {
    Error::from_boxed(error.into())
}
