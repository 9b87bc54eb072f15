//! Human-in-the-loop approval of tool calls (`before_tool`).
//!
//! A [`Gate`] per tool says which calls need a decision (all of them, or those whose
//! arguments match a predicate), which [`Decision`]s the human may take, and what to show
//! them. Calls of other tools pass straight through. A gated call is decided either
//!
//! - **inline**: an [`Human`] (a terminal prompt, a web socket to a UI) decides while the
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
//! | edit | runs once with the edited arguments | the tool's; **the call in the history shows the edited arguments** (the history records what ran: the response says so in [`ToolResponse::arguments`]) |
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

mod future;
mod gate;

pub use future::{ResponseFuture, STATE_KEY};
pub use gate::{ApprovalBuilder, ConfigError, Gate, GateProblem, ReviewRequest};

pub use crate::ask::{DEFAULT_TIMEOUT, Human, HumanFn, human_fn};

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::{
    Decision, DecisionKind, Event, RunContext, ToolCall, ToolRequest, ToolResponse,
    decision::DecisionError,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::ask::{self, Answer, Decided};
use future::{Approved, take_approved};
use gate::{Config, Mode};

/// What an approval call's future is inside.
type Asked<S> = ask::ResponseFuture<
    <S as Service<ToolRequest>>::Future,
    <S as Service<ToolRequest>>::Error,
    Option<Approved>,
>;

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

    tower_agent_core::inner_service_accessors!();
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

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for Approval<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
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

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        ResponseFuture::new(self.decide(req))
    }
}

impl<S> Approval<S>
where
    S: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    fn decide(&mut self, mut req: ToolRequest) -> Asked<S> {
        let gate = match self.config.gates.get(&req.call.name) {
            // A call an earlier run started is recovered, not made again: it was approved
            // then (or not gated), and what became of it is not a human's to decide.
            Some(gate) if gate.applies(&req.call) && !req.recover => gate,
            _ => return ask::ResponseFuture::inner(self.inner.call(req), None),
        };
        if req.resume.is_some() {
            if let Some(edited) = take_approved(&req.ctx, &req.call.id) {
                // Approved before, then the tool asked a question of its own: the value is
                // the tool's answer.
                if let Some(arguments) = &edited {
                    req.call.arguments.clone_from(arguments);
                }
                let after = Approved::new(&req, edited);
                return ask::ResponseFuture::inner(self.inner.call(req), Some(after));
            }
        }
        // The decision is this layer's: the layers and the tool inside never see it.
        if let Some(value) = req.resume.take() {
            // The agent checks decisions before resuming; a host calling the tool stack
            // directly may not have: fail closed. So does a decision without this call's
            // token, when decisions are signed.
            let decision = match Decision::deserialize(&value) {
                Ok(_) if !self.config.verifies(&req.call, &value) => {
                    Decision::reject("the decision does not carry this call's token")
                }
                Ok(decision) => match acceptable(&decision, &gate.allowed) {
                    Ok(()) => decision,
                    Err(reason) => Decision::reject(format!("the decision {reason}")),
                },
                Err(_) => Decision::reject(format!("{value} is not a decision")),
            };
            // Known now: the inner service is ready.
            return match decided(req, decision) {
                Decided::Answer(response) => ask::ResponseFuture::ready(response),
                Decided::Run(req, after) => ask::ResponseFuture::inner(self.inner.call(req), after),
            };
        }
        match &self.config.mode {
            Mode::Interrupt => {
                let mut review = gate.review(&req.call);
                review.token = self.config.token(&req.call);
                let payload = serde_json::to_value(&review).unwrap_or(Value::Null);
                ask::ResponseFuture::ready(ToolResponse::review(
                    &req.call,
                    payload,
                    gate.allowed.iter().copied(),
                ))
            }
            Mode::Inline { approver, timeout } => {
                let review = gate.review(&req.call);
                let allowed = review.allowed_decisions.clone();
                let asked = approver.ask(review, req.ctx.clone());
                let timeout = *timeout;
                ask::inline(&mut self.inner, async move {
                    let decision = match ask::within(asked, timeout).await {
                        Answer::Given(decision) => acceptable(&decision, &allowed)
                            .map(|()| decision)
                            .map_err(|reason| format!("the approver's decision {reason}")),
                        Answer::Failed(error) => Err(format!("the approval failed ({error})")),
                        Answer::Late(waited) => Err(format!(
                            "no decision within {} s",
                            waited.as_secs_f64().round()
                        )),
                    };
                    let decision = match decision {
                        Ok(decision) => decision,
                        Err(reason) => {
                            warn(&req.ctx, &req.call, &reason).await;
                            Decision::reject(reason)
                        }
                    };
                    decided(req, decision)
                })
            }
        }
    }
}

/// Whether `decision` may be taken for this tool ([`Decision::check`]), in the words the model
/// sees.
fn acceptable(decision: &Decision, allowed: &[DecisionKind]) -> Result<(), String> {
    decision.check(allowed).map_err(|problem| match problem {
        DecisionError::NotAllowed(kind) => format!("`{kind}` is not allowed for this tool"),
        _ => "`edit` needs arguments that are a JSON object".to_owned(),
    })
}

/// What `decision` does with the call: answer it, or run it (with the edited arguments).
fn decided(mut req: ToolRequest, decision: Decision) -> Decided<Option<Approved>> {
    match decision {
        Decision::Approve => {
            let after = Approved::new(&req, None);
            Decided::Run(req, Some(after))
        }
        Decision::Edit { arguments } => {
            let arguments = arguments.to_string();
            req.call.arguments.clone_from(&arguments);
            let after = Approved::new(&req, Some(arguments));
            Decided::Run(req, Some(after))
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

/// Human approval of gated tool calls, on the tools.
impl tower_agent_loop::Builtin for ApprovalLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ToolSlot;
        stacks.tools(ToolSlot::Approval, self);
    }
}
