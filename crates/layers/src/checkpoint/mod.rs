//! The checkpoint (`before_tool`): after every N tool calls of a run (20 by
//! default), ask whether to go on.
//!
//! "Yes" gives N more calls (so it asks again at 40, 60...). "No", no answer
//! within the timeout (15 minutes by default) or a failing checkpoint stops the run before
//! the call that would have gone over: the call gets a "not executed" result and the run ends
//! [`Outcome::Stopped`] with [`StopReason::Checkpoint`] and a [`Progress`] of what was done,
//! which shows as `query_todoist ✓ → create_todoist_task ✓ → set_memory_block ✗`
//! ([`Outcome::summary`] makes the sentence).
//!
//! The question is answered either
//!
//! - **inline**, by a [`Human`] (a prompt, a message to the user's chat) while the run
//!   waits; concurrent calls of one round wait for one answer, never ask twice; or
//! - **by interrupting** the run at the call that would go over: the interrupt's payload is a
//!   [`CheckpointRequest`], and it allows [`DecisionKind::Approve`] (go on) and
//!   [`DecisionKind::Reject`] (stop). The host asks the human between processes and resumes
//!   with [`AgentInput::Resume`](tower_agent_core::AgentInput::Resume).
//!
//! The allowance counts the calls of one run (a resumed run starts a fresh one); a call that
//! resumes after another layer's interrupt is not counted again. Put the checkpoint outside
//! the approval layer, so a call it stopped is never shown to a human for approval.
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, ModelResponse, Outcome, RunContext, Session, ToolCall};
//! use tower_agent_layers::checkpoint::{human_fn, CheckpointLayer, CheckpointRequest};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! // Go on once (at 2 calls), stop the second time (at 4).
//! let checkpoint = CheckpointLayer::inline(human_fn(|ask: CheckpointRequest, _: RunContext| async move {
//!     Ok(ask.progress.len() < 4)
//! }))
//! .every(2);
//! let model = ScriptedModel::from_fn(|req| {
//!     let n = req.ctx.round();
//!     Ok(ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "step", json!({}))]))
//! });
//! let tools = ServiceBuilder::new().layer(checkpoint).service(ToolSet::new().tool(StubTool::returning("step", "ok")));
//! let res = Agent::new(model, tools).oneshot(AgentRequest::new(Session::new(), "work")).await?;
//! assert_eq!(
//!     res.outcome.summary().as_deref(),
//!     Some("Stopped: the checkpoint after 2 tool calls said stop (declined). Done: step ✓ → step ✓ → step ✓ → step ✓ → step ✗")
//! );
//! # Ok(())
//! # }
//! ```
//!
//! [`Outcome::Stopped`]: tower_agent_core::Outcome::Stopped
//! [`Outcome::summary`]: tower_agent_core::Outcome::summary
//! [`DecisionKind::Approve`]: tower_agent_core::DecisionKind::Approve
//! [`DecisionKind::Reject`]: tower_agent_core::DecisionKind::Reject
//! [`StopReason::Checkpoint`]: tower_agent_core::StopReason::Checkpoint

mod allowance;
mod future;
mod service;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_agent_core::{ExtensionKey, Interrupt, Progress, StateKey};
use tower_layer::Layer;

pub use crate::ask::{DEFAULT_TIMEOUT, Human, HumanFn, human_fn};
pub use future::ResponseFuture;

/// The default allowance: 20 tool calls.
pub const DEFAULT_EVERY: u32 = 20;
/// The key, in the session's JSON state, of the calls waiting at a checkpoint.
pub const STATE_KEY: StateKey<Waiting> = StateKey::new("tower_agent.checkpoint");

/// The calls that wait at the checkpoint for the host's answer, in the session's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// Their call ids.
    #[serde(default)]
    pub waiting: Vec<String>,
}

/// What the checkpoint is asked: how many calls were made since the allowance was last given,
/// what they were, and which call waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Tool calls made since the allowance was last given.
    pub calls: u32,
    /// The run's tool calls so far.
    pub progress: Progress,
    /// The tool of the call that waits.
    pub next: String,
}

impl CheckpointRequest {
    /// The checkpoint an interrupt carries, if it is one.
    pub fn from_interrupt(interrupt: &Interrupt) -> Option<Self> {
        let payload = interrupt.payload.get("checkpoint")?;
        CheckpointRequest::deserialize(payload).ok()
    }
}

#[derive(Clone)]
enum Mode {
    Interrupt,
    Inline(Arc<dyn Human<CheckpointRequest, bool>>),
}

#[derive(Clone)]
struct Config {
    every: u32,
    timeout: Duration,
    mode: Mode,
    /// Where this layer keeps the run's allowance in the run's extensions.
    allowance: ExtensionKey<allowance::Allowance>,
}

/// The checkpoint; see the [module docs](self).
#[derive(Clone)]
pub struct CheckpointLayer {
    config: Arc<Config>,
}

impl CheckpointLayer {
    /// Ask `checkpoint` while the run waits.
    pub fn inline(checkpoint: impl Human<CheckpointRequest, bool>) -> Self {
        Self::with_mode(Mode::Inline(Arc::new(checkpoint)))
    }

    /// Interrupt the run at the checkpoint; resume with approve (go on) or reject (stop).
    pub fn interrupting() -> Self {
        Self::with_mode(Mode::Interrupt)
    }

    fn with_mode(mode: Mode) -> Self {
        Self {
            config: Arc::new(Config {
                every: DEFAULT_EVERY,
                timeout: DEFAULT_TIMEOUT,
                mode,
                allowance: ExtensionKey::new(),
            }),
        }
    }

    /// Ask after every `n` tool calls ([`DEFAULT_EVERY`]); at least 1.
    pub fn every(mut self, n: u32) -> Self {
        Arc::make_mut(&mut self.config).every = n.max(1);
        self
    }

    /// How long an inline checkpoint may take to answer ([`DEFAULT_TIMEOUT`]); then the run
    /// stops.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).timeout = timeout;
        self
    }
}

impl fmt::Debug for CheckpointLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointLayer")
            .field("every", &self.config.every)
            .field("timeout", &self.config.timeout)
            .field(
                "mode",
                &match self.config.mode {
                    Mode::Interrupt => "interrupt",
                    Mode::Inline(_) => "inline",
                },
            )
            .finish()
    }
}

impl<S> Layer<S> for CheckpointLayer {
    type Service = Checkpoint<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Checkpoint {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`CheckpointLayer`] makes.
#[derive(Clone)]
pub struct Checkpoint<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Checkpoint<S> {
    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for Checkpoint<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The checkpoint on the tools, inside the limits, outside approval.
impl tower_agent_loop::Builtin for CheckpointLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ToolSlot;
        stacks.tools(ToolSlot::Checkpoint, self);
    }
}
