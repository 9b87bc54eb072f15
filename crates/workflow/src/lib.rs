//! Workflows over agent services: [`Sequential`] runs agents one after the other, [`Loop`]
//! runs an agent (a `Sequential` of a coder and a reviewer, say) iteration after iteration
//! until a [`Judge`] says stop. Each is a `tower::Service<AgentRequest>`, so it takes the
//! same `before_agent` / `after_agent` / `around_agent` layers as a plain agent, and nests.
//!
//! A workflow keeps its position (the step, the iteration) in the session's state, under
//! `tower_agent.workflow` and its path: a run that a human approval deep inside paused is
//! resumed from the saved session alone, at the step and iteration it stopped at.
//!
//! Each nested agent runs with a context of its own ([`RunContext::nested`]): its events
//! reach the outer run's observers and stream as [`Event::Nested`], tagged with its path
//! (`coding_loop/2/reviewer`), between the workflow's own events ([`events`], as
//! [`Event::Layer`]) [`AgentStarted`](events::AgentStarted) and
//! [`AgentEnded`](events::AgentEnded) / [`AgentFailed`](events::AgentFailed); a loop adds
//! [`IterationStarted`](events::IterationStarted) and [`IterationEnded`](events::IterationEnded).
//! [`WorkflowObserver`] turns them into hooks.
//!
//! [`RunContext::nested`]: tower_agent_core::RunContext::nested
//! [`Event::Nested`]: tower_agent_core::Event::Nested
//! [`Event::Layer`]: tower_agent_core::Event::Layer

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod common;
pub mod events;
mod judge;
mod looping;
mod observer;
pub mod progress;
pub mod rules;
mod sequential;
mod subagent;

pub use common::STATE_KEY;
pub use judge::{
    JUDGE_PROMPT, Judge, JudgeFn, JudgeRequest, Judged, ModelJudge, Verdict, judge_fn,
};
pub use looping::Loop;
pub use observer::{WorkflowObserver, WorkflowObserverAdapter, workflow_observer};
pub use sequential::{Mode, Sequential};
pub use subagent::{AgentTool, SUBAGENT_STATE_KEY};

/// The response futures of the workflows.
pub mod future {
    pub use crate::common::WorkflowFuture;
    pub use crate::progress::ResponseFuture as ProgressFuture;
}
