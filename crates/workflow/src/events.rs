//! The workflows' own events, carried as [`Event::Layer`](tower_agent_core::Event::Layer):
//! read one with [`Event::downcast_ref`](tower_agent_core::Event::downcast_ref) (through
//! [`Event::origin`](tower_agent_core::Event::origin) for a nested agent's). Each one's
//! `Display` is its line in the progress digest.

use std::fmt;
use std::sync::Arc;

use tower_agent_core::{Error, LayerEvent, Outcome};

/// A nested agent (a step of a workflow) is about to run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentStarted {
    /// The agent's path.
    pub path: Arc<str>,
}

/// A nested agent's run ended normally.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentEnded {
    /// The agent's path.
    pub path: Arc<str>,
    /// How its run ended.
    pub outcome: Outcome,
}

/// A nested agent's run failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentFailed {
    /// The agent's path.
    pub path: Arc<str>,
    /// The error it failed with.
    pub error: Error,
}

/// An iteration of a loop workflow is about to run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IterationStarted {
    /// The loop's path.
    pub path: Arc<str>,
    /// The iteration, from 1.
    pub iteration: u32,
}

/// An iteration of a loop workflow ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IterationEnded {
    /// The loop's path.
    pub path: Arc<str>,
    /// The iteration, from 1.
    pub iteration: u32,
    /// Whether the loop goes on.
    pub next: bool,
    /// Why (the judge's reason, or the limit).
    pub reason: String,
}

/// A one-line summary of the run's progress so far, for a UI (the progress layer).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProgressSummary {
    /// The summary.
    pub summary: String,
}

impl LayerEvent for AgentStarted {
    const NAME: &'static str = "agent_started";
}

impl LayerEvent for AgentEnded {
    const NAME: &'static str = "agent_ended";
}

impl LayerEvent for AgentFailed {
    const NAME: &'static str = "agent_failed";
}

impl LayerEvent for IterationStarted {
    const NAME: &'static str = "iteration_started";
}

impl LayerEvent for IterationEnded {
    const NAME: &'static str = "iteration_ended";
}

impl LayerEvent for ProgressSummary {
    const NAME: &'static str = "progress_summary";
}

impl fmt::Display for AgentStarted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent `{}` started", self.path)
    }
}

impl fmt::Display for AgentEnded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent `{}` ended", self.path)
    }
}

impl fmt::Display for AgentFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent `{}` failed: {}", self.path, self.error)
    }
}

impl fmt::Display for IterationStarted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` iteration {} started", self.path, self.iteration)
    }
}

impl fmt::Display for IterationEnded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` iteration {} ended: {}",
            self.path, self.iteration, self.reason
        )
    }
}

impl fmt::Display for ProgressSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)
    }
}
