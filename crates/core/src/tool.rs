//! The tool service's request and response.

use serde_json::Value;

use crate::context::RunContext;
use crate::decision::DecisionKind;
use crate::message::{ToolCall, ToolResult};
pub use crate::session::Interrupt;

/// What the tool service receives: one call, and the run context.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The call to execute.
    pub call: ToolCall,
    /// The run this call belongs to.
    pub ctx: RunContext,
    /// When this call was interrupted and the run is being resumed, the value the host
    /// resumed it with (for example a human's decision). `None` on a first execution.
    pub resume: Option<Value>,
}

impl ToolRequest {
    /// A first execution of `call` in `ctx`.
    pub fn new(call: ToolCall, ctx: RunContext) -> Self {
        Self {
            call,
            ctx,
            resume: None,
        }
    }
}

impl AsRef<RunContext> for ToolRequest {
    fn as_ref(&self) -> &RunContext {
        &self.ctx
    }
}

/// What the agent does after a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ToolAction {
    /// Go on: append the result, call the model again.
    #[default]
    Continue,
    /// Append the result, then stop the loop: the run ends with
    /// [`Outcome::Stopped`](crate::Outcome::Stopped). Later calls of the same round are not
    /// executed (in sequential mode) and get a "not executed" result.
    Stop {
        /// Why, for the host.
        reason: String,
    },
    /// Pause the run at this call: no result is appended; the run ends with
    /// [`Outcome::Interrupted`](crate::Outcome::Interrupted) once the round's other calls ran.
    /// Boxed: a pause is rare, and a small response moves cheaply through every layer.
    Interrupt(Box<Pause>),
}

/// What a paused call waits for: the payload for the host and the decisions it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// What the host needs to decide.
    pub payload: Value,
    /// The decisions the call takes on resume; empty: any value ([`Interrupt::allowed`]).
    pub allowed: Vec<DecisionKind>,
}

/// What the tool service returns: the result the model sees, and what the loop does next.
///
/// Equality ignores whether an after callback replaced the response.
#[derive(Debug, Clone)]
pub struct ToolResponse {
    /// The result. Ignored when `action` is [`ToolAction::Interrupt`].
    pub result: ToolResult,
    /// What the loop does next.
    pub action: ToolAction,
    pub(crate) replaced: bool,
}

impl ToolResponse {
    /// A response carrying `result`, letting the loop go on.
    pub fn new(result: ToolResult) -> Self {
        Self {
            result,
            action: ToolAction::Continue,
            replaced: false,
        }
    }

    /// A successful result for `call`.
    pub fn success(call: &ToolCall, content: impl Into<String>) -> Self {
        Self::new(ToolResult::success(call, content))
    }

    /// A failed result for `call`, which the model sees.
    pub fn error(call: &ToolCall, content: impl Into<String>) -> Self {
        Self::new(ToolResult::error(call, content))
    }

    /// Pause the run at `call` with `payload` for the host; it resumes with any value.
    pub fn interrupt(call: &ToolCall, payload: Value) -> Self {
        Self::review(call, payload, [])
    }

    /// Pause the run at `call` for a review that takes only the `allowed` decisions.
    pub fn review(
        call: &ToolCall,
        payload: Value,
        allowed: impl IntoIterator<Item = DecisionKind>,
    ) -> Self {
        Self::new(ToolResult::error(
            call,
            "interrupted: waiting for a decision",
        ))
        .with_action(ToolAction::Interrupt(Box::new(Pause {
            payload,
            allowed: allowed.into_iter().collect(),
        })))
    }

    /// Set the action.
    pub fn with_action(mut self, action: ToolAction) -> Self {
        self.action = action;
        self
    }
}

impl PartialEq for ToolResponse {
    fn eq(&self, other: &Self) -> bool {
        self.result == other.result && self.action == other.action
    }
}
