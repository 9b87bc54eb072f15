//! Model-call and tool-call limits, per run and per session, global or per tool
//! (`before_model` + `before_tool`).
//!
//! One [`CallLimitsLayer`] value goes on both stacks (`.layer(limits.clone())` on the model
//! and on the tools): the model side counts model calls, the tool side counts tool calls.
//! "Reached" is not "exceeded": a limit of 3 allows 3 calls and blocks the 4th. A blocked
//! call is not counted. What happens to it is the limit's [`Exit`]:
//!
//! | exit | a blocked tool call | a blocked model call |
//! |---|---|---|
//! | [`Exit::Continue`] | an error result the model sees; the run goes on | as `End` (a model call has no result to give) |
//! | [`Exit::End`] (default) | a "not executed" result, then the run ends [`Outcome::Stopped`] with [`StopReason::Limit`] | not made; the run ends stopped |
//! | [`Exit::Error`] | the model's message asking for it fails the run with [`ErrorKind::LimitReached`] before any of its calls runs | the run fails with [`ErrorKind::LimitReached`] |
//!
//! Every tool call keeps a result in each case (a parallel batch included), and a failed run
//! returns its session, as any failed run does. `Exit::Error` for tool calls is checked on the
//! model side, when the model asks for the calls: put the layer on both stacks (on the tool
//! stack alone it ends the run like `End`).
//!
//! Counts per run live in the run context; counts per session in the session's JSON state
//! (key `tower_agent.calls`), so they persist with the session. A call that resumes after an
//! interrupt ([`ToolRequest::resume`] set) is not counted again: it was counted when it first
//! came through, so put this layer outside the approval layer.
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, ModelResponse, Outcome, Session, StopReason, ToolCall};
//! use tower_agent_layers::limits::{CallLimitsLayer, Limit};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! let limits = CallLimitsLayer::new()
//!     .model_calls(Limit::per_run(10))
//!     .tool("search", Limit::per_run(2));
//! let search = StubTool::returning("search", "3 hits");
//! let model = ScriptedModel::from_fn(|req| {
//!     let n = req.ctx.round();
//!     Ok(ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "search", json!({}))]))
//! });
//! let model = ServiceBuilder::new().layer(limits.clone()).service(model);
//! let tools = ServiceBuilder::new().layer(limits).service(ToolSet::new().tool(search.clone()));
//!
//! let res = Agent::new(model, tools).oneshot(AgentRequest::new(Session::new(), "look")).await?;
//! let Outcome::Stopped { reason, progress } = &res.outcome else { unreachable!() };
//! assert_eq!(*reason, StopReason::Limit { name: "`search` calls per run".into(), limit: 2 });
//! assert_eq!(progress.to_string(), "search ✓ → search ✓ → search ✗");
//! assert_eq!(search.calls().len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`Outcome::Stopped`]: tower_agent_core::Outcome::Stopped

use crate::by_name::ByName;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use serde_json::{Map, Value};
use tower_agent_core::{
    Error, ErrorKind, ModelRequest, ModelResponse, RunContext, StopReason, ToolAction, ToolRequest,
    ToolResponse,
};
use tower_layer::Layer;
use tower_service::Service;

/// The key of the session counts in the JSON state.
pub const STATE_KEY: &str = "tower_agent.calls";

/// What happens to a call a limit blocks (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Exit {
    /// The blocked tool call gets an error result the model sees; the run goes on.
    Continue,
    /// The run ends gracefully: outcome stopped, every call answered.
    #[default]
    End,
    /// The run fails with [`ErrorKind::LimitReached`].
    Error,
}

/// A limit on a number of calls, per run, per session, or both.
///
/// ```
/// use tower_agent_layers::limits::{Exit, Limit};
///
/// let limit = Limit::per_run(20).and_per_session(200).exit(Exit::Continue);
/// # let _ = limit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    run: Option<u32>,
    session: Option<u32>,
    exit: Exit,
}

impl Limit {
    /// At most `n` calls in one run.
    pub fn per_run(n: u32) -> Self {
        Self {
            run: Some(n),
            session: None,
            exit: Exit::End,
        }
    }

    /// At most `n` calls over the session's life.
    pub fn per_session(n: u32) -> Self {
        Self {
            run: None,
            session: Some(n),
            exit: Exit::End,
        }
    }

    /// Also at most `n` calls over the session's life.
    pub fn and_per_session(mut self, n: u32) -> Self {
        self.session = Some(n);
        self
    }

    /// Also at most `n` calls in one run.
    pub fn and_per_run(mut self, n: u32) -> Self {
        self.run = Some(n);
        self
    }

    /// What happens to a blocked call ([`Exit::End`] by default).
    pub fn exit(mut self, exit: Exit) -> Self {
        self.exit = exit;
        self
    }
}

/// One limited scope: a limit and where its counts are.
#[derive(Debug, Clone)]
struct Scope {
    /// In words, without "per run": `model calls`, `tool calls`, `` `search` calls ``.
    name: String,
    /// The key of its session count.
    key: String,
    limit: Limit,
    /// Its index in the run counts.
    slot: usize,
}

/// Which limit blocked a call.
struct Blocked<'a> {
    scope: &'a Scope,
    limit: u32,
    per: &'static str,
}

impl Blocked<'_> {
    fn name(&self) -> String {
        format!("{} per {}", self.scope.name, self.per)
    }

    fn reason(&self) -> StopReason {
        StopReason::Limit {
            name: self.name(),
            limit: self.limit,
        }
    }

    fn message(&self) -> String {
        format!(
            "not executed: the limit of {} {} was reached; do not call it again in this {}",
            self.limit,
            self.name(),
            self.per
        )
    }

    fn error(&self) -> Error {
        Error::new(
            ErrorKind::LimitReached,
            format!("the limit of {} {} was reached", self.limit, self.name()),
        )
    }
}

#[derive(Debug, Clone)]
struct Config {
    /// Tells this layer's run counts from another's.
    id: u64,
    model: Option<Scope>,
    tools: Option<Scope>,
    per_tool: ByName<Scope>,
    /// Whether a tool scope fails the run: the model side then checks the calls it asks for.
    tool_errors: bool,
    slots: usize,
}

/// One layer's run counts, one per scope slot, by layer id.
type LayerCounts = (u64, Vec<u32>);

/// The run counts of every limits layer, in the run context.
#[derive(Clone, Default)]
struct RunCounts(Arc<Mutex<Vec<LayerCounts>>>);

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Model-call and tool-call limits; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct CallLimitsLayer {
    config: Arc<Config>,
}

impl Default for CallLimitsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl CallLimitsLayer {
    /// No limit yet.
    pub fn new() -> Self {
        Self {
            config: Arc::new(Config {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                model: None,
                tools: None,
                per_tool: ByName::default(),
                tool_errors: false,
                slots: 0,
            }),
        }
    }

    fn with(self, scope: impl FnOnce(&mut Config, usize)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        // Another configuration: its own run counts.
        config.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let slot = config.slots;
        config.slots += 1;
        scope(&mut config, slot);
        config.tool_errors = config
            .tools
            .iter()
            .chain(config.per_tool.iter().map(|(_, scope)| scope))
            .any(|s| s.limit.exit == Exit::Error);
        Self {
            config: Arc::new(config),
        }
    }

    /// Limit the model calls.
    pub fn model_calls(self, limit: Limit) -> Self {
        self.with(|config, slot| {
            config.model = Some(Scope {
                name: "model calls".into(),
                key: "model".into(),
                limit,
                slot,
            });
        })
    }

    /// Limit the tool calls, all tools together.
    pub fn tool_calls(self, limit: Limit) -> Self {
        self.with(|config, slot| {
            config.tools = Some(Scope {
                name: "tool calls".into(),
                key: "tools".into(),
                limit,
                slot,
            });
        })
    }

    /// Limit the calls of the tool `name` (besides [`CallLimitsLayer::tool_calls`]).
    pub fn tool(self, name: impl Into<String>, limit: Limit) -> Self {
        let name = name.into();
        self.with(|config, slot| {
            let scope = Scope {
                name: format!("`{name}` calls"),
                key: format!("tool:{name}"),
                limit,
                slot,
            };
            config.per_tool.insert(name, scope);
        })
    }
}

impl<S> Layer<S> for CallLimitsLayer {
    type Service = CallLimits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallLimits {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`CallLimitsLayer`] makes: a model service or a tool service.
#[derive(Clone)]
pub struct CallLimits<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> CallLimits<S> {
    /// The layer.
    pub fn layer(layer: &CallLimitsLayer) -> CallLimitsLayer {
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

impl<S: fmt::Debug> fmt::Debug for CallLimits<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallLimits")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

fn session_count(state: &Map<String, Value>, key: &str) -> u32 {
    state
        .get(STATE_KEY)
        .and_then(|counts| counts.get(key))
        .and_then(Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Add one call to the session counts of `scopes` that have a session limit.
fn count_in_session(state: &mut Map<String, Value>, scopes: &[&Scope]) {
    let entry = state
        .entry(STATE_KEY)
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    let Value::Object(saved) = entry else {
        return;
    };
    for scope in scopes.iter().filter(|s| s.limit.session.is_some()) {
        // In place once the key exists: no allocation per call.
        match saved.get_mut(&scope.key) {
            Some(n) => *n = Value::from(n.as_u64().unwrap_or(0) + 1),
            None => {
                saved.insert(scope.key.clone(), Value::from(1));
            }
        }
    }
}

impl Config {
    /// Check the scopes and, when none blocks, count the call in each (one step, so
    /// concurrent calls cannot both take the last one). `extra`: calls asked for at once (the
    /// model side's check of a message's calls), only checked.
    fn admit<'a>(
        &'a self,
        ctx: &RunContext,
        scopes: &[&'a Scope],
        extra: Option<&[u32]>,
    ) -> Result<(), Blocked<'a>> {
        if scopes.is_empty() {
            return Ok(());
        }
        let runs = ctx.extension_or_insert_with(RunCounts::default);
        let mut runs = runs.0.lock().unwrap_or_else(PoisonError::into_inner);
        let index = match runs.iter().position(|(id, _)| *id == self.id) {
            Some(index) => index,
            None => {
                runs.push((self.id, Vec::new()));
                runs.len() - 1
            }
        };
        let counts = &mut runs[index].1;
        if counts.len() < self.slots {
            counts.resize(self.slots, 0);
        }
        let check = |state: Option<&Map<String, Value>>| {
            for (index, scope) in scopes.iter().enumerate() {
                let asked = extra.map_or(1, |extra| extra[index]);
                let per_run = scope
                    .limit
                    .run
                    .map(|limit| (limit, counts[scope.slot], "run"));
                let per_session = scope
                    .limit
                    .session
                    .zip(state)
                    .map(|(limit, state)| (limit, session_count(state, &scope.key), "session"));
                for (limit, count, per) in per_run.into_iter().chain(per_session) {
                    if count.saturating_add(asked) > limit {
                        return Err(Blocked { scope, limit, per });
                    }
                }
            }
            Ok(())
        };
        if !scopes.iter().any(|s| s.limit.session.is_some()) {
            // Run limits only: the session's state is not touched.
            check(None)?;
        } else {
            ctx.with_state(|state| {
                check(Some(state))?;
                if extra.is_none() {
                    count_in_session(state, scopes);
                }
                Ok(())
            })?;
        }
        if extra.is_none() {
            for scope in scopes {
                counts[scope.slot] += 1;
            }
        }
        Ok(())
    }

    /// The global tool scope and the tool's own, when set.
    fn tool_scopes(&self, tool: &str) -> [Option<&Scope>; 2] {
        let own = self.per_tool.get(tool);
        [self.tools.as_ref(), own]
    }
}

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for CallLimits<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S> Service<ModelRequest> for CallLimits<S>
where
    S: Service<ModelRequest, Response = ModelResponse>,
    S::Error: From<Error>,
{
    type Response = ModelResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ModelResponse, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ModelRequest) -> Self::Future {
        let config = &self.config;
        if let Some(scope) = &config.model {
            if let Err(blocked) = config.admit(&req.ctx, &[scope], None) {
                return match blocked.scope.limit.exit {
                    Exit::Error => ResponseFuture::ready(Err(blocked.error().into())),
                    _ => ResponseFuture::ready(Ok(ModelResponse::stop(blocked.reason()))),
                };
            }
        }
        let check = config
            .tool_errors
            .then(|| (Arc::clone(config), req.ctx.clone()));
        ResponseFuture::inner(self.inner.call(req), check)
    }
}

impl<S> Service<ToolRequest> for CallLimits<S>
where
    S: Service<ToolRequest, Response = ToolResponse>,
    S::Error: From<Error>,
{
    type Response = ToolResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ToolResponse, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: ToolRequest) -> Self::Future {
        // Counted when it first came through, before it waited.
        if req.resume.is_some() {
            return ResponseFuture::inner(self.inner.call(req), None);
        }
        let config = &self.config;
        let admitted = match config.tool_scopes(&req.call.name) {
            [None, None] => Ok(()),
            [Some(one), None] | [None, Some(one)] => config.admit(&req.ctx, &[one], None),
            [Some(global), Some(own)] => config.admit(&req.ctx, &[global, own], None),
        };
        {
            if let Err(blocked) = admitted {
                let mut response = ToolResponse::error(&req.call, blocked.message());
                if blocked.scope.limit.exit != Exit::Continue {
                    response.action = ToolAction::Stop(blocked.reason());
                }
                return ResponseFuture::ready(Ok(response));
            }
        }
        ResponseFuture::inner(self.inner.call(req), None)
    }
}

/// The model side's check of the calls a message asks for, against limits that fail the run.
fn check_calls(config: &Config, ctx: &RunContext, response: &ModelResponse) -> Result<(), Error> {
    let mut scopes: Vec<&Scope> = Vec::new();
    let mut asked: Vec<u32> = Vec::new();
    for call in response.message.tool_calls() {
        for scope in config.tool_scopes(&call.name).into_iter().flatten() {
            if scope.limit.exit != Exit::Error {
                continue;
            }
            match scopes.iter().position(|s| std::ptr::eq(*s, scope)) {
                Some(index) => asked[index] += 1,
                None => {
                    scopes.push(scope);
                    asked.push(1);
                }
            }
        }
    }
    config
        .admit(ctx, &scopes, Some(&asked))
        .map_err(|blocked| blocked.error())
}

use sealed::Check;

pin_project! {
    /// The response future of [`CallLimits`]: the inner future, or a blocked call's answer.
    pub struct ResponseFuture<F, T, E> {
        #[pin]
        kind: Kind<F, T, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, T, E> {
        Inner { #[pin] future: F, check: Check },
        Ready { answer: Option<Result<T, E>> },
    }
}

impl<F, T, E> ResponseFuture<F, T, E> {
    fn inner(future: F, check: Option<(Arc<Config>, RunContext)>) -> Self {
        Self {
            kind: Kind::Inner {
                future,
                check: Check(check),
            },
        }
    }

    fn ready(answer: Result<T, E>) -> Self {
        Self {
            kind: Kind::Ready {
                answer: Some(answer),
            },
        }
    }
}

impl<F, T, E> fmt::Debug for ResponseFuture<F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

mod sealed {
    use std::sync::Arc;

    use super::{Config, Error, RunContext};

    /// What the model side needs to check a response: set when a tool limit fails the run.
    #[derive(Debug)]
    pub struct Check(pub(super) Option<(Arc<Config>, RunContext)>);

    /// What the model side checks in a response; nothing for a tool response.
    pub trait Checked {
        fn check(&self, check: &Check) -> Result<(), Error>;
    }
}

use sealed::Checked;

impl Checked for ModelResponse {
    fn check(&self, check: &Check) -> Result<(), Error> {
        match &check.0 {
            Some((config, ctx)) => check_calls(config, ctx, self),
            None => Ok(()),
        }
    }
}

impl Checked for ToolResponse {
    fn check(&self, _check: &Check) -> Result<(), Error> {
        Ok(())
    }
}

impl<F, T, E> Future for ResponseFuture<F, T, E>
where
    F: Future<Output = Result<T, E>>,
    T: Checked,
    E: From<Error>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, check } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => Poll::Ready(match response.check(check) {
                    Ok(()) => Ok(response),
                    Err(error) => Err(error.into()),
                }),
                other => other,
            },
            KindProj::Ready { answer } => match answer.take() {
                Some(answer) => Poll::Ready(answer),
                None => panic!("ResponseFuture polled after completion"),
            },
        }
    }
}
