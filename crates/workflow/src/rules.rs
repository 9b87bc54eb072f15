//! Tool rules: tools that must run first, tools that must have run before the run ends, tools
//! that end it, and heartbeats that keep it going.
//!
//! [`ToolRulesLayer`] is one value added to the **model** and the **tool** stacks (like the
//! call limits of `tower-agent-layers`):
//!
//! | rule | method | what happens |
//! |---|---|---|
//! | start constraint | [`start_with`](ToolRulesLayer::start_with) | until the tool has run successfully (in this run or earlier in the session), a model answer that does not call it first is replaced by a call to it: the agent executes it itself, the history shows the call and its result |
//! | exit requirement | [`require_before_exit`](ToolRulesLayer::require_before_exit) | a model answer that would end the run (no tool call) before the tool ran successfully in this run is replaced by a call to it; the model is then asked again |
//! | exit tool | [`exit_on`](ToolRulesLayer::exit_on) | once the tool ran successfully, the run stops after the round: `Outcome::Stopped` with `StopReason::Tool`, the reason naming the rule |
//! | heartbeat | (always) | a call whose arguments, or whose result, hold `"request_heartbeat": true` keeps the run going where it would stop (an exit tool, a tool's own stop) |
//!
//! A forced call is tried at most [`attempts`](ToolRulesLayer::attempts) times (2); when it
//! still has not succeeded, the run stops ([`ModelResponse::stop`]) with a reason that names the
//! rule, before the next model or tool call. A forced call has the id `rule_{tool}_{n}` and
//! the arguments given to the rule.
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, Error, ModelResponse, Session};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//! use tower_agent_workflow::rules::ToolRulesLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let rules = ToolRulesLayer::new().start_with("load_context", json!({}));
//! let model = ServiceBuilder::new()
//!     .layer(rules.clone())
//!     .service(ScriptedModel::new([ModelResponse::text("skipping ahead"), ModelResponse::text("done")]));
//! let tools = ServiceBuilder::new()
//!     .layer(rules)
//!     .service(ToolSet::new().tool(StubTool::returning("load_context", "the context")));
//! let res = Agent::new(model, tools).oneshot(AgentRequest::new(Session::new(), "go")).await?;
//! // The model skipped `load_context`: the agent ran it, then asked the model again.
//! let names: Vec<String> = res.session.history.iter().flat_map(|m| m.tool_calls()).map(|c| c.name.clone()).collect();
//! assert_eq!(names, ["load_context"]);
//! assert_eq!(res.text().as_deref(), Some("done"));
//! # Ok(())
//! # }
//! ```
//!
//! [`ModelResponse::stop`]: tower_agent_core::ModelResponse::stop

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use serde_json::Value;
use tower_agent_core::{
    ExtensionKey, FinishReason, Message, ModelRequest, ModelResponse, Role, RunContext, StopReason,
    ToolAction, ToolCall, ToolRequest, ToolResponse,
};
use tower_layer::Layer;
use tower_service::Service;

#[derive(Debug, Clone)]
struct Forced {
    tool: String,
    arguments: Value,
}

#[derive(Debug, Default, Clone)]
struct Config {
    start: Vec<Forced>,
    exit: Vec<Forced>,
    exit_tools: Vec<String>,
    attempts: u32,
    /// Where this layer keeps a run's rules in the run's extensions.
    runs: ExtensionKey<Shared>,
}

/// Applies [`ToolRules`]; see the [module docs](self). The same value goes on the model and
/// the tool stack.
#[derive(Clone, Debug)]
pub struct ToolRulesLayer {
    config: Arc<Config>,
}

impl Default for ToolRulesLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolRulesLayer {
    /// The default of [`ToolRulesLayer::attempts`].
    pub const DEFAULT_ATTEMPTS: u32 = 2;

    /// No rule yet.
    pub fn new() -> Self {
        Self {
            config: Arc::new(Config {
                attempts: Self::DEFAULT_ATTEMPTS,
                ..Config::default()
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// `tool` must run (successfully) before any other; if the model does not call it first,
    /// the agent calls it with `arguments`.
    pub fn start_with(self, tool: impl Into<String>, arguments: Value) -> Self {
        let tool = tool.into();
        self.edit(|c| c.start.push(Forced { tool, arguments }))
    }

    /// `tool` must have run (successfully) in the run before it may end; if the model tries to
    /// finish without it, the agent calls it with `arguments`.
    pub fn require_before_exit(self, tool: impl Into<String>, arguments: Value) -> Self {
        let tool = tool.into();
        self.edit(|c| c.exit.push(Forced { tool, arguments }))
    }

    /// A successful call of `tool` ends the run after its round (unless a heartbeat asks for
    /// another turn).
    pub fn exit_on(self, tool: impl Into<String>) -> Self {
        let tool = tool.into();
        self.edit(|c| c.exit_tools.push(tool))
    }

    /// How many times a rule's tool is forced before the run stops (at least 1).
    pub fn attempts(self, attempts: u32) -> Self {
        self.edit(|c| c.attempts = attempts.max(1))
    }
}

impl<S> Layer<S> for ToolRulesLayer {
    type Service = ToolRules<S>;

    fn layer(&self, inner: S) -> ToolRules<S> {
        ToolRules {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// Enforces tool rules on the model and the tool service; see the [module docs](self).
#[derive(Clone)]
pub struct ToolRules<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ToolRules<S> {
    /// Wrap `inner` with the rules of `layer`.
    pub fn new(inner: S, layer: &ToolRulesLayer) -> Self {
        layer.layer(inner)
    }

    tower_agent_core::inner_service_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for ToolRules<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRules")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// What a run's rules know: the tools that succeeded, and how often each rule forced its tool.
#[derive(Default)]
struct RunRules {
    /// The session's history was searched for earlier successes (start rules).
    searched: bool,
    succeeded: Vec<String>,
    forced: Vec<(String, u32)>,
}

impl RunRules {
    fn succeeded(&self, tool: &str) -> bool {
        self.succeeded.iter().any(|t| t == tool)
    }

    fn record(&mut self, tool: &str) {
        if !self.succeeded(tool) {
            self.succeeded.push(tool.to_owned());
        }
    }

    /// Count one more forced call of `tool`; the number of this one.
    fn force(&mut self, tool: &str) -> u32 {
        match self.forced.iter_mut().find(|(t, _)| t == tool) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.forced.push((tool.to_owned(), 1));
                1
            }
        }
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<RunRules>>);

/// Run `f` on the run's rules of the layer configured by `config`.
fn with<R>(config: &Config, ctx: &RunContext, f: impl FnOnce(&mut RunRules) -> R) -> R {
    let shared = ctx.extension_at_or_insert_with(&config.runs, Shared::default);
    let mut rules = shared
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut rules)
}

/// Whether `text` asks for another model turn: a JSON object with `"request_heartbeat": true`.
fn heartbeat(text: &str) -> bool {
    text.contains("request_heartbeat")
        && serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.get("request_heartbeat").and_then(Value::as_bool))
            .unwrap_or(false)
}

impl<S> Service<ModelRequest> for ToolRules<S>
where
    S: Service<ModelRequest, Response = ModelResponse>,
{
    type Response = ModelResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let config = &self.config;
        let ctx = req.ctx.clone();
        if !config.start.is_empty() {
            // Once per run: a start tool that succeeded earlier in the session counts.
            let messages = &req.messages;
            with(config, &ctx, |rules| {
                if !rules.searched {
                    rules.searched = true;
                    for result in messages
                        .iter()
                        .filter(|m| m.role == Role::Tool)
                        .flat_map(Message::tool_results)
                        .filter(|r| !r.is_error)
                    {
                        if config.start.iter().any(|f| f.tool == result.name) {
                            rules.record(&result.name);
                        }
                    }
                }
            });
        }
        let pending = (!config.start.is_empty() || !config.exit.is_empty())
            .then(|| (Arc::clone(config), ctx, Side::Model));
        ResponseFuture {
            inner: self.inner.call(req),
            pending,
            heartbeat: false,
        }
    }
}

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for ToolRules<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S> Service<ToolRequest> for ToolRules<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        let asked = heartbeat(&req.call.arguments);
        let pending = Some((Arc::clone(&self.config), req.ctx.clone(), Side::Tool));
        ResponseFuture {
            inner: self.inner.call(req),
            pending,
            heartbeat: asked,
        }
    }
}

#[derive(Clone, Copy)]
enum Side {
    Model,
    Tool,
}

pin_project_lite::pin_project! {
    /// The response future of [`ToolRules`]: the inner future, then the rules, at once.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        pending: Option<(Arc<Config>, RunContext, Side)>,
        heartbeat: bool,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// A response the rules may change.
trait Ruled: Sized {
    fn apply(self, config: &Config, ctx: &RunContext, side: Side, heartbeat: bool) -> Self;
}

impl Ruled for ModelResponse {
    fn apply(self, config: &Config, ctx: &RunContext, _side: Side, _heartbeat: bool) -> Self {
        model_rules(self, config, ctx)
    }
}

impl Ruled for ToolResponse {
    fn apply(self, config: &Config, ctx: &RunContext, _side: Side, heartbeat: bool) -> Self {
        tool_rules(self, config, ctx, heartbeat)
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, E>>,
    R: Ruled,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        Poll::Ready(Ok(match this.pending.take() {
            Some((config, ctx, side)) => response.apply(&config, &ctx, side, *this.heartbeat),
            None => response,
        }))
    }
}

/// The model side: force a start tool the model skipped, or an exit requirement it did not
/// meet.
fn model_rules(response: ModelResponse, config: &Config, ctx: &RunContext) -> ModelResponse {
    let first_call = response.message.tool_calls().next().map(|c| c.name.clone());
    let finishing = first_call.is_none();
    with(config, ctx, |rules| {
        let start = config
            .start
            .iter()
            .find(|f| !rules.succeeded(&f.tool) && first_call.as_deref() != Some(&f.tool));
        let exit = || {
            finishing
                .then(|| config.exit.iter().find(|f| !rules.succeeded(&f.tool)))
                .flatten()
        };
        let (rule, what) = match (start, start.is_none().then(exit).flatten()) {
            (Some(rule), _) => (rule, "must run first"),
            (None, Some(rule)) => (rule, "must run before the run ends"),
            (None, None) => return response,
        };
        let n = rules.force(&rule.tool);
        if n > config.attempts {
            let mut response = response;
            response.stop = Some(StopReason::Layer {
                reason: format!(
                    "tool rule: `{}` {what}, and it did not succeed in {} forced attempts",
                    rule.tool, config.attempts
                ),
            });
            return response;
        }
        let call = ToolCall::new(
            format!("rule_{}_{n}", rule.tool),
            rule.tool.clone(),
            rule.arguments.clone(),
        );
        tracing::debug!(target: "tower_agent::rules", tool = %rule.tool, "{what}: forced");
        // The model's message is replaced; what the layers inside did is kept.
        let mut forced = response;
        forced.message = Message::assistant_with_calls("", [call]);
        forced.finish_reason = FinishReason::ToolCalls;
        forced
    })
}

/// The tool side: record successes; end the run after an exit tool unless a heartbeat asks
/// for another turn.
fn tool_rules(
    mut response: ToolResponse,
    config: &Config,
    ctx: &RunContext,
    asked: bool,
) -> ToolResponse {
    if response.is_interrupt() {
        return response;
    }
    let ok = !response.result.is_error;
    // Successes matter only to the rules that force tools.
    if ok && (!config.start.is_empty() || !config.exit.is_empty()) {
        with(config, ctx, |rules| rules.record(&response.result.name));
    }
    let name = &response.result.name;
    let exits = ok && config.exit_tools.iter().any(|t| t == name);
    let stops = matches!(response.action, ToolAction::Stop { .. });
    if !exits && !stops {
        return response;
    }
    // Only where the run would stop is the result searched for a heartbeat.
    if asked || heartbeat(&response.result.content) {
        response.action = ToolAction::Continue;
    } else if exits {
        response.action = ToolAction::Stop(StopReason::Tool {
            call_id: response.result.call_id.clone(),
            name: name.clone(),
            reason: format!("tool rule: `{name}` ends the run"),
        });
    }
    response
}
