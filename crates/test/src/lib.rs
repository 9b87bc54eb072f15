//! The test kit of [tower-agent](https://docs.rs/tower-agent): stub services to unit-test your
//! layers and agents without a network.
//!
//! - [`ScriptedModel`]: a model service answering from a script (a queue or a closure), recording
//!   every request, with a clear error when the script runs out;
//! - [`StubTool`]: tools that return, fail, error, panic, stop, interrupt or hang on demand,
//!   recording their calls;
//! - [`EventRecorder`]: an observer that keeps every event of a run;
//! - [`assert_valid_history`]: every tool call answered exactly once, no orphan results;
//! - [`cassette`]: record a real run's model calls to a file and replay them without a network;
//! - [`check`]: a property check of your own agent stack, with a replayable seed.
//!
//! # Testing your own layer
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{before_model, Error, Flow, Message, ModelRequest, ModelResponse};
//! use tower_agent_test::ScriptedModel;
//!
//! // The layer under test: it reminds the model of the date on every call.
//! fn with_date() -> impl tower::Layer<ScriptedModel, Service: tower::Service<ModelRequest, Response = ModelResponse, Error = Error>> {
//!     before_model(|mut req: ModelRequest| async move {
//!         req.append_system("Today is 2026-11-22.");
//!         Ok(Flow::Continue(req))
//!     })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let model = ScriptedModel::new([ModelResponse::text("ok")]);
//! let stack = ServiceBuilder::new().layer(with_date()).service(model.clone());
//!
//! stack.oneshot(ModelRequest::new(vec![Message::user("what day is it?")])).await?;
//!
//! let seen = model.requests();
//! assert_eq!(seen.len(), 1);
//! assert_eq!(seen[0].system.as_deref(), Some("Today is 2026-11-22."));
//! # Ok(())
//! # }
//! ```
//!
//! # Testing an agent
//!
//! ```
//! use serde_json::json;
//! use tower::ServiceExt;
//! use tower_agent_core::{AgentRequest, Error, ModelResponse, Outcome, Session, ToolCall};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{assert_valid_history, ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let model = ScriptedModel::new([
//!     ModelResponse::tool_calls([ToolCall::new("c1", "lookup", json!({ "q": "rust" }))]),
//!     ModelResponse::text("Rust is a language."),
//! ]);
//! let lookup = StubTool::returning("lookup", "a systems language");
//! let tools = ToolSet::new().tool(lookup.clone());
//! let agent = Agent::builder().tool_specs(tools.specs()).build(model.clone(), tools);
//!
//! let res = agent.oneshot(AgentRequest::new(Session::new(), "what is rust?")).await?;
//! assert!(matches!(res.outcome, Outcome::Completed { .. }));
//! assert_eq!(lookup.calls().len(), 1);
//! assert_eq!(model.requests()[1].messages.last().unwrap().tool_results().next().unwrap().content, "a systems language");
//! assert_valid_history(&res.session.history);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::history::validate;
use tower_agent_core::{
    Error, Event, Message, Observer, Role, ToolAction, ToolCall, ToolRequest, ToolResponse,
    ToolSpec,
};
use tower_agent_tools::Tool;
use tower_service::Service;

pub mod cassette;
pub mod check;
mod model;

pub use model::ScriptedModel;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Clone)]
enum Behavior {
    Returns(String),
    Fails(String),
    Errors(Error),
    Panics(String),
    Stops { content: String, reason: String },
    Interrupts(Value),
    Hangs,
    Fn(Arc<dyn Fn(&ToolRequest) -> ToolResponse + Send + Sync>),
}

/// A tool with a fixed behaviour, recording every call it gets.
///
/// Clones share the record. Put it in a [`ToolSet`](tower_agent_tools::ToolSet) or use it
/// alone as a tool service.
#[derive(Clone)]
pub struct StubTool {
    spec: Arc<ToolSpec>,
    behavior: Behavior,
    requests: Arc<Mutex<Vec<ToolRequest>>>,
    delay: std::time::Duration,
}

impl StubTool {
    fn with_behavior(name: impl Into<String>, behavior: Behavior) -> Self {
        let name = name.into();
        let spec = ToolSpec::new(
            name.clone(),
            format!("Stub tool `{name}`."),
            json!({ "type": "object", "properties": {} }),
        );
        Self {
            spec: Arc::new(spec),
            behavior,
            requests: Arc::default(),
            delay: std::time::Duration::ZERO,
        }
    }

    /// Marked read-only ([`ToolSpec::read_only`]).
    pub fn read_only(mut self) -> Self {
        Arc::make_mut(&mut self.spec).read_only = true;
        self
    }

    /// Takes `delay` (on tokio's clock) before it answers, like a slow tool.
    pub fn taking(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Succeeds with `content`.
    pub fn returning(name: impl Into<String>, content: impl Into<String>) -> Self {
        Self::with_behavior(name, Behavior::Returns(content.into()))
    }

    /// Fails the way a tool should: an error result with `message`, which the model sees.
    pub fn failing(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::with_behavior(name, Behavior::Fails(message.into()))
    }

    /// Fails the service with `error` (`Err`), like broken infrastructure.
    pub fn erroring(name: impl Into<String>, error: Error) -> Self {
        Self::with_behavior(name, Behavior::Errors(error))
    }

    /// Panics with `message`.
    pub fn panicking(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::with_behavior(name, Behavior::Panics(message.into()))
    }

    /// Succeeds with `content` and asks the loop to stop for `reason`.
    pub fn stopping(
        name: impl Into<String>,
        content: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::with_behavior(
            name,
            Behavior::Stops {
                content: content.into(),
                reason: reason.into(),
            },
        )
    }

    /// Interrupts the run with `payload`; when resumed, succeeds with
    /// `"resumed with <value>"`.
    pub fn interrupting(name: impl Into<String>, payload: Value) -> Self {
        Self::with_behavior(name, Behavior::Interrupts(payload))
    }

    /// Never completes (for cancellation and timeout tests).
    pub fn hanging(name: impl Into<String>) -> Self {
        Self::with_behavior(name, Behavior::Hangs)
    }

    /// Answers with whatever `f` returns.
    pub fn from_fn(
        name: impl Into<String>,
        f: impl Fn(&ToolRequest) -> ToolResponse + Send + Sync + 'static,
    ) -> Self {
        Self::with_behavior(name, Behavior::Fn(Arc::new(f)))
    }

    /// The calls received so far, in order.
    pub fn calls(&self) -> Vec<ToolCall> {
        lock(&self.requests)
            .iter()
            .map(|r| r.call.clone())
            .collect()
    }

    /// The requests received so far, in order (with their contexts and resume values).
    pub fn requests(&self) -> Vec<ToolRequest> {
        lock(&self.requests).clone()
    }
}

impl fmt::Debug for StubTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StubTool")
            .field("name", &self.spec.name)
            .field("calls", &lock(&self.requests).len())
            .finish()
    }
}

impl Service<ToolRequest> for StubTool {
    type Response = ToolResponse;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<ToolResponse, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        lock(&self.requests).push(request.clone());
        let call = &request.call;
        let answer = match &self.behavior {
            Behavior::Returns(content) => Ok(ToolResponse::success(call, content.clone())),
            Behavior::Fails(message) => Ok(ToolResponse::error(call, message.clone())),
            Behavior::Errors(error) => Err(error.clone()),
            Behavior::Panics(message) => panic!("{message}"),
            Behavior::Stops { content, reason } => Ok(ToolResponse::success(call, content.clone())
                .with_action(ToolAction::stop(call, reason.clone()))),
            Behavior::Interrupts(payload) => Ok(match &request.resume {
                Some(value) => ToolResponse::success(call, format!("resumed with {value}")),
                None => ToolResponse::interrupt(call, payload.clone()),
            }),
            Behavior::Hangs => return Box::pin(futures_util::future::pending()),
            Behavior::Fn(f) => Ok(f(&request)),
        };
        let delay = self.delay;
        if delay.is_zero() {
            return Box::pin(std::future::ready(answer));
        }
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer
        })
    }
}

impl Tool for StubTool {
    fn spec(&self) -> ToolSpec {
        (*self.spec).clone()
    }
}

/// An observer keeping every event of the runs it watches.
///
/// ```
/// use serde_json::json;
/// use tower::ServiceExt;
/// use tower_agent_core::{AgentRequest, Error, ModelResponse, Session, ToolCall};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::{EventRecorder, ScriptedModel, StubTool};
/// use tower_agent_tools::ToolSet;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = ScriptedModel::new([
///     ModelResponse::tool_calls([ToolCall::new("c1", "fetch", json!({}))]),
///     ModelResponse::text("done"),
/// ]);
/// let agent = Agent::new(model, ToolSet::new().tool(StubTool::failing("fetch", "404")));
/// let recorder = EventRecorder::new();
/// let request = AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone());
/// agent.oneshot(request).await?;
///
/// assert_eq!(recorder.names().first(), Some(&"run_started"));
/// assert_eq!(recorder.tools_finished(), [("c1".to_string(), true)]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct EventRecorder {
    events: Arc<Mutex<Vec<Event>>>,
}

impl EventRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }

    /// The events' names so far (see [`Event::name`]).
    pub fn names(&self) -> Vec<&'static str> {
        lock(&self.events).iter().map(Event::name).collect()
    }

    /// `(call id, is_error)` of every `ToolFinished` event so far, in the order they came.
    pub fn tools_finished(&self) -> Vec<(String, bool)> {
        lock(&self.events)
            .iter()
            .filter_map(|event| match event {
                Event::ToolFinished {
                    call_id, is_error, ..
                } => Some((call_id.clone(), *is_error)),
                _ => None,
            })
            .collect()
    }

    /// Every `TextDelta`'s text, in order, whatever its round (retractions included).
    pub fn text_deltas(&self) -> Vec<String> {
        lock(&self.events)
            .iter()
            .filter_map(|event| match event {
                Event::TextDelta { delta, .. } => Some(delta.clone()),
                _ => None,
            })
            .collect()
    }

    /// The text a stream reader put together for `round` from the run's own events: its
    /// `TextDelta`s appended, emptied at each `Retract`. It equals the text of the round's
    /// message (see [`tower_agent_core::stream`]).
    pub fn streamed_text(&self, round: u32) -> String {
        let mut text = String::new();
        for event in lock(&self.events).iter() {
            match event {
                Event::TextDelta { round: r, delta } if *r == round => text.push_str(delta),
                Event::Retract { round: r } if *r == round => text.clear(),
                _ => {}
            }
        }
        text
    }
}

impl fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRecorder")
            .field("events", &lock(&self.events).len())
            .finish()
    }
}

impl Observer for EventRecorder {
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        lock(&self.events).push(event.clone());
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Assert that every tool call in `history` is answered exactly once, right after the
/// assistant message that made it, and that no result is an orphan.
///
/// # Panics
///
/// With the defect and a one-line-per-message dump of the history.
#[track_caller]
pub fn assert_valid_history(history: &[Message]) {
    assert_valid_history_with_pending(history, &[]);
}

/// Like [`assert_valid_history`], but the calls named in `pending` (of the last assistant
/// message) may wait for a decision, as in an interrupted session.
///
/// # Panics
///
/// As [`assert_valid_history`].
#[track_caller]
pub fn assert_valid_history_with_pending(history: &[Message], pending: &[&str]) {
    if let Err(error) = validate(history, pending) {
        panic!("invalid history: {error}\n{}", dump(history));
    }
}

/// One line per message: index, role, text, calls and results. For failure messages.
pub fn dump(history: &[Message]) -> String {
    let mut out = String::new();
    for (index, message) in history.iter().enumerate() {
        let role = match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        out.push_str(&format!("  [{index}] {role}: {:?}", message.text()));
        for call in message.tool_calls() {
            out.push_str(&format!(" call({} {})", call.id, call.name));
        }
        for result in message.tool_results() {
            let flag = if result.is_error { " error" } else { "" };
            out.push_str(&format!(" result({}{flag})", result.call_id));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;
    use tower_agent_core::{ModelRequest, ModelResponse, RunContext, ToolResult};

    #[tokio::test]
    async fn script_runs_out_with_a_clear_error() {
        let model = ScriptedModel::new([ModelResponse::text("one")]);
        let first = model
            .clone()
            .oneshot(ModelRequest::new(vec![]))
            .await
            .unwrap();
        assert_eq!(first.message.text(), "one");
        let err = model
            .clone()
            .oneshot(ModelRequest::new(vec![]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("script is exhausted"), "{err}");
        assert!(err.to_string().contains("held 1 responses"), "{err}");
        assert_eq!(model.request_count(), 2);
        assert_eq!(model.requests().len(), 2);
    }

    #[tokio::test]
    async fn stub_tools_record_and_behave() {
        let tool = StubTool::interrupting("ask", json!({ "question": "ok?" }));
        let call = ToolCall::new("c", "ask", json!({}));
        let first = tool
            .clone()
            .oneshot(ToolRequest::new(call.clone(), RunContext::new()))
            .await
            .unwrap();
        assert!(matches!(first.action, ToolAction::Interrupt(_)));
        let mut resumed = ToolRequest::new(call, RunContext::new());
        resumed.resume = Some(json!("yes"));
        let second = tool.clone().oneshot(resumed).await.unwrap();
        assert_eq!(second.result.content, r#"resumed with "yes""#);
        assert_eq!(tool.calls().len(), 2);
    }

    #[test]
    #[should_panic(expected = "invalid history: tool call `c` (t) in message 0 has no result")]
    fn invalid_history_panics_with_the_defect() {
        assert_valid_history(&[Message::assistant_with_calls(
            "",
            [ToolCall::new("c", "t", json!({}))],
        )]);
    }

    #[test]
    fn dump_lists_calls_and_results() {
        let call = ToolCall::new("c", "t", json!({}));
        let text = dump(&[
            Message::assistant_with_calls("", [call.clone()]),
            Message::tool_result(ToolResult::error(&call, "x")),
        ]);
        assert!(text.contains("call(c t)"));
        assert!(text.contains("result(c error)"));
    }
}
