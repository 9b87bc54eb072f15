//! The agent's configuration and builder.

use std::sync::Arc;

use tower_agent_core::{DescribeTools, GenerationOptions, ToolSpec};

use super::Agent;

/// How the tool calls of one round run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolExecution {
    /// One after the other, in call order. A tool response that stops the loop skips the
    /// calls after it (they get a "not executed" result).
    #[default]
    Sequential,
    /// Up to `limit` at once. Results are still appended in call order; every call of the
    /// round runs, even when one of them stops the loop.
    Concurrent {
        /// The most calls running at once (at least 1).
        limit: usize,
    },
}

/// The loop's configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The most model calls in one run (at least 1).
    pub max_rounds: u32,
    /// How tool calls run.
    pub tool_execution: ToolExecution,
    /// The tools offered to the model instead of those the tool service reports
    /// ([`DescribeTools`]); `None`: those.
    pub tool_specs: Option<Arc<[ToolSpec]>>,
    /// The system instructions of every model call.
    pub system: Option<Arc<str>>,
    /// The generation options of every model call.
    pub options: GenerationOptions,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_rounds: AgentBuilder::DEFAULT_MAX_ROUNDS,
            tool_execution: ToolExecution::Sequential,
            tool_specs: None,
            system: None,
            options: GenerationOptions::default(),
        }
    }
}

/// Builds an [`Agent`].
#[derive(Debug, Clone, Default)]
pub struct AgentBuilder {
    config: AgentConfig,
}

impl AgentBuilder {
    /// The default for [`AgentBuilder::max_rounds`].
    pub const DEFAULT_MAX_ROUNDS: u32 = 32;

    /// A builder with the defaults: 32 rounds, sequential tools, the tools the tool service
    /// reports, no system prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// The system instructions of every model call.
    pub fn system(mut self, system: impl Into<Arc<str>>) -> Self {
        self.config.system = Some(system.into());
        self
    }

    /// The most model calls in one run; 0 counts as 1. When the model still asks for tools
    /// after that many calls, the run ends with [`StopReason::MaxRounds`](tower_agent_core::StopReason::MaxRounds).
    pub fn max_rounds(mut self, max_rounds: u32) -> Self {
        self.config.max_rounds = max_rounds.max(1);
        self
    }

    /// Run the tool calls of a round one after the other (the default).
    pub fn sequential_tools(mut self) -> Self {
        self.config.tool_execution = ToolExecution::Sequential;
        self
    }

    /// Run up to `limit` tool calls of a round at once; 0 counts as 1.
    pub fn concurrent_tools(mut self, limit: usize) -> Self {
        self.config.tool_execution = ToolExecution::Concurrent {
            limit: limit.max(1),
        };
        self
    }

    /// Offer the model these tools instead of those the tool service reports (a subset, say,
    /// or none).
    pub fn tool_specs(mut self, specs: impl Into<Arc<[ToolSpec]>>) -> Self {
        self.config.tool_specs = Some(specs.into());
        self
    }

    /// The generation options of every model call.
    pub fn options(mut self, options: GenerationOptions) -> Self {
        self.config.options = options;
        self
    }

    /// The agent driving `model` and `tools`. The model is offered the tools `tools` reports
    /// ([`DescribeTools`]) unless [`AgentBuilder::tool_specs`] says otherwise.
    pub fn build<M, T: DescribeTools>(self, model: M, tools: T) -> Agent<M, T> {
        Agent {
            model,
            tools,
            config: Arc::new(self.config),
        }
    }
}
