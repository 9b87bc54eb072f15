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
    /// Calls whose tools may repeat ([`ToolSpec::may_repeat`]: read-only or idempotent) up to
    /// `limit` at once; every other call alone, in call order (a payment before the refund
    /// that follows it), beside the reads. The hints decide what may overlap.
    ConcurrentReads {
        /// The most calls running at once (at least 1).
        limit: usize,
    },
}

/// What the agent does with a model answer cut off at its length limit
/// ([`FinishReason::Length`](tower_agent_core::FinishReason::Length): OpenAI's `length`,
/// Anthropic's `max_tokens`, Gemini's `MAX_TOKENS`).
///
/// Whatever the setting, a cut answer is never acted on as complete: its tool calls are not
/// run (nor shown for approval; their arguments may be incomplete), and observers get
/// [`Event::Truncated`](tower_agent_core::Event::Truncated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Truncation {
    /// The run stops: the cut answer stays as the last message (its text is what the model
    /// wrote), each of its calls is answered
    /// [`ToolResult::TRUNCATED`](tower_agent_core::ToolResult::TRUNCATED), and the outcome is
    /// [`StopReason::Truncated`](tower_agent_core::StopReason::Truncated).
    ///
    /// The default: nothing incomplete runs, nothing fails (the session stays valid, and a
    /// next run goes on from it), and the host sees why in the outcome. Failing would throw
    /// away an answer that may be useful; going on would spend another call the host did not
    /// ask for.
    #[default]
    Stop,
    /// The run fails with [`ErrorKind::Truncated`](tower_agent_core::ErrorKind::Truncated);
    /// its session (as `Stop` leaves it) comes with the error.
    Fail,
    /// The run goes on: the cut answer stays, its calls are answered as `Stop` does, and the
    /// model is called again with it (it continues its answer, or makes its calls again).
    /// Counts as a round.
    Continue,
    /// The cut answer is dropped and the same request is sent once more with this
    /// `max_tokens`; cut again, the run stops as with `Stop`.
    AskAgain {
        /// The room the second request asks for.
        max_tokens: u32,
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
    /// The generation options of every model call (each request shares them).
    pub options: Arc<GenerationOptions>,
    /// Start calls to read-only tools while the model still streams
    /// ([`AgentBuilder::early_tool_start`]).
    pub early_tool_start: bool,
    /// What a model answer cut off at its length limit does ([`Truncation`]).
    pub truncation: Truncation,
    /// The agent's name, for telemetry (`gen_ai.agent.name`); `None`: the name of the
    /// workflow step or sub-agent that runs it, if any.
    pub name: Option<Arc<str>>,
    /// A call that repeats an earlier call of the same message (same tool, same arguments)
    /// is not run: the earlier one's result answers it ([`AgentBuilder::dedupe_calls`]).
    pub dedupe_calls: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_rounds: AgentBuilder::DEFAULT_MAX_ROUNDS,
            tool_execution: ToolExecution::Sequential,
            tool_specs: None,
            system: None,
            options: Arc::default(),
            early_tool_start: false,
            truncation: Truncation::Stop,
            name: None,
            dedupe_calls: false,
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

    /// The agent's name: its `invoke_agent {name}` span carries it as `gen_ai.agent.name`.
    /// Without one, an agent a workflow runs as a step (or a sub-agent) is named after the
    /// step.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
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

    /// Run the read-only and idempotent calls of a round up to `limit` at once, and every
    /// other call alone, in call order, beside them ([`ToolExecution::ConcurrentReads`]); 0
    /// counts as 1.
    pub fn concurrent_reads(mut self, limit: usize) -> Self {
        self.config.tool_execution = ToolExecution::ConcurrentReads {
            limit: limit.max(1),
        };
        self
    }

    /// Run a call that repeats an earlier call of the same message (same tool, same arguments,
    /// compared as JSON) only once: the repeat is answered with the earlier call's result and
    /// never reaches the tools. Off by default: a model may mean two of the same (two
    /// identical orders).
    pub fn dedupe_calls(mut self, dedupe: bool) -> Self {
        self.config.dedupe_calls = dedupe;
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
        self.config.options = Arc::new(options);
        self
    }

    /// Start a call to a read-only tool ([`ToolSpec::read_only`]) as soon as the model's
    /// stream closes it, while the model still streams the rest. The round keeps the early
    /// result when the model's message has the same call (id, name and arguments); otherwise,
    /// and when the stream breaks, is retried or falls back, the early run is aborted and the
    /// call runs as usual. Off by default.
    ///
    /// The early run goes through the whole tool stack, but starts before the message is
    /// saved and before the round's `ToolStarted` event (which still comes, in call order,
    /// when the round adopts it): keep it to tools that only read. It needs a provider that
    /// streams calls ([`Delta::ToolCall`](tower_agent_core::stream::Delta::ToolCall)); every
    /// provider of `tower-agent-providers` does.
    pub fn early_tool_start(mut self, early: bool) -> Self {
        self.config.early_tool_start = early;
        self
    }

    /// What a model answer cut off at its length limit does (default [`Truncation::Stop`]).
    pub fn when_truncated(mut self, truncation: Truncation) -> Self {
        self.config.truncation = truncation;
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
