//! One run's state: what the round state machine (`rounds`), the tool rounds (`tools`) and
//! the start of a run (`resume`) work on. Data only, at the bottom of the agent's modules.

use std::sync::Arc;

use tower_agent_core::{
    CallKey, Deltas, HistoryMark, Interrupt, RunContext, Session, Steering, Usage,
};

use super::builder::AgentConfig;
use super::key::CallKeys;
use super::saving::Saving;

/// One run's state.
pub(super) struct Run<M, T> {
    pub(super) model: M,
    pub(super) tools: T,
    pub(super) config: Arc<AgentConfig>,
    pub(super) session: Session,
    pub(super) ctx: RunContext,
    pub(super) usage: Usage,
    pub(super) rounds: u32,
    /// Every call id of the session (8 bytes each): new calls get unique ones.
    pub(super) call_ids: tower_agent_core::CallIds,
    /// Where this run's work starts in the history, for the progress of a stopped or
    /// cancelled run.
    pub(super) start: usize,
    /// Where the run saves, and the saves its tool calls ask for.
    pub(super) saving: Saving,
    /// The session before the run's new messages, until the first model call: a run whose
    /// first model call a layer refuses (a guardrail on the input, a limit, a budget) leaves
    /// the session as it found it. Boxed: the run's future carries it for the whole run, and
    /// it is there only until the first answer.
    pub(super) before_input: Option<Box<BeforeInput>>,
    /// The way up for the model's deltas, in every round: settled after each call.
    pub(super) deltas: Deltas,
    /// The keys of the run's calls.
    pub(super) keys: CallKeys,
    /// While the run recovers calls an earlier run started and did not finish: their keys
    /// (the session's write-ahead record as the run found it). Their requests say so
    /// ([`ToolRequest::recover`](tower_agent_core::ToolRequest::recover)).
    pub(super) recovering: Vec<CallKey>,
    /// The messages the host sends while the run runs, when its request takes them
    /// ([`AgentRequest::with_steering`](tower_agent_core::AgentRequest::with_steering)).
    pub(super) steering: Option<Steering>,
}

/// Where the history stood before a run's new messages, how many user messages the input
/// was (0 when it held others), and the interrupts the session waited on then.
pub(super) struct BeforeInput {
    pub(super) mark: HistoryMark,
    pub(super) users: usize,
    pub(super) interrupts: Vec<Interrupt>,
}
