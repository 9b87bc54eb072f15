//! Plain data of a session, at the bottom of the crate: the session itself, pending
//! interrupts, how a run ended, token usage and ids. Nothing here knows about services.

use std::fmt;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cost::Cost;
pub use crate::decision::Interrupt;
use crate::history::{History, Repair};
use crate::message::{CallKey, ContentPart, Message, Role, ToolCall, ToolResult};

/// A conversation that outlives a run: history, JSON state and pending interrupts.
///
/// Serializes with serde, so a host saves it after a run and resumes it later, in another
/// process:
///
/// ```
/// use tower_agent_core::{Message, Session};
///
/// let mut session = Session::new();
/// session.history.push(Message::user("hello"));
/// session.state.insert("lang".into(), "fr".into());
/// let saved = serde_json::to_string(&session).unwrap();
/// let restored: Session = serde_json::from_str(&saved).unwrap();
/// assert_eq!(restored, session);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// The session's id.
    pub id: String,
    /// The messages so far.
    #[serde(default)]
    pub history: History,
    /// Durable state written by layers and tools (see [`RunContext::set_state`](crate::RunContext::set_state)).
    #[serde(default)]
    pub state: Map<String, Value>,
    /// Calls waiting for a decision, when the last run was interrupted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupts: Vec<Interrupt>,
    /// The write-ahead record: the keys ([`ToolCall::key`]) of calls that were handed to
    /// their tool and have no result yet. The loop saves a call's key here before a call that
    /// may not repeat ([`ToolSpec::may_repeat`](crate::ToolSpec::may_repeat)) runs, and drops
    /// it with the result it saves. A key still here when a run starts is a call whose process
    /// died while it ran: it may have taken effect, so it is recovered
    /// ([`ToolRequest::recover`](crate::ToolRequest::recover)), never run again blindly nor
    /// reported as not done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started: Vec<CallKey>,
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// An empty session with a fresh id.
    pub fn new() -> Self {
        Self::with_id(new_id())
    }

    /// An empty session with `id`.
    pub fn with_id(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            history: History::new(),
            state: Map::new(),
            interrupts: Vec::new(),
            started: Vec::new(),
        }
    }

    /// A session starting from `history`.
    pub fn with_history(mut self, history: impl Into<History>) -> Self {
        self.history = history.into();
        self
    }

    /// Append new input: first, calls that waited for a decision get a
    /// [`ToolResult::NOT_DECIDED`] result (the user moved on) and calls a previous run left
    /// without a result get a [`ToolResult::UNANSWERED`] one, each right after its call; the
    /// pending interrupts are cleared; then `messages` are appended.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{Interrupt, Message, Session, ToolCall, ToolResult};
    ///
    /// let call = ToolCall::new("c1", "rm", json!({}));
    /// let mut session = Session::new()
    ///     .with_history(vec![Message::user("clean up"), Message::assistant_with_calls("", [call.clone()])]);
    /// session.interrupts.push(Interrupt::new(call, json!("approve?")));
    /// session.push_input([Message::user("no, stop")]);
    /// assert_eq!(session.history[2].tool_results().next().unwrap().content, ToolResult::NOT_DECIDED);
    /// assert_eq!(session.history[3].text(), "no, stop");
    /// assert!(session.interrupts.is_empty());
    /// ```
    ///
    /// Only the last assistant message is repaired ([`Repair::last_message_only`]): a
    /// session the agent left can hold calls without results nowhere else.
    pub fn push_input(&mut self, messages: impl IntoIterator<Item = Message>) {
        let pending = std::mem::take(&mut self.interrupts);
        let started = std::mem::take(&mut self.started);
        let answer = |call: &ToolCall| {
            if pending.iter().any(|i| i.call.id == call.id) {
                ToolResult::error(call, ToolResult::NOT_DECIDED)
            } else {
                unanswered(call, &started)
            }
        };
        self.history
            .repair(&Repair::new().last_message_only().answer(&answer));
        self.history.extend(messages);
    }

    /// Give calls a previous run left without a result a [`ToolResult::unanswered`] one, right
    /// after its call; calls of pending interrupts keep waiting. Returns how many were
    /// answered.
    ///
    /// A call the write-ahead record says had started ([`Session::started`]) is answered
    /// [`ToolResult::OUTCOME_UNKNOWN`] (it may have taken effect), and the record is cleared:
    /// the loop recovers such calls first, through their tools, so that this only answers what
    /// nothing could say.
    pub fn answer_dangling_calls(&mut self) -> usize {
        let pending = &self.interrupts;
        let started = std::mem::take(&mut self.started);
        let wait = |call: &ToolCall| pending.iter().any(|i| i.call.id == call.id);
        let answer = |call: &ToolCall| unanswered(call, &started);
        let how = Repair::new()
            .last_message_only()
            .wait(&wait)
            .answer(&answer);
        self.history.repair(&how).answered
    }
}

/// The synthetic result of a call left without one: [`ToolResult::OUTCOME_UNKNOWN`] when the
/// write-ahead record says it had started, else [`ToolResult::unanswered`].
fn unanswered(call: &ToolCall, started: &[CallKey]) -> ToolResult {
    match call.key {
        Some(key) if started.contains(&key) => ToolResult::error(call, ToolResult::OUTCOME_UNKNOWN),
        _ => ToolResult::unanswered(call),
    }
}

/// Why the loop stopped before the model finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StopReason {
    /// The model was called `limit` times and still asked for tools.
    MaxRounds {
        /// The limit.
        limit: u32,
    },
    /// A tool response asked to stop.
    Tool {
        /// The call whose response stopped the loop.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The reason it gave.
        reason: String,
    },
    /// A call limit was reached (see the limit layers of `tower-agent-layers`).
    Limit {
        /// Which limit, in words (`"model calls per run"`, `"\`search\` calls per session"`).
        name: String,
        /// The number of calls it allows.
        limit: u32,
    },
    /// The checkpoint was answered "stop" (or not answered in time).
    Checkpoint {
        /// Tool calls made since the previous checkpoint.
        calls: u32,
        /// Why, in words (`"declined"`, `"no answer within 900 s"`).
        reason: String,
    },
    /// A layer stopped the run ([`ModelResponse::stop`](crate::ModelResponse::stop),
    /// [`ToolAction::Stop`](crate::ToolAction::Stop)).
    Layer {
        /// Why.
        reason: String,
    },
    /// A resume whose decisions were all applied before (delivered twice): nothing ran.
    Replayed,
    /// A loop workflow ran its last allowed iteration and its judge still asked for more.
    MaxIterations {
        /// The limit.
        limit: u32,
    },
    /// A loop workflow's judge could not decide (its verdict could not be read).
    Judge {
        /// Why, in words.
        reason: String,
    },
    /// A cost budget is spent (see the budget layer of `tower-agent-layers`): the call that
    /// would have passed it was not sent.
    Budget {
        /// Which budget, in words (`"run"`, `"session"`, `"tenant acme"`).
        scope: String,
        /// What it allows.
        limit: Cost,
        /// What was spent or reserved when the call asked for its worst case.
        spent: Cost,
        /// The worst case of the refused call.
        asked: Cost,
    },
    /// A guardrail tripped (see the guardrail layer of `tower-agent-layers`): on the input, the
    /// model's output or a tool result. Nothing it tripped on was appended.
    Guardrail {
        /// The guardrail's name.
        name: String,
        /// Why it tripped, as it said.
        reason: String,
    },
    /// The model's answer was cut off at its length limit
    /// ([`FinishReason::Length`](crate::FinishReason::Length)): its text is kept as the last
    /// message, its tool calls were not run (each is answered
    /// [`ToolResult::TRUNCATED`](crate::ToolResult::TRUNCATED)).
    Truncated {
        /// The request's `max_tokens`, when it set one.
        max_tokens: Option<u32>,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::MaxRounds { limit } => {
                write!(f, "the run reached its limit of {limit} rounds")
            }
            StopReason::Tool { name, reason, .. } => {
                write!(f, "`{name}` stopped the run: {reason}")
            }
            StopReason::Limit { name, limit } => {
                write!(f, "the limit of {limit} {name} was reached")
            }
            StopReason::Checkpoint { calls, reason } => {
                write!(
                    f,
                    "the checkpoint after {calls} tool calls said stop ({reason})"
                )
            }
            StopReason::Layer { reason } => f.write_str(reason),
            StopReason::Replayed => {
                f.write_str("these decisions were already applied; nothing ran")
            }
            StopReason::MaxIterations { limit } => {
                write!(f, "the loop reached its limit of {limit} iterations")
            }
            StopReason::Judge { reason } => write!(f, "the judge could not decide: {reason}"),
            StopReason::Budget {
                scope,
                limit,
                spent,
                asked,
            } => write!(
                f,
                "the {scope} budget of {limit} is spent: {spent} spent or reserved, and the next \
                 call could cost {asked}"
            ),
            StopReason::Guardrail { name, reason } => {
                write!(f, "the guardrail `{name}` tripped: {reason}")
            }
            StopReason::Truncated {
                max_tokens: Some(max),
            } => write!(
                f,
                "the model's answer was cut off at its limit of {max} tokens"
            ),
            StopReason::Truncated { max_tokens: None } => {
                f.write_str("the model's answer was cut off at its length limit")
            }
        }
    }
}

/// What a run did with tools: its calls in order, each with whether it succeeded. Shows as
/// `query_todoist ✓ → create_todoist_task ✓ → set_memory_block ✗`.
///
/// Each tool name is stored once, so recording a call allocates nothing after the first call
/// of a tool. Serializes as a list of `{"tool": .., "ok": ..}`.
///
/// ```
/// use tower_agent_core::Progress;
///
/// let mut progress = Progress::default();
/// progress.push("search", true);
/// progress.push("write_file", false);
/// assert_eq!(progress.to_string(), "search ✓ → write_file ✗");
/// assert_eq!(progress.len(), 2);
/// assert_eq!(progress.steps().filter(|s| s.ok).count(), 1);
/// assert_eq!(Progress::default().to_string(), "no tool calls");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    tools: Vec<String>,
    steps: Vec<(u32, bool)>,
}

/// One tool call of a [`Progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step<'a> {
    /// The tool.
    pub tool: &'a str,
    /// Whether its result is not an error.
    pub ok: bool,
}

impl Progress {
    /// Add a call.
    pub fn push(&mut self, tool: &str, ok: bool) {
        let index = match self.tools.iter().position(|t| t == tool) {
            Some(index) => index,
            None => {
                self.tools.push(tool.to_owned());
                self.tools.len() - 1
            }
        };
        self.steps
            .push((u32::try_from(index).unwrap_or(u32::MAX), ok));
    }

    /// The calls, in order.
    pub fn steps(&self) -> impl ExactSizeIterator<Item = Step<'_>> + '_ {
        self.steps.iter().map(|&(index, ok)| Step {
            tool: self.tools.get(index as usize).map_or("?", String::as_str),
            ok,
        })
    }

    /// The `index`-th call.
    pub fn get(&self, index: usize) -> Option<Step<'_>> {
        self.steps().nth(index)
    }

    /// How many calls.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether no call was made.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The tool calls answered in `messages`: one step per tool result of a tool message, in
    /// the order of the results (a history keeps them in call order), each with its tool and
    /// whether it succeeded. A call without a result is not a step.
    ///
    /// ```
    /// use tower_agent_core::{Message, Progress, ToolCall, ToolResult};
    ///
    /// let (a, b) = (ToolCall::raw("1", "search", "{}"), ToolCall::raw("2", "fetch", "{}"));
    /// let history = [
    ///     Message::user("go"),
    ///     Message::assistant_with_calls("", [a.clone(), b.clone()]),
    ///     Message::tool_result(ToolResult::success(&a, "found")),
    ///     Message::tool_result(ToolResult::error(&b, "timed out")),
    /// ];
    /// assert_eq!(Progress::of(&history).to_string(), "search ✓ → fetch ✗");
    /// assert!(Progress::of(&history[..2]).is_empty(), "calls without a result do not count");
    ///
    /// // A result without its tool's name (built by hand, imported) takes the call's.
    /// let mut nameless = ToolResult::success(&b, "fetched");
    /// nameless.name.clear();
    /// let retried = [history[1].clone(), Message::tool_result(nameless)];
    /// assert_eq!(Progress::of(&retried).to_string(), "fetch ✓");
    /// ```
    pub fn of(messages: &[Message]) -> Self {
        // The results alone: a result names its tool, so no call has to be looked up (a third
        // of the cost of matching each call to its result). Results are in tool messages (a
        // history with one elsewhere is invalid), one result for every call before it.
        let mut progress = Progress {
            tools: Vec::new(),
            steps: Vec::with_capacity((messages.len() / 2).min(64)),
        };
        for message in messages {
            if message.role != Role::Tool {
                continue;
            }
            for part in &message.content {
                if let ContentPart::ToolResult(result) = part {
                    let tool = if result.name.is_empty() {
                        // A result made without its tool's name: the call's.
                        call_name(messages, &result.call_id)
                    } else {
                        &result.name
                    };
                    progress.push(tool, !result.is_error);
                }
            }
        }
        progress
    }
}

/// The tool of the call `call_id` in `messages` (empty if it is not there).
fn call_name<'a>(messages: &'a [Message], call_id: &str) -> &'a str {
    messages
        .iter()
        .flat_map(Message::tool_calls)
        .find(|call| call.id == call_id)
        .map_or("", |call| call.name.as_str())
}

impl Serialize for Progress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.steps())
    }
}

impl<'de> Deserialize<'de> for Progress {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Owned {
            tool: String,
            ok: bool,
        }
        let steps = Vec::<Owned>::deserialize(deserializer)?;
        let mut progress = Progress::default();
        for step in steps {
            progress.push(&step.tool, step.ok);
        }
        Ok(progress)
    }
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.steps.is_empty() {
            return f.write_str("no tool calls");
        }
        for (index, step) in self.steps().enumerate() {
            if index > 0 {
                f.write_str(" → ")?;
            }
            write!(f, "{} {}", step.tool, if step.ok { '✓' } else { '✗' })?;
        }
        Ok(())
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// The model answered without asking for tools.
    Completed {
        /// Its final message.
        message: Message,
    },
    /// The loop was stopped by a limit, a checkpoint, a layer or a tool response. Every tool
    /// call in the history has a result.
    Stopped {
        /// Why.
        reason: StopReason,
        /// The run's tool calls.
        progress: Progress,
    },
    /// The run was cancelled. Every tool call in the history has a result.
    Cancelled {
        /// The run's tool calls, up to the cancellation.
        progress: Progress,
    },
    /// The run paused for the host: resume it with [`AgentInput::Resume`](crate::AgentInput::Resume).
    Interrupted {
        /// The calls waiting (also in [`Session::interrupts`]).
        interrupts: Vec<Interrupt>,
    },
}

impl Outcome {
    /// A one-line summary for a person when the run stopped or was cancelled:
    /// `Cancelled. Was working on: search ✓ → write_file ✗`.
    ///
    /// ```
    /// use tower_agent_core::{Outcome, Progress};
    ///
    /// let mut progress = Progress::default();
    /// progress.push("a", true);
    /// let outcome = Outcome::Cancelled { progress };
    /// assert_eq!(outcome.summary().as_deref(), Some("Cancelled. Was working on: a ✓"));
    /// ```
    pub fn summary(&self) -> Option<String> {
        match self {
            Outcome::Cancelled { progress } => {
                Some(format!("Cancelled. Was working on: {progress}"))
            }
            Outcome::Stopped { reason, progress } => {
                Some(format!("Stopped: {reason}. Done: {progress}"))
            }
            _ => None,
        }
    }

    /// The run's tool calls, when it stopped or was cancelled.
    pub fn progress(&self) -> Option<&Progress> {
        match self {
            Outcome::Cancelled { progress } | Outcome::Stopped { progress, .. } => Some(progress),
            _ => None,
        }
    }
}

/// Tokens used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (the cached ones included).
    pub input_tokens: u64,
    /// Completion tokens (reasoning included).
    pub output_tokens: u64,
    /// Of the prompt tokens, those the provider read from its prompt cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Of the prompt tokens, those the provider wrote to its prompt cache (Anthropic's
    /// `cache_creation_input_tokens`, billed above the prompt price); none for providers
    /// that cache without saying (OpenAI, Gemini).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_input_tokens: u64,
    /// What these tokens cost, when the provider or a layer priced them
    /// ([`ModelPrice`](crate::ModelPrice)); zero otherwise.
    #[serde(default, skip_serializing_if = "Cost::is_zero")]
    pub cost: Cost,
}

impl Usage {
    /// `input` prompt tokens and `output` completion tokens, none cached.
    ///
    /// ```
    /// use tower_agent_core::Usage;
    ///
    /// let usage = Usage::new(10, 5) + Usage::new(1, 1).with_cached(1);
    /// assert_eq!((usage.input_tokens, usage.output_tokens, usage.cached_input_tokens), (11, 6, 1));
    /// ```
    pub const fn new(input: u64, output: u64) -> Self {
        Self {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            cost: Cost::ZERO,
        }
    }

    /// The same usage with `cached` of its prompt tokens read from the provider's cache.
    pub const fn with_cached(mut self, cached: u64) -> Self {
        self.cached_input_tokens = cached;
        self
    }

    /// The same usage with `written` of its prompt tokens written to the provider's cache.
    ///
    /// ```
    /// use tower_agent_core::Usage;
    ///
    /// let usage = Usage::new(5_000, 100).with_cache_writes(4_000) + Usage::new(5_000, 100).with_cached(4_000);
    /// assert_eq!((usage.cache_write_input_tokens, usage.cached_input_tokens), (4_000, 4_000));
    /// ```
    pub const fn with_cache_writes(mut self, written: u64) -> Self {
        self.cache_write_input_tokens = written;
        self
    }

    /// The same usage with its cost.
    pub const fn with_cost(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }

    /// Whether no token was counted.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl Add for Usage {
    type Output = Usage;

    fn add(self, rhs: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(rhs.input_tokens),
            output_tokens: self.output_tokens.saturating_add(rhs.output_tokens),
            cached_input_tokens: self
                .cached_input_tokens
                .saturating_add(rhs.cached_input_tokens),
            cache_write_input_tokens: self
                .cache_write_input_tokens
                .saturating_add(rhs.cache_write_input_tokens),
            cost: self.cost + rhs.cost,
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, rhs: Usage) {
        *self = *self + rhs;
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A fresh random id (UUID v4, hyphenated).
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
