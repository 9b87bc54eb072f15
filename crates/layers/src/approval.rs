//! Human-in-the-loop approval of tool calls (`before_tool`).
//!
//! A [`Gate`] per tool says which calls need a decision (all of them, or those whose
//! arguments match a predicate), which [`Decision`]s the human may take, and what to show
//! them. Calls of other tools pass straight through. A gated call is decided either
//!
//! - **inline**: an [`Approver`] (a terminal prompt, a web socket to a UI) decides while the
//!   run waits; no answer within the timeout (15 minutes by default), or an approver error,
//!   rejects the call (fail closed); or
//! - **by interrupting** (the default): the call ends the run with
//!   [`Outcome::Interrupted`](tower_agent_core::Outcome::Interrupted), one
//!   [`ReviewRequest`] per gated call in the interrupts' payloads. Calls of the same batch
//!   that need no decision run at once and their results are kept. The host saves the
//!   session, asks the human (maybe in another process, days later) and resumes with
//!   [`AgentInput::Resume`](tower_agent_core::AgentInput::Resume): each decision keyed by its
//!   call id, checked against what the gate allows before anything runs.
//!
//! What each decision does:
//!
//! | decision | the tool | the result the model sees |
//! |---|---|---|
//! | approve | runs once, as the model wrote it | the tool's |
//! | edit | runs once with the edited arguments | the tool's; **the call in the history shows the edited arguments** (the history records what ran, through [`RunContext::record_arguments`]) |
//! | reject | does not run | an error result: rejected by the user, the reason, and not to retry unless asked |
//! | respond | does not run | the human's text, as a successful result |
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, Decision, Decisions, Outcome, Session, ToolCall, ModelResponse};
//! use tower_agent_layers::approval::{ApprovalLayer, Gate, ReviewRequest};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let approval = ApprovalLayer::builder()
//!     .gate("shell", Gate::new().description("Runs a shell command on your machine"))
//!     .build()
//!     .expect("a valid configuration");
//! let shell = StubTool::returning("shell", "build/ removed");
//! let tools = ServiceBuilder::new().layer(approval).service(ToolSet::new().tool(shell.clone()));
//! let model = ScriptedModel::new([
//!     ModelResponse::tool_calls([ToolCall::new("c1", "shell", json!({"cmd": "rm -rf build"}))]),
//!     ModelResponse::text("Cleaned."),
//! ]);
//! let agent = Agent::new(model, tools);
//!
//! let paused = agent.clone().oneshot(AgentRequest::new(Session::new(), "clean up")).await?;
//! let Outcome::Interrupted { interrupts } = &paused.outcome else { unreachable!() };
//! let review = ReviewRequest::from_interrupt(&interrupts[0]).expect("a review");
//! assert_eq!(review.tool, "shell");
//! assert_eq!(review.arguments["cmd"], "rm -rf build");
//! assert!(shell.calls().is_empty(), "nothing ran yet");
//!
//! let decisions = Decisions::new().with(review.call_id, Decision::Approve);
//! let done = agent.oneshot(AgentRequest::resume(paused.session, decisions)).await?;
//! assert_eq!(done.text().as_deref(), Some("Cleaned."));
//! assert_eq!(shell.calls().len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! Put the approval layer on the whole tool stack, inside call limits and the checkpoint and
//! outside the tools (see `docs/ordering.md`). On resume the whole tool stack runs again for
//! the calls that waited: the approval layer consumes the decision (the layers and the tool
//! inside it see [`ToolRequest::resume`] as `None`); a counting layer outside it skips
//! requests that carry a resume value, as they were counted when they first came through.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tower_agent_core::{
    BoxError, Decision, DecisionKind, Event, Interrupt, RunContext, ToolAction, ToolCall,
    ToolRequest, ToolResponse, UnknownDecision,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::by_name::ByName;

/// The default time an inline approver has to decide: 15 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

type Predicate = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
type Describe = Arc<dyn Fn(&ToolCall) -> String + Send + Sync>;

/// Which calls of one tool need a decision, which decisions they allow, and what the human is
/// shown.
///
/// ```
/// use serde_json::Value;
/// use tower_agent_layers::approval::Gate;
///
/// // Only `rm` outside /tmp needs a decision; it can be approved or rejected, not edited.
/// let gate = Gate::new()
///     .allow(["approve", "reject"])
///     .when(|args: &Value| !args["path"].as_str().unwrap_or("").starts_with("/tmp/"))
///     .description("Deletes files");
/// # let _ = gate;
/// ```
#[derive(Clone)]
pub struct Gate {
    allowed: Vec<String>,
    when: Option<Predicate>,
    description: Option<Describe>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// Every call of the tool needs a decision; every decision is allowed.
    pub fn new() -> Self {
        Self {
            allowed: DecisionKind::ALL
                .iter()
                .map(|k| k.as_str().to_owned())
                .collect(),
            when: None,
            description: None,
        }
    }

    /// The decisions the human may take, by name (`"approve"`, `"edit"`, `"reject"`,
    /// `"respond"`) or as [`DecisionKind`]s. A name that is not a decision fails
    /// [`ApprovalBuilder::build`].
    pub fn allow<I>(mut self, decisions: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.allowed = decisions
            .into_iter()
            .map(|d| d.as_ref().to_owned())
            .collect();
        self
    }

    /// Only calls whose arguments match need a decision. Arguments that are not JSON always
    /// need one (fail closed).
    pub fn when(mut self, predicate: impl Fn(&Value) -> bool + Send + Sync + 'static) -> Self {
        self.when = Some(Arc::new(predicate));
        self
    }

    /// What the human is shown about the tool.
    pub fn description(self, text: impl Into<String>) -> Self {
        let text: Arc<str> = text.into().into();
        self.describe(move |_| text.to_string())
    }

    /// What the human is shown, written from the call.
    pub fn describe(
        mut self,
        describe: impl Fn(&ToolCall) -> String + Send + Sync + 'static,
    ) -> Self {
        self.description = Some(Arc::new(describe));
        self
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("allowed", &self.allowed)
            .field("when", &self.when.as_ref().map(|_| "<predicate>"))
            .finish_non_exhaustive()
    }
}

/// A gate whose decisions were checked.
#[derive(Clone)]
struct Checked {
    allowed: Vec<DecisionKind>,
    when: Option<Predicate>,
    description: Option<Describe>,
}

impl Checked {
    /// Whether `call` needs a decision.
    fn applies(&self, call: &ToolCall) -> bool {
        match &self.when {
            None => true,
            Some(predicate) => match call.parse_arguments::<Value>() {
                Ok(args) => predicate(&args),
                Err(_) => true,
            },
        }
    }

    fn review(&self, call: &ToolCall) -> ReviewRequest {
        let description = match &self.description {
            Some(describe) => describe(call),
            None => format!("The agent wants to call `{}`.", call.name),
        };
        ReviewRequest {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call
                .parse_arguments::<Value>()
                .unwrap_or_else(|_| Value::String(call.arguments.clone())),
            description,
            allowed_decisions: self.allowed.clone(),
        }
    }
}

/// What a human is asked about one gated call: the payload of its interrupt, and what an
/// inline [`Approver`] receives. Serializable, for a UI in another process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewRequest {
    /// The call's id: key the decision by it.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments the model wrote (a JSON string when they are not JSON).
    pub arguments: Value,
    /// What the gate says about the tool.
    pub description: String,
    /// The decisions the human may take.
    pub allowed_decisions: Vec<DecisionKind>,
}

impl ReviewRequest {
    /// The review an interrupt carries, if it is one (an interrupt from a tool's own question
    /// is not).
    pub fn from_interrupt(interrupt: &Interrupt) -> Option<Self> {
        if interrupt.allowed.is_empty() {
            return None;
        }
        ReviewRequest::deserialize(&interrupt.payload).ok()
    }
}

/// Decides gated calls while the run waits (inline mode).
///
/// Implement it for a type, or make one from a closure with [`approver_fn`].
pub trait Approver: Send + Sync + 'static {
    /// Decide on one call. An error rejects the call.
    fn review(
        &self,
        request: ReviewRequest,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send + 'static>>;
}

/// An [`Approver`] from an async closure.
///
/// ```
/// use tower_agent_core::{Decision, RunContext};
/// use tower_agent_layers::approval::{approver_fn, ReviewRequest};
///
/// let approver = approver_fn(|review: ReviewRequest, _ctx: RunContext| async move {
///     if review.arguments["cmd"].as_str().is_some_and(|c| c.starts_with("ls")) {
///         Ok(Decision::Approve)
///     } else {
///         Ok(Decision::reject("only listing is allowed"))
///     }
/// });
/// # let _ = approver;
/// ```
pub fn approver_fn<F, Fut>(f: F) -> ApproverFn<F>
where
    F: Fn(ReviewRequest, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Decision, BoxError>> + Send + 'static,
{
    ApproverFn { f }
}

/// The approver [`approver_fn`] makes.
#[derive(Clone)]
pub struct ApproverFn<F> {
    f: F,
}

impl<F> fmt::Debug for ApproverFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApproverFn").finish_non_exhaustive()
    }
}

impl<F, Fut> Approver for ApproverFn<F>
where
    F: Fn(ReviewRequest, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Decision, BoxError>> + Send + 'static,
{
    fn review(
        &self,
        request: ReviewRequest,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send + 'static>> {
        Box::pin((self.f)(request, ctx))
    }
}

#[derive(Clone)]
enum Mode {
    Interrupt,
    Inline {
        approver: Arc<dyn Approver>,
        timeout: Duration,
    },
}

struct Config {
    gates: ByName<Checked>,
    mode: Mode,
}

/// A gate names a decision that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the approval gate of tool `{tool}`: {error}")]
pub struct ConfigError {
    /// The gate's tool.
    pub tool: String,
    /// The name that is not a decision.
    #[source]
    pub error: UnknownDecision,
}

/// Builds an [`ApprovalLayer`].
#[derive(Default)]
pub struct ApprovalBuilder {
    gates: Vec<(String, Gate)>,
    approver: Option<Arc<dyn Approver>>,
    timeout: Option<Duration>,
}

impl fmt::Debug for ApprovalBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalBuilder")
            .field("gates", &self.gates)
            .field("inline", &self.approver.is_some())
            .finish_non_exhaustive()
    }
}

impl ApprovalBuilder {
    /// Gate the tool `tool` (replacing an earlier gate of the same tool).
    pub fn gate(mut self, tool: impl Into<String>, gate: Gate) -> Self {
        let tool = tool.into();
        self.gates.retain(|(name, _)| *name != tool);
        self.gates.push((tool, gate));
        self
    }

    /// Decide inline with `approver` instead of interrupting the run.
    pub fn inline(mut self, approver: impl Approver) -> Self {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// How long an inline approver has to decide ([`DEFAULT_TIMEOUT`]); then the call is
    /// rejected.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The layer; fails when a gate allows a decision that does not exist.
    pub fn build(self) -> Result<ApprovalLayer, ConfigError> {
        let mut gates = ByName::default();
        for (tool, gate) in self.gates {
            let mut allowed = Vec::with_capacity(gate.allowed.len());
            for name in &gate.allowed {
                let kind = name.parse::<DecisionKind>().map_err(|error| ConfigError {
                    tool: tool.clone(),
                    error,
                })?;
                if !allowed.contains(&kind) {
                    allowed.push(kind);
                }
            }
            let checked = Checked {
                allowed,
                when: gate.when,
                description: gate.description,
            };
            gates.insert(tool, checked);
        }
        let mode = match self.approver {
            None => Mode::Interrupt,
            Some(approver) => Mode::Inline {
                approver,
                timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            },
        };
        Ok(ApprovalLayer {
            config: Arc::new(Config { gates, mode }),
        })
    }
}

/// Human approval of gated tool calls; see the [module docs](self).
#[derive(Clone)]
pub struct ApprovalLayer {
    config: Arc<Config>,
}

impl ApprovalLayer {
    /// A builder.
    pub fn builder() -> ApprovalBuilder {
        ApprovalBuilder::default()
    }
}

impl fmt::Debug for ApprovalLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<&str> = self.config.gates.iter().map(|(name, _)| name).collect();
        tools.sort_unstable();
        f.debug_struct("ApprovalLayer")
            .field("gated", &tools)
            .field(
                "mode",
                &match self.config.mode {
                    Mode::Interrupt => "interrupt",
                    Mode::Inline { .. } => "inline",
                },
            )
            .finish()
    }
}

impl<S> Layer<S> for ApprovalLayer {
    type Service = Approval<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Approval {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`ApprovalLayer`] makes.
#[derive(Clone)]
pub struct Approval<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Approval<S> {
    /// The layer.
    pub fn layer(layer: &ApprovalLayer) -> ApprovalLayer {
        layer.clone()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Approval<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approval")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The result of a rejected call.
pub fn rejected(call: &ToolCall, reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        format!(
            "The user rejected this call of `{}`. Do not retry it unless the user asks you to.",
            call.name
        )
    } else {
        format!(
            "The user rejected this call of `{}`: {reason}. Do not retry it unless the user \
             asks you to.",
            call.name
        )
    }
}

impl<S> Service<ToolRequest> for Approval<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ToolRequest) -> Self::Future {
        let gate = match self.config.gates.get(&req.call.name) {
            Some(gate) if gate.applies(&req.call) => gate,
            _ => return ResponseFuture::pass(self.inner.call(req)),
        };
        if req.resume.is_some() {
            if let Some(edited) = take_approved(&req.ctx, &req.call.id) {
                // Approved before, then the tool asked a question of its own: the value is
                // the tool's answer.
                if let Some(arguments) = &edited {
                    req.call.arguments.clone_from(arguments);
                }
                let after = After::new(&req, edited);
                return ResponseFuture::after(self.inner.call(req), after);
            }
        }
        // The decision is this layer's: the layers and the tool inside never see it.
        if let Some(value) = req.resume.take() {
            // The agent checks decisions before resuming; a host calling the tool stack
            // directly may not have: fail closed.
            let decision = match Decision::deserialize(&value) {
                Ok(decision) => match acceptable(&decision, &gate.allowed) {
                    Ok(()) => decision,
                    Err(reason) => Decision::reject(format!("the decision {reason}")),
                },
                Err(_) => Decision::reject(format!("{value} is not a decision")),
            };
            return self.apply(req, decision);
        }
        match &self.config.mode {
            Mode::Interrupt => {
                let review = gate.review(&req.call);
                let payload = serde_json::to_value(&review).unwrap_or(Value::Null);
                ResponseFuture::ready(ToolResponse::review(
                    &req.call,
                    payload,
                    gate.allowed.iter().copied(),
                ))
            }
            Mode::Inline { approver, timeout } => {
                let review = gate.review(&req.call);
                let allowed = review.allowed_decisions.clone();
                let decided = approver.review(review, req.ctx.clone());
                let timeout = *timeout;
                // The ready service goes with the future; this one gets a fresh clone (tower's
                // "be careful when cloning inner services").
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::boxed(async move {
                    let decision = match tokio::time::timeout(timeout, decided).await {
                        Ok(Ok(decision)) => match acceptable(&decision, &allowed) {
                            Ok(()) => decision,
                            Err(reason) => {
                                let reason = format!("the approver's decision {reason}");
                                warn(&req.ctx, &req.call, &reason).await;
                                Decision::reject(reason)
                            }
                        },
                        Ok(Err(error)) => {
                            let reason = format!("the approval failed ({error})");
                            warn(&req.ctx, &req.call, &reason).await;
                            Decision::reject(reason)
                        }
                        Err(_) => {
                            let reason =
                                format!("no decision within {} s", timeout.as_secs_f64().round());
                            warn(&req.ctx, &req.call, &reason).await;
                            Decision::reject(reason)
                        }
                    };
                    let mut inner = inner;
                    match decided_request(req, decision) {
                        Decided::Answer(response) => Ok(response),
                        Decided::Run(req, edited) => {
                            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                            let after = After::new(&req, edited);
                            let response = inner.call(req).await?;
                            after.done(&response);
                            Ok(response)
                        }
                    }
                })
            }
        }
    }
}

impl<S> Approval<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    /// Apply a decision known now (on resume): the inner service is ready.
    fn apply(
        &mut self,
        req: ToolRequest,
        decision: Decision,
    ) -> ResponseFuture<S::Future, S::Error> {
        match decided_request(req, decision) {
            Decided::Answer(response) => ResponseFuture::ready(response),
            Decided::Run(req, edited) => {
                let after = After::new(&req, edited);
                ResponseFuture::after(self.inner.call(req), after)
            }
        }
    }
}

/// Whether `decision` is one of `allowed`, with edited arguments that are a JSON object.
fn acceptable(decision: &Decision, allowed: &[DecisionKind]) -> Result<(), String> {
    if !allowed.contains(&decision.kind()) {
        return Err(format!(
            "`{}` is not allowed for this tool",
            decision.kind()
        ));
    }
    match decision {
        Decision::Edit { arguments } if !arguments.is_object() => {
            Err("`edit` needs arguments that are a JSON object".to_owned())
        }
        _ => Ok(()),
    }
}

enum Decided {
    /// Answered without running the tool.
    Answer(ToolResponse),
    /// Run this request; with the edited arguments to record.
    Run(ToolRequest, Option<String>),
}

fn decided_request(mut req: ToolRequest, decision: Decision) -> Decided {
    match decision {
        Decision::Approve => Decided::Run(req, None),
        Decision::Edit { arguments } => {
            let arguments = arguments.to_string();
            req.call.arguments.clone_from(&arguments);
            Decided::Run(req, Some(arguments))
        }
        Decision::Reject { reason } => {
            Decided::Answer(ToolResponse::error(&req.call, rejected(&req.call, &reason)))
        }
        Decision::Respond { text } => Decided::Answer(ToolResponse::success(&req.call, text)),
        // A decision kind added later: not understood, so not run.
        _ => Decided::Answer(ToolResponse::error(
            &req.call,
            rejected(&req.call, "the decision was not understood"),
        )),
    }
}

/// The key, in the session's JSON state, of approved calls that then asked a question of
/// their own (so the value they resume with is theirs, not a decision).
pub const STATE_KEY: &str = "tower_agent.approval";

fn is_interrupt(response: &ToolResponse) -> bool {
    matches!(response.action, ToolAction::Interrupt(_))
}

/// Note that the approved call `id` (run with `edited` arguments, if any) now waits for its
/// own question.
fn remember_approved(ctx: &RunContext, id: &str, edited: Option<&str>) {
    ctx.with_state(|state| {
        let entry = state
            .entry(STATE_KEY)
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Value::Object(approved) = entry {
            approved.insert(id.to_owned(), edited.map_or(Value::Null, Value::from));
        }
    });
}

/// Whether the call `id` was approved before it asked its own question: `Some(edited
/// arguments)`; takes it off the list.
fn take_approved(ctx: &RunContext, id: &str) -> Option<Option<String>> {
    ctx.with_state(|state| {
        let Value::Object(approved) = state.get_mut(STATE_KEY)? else {
            return None;
        };
        let edited = approved.remove(id)?;
        if approved.is_empty() {
            state.remove(STATE_KEY);
        }
        Some(edited.as_str().map(str::to_owned))
    })
}

/// What follows an approved call: the edited arguments are recorded for the history
/// ([`RunContext::record_arguments`]), or, when the tool asks a question of its own, the
/// approval is remembered for the next resume.
struct After {
    ctx: RunContext,
    id: String,
    edited: Option<String>,
}

impl After {
    fn new(req: &ToolRequest, edited: Option<String>) -> Self {
        Self {
            ctx: req.ctx.clone(),
            id: req.call.id.clone(),
            edited,
        }
    }

    fn done(self, response: &ToolResponse) {
        if is_interrupt(response) {
            remember_approved(&self.ctx, &self.id, self.edited.as_deref());
        } else if let Some(arguments) = self.edited {
            self.ctx.record_arguments(self.id, arguments);
        }
    }
}

async fn warn(ctx: &RunContext, call: &ToolCall, reason: &str) {
    tracing::warn!(tool = %call.name, call_id = %call.id, reason, "approval rejected the call");
    if ctx.events().is_enabled() {
        let message = format!("`{}` ({}) rejected: {reason}", call.name, call.id);
        // A failing observer must not turn a rejection into an approval: ignore it here.
        let _ = ctx
            .emit(Event::Warning {
                source: "approval",
                message,
            })
            .await;
    }
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<ToolResponse, E>> + Send>>;

pin_project! {
    /// The response future of [`Approval`]: the inner service's future when the call passes
    /// through, a ready answer, or a boxed review (inline mode only).
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        Pass {
            #[pin]
            future: F,
            // Set for an approved call.
            after: Option<After>,
        },
        Ready { response: Option<ToolResponse> },
        Boxed { future: BoxFuture<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    fn pass(future: F) -> Self {
        Self {
            kind: Kind::Pass {
                future,
                after: None,
            },
        }
    }

    fn after(future: F, after: After) -> Self {
        Self {
            kind: Kind::Pass {
                future,
                after: Some(after),
            },
        }
    }

    fn ready(response: ToolResponse) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    fn boxed(future: impl Future<Output = Result<ToolResponse, E>> + Send + 'static) -> Self {
        Self {
            kind: Kind::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<ToolResponse, E>>,
{
    type Output = Result<ToolResponse, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Pass { future, after } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => {
                    if let Some(after) = after.take() {
                        after.done(&response);
                    }
                    Poll::Ready(Ok(response))
                }
                other => other,
            },
            KindProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
