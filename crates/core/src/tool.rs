//! The tool service's request and response.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_service::Service;

use crate::context::RunContext;
use crate::decision::DecisionKind;
use crate::message::{ToolCall, ToolResult};
use crate::model::ToolSpec;
pub use crate::session::Interrupt;
use crate::session::{StopReason, Usage};

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
    /// Set when the loop started this call while the model still streamed (early tool
    /// start): the model's final message may yet discard it. A layer that counts calls (a
    /// limit, a checkpoint) gives back what it counted if that happens ([`Tentative`]).
    pub early: Option<Tentative>,
    /// Set when an earlier run started this call and stopped (its process died) before the
    /// call's result was saved: the call may have taken effect ([`Session::started`], the
    /// write-ahead record). It is **not** to run again: the tool says what became of it (the
    /// `Tools` router asks the tool's reconcile step, and answers [`Recovery::Unknown`] for a
    /// tool without one), or runs it again only when the tool may repeat
    /// ([`ToolSpec::may_repeat`](crate::ToolSpec::may_repeat)). Layers that gate calls
    /// (approval, limits, a guard, a checkpoint) let it through untouched: it is not a new
    /// call, and its answer must reach the session whatever a gate would say now.
    ///
    /// [`Session::started`]: crate::Session::started
    pub recover: bool,
}

impl ToolRequest {
    /// A first execution of `call` in `ctx`.
    pub fn new(call: ToolCall, ctx: RunContext) -> Self {
        Self {
            call,
            ctx,
            resume: None,
            early: None,
            recover: false,
        }
    }
}

/// The tools a run offers, as the agent put them in the run's context
/// ([`RunContext::extension`]) when the run started: what a layer that does not wrap the
/// tools (a retry policy) reads a tool's hints from.
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{RunContext, RunTools, ToolSpec};
///
/// let ctx = RunContext::new();
/// let read = ToolSpec::new("read", "Reads.", json!({"type": "object"})).read_only();
/// ctx.insert_extension(RunTools::new([read, ToolSpec::new("pay", "Pays.", json!({}))].into()));
/// let tools = RunTools::of(&ctx).expect("put there");
/// assert_eq!((tools.may_repeat("read"), tools.may_repeat("pay")), (Some(true), Some(false)));
/// assert_eq!(tools.may_repeat("nope"), None);
/// ```
#[derive(Debug, Clone)]
pub struct RunTools(Arc<[ToolSpec]>);

impl RunTools {
    /// The tools `specs` describe.
    pub fn new(specs: Arc<[ToolSpec]>) -> Self {
        Self(specs)
    }

    /// The tools of the run `ctx` belongs to, when the agent put them there.
    pub fn of(ctx: &RunContext) -> Option<Self> {
        ctx.extension::<RunTools>()
    }

    /// Whether the tool `name` may repeat ([`ToolSpec::may_repeat`]); `None` for a tool the
    /// run does not offer.
    pub fn may_repeat(&self, name: &str) -> Option<bool> {
        self.0
            .iter()
            .find(|spec| spec.name == name)
            .map(ToolSpec::may_repeat)
    }
}

/// What became of a call an earlier run started and did not finish ([`ToolRequest::recover`]):
/// a tool's reconcile step answers it from the effect's own record, looked up by the call's
/// key ([`ToolCall::key`](crate::ToolCall::key)).
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{Recovery, ToolCall, ToolResult};
///
/// let call = ToolCall::new("c1", "refund", json!({"order": "A-1"}));
/// let done = Recovery::done("refunded A-1").result(&call);
/// assert_eq!((done.content.as_str(), done.is_error), ("refunded A-1", false));
/// assert_eq!(Recovery::NotRun.result(&call).content, ToolResult::NOT_RUN);
/// assert_eq!(Recovery::Unknown.result(&call).content, ToolResult::OUTCOME_UNKNOWN);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// It took effect: its result, as the model would have seen it, and the arguments it ran
    /// with when they were not the model's (a human's edit, a guard's revision: the effect's
    /// record has them), so that the session shows the call that ran.
    Done {
        /// The call's result.
        result: String,
        /// The arguments it ran with, when not the model's.
        arguments: Option<Value>,
    },
    /// It did not take effect: the model is told so, and may make the call again (a new call,
    /// with a new key, through every gate).
    NotRun,
    /// Nothing can say: the model is told to check before calling again.
    Unknown,
}

impl Recovery {
    /// It took effect, with the model's arguments, and `result` is its result.
    pub fn done(result: impl Into<String>) -> Self {
        Recovery::Done {
            result: result.into(),
            arguments: None,
        }
    }

    /// The call's result: its own ([`Recovery::Done`]), [`ToolResult::NOT_RUN`] or
    /// [`ToolResult::OUTCOME_UNKNOWN`] (both errors the model sees).
    pub fn result(&self, call: &ToolCall) -> ToolResult {
        match self {
            Recovery::Done { result, .. } => ToolResult::success(call, result.as_str()),
            Recovery::NotRun => ToolResult::error(call, ToolResult::NOT_RUN),
            Recovery::Unknown => ToolResult::error(call, ToolResult::OUTCOME_UNKNOWN),
        }
    }

    /// Answer `req`, which recovers a call ([`ToolRequest::recover`]), with this: the run hears
    /// it ([`Event::ToolRecovered`](crate::Event::ToolRecovered)), and the call gets
    /// [`Recovery::result`]. An observer that fails on the event changes nothing: what became
    /// of the call reaches the session.
    pub async fn respond(self, req: &ToolRequest) -> ToolResponse {
        let (call, ctx) = (&req.call, &req.ctx);
        let _observer_failed = ctx
            .emit(crate::Event::ToolRecovered {
                round: ctx.round(),
                call_id: call.id.clone(),
                name: call.name.clone(),
                outcome: self.name(),
            })
            .await;
        let mut response = ToolResponse::new(self.result(call));
        if let Recovery::Done {
            arguments: Some(arguments),
            ..
        } = self
        {
            response.arguments = Some(arguments.to_string());
        }
        response
    }

    /// Its name, for the [`Event::ToolRecovered`](crate::Event::ToolRecovered) a host reads:
    /// `"done"`, `"not_run"`, `"unknown"`.
    pub fn name(&self) -> &'static str {
        match self {
            Recovery::Done { .. } => "done",
            Recovery::NotRun => "not_run",
            Recovery::Unknown => "unknown",
        }
    }
}

/// A tool call started early, that the loop keeps or discards once the model's message is in.
///
/// A layer that counts calls registers, with [`Tentative::on_discard`], how to give back what
/// it counted for this call: when the loop discards the call (the final message does not have
/// it, the stream restarted, the run ended first), every registered step runs, so a discarded
/// call counts against nothing. When the loop keeps it, nothing runs.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use tower_agent_core::Tentative;
///
/// let calls = Arc::new(AtomicU32::new(0));
/// let early = Tentative::new();
/// calls.fetch_add(1, Ordering::SeqCst);
/// let counted = calls.clone();
/// early.on_discard(move || { counted.fetch_sub(1, Ordering::SeqCst); });
/// early.discard();
/// assert_eq!(calls.load(Ordering::SeqCst), 0, "given back");
///
/// let kept = Tentative::new();
/// kept.keep();
/// let counted = calls.clone();
/// kept.on_discard(move || { counted.fetch_sub(1, Ordering::SeqCst); });
/// kept.discard();
/// assert_eq!(calls.load(Ordering::SeqCst), 0, "a kept call gives nothing back");
/// ```
#[derive(Clone, Default)]
pub struct Tentative(Arc<Mutex<Fate>>);

/// Where a tentative call stands.
#[derive(Default)]
enum Fate {
    /// Not decided, nothing to give back.
    #[default]
    Open,
    /// Not decided: what to give back if it is discarded.
    Undo(Vec<Box<dyn FnOnce() + Send>>),
    Kept,
    Discarded,
}

impl Tentative {
    /// A call not decided yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Run `undo` if the call is discarded (at once when it was already); never once it is
    /// kept.
    pub fn on_discard(&self, undo: impl FnOnce() + Send + 'static) {
        let mut fate = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *fate {
            Fate::Kept => {}
            Fate::Discarded => {
                drop(fate);
                undo();
            }
            Fate::Undo(list) => list.push(Box::new(undo)),
            Fate::Open => *fate = Fate::Undo(vec![Box::new(undo)]),
        }
    }

    /// The loop keeps the call: its result is the model's.
    pub fn keep(&self) {
        let mut fate = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*fate, Fate::Discarded) {
            *fate = Fate::Kept;
        }
    }

    /// The loop discards the call: what was counted for it is given back (once).
    pub fn discard(&self) {
        let undo = {
            let mut fate = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::replace(&mut *fate, Fate::Discarded) {
                Fate::Undo(list) => list,
                Fate::Kept => {
                    *fate = Fate::Kept;
                    Vec::new()
                }
                Fate::Open | Fate::Discarded => Vec::new(),
            }
        };
        for step in undo {
            step();
        }
    }
}

impl fmt::Debug for Tentative {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fate = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f.write_str(match &*fate {
            Fate::Open | Fate::Undo(_) => "Tentative(open)",
            Fate::Kept => "Tentative(kept)",
            Fate::Discarded => "Tentative(discarded)",
        })
    }
}

impl AsRef<RunContext> for ToolRequest {
    fn as_ref(&self) -> &RunContext {
        &self.ctx
    }
}

/// What the agent does after a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolAction {
    /// Go on: append the result, call the model again.
    #[default]
    Continue,
    /// Append the result, then stop the loop: the run ends with
    /// [`Outcome::Stopped`](crate::Outcome::Stopped) and this reason. Later calls of the same
    /// round are not executed (in sequential mode) and get a "not executed" result. A tool
    /// that stops the run itself uses [`ToolAction::stop`].
    Stop(StopReason),
    /// Pause the run at this call: no result is appended; the run ends with
    /// [`Outcome::Interrupted`](crate::Outcome::Interrupted) once the round's other calls ran.
    /// Boxed: a pause is rare, and a small response moves cheaply through every layer.
    Interrupt(Box<Pause>),
}

impl ToolAction {
    /// Stop the run because the tool `call` said so, for `reason`
    /// ([`StopReason::Tool`]).
    pub fn stop(call: &ToolCall, reason: impl Into<String>) -> Self {
        ToolAction::Stop(StopReason::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            reason: reason.into(),
        })
    }
}

/// What a paused call waits for: the payload for the host and the decisions it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// What the host needs to decide.
    pub payload: Value,
    /// The decisions the call takes on resume; empty: any value ([`Interrupt::allowed`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed: Vec<DecisionKind>,
}

/// What the tool service returns: the result the model sees, what the loop does next, and
/// what the layers it went through did.
///
/// It holds the call's whole effect, so a response saved as JSON and applied later does what
/// the live one did: [`arguments`](Self::arguments) the call really ran with (an approval that
/// edited them) and [`usage`](Self::usage) of model calls the tool made (a sub-agent).
///
/// ```
/// use serde_json::json;
/// use tower_agent_core::{ToolAction, ToolCall, ToolResponse};
///
/// let call = ToolCall::new("c1", "rm", json!({"path": "/"}));
/// let res = ToolResponse::success(&call, "removed /tmp")
///     .ran_with(r#"{"path":"/tmp"}"#)
///     .with_action(ToolAction::stop(&call, "done"));
/// let back: ToolResponse = serde_json::from_str(&serde_json::to_string(&res).unwrap()).unwrap();
/// assert_eq!(back, res);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResponse {
    /// The result. Ignored when `action` is [`ToolAction::Interrupt`].
    pub result: ToolResult,
    /// What the loop does next.
    #[serde(default)]
    pub action: ToolAction,
    /// The arguments (raw JSON) the call ran with when a layer changed the model's (an
    /// approval that edited them): the agent writes them into the call in the history, so the
    /// history records what was executed. Ignored for a call that ends up waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// Tokens used by model calls the tool made (a sub-agent), added to the run's usage.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

impl ToolResponse {
    /// A response carrying `result`, letting the loop go on.
    pub fn new(result: ToolResult) -> Self {
        Self {
            result,
            action: ToolAction::Continue,
            arguments: None,
            usage: Usage::default(),
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

    /// The answer to a call of a tool the service does not have: an error result naming the
    /// tools it has (`specs`), so the model can correct itself.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{ToolCall, ToolResponse, ToolSpec};
    ///
    /// let call = ToolCall::new("c1", "serach", json!({}));
    /// let specs = [ToolSpec::new("search", "Searches.", json!({"type": "object"}))];
    /// let answer = ToolResponse::unknown_tool(&call, &specs);
    /// assert!(answer.result.is_error);
    /// assert_eq!(answer.result.content, "unknown tool `serach`. Available tools: search");
    /// assert_eq!(
    ///     ToolResponse::unknown_tool(&call, &[]).result.content,
    ///     "unknown tool `serach`: no tools are available"
    /// );
    /// ```
    pub fn unknown_tool(call: &ToolCall, specs: &[ToolSpec]) -> Self {
        let content = if specs.is_empty() {
            format!("unknown tool `{}`: no tools are available", call.name)
        } else {
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            format!(
                "unknown tool `{}`. Available tools: {}",
                call.name,
                names.join(", ")
            )
        };
        Self::error(call, content)
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

    /// Whether the call pauses the run ([`ToolAction::Interrupt`]): its result is only a
    /// placeholder, and the call waits for the value the run resumes with.
    ///
    /// ```
    /// use serde_json::json;
    /// use tower_agent_core::{ToolCall, ToolResponse};
    ///
    /// let call = ToolCall::new("c1", "deploy", json!({"env": "prod"}));
    /// assert!(ToolResponse::interrupt(&call, json!({"question": "Deploy?"})).is_interrupt());
    /// assert!(!ToolResponse::error(&call, "deploy failed").is_interrupt());
    /// ```
    pub fn is_interrupt(&self) -> bool {
        matches!(self.action, ToolAction::Interrupt(_))
    }

    /// Set the action.
    pub fn with_action(mut self, action: ToolAction) -> Self {
        self.action = action;
        self
    }

    /// Say the call ran with `arguments` (raw JSON) instead of the model's
    /// ([`ToolResponse::arguments`]).
    pub fn ran_with(mut self, arguments: impl Into<String>) -> Self {
        self.arguments = Some(arguments.into());
        self
    }

    /// Add `usage` to the tokens the call used ([`ToolResponse::usage`]).
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage += usage;
        self
    }
}

/// A tool service that says which tools it serves. The agent offers the model the tools its
/// tool stack reports, so tool specs never travel apart from the service that runs them.
///
/// A [`ToolSet`](https://docs.rs/tower-agent-tools) reports its tools; every layer of
/// tower-agent reports what the service inside it reports (a layer that adds a tool, like
/// eviction's read tool, adds it there). Another tool service says what it serves with
/// [`DescribedTools`].
///
///
/// ```
/// use serde_json::json;
/// use tower::service_fn;
/// use tower_agent_core::{DescribeTools, DescribedTools, Error, ToolRequest, ToolResponse, ToolSpec};
///
/// let echo = ToolSpec::new("echo", "Says it back.", json!({"type": "object"}));
/// let tools = DescribedTools::new([echo], service_fn(|req: ToolRequest| async move {
///     Ok::<_, Error>(ToolResponse::success(&req.call, req.call.arguments.clone()))
/// }));
/// assert_eq!(tools.tool_specs()[0].name, "echo");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say which tools it serves",
    label = "the agent offers the model the tools its tool service reports",
    note = "a `ToolSet` reports its tools, and every tower-agent layer around one passes them on; \
            wrap any other tool service in `DescribedTools::new(specs, service)`, or \
            `DescribedTools::none(service)` when the model is offered no tools"
)]
pub trait DescribeTools {
    /// The specs of the tools it serves, in the order the model is offered them.
    fn tool_specs(&self) -> Arc<[ToolSpec]>;
}

/// A tool service with the specs of the tools it serves ([`DescribeTools`]).
#[derive(Debug, Clone)]
pub struct DescribedTools<S> {
    inner: S,
    specs: Arc<[ToolSpec]>,
}

impl<S> DescribedTools<S> {
    /// `inner`, serving the tools `specs` describe.
    pub fn new(specs: impl IntoIterator<Item = ToolSpec>, inner: S) -> Self {
        Self {
            inner,
            specs: specs.into_iter().collect(),
        }
    }

    /// `inner`, offering the model no tools (a stub in a test, a service that only answers
    /// calls a layer makes).
    pub fn none(inner: S) -> Self {
        Self::new([], inner)
    }

    crate::inner_service_accessors!();
}

impl<S> DescribeTools for DescribedTools<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.specs)
    }
}

impl<S: Service<ToolRequest>> Service<ToolRequest> for DescribedTools<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ToolRequest) -> Self::Future {
        self.inner.call(request)
    }
}

impl<T: DescribeTools + ?Sized> DescribeTools for &T {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        (**self).tool_specs()
    }
}

/// tower's own middleware around a tool service passes its tools on (those that expose their
/// inner service: a concurrency limit, a rate limit, a timeout). Wrap any other middleware's
/// result in [`DescribedTools`].
#[cfg(feature = "tower")]
mod tower_middleware {
    use std::sync::Arc;

    use super::DescribeTools;
    use crate::model::ToolSpec;

    impl<S: DescribeTools> DescribeTools for tower::limit::ConcurrencyLimit<S> {
        fn tool_specs(&self) -> Arc<[ToolSpec]> {
            self.get_ref().tool_specs()
        }
    }

    impl<S: DescribeTools> DescribeTools for tower::limit::RateLimit<S> {
        fn tool_specs(&self) -> Arc<[ToolSpec]> {
            self.get_ref().tool_specs()
        }
    }

    impl<S: DescribeTools> DescribeTools for tower::timeout::Timeout<S> {
        fn tool_specs(&self) -> Arc<[ToolSpec]> {
            self.get_ref().tool_specs()
        }
    }
}
