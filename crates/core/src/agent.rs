//! The agent service's request and response: sessions, inputs and outcomes.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::context::{RunContext, new_id};
use crate::event::{EventStream, Observer};
use crate::history::History;
use crate::message::Message;
use crate::model::Usage;
use crate::tool::Interrupt;

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
    /// Durable state written by layers and tools (see [`RunContext::set_state`]).
    #[serde(default)]
    pub state: Map<String, Value>,
    /// Calls waiting for a decision, when the last run was interrupted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupts: Vec<Interrupt>,
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
        }
    }

    /// A session starting from `history`.
    pub fn with_history(mut self, history: impl Into<History>) -> Self {
        self.history = history.into();
        self
    }
}

/// What the run starts from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentInput {
    /// New messages, appended before the first round (usually one user message).
    ///
    /// If the session has pending interrupts, their calls get a "not executed" result first:
    /// the user moved on without deciding.
    Messages(Vec<Message>),
    /// Resume an interrupted run: the pending calls are executed again with this value in
    /// [`ToolRequest::resume`](crate::ToolRequest::resume), then the loop goes on.
    Resume(Value),
    /// Go on from the history as it is (after a cancelled or stopped run). Pending interrupts
    /// stay pending: the run ends interrupted again at once.
    Continue,
}

impl From<&str> for AgentInput {
    fn from(text: &str) -> Self {
        AgentInput::Messages(vec![Message::user(text)])
    }
}

impl From<String> for AgentInput {
    fn from(text: String) -> Self {
        AgentInput::Messages(vec![Message::user(text)])
    }
}

impl From<Message> for AgentInput {
    fn from(message: Message) -> Self {
        AgentInput::Messages(vec![message])
    }
}

impl From<Vec<Message>> for AgentInput {
    fn from(messages: Vec<Message>) -> Self {
        AgentInput::Messages(messages)
    }
}

/// What the agent service receives: the session, the new input and the run context.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    /// The session to run.
    pub session: Session,
    /// What the run starts from.
    pub input: AgentInput,
    /// The run's context; its session id is the session's.
    pub ctx: RunContext,
}

impl AgentRequest {
    /// A run of `session` on `input`, with a fresh context.
    ///
    /// ```
    /// use tower_agent_core::{AgentInput, AgentRequest, Session};
    ///
    /// let req = AgentRequest::new(Session::with_id("s1"), "hi");
    /// assert_eq!(req.ctx.session_id(), "s1");
    /// assert!(matches!(req.input, AgentInput::Messages(_)));
    /// ```
    pub fn new(session: Session, input: impl Into<AgentInput>) -> Self {
        let ctx = RunContext::new().with_session_id(session.id.as_str());
        Self {
            session,
            input: input.into(),
            ctx,
        }
    }

    /// Cancel the run through `token`.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.ctx = self.ctx.with_cancellation(token);
        self
    }

    /// Add an event observer.
    pub fn with_observer(mut self, observer: impl Observer) -> Self {
        self.ctx = self.ctx.with_observer(observer);
        self
    }

    /// Add a bounded event stream (see [`RunContext::with_event_stream`]).
    pub fn with_event_stream(mut self, capacity: usize) -> (Self, EventStream) {
        let (ctx, stream) = self.ctx.with_event_stream(capacity);
        self.ctx = ctx;
        (self, stream)
    }
}

impl AsRef<RunContext> for AgentRequest {
    fn as_ref(&self) -> &RunContext {
        &self.ctx
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
    /// The loop was stopped by a limit or a tool response.
    Stopped {
        /// Why.
        reason: StopReason,
    },
    /// The run was cancelled. Every tool call in the history has a result.
    Cancelled,
    /// The run paused for the host: resume it with [`AgentInput::Resume`].
    Interrupted {
        /// The calls waiting (also in [`Session::interrupts`]).
        interrupts: Vec<Interrupt>,
    },
}

/// What the agent service returns: the session after the run and how it ended.
///
/// Equality ignores whether an after callback replaced the response.
#[derive(Debug, Clone)]
pub struct AgentResponse {
    /// The session after the run, ready to save or run again.
    pub session: Session,
    /// How the run ended.
    pub outcome: Outcome,
    /// Tokens used by all model calls of the run.
    pub usage: Usage,
    /// Model calls made.
    pub rounds: u32,
    pub(crate) replaced: bool,
}

impl AgentResponse {
    /// A response.
    pub fn new(session: Session, outcome: Outcome) -> Self {
        Self {
            session,
            outcome,
            usage: Usage::default(),
            rounds: 0,
            replaced: false,
        }
    }

    /// The final message's text when the run completed.
    pub fn text(&self) -> Option<String> {
        match &self.outcome {
            Outcome::Completed { message } => Some(message.text()),
            _ => None,
        }
    }
}

impl PartialEq for AgentResponse {
    fn eq(&self, other: &Self) -> bool {
        self.session == other.session
            && self.outcome == other.outcome
            && self.usage == other.usage
            && self.rounds == other.rounds
    }
}
