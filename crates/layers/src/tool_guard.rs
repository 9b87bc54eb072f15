//! A guard on each tool call: a policy reads the call before it runs and allows it, denies it
//! or revises its arguments. A denied call is answered with the reason as an error result and
//! the run goes on (the model may try something else); a revised call runs with the policy's
//! arguments, and the history shows the call as it ran.
//!
//! Unlike the guardrails of [`guardrail`](crate::guardrail), which end the run when they trip,
//! a guard acts on one call. The policy is an async closure: it may ask a policy server.
//!
//! ```
//! use serde_json::json;
//! use tower::{Layer, ServiceExt};
//! use tower_agent_core::{Error, RunContext, ToolCall, ToolRequest};
//! use tower_agent_layers::tool_guard::{ToolGuardLayer, ToolVerdict};
//! use tower_agent_test::StubTool;
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let shell = StubTool::returning("shell", "done");
//! let tools = ToolGuardLayer::new(|call: ToolCall, _ctx: RunContext| async move {
//!     let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_default();
//!     match args["cmd"].as_str() {
//!         Some(cmd) if cmd.contains("rm -rf /") => ToolVerdict::deny("it would wipe the disk"),
//!         Some(cmd) if !cmd.starts_with("timeout ") => {
//!             ToolVerdict::revise(json!({"cmd": format!("timeout 60 {cmd}")}))
//!         }
//!         _ => ToolVerdict::Allow,
//!     }
//! })
//! .layer(ToolSet::new().tool(shell.clone()));
//!
//! let call = |args| ToolRequest::new(ToolCall::new("c1", "shell", args), RunContext::new());
//! let denied = tools.clone().oneshot(call(json!({"cmd": "rm -rf /"}))).await?;
//! assert!(denied.result.is_error);
//! assert!(denied.result.content.contains("it would wipe the disk"));
//! assert!(shell.calls().is_empty(), "a denied call never reaches the tool");
//!
//! let revised = tools.oneshot(call(json!({"cmd": "make"}))).await?;
//! assert_eq!(revised.result.content, "done");
//! assert_eq!(revised.arguments.as_deref(), Some(r#"{"cmd":"timeout 60 make"}"#));
//! assert_eq!(shell.calls()[0].arguments, r#"{"cmd":"timeout 60 make"}"#);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::Value;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    DescribeTools, Error, Event, LayerEvent, RunContext, ToolCall, ToolRequest, ToolResponse,
    ToolSpec,
};
use tower_layer::Layer;
use tower_service::Service;

/// What a guard's policy says of one tool call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ToolVerdict {
    /// Run the call as the model wrote it.
    Allow,
    /// Do not run the call; the model gets `reason` in its error result.
    Deny {
        /// Why, for the model.
        reason: String,
    },
    /// Run the call with these arguments (a JSON object) instead of the model's.
    Revise {
        /// The arguments to run with.
        arguments: Value,
    },
}

impl ToolVerdict {
    /// Do not run the call, for `reason`.
    pub fn deny(reason: impl Into<String>) -> Self {
        ToolVerdict::Deny {
            reason: reason.into(),
        }
    }

    /// Run the call with `arguments` instead.
    pub fn revise(arguments: Value) -> Self {
        ToolVerdict::Revise { arguments }
    }
}

/// A call a guard denied or revised: what a host shows beside the call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolGuarded {
    /// The call's id.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// `None` when the call was denied; the arguments it ran with when it was revised.
    pub revised: Option<String>,
    /// Why it was denied (empty when revised).
    pub reason: String,
}

impl LayerEvent for ToolGuarded {
    const NAME: &'static str = "tool_guarded";
}

impl fmt::Display for ToolGuarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revised {
            Some(arguments) => write!(f, "`{}` ({}) revised: {arguments}", self.tool, self.call_id),
            None => write!(
                f,
                "`{}` ({}) denied: {}",
                self.tool, self.call_id, self.reason
            ),
        }
    }
}

type Policy = Arc<dyn Fn(ToolCall, RunContext) -> BoxFuture<'static, ToolVerdict> + Send + Sync>;

/// Guards each tool call with a policy ([`ToolVerdict`]); see the [module](self).
///
/// On the agent, it sits right inside the call limits (a denied call still counts, so a model
/// that insists is stopped) and outside the checkpoint and approval (a human is never asked
/// about a call the policy denies, and approves revised arguments).
#[derive(Clone)]
pub struct ToolGuardLayer {
    policy: Policy,
}

impl ToolGuardLayer {
    /// A guard that asks `policy` about every tool call before it runs.
    pub fn new<F, Fut>(policy: F) -> Self
    where
        F: Fn(ToolCall, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolVerdict> + Send + 'static,
    {
        Self {
            policy: Arc::new(move |call, ctx| Box::pin(policy(call, ctx))),
        }
    }
}

impl fmt::Debug for ToolGuardLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolGuardLayer").finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ToolGuardLayer {
    type Service = ToolGuard<S>;

    fn layer(&self, inner: S) -> ToolGuard<S> {
        ToolGuard {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// The tool service of [`ToolGuardLayer`].
#[derive(Clone)]
pub struct ToolGuard<S> {
    inner: S,
    policy: Policy,
}

impl<S: fmt::Debug> fmt::Debug for ToolGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolGuard")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S: DescribeTools> DescribeTools for ToolGuard<S> {
    fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

impl<S> Service<ToolRequest> for ToolGuard<S>
where
    S: Service<ToolRequest, Response = ToolResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = ToolResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<ToolResponse, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ToolRequest) -> Self::Future {
        // The service that was made ready serves this call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // A call an earlier run started is recovered, not made again: the policy saw it then,
        // and what became of it must reach the session whatever the policy says now.
        if req.recover {
            return Box::pin(async move { inner.call(req).await });
        }
        let verdict = (self.policy)(req.call.clone(), req.ctx.clone());
        Box::pin(async move {
            match verdict.await {
                ToolVerdict::Allow => inner.call(req).await,
                ToolVerdict::Revise { arguments } if arguments.is_object() => {
                    let arguments = arguments.to_string();
                    req.call.arguments.clone_from(&arguments);
                    tell(&req.ctx, &req.call, Some(arguments.clone()), String::new()).await;
                    let mut response = inner.call(req).await?;
                    // A layer further in that changed them again knows better.
                    response.arguments.get_or_insert(arguments);
                    Ok(response)
                }
                ToolVerdict::Revise { .. } => {
                    let reason = "the guard's revised arguments are not a JSON object";
                    Ok(deny(&req, reason.to_owned()).await)
                }
                ToolVerdict::Deny { reason } => Ok(deny(&req, reason).await),
            }
        })
    }
}

/// The call answered with `reason`, in the words the model sees.
async fn deny(req: &ToolRequest, reason: String) -> ToolResponse {
    let call = &req.call;
    tracing::info!(tool = %call.name, call_id = %call.id, %reason, "a guard denied the call");
    let content = format!(
        "This call of `{}` was denied by policy: {}. Do not retry it as it is.",
        call.name,
        reason.trim()
    );
    tell(&req.ctx, call, None, reason).await;
    ToolResponse::error(call, content)
}

async fn tell(ctx: &RunContext, call: &ToolCall, revised: Option<String>, reason: String) {
    if ctx.events().is_enabled() {
        let event = ToolGuarded {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            revised,
            reason,
        };
        // A failing observer must not turn a denial into a run: ignore it here.
        let _ = ctx.emit(Event::layer(event)).await;
    }
}

/// The guard on the tools, right inside the call limits.
impl tower_agent_loop::Builtin for ToolGuardLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::ToolSlot;
        stacks.tools(ToolSlot::Guard, self);
    }
}
