//! The agent service's request and response: sessions, inputs and outcomes.

use std::fmt;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::context::RunContext;
use crate::decision::Decisions;
use crate::event::{EventStream, Observer};
use crate::history::Repair;
use crate::message::{Message, ToolCall, ToolResult};
use crate::saver::Saver;
pub use crate::session::{Outcome, Session, StopReason, Usage};

/// What the run starts from.
///
/// [`StopReason::Replayed`]: crate::StopReason::Replayed
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentInput {
    /// New messages, appended before the first round (usually one user message).
    ///
    /// If the session has pending interrupts, their calls get a "not executed" result first:
    /// the user moved on without deciding.
    Messages(Vec<Message>),
    /// Resume an interrupted run with one value per waiting call, keyed by its id: each
    /// pending call is executed again with its value in
    /// [`ToolRequest::resume`](crate::ToolRequest::resume), then the loop goes on.
    ///
    /// Checked before anything changes (a `ResumeError` of the agent): a value for a
    /// call the session does not have, a waiting call without a value, or a value its call
    /// does not allow ([`Interrupt::allowed`](crate::Interrupt::allowed)) fails the run with
    /// the session unchanged. Values for calls already answered are ignored: resuming the
    /// session a resume returned with the same decisions runs nothing twice (outcome
    /// [`StopReason::Replayed`], or the pending or final state the session is in).
    Resume(Decisions),
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

/// What the agent service receives: the session, the new input, the run context, and where
/// the run saves its session as it goes.
#[derive(Clone)]
pub struct AgentRequest {
    /// The session to run.
    pub session: Session,
    /// What the run starts from.
    pub input: AgentInput,
    /// The run's context; its session id is the session's.
    pub ctx: RunContext,
    /// Where the agent service that runs this request saves the session at each step
    /// ([`Saver`]); `None`: nowhere. A session store's layer sets it; a workflow gives each
    /// agent it runs one that saves into the workflow's session. A layer that makes a new
    /// request for the service below passes it on (or decides where that run saves).
    pub saver: Option<Arc<dyn Saver>>,
}

impl fmt::Debug for AgentRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentRequest")
            .field("session", &self.session)
            .field("input", &self.input)
            .field("ctx", &self.ctx)
            .field("saver", &self.saver.as_ref().map(|_| ".."))
            .finish()
    }
}

impl AgentRequest {
    /// The result [`AgentRequest::answer`] gives a call that waited when the run was resumed
    /// or continued.
    pub const ANSWERED: &'static str =
        "not executed: a layer answered the run before this tool call ran";

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
            saver: None,
        }
    }

    /// Save the run's session with `saver` as it goes (see [`Saver`]).
    pub fn with_saver(mut self, saver: impl Saver) -> Self {
        self.saver = Some(Arc::new(saver));
        self
    }

    /// Answer the run here, without running the loop: for a `before_agent` callback. New
    /// messages are applied to the session as the agent would ([`Session::push_input`]);
    /// calls that waited for a decision (also on `Resume` and `Continue`) get a result saying
    /// they were not executed; `text` is appended as the assistant's final message, and the
    /// run's JSON state is written back to the session. No event is emitted (the loop did not
    /// run); an event stream ends when the request's context is dropped.
    ///
    /// ```
    /// use tower_agent_core::{AgentRequest, Outcome, Session};
    ///
    /// let res = AgentRequest::new(Session::new(), "hi").answer("The service is closed today.");
    /// assert_eq!(res.text().as_deref(), Some("The service is closed today."));
    /// assert_eq!(res.session.history.len(), 2); // the input and the answer
    /// ```
    pub fn answer(self, text: impl Into<String>) -> AgentResponse {
        let AgentRequest {
            mut session,
            input,
            ctx,
            ..
        } = self;
        match input {
            AgentInput::Messages(messages) => session.push_input(messages),
            AgentInput::Resume(_) | AgentInput::Continue => {
                session.interrupts.clear();
                let answer = |call: &ToolCall| ToolResult::error(call, Self::ANSWERED);
                let how = Repair::new().last_message_only().answer(&answer);
                session.history.repair(&how);
            }
        }
        let message = Message::assistant(text);
        session.history.push(message.clone());
        ctx.absorb_state(std::mem::take(&mut session.state));
        session.state = ctx.state_snapshot();
        AgentResponse::new(session, Outcome::Completed { message })
    }

    /// Resume `session` with `decisions`, one per waiting call ([`AgentInput::Resume`]).
    pub fn resume(session: Session, decisions: Decisions) -> Self {
        Self::new(session, AgentInput::Resume(decisions))
    }

    /// Resume `session` with the same value for every waiting call: one approval for all, or
    /// the answer to a single question.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{AgentInput, AgentRequest, Decision, Interrupt, Session, ToolCall};
    ///
    /// let mut session = Session::new();
    /// session.interrupts.push(Interrupt::new(ToolCall::new("c1", "rm", json!({})), json!("ok?")));
    /// let req = AgentRequest::resume_all(session, Decision::Approve);
    /// let AgentInput::Resume(decisions) = &req.input else { unreachable!() };
    /// assert_eq!(decisions.get("c1"), Some(&json!({"type": "approve"})));
    /// ```
    pub fn resume_all(session: Session, value: impl Into<serde_json::Value>) -> Self {
        let decisions = Decisions::all(&session.interrupts, value);
        Self::resume(session, decisions)
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

/// What the agent service returns: the session after the run and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentResponse {
    /// The session after the run, ready to save or run again.
    pub session: Session,
    /// How the run ended.
    pub outcome: Outcome,
    /// Tokens used by all model calls of the run.
    pub usage: Usage,
    /// Model calls made.
    pub rounds: u32,
}

impl AgentResponse {
    /// A response.
    pub fn new(session: Session, outcome: Outcome) -> Self {
        Self {
            session,
            outcome,
            usage: Usage::default(),
            rounds: 0,
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
