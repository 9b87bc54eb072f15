//! The tool-budget checkpoint (`before_tool`): after every N tool calls of a run (20 by
//! default), ask whether to go on.
//!
//! "Yes" gives a fresh budget of N calls (so it asks again at 40, 60...). "No", no answer
//! within the timeout (15 minutes by default) or a failing checkpoint stops the run before
//! the call that would have gone over: the call gets a "not executed" result and the run ends
//! [`Outcome::Stopped`] with [`StopReason::Checkpoint`] and a [`Progress`] of what was done,
//! which shows as `query_todoist ✓ → create_todoist_task ✓ → set_memory_block ✗`
//! ([`Outcome::summary`] makes the sentence).
//!
//! The question is answered either
//!
//! - **inline**, by a [`Checkpoint`] (a prompt, a message to the user's chat) while the run
//!   waits; concurrent calls of one round wait for one answer, never ask twice; or
//! - **by interrupting** the run at the call that would go over: the interrupt's payload is a
//!   [`CheckpointRequest`], and it allows [`DecisionKind::Approve`] (go on) and
//!   [`DecisionKind::Reject`] (stop). The host asks the human between processes and resumes
//!   with [`AgentInput::Resume`](tower_agent_core::AgentInput::Resume).
//!
//! The budget counts the calls of one run (a resumed run starts a fresh one); a call that
//! resumes after another layer's interrupt is not counted again. Put the checkpoint outside
//! the approval layer, so a call it stopped is never shown to a human for approval.
//!
//! ```
//! use serde_json::json;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, ModelResponse, Outcome, RunContext, Session, ToolCall};
//! use tower_agent_layers::checkpoint::{checkpoint_fn, CheckpointLayer, CheckpointRequest};
//! use tower_agent_loop::Agent;
//! use tower_agent_test::{ScriptedModel, StubTool};
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_core::Error> {
//! // Go on once (at 2 calls), stop the second time (at 4).
//! let checkpoint = CheckpointLayer::inline(checkpoint_fn(|ask: CheckpointRequest, _: RunContext| async move {
//!     Ok(ask.progress.len() < 4)
//! }))
//! .every(2);
//! let model = ScriptedModel::from_fn(|req| {
//!     let n = req.ctx.round();
//!     Ok(ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "step", json!({}))]))
//! });
//! let tools = ServiceBuilder::new().layer(checkpoint).service(ToolSet::new().tool(StubTool::returning("step", "ok")));
//! let res = Agent::new(model, tools).oneshot(AgentRequest::new(Session::new(), "work")).await?;
//! assert_eq!(
//!     res.outcome.summary().as_deref(),
//!     Some("Stopped: the checkpoint after 2 tool calls said stop (declined). Done: step ✓ → step ✓ → step ✓ → step ✓ → step ✗")
//! );
//! # Ok(())
//! # }
//! ```
//!
//! [`Outcome::Stopped`]: tower_agent_core::Outcome::Stopped
//! [`Outcome::summary`]: tower_agent_core::Outcome::summary

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_agent_core::{
    BoxError, Decision, DecisionKind, Interrupt, Progress, RunContext, StopReason, ToolAction,
    ToolRequest, ToolResponse,
};
use tower_layer::Layer;
use tower_service::Service;

/// The default budget: 20 tool calls.
pub const DEFAULT_EVERY: u32 = 20;
/// The default time to answer an inline checkpoint: 15 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The key, in the session's JSON state, of the calls waiting at a checkpoint.
pub const STATE_KEY: &str = "tower_agent.checkpoint";

/// What the checkpoint is asked: how many calls were made since the budget was last given,
/// what they were, and which call waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Tool calls made since the budget was last given.
    pub calls: u32,
    /// The run's tool calls so far.
    pub progress: Progress,
    /// The tool of the call that waits.
    pub next: String,
}

impl CheckpointRequest {
    /// The checkpoint an interrupt carries, if it is one.
    pub fn from_interrupt(interrupt: &Interrupt) -> Option<Self> {
        let payload = interrupt.payload.get("checkpoint")?;
        CheckpointRequest::deserialize(payload).ok()
    }
}

/// Answers the checkpoint while the run waits: `true` to go on with a fresh budget.
pub trait Checkpoint: Send + Sync + 'static {
    /// Ask whether to go on. An error stops the run.
    fn ask(
        &self,
        request: CheckpointRequest,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<bool, BoxError>> + Send + 'static>>;
}

/// A [`Checkpoint`] from an async closure.
pub fn checkpoint_fn<F, Fut>(f: F) -> CheckpointFn<F>
where
    F: Fn(CheckpointRequest, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    CheckpointFn { f }
}

/// The checkpoint [`checkpoint_fn`] makes.
#[derive(Clone)]
pub struct CheckpointFn<F> {
    f: F,
}

impl<F> fmt::Debug for CheckpointFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointFn").finish_non_exhaustive()
    }
}

impl<F, Fut> Checkpoint for CheckpointFn<F>
where
    F: Fn(CheckpointRequest, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    fn ask(
        &self,
        request: CheckpointRequest,
        ctx: RunContext,
    ) -> Pin<Box<dyn Future<Output = Result<bool, BoxError>> + Send + 'static>> {
        Box::pin((self.f)(request, ctx))
    }
}

#[derive(Clone)]
enum Mode {
    Interrupt,
    Inline(Arc<dyn Checkpoint>),
}

#[derive(Clone)]
struct Config {
    every: u32,
    timeout: Duration,
    mode: Mode,
}

/// The tool-budget checkpoint; see the [module docs](self).
#[derive(Clone)]
pub struct CheckpointLayer {
    config: Arc<Config>,
}

impl CheckpointLayer {
    /// Ask `checkpoint` while the run waits.
    pub fn inline(checkpoint: impl Checkpoint) -> Self {
        Self::with_mode(Mode::Inline(Arc::new(checkpoint)))
    }

    /// Interrupt the run at the checkpoint; resume with approve (go on) or reject (stop).
    pub fn interrupting() -> Self {
        Self::with_mode(Mode::Interrupt)
    }

    fn with_mode(mode: Mode) -> Self {
        Self {
            config: Arc::new(Config {
                every: DEFAULT_EVERY,
                timeout: DEFAULT_TIMEOUT,
                mode,
            }),
        }
    }

    /// Ask after every `n` tool calls ([`DEFAULT_EVERY`]); at least 1.
    pub fn every(mut self, n: u32) -> Self {
        Arc::make_mut(&mut self.config).every = n.max(1);
        self
    }

    /// How long an inline checkpoint may take to answer ([`DEFAULT_TIMEOUT`]); then the run
    /// stops.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).timeout = timeout;
        self
    }
}

impl fmt::Debug for CheckpointLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointLayer")
            .field("every", &self.config.every)
            .field("timeout", &self.config.timeout)
            .field(
                "mode",
                &match self.config.mode {
                    Mode::Interrupt => "interrupt",
                    Mode::Inline(_) => "inline",
                },
            )
            .finish()
    }
}

impl<S> Layer<S> for CheckpointLayer {
    type Service = CheckpointService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CheckpointService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`CheckpointLayer`] makes.
#[derive(Clone)]
pub struct CheckpointService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> CheckpointService<S> {
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

impl<S: fmt::Debug> fmt::Debug for CheckpointService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The run's budget, in the run context.
#[derive(Clone, Default)]
struct Budget(Arc<Shared>);

#[derive(Default)]
struct Shared {
    /// Calls since the budget was last given: counted without the lock.
    calls: AtomicU32,
    counts: Mutex<Counts>,
    /// Held while the checkpoint is asked, so concurrent calls ask once.
    asking: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Counts {
    /// How many times a budget was given: a call that waited sees whether another one got
    /// the answer first.
    generation: u64,
    /// The checkpoint stopped the run: calls that waited to ask are not run.
    stopped: bool,
    /// The run's calls (recording one allocates nothing after a tool's first call).
    progress: Progress,
}

impl Budget {
    fn of(ctx: &RunContext) -> Self {
        ctx.extension_or_insert_with(Budget::default)
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.0.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take one call of the budget, if any is left.
    fn take(&self, every: u32) -> bool {
        self.0
            .calls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |calls| {
                (calls < every).then_some(calls + 1)
            })
            .is_ok()
    }

    /// A fresh budget, of which the calling call takes one.
    fn renew(&self) {
        let mut counts = self.counts();
        counts.generation += 1;
        self.0.calls.store(1, Ordering::Release);
    }
}

fn not_executed(calls: u32) -> String {
    format!("not executed: the run was stopped at the checkpoint after {calls} tool calls")
}

/// Whether the call waited at this layer's checkpoint (it is in the session's list); takes it
/// off the list.
fn take_waiting(ctx: &RunContext, call_id: &str) -> bool {
    ctx.with_state(|state| {
        let Some(Value::Array(waiting)) = state
            .get_mut(STATE_KEY)
            .and_then(|entry| entry.get_mut("waiting"))
        else {
            return false;
        };
        let before = waiting.len();
        waiting.retain(|id| id.as_str() != Some(call_id));
        let found = waiting.len() != before;
        if waiting.is_empty() {
            state.remove(STATE_KEY);
        }
        found
    })
}

fn add_waiting(ctx: &RunContext, call_id: &str) {
    ctx.with_state(|state| {
        let entry = state
            .entry(STATE_KEY)
            .or_insert_with(|| serde_json::json!({ "waiting": [] }));
        if entry.get("waiting").is_none_or(|w| !w.is_array()) {
            *entry = serde_json::json!({ "waiting": [] });
        }
        if let Some(Value::Array(waiting)) = entry.get_mut("waiting") {
            waiting.push(Value::from(call_id));
        }
    });
}

/// Passes on the tools of the service inside it.
impl<S: tower_agent_core::DescribeTools> tower_agent_core::DescribeTools for CheckpointService<S> {
    fn tool_specs(&self) -> std::sync::Arc<[tower_agent_core::ToolSpec]> {
        self.get_ref().tool_specs()
    }
}

impl<S> Service<ToolRequest> for CheckpointService<S>
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

    fn call(&mut self, mut req: ToolRequest) -> Self::Future {
        let every = self.config.every;
        let budget = Budget::of(&req.ctx);
        if req.resume.is_some() {
            if !take_waiting(&req.ctx, &req.call.id) {
                // Another layer's interrupt: counted when it first came through.
                return ResponseFuture::tracked(self.inner.call(req), budget);
            }
            let value = req.resume.take().unwrap_or(Value::Null);
            return match Decision::deserialize(&value) {
                Ok(Decision::Approve) => {
                    budget.renew();
                    ResponseFuture::tracked(self.inner.call(req), budget)
                }
                _ => stop(&req, every, "declined"),
            };
        }
        if budget.take(every) {
            return ResponseFuture::tracked(self.inner.call(req), budget);
        }
        let question = CheckpointRequest {
            calls: budget.0.calls.load(Ordering::Acquire),
            progress: budget.counts().progress.clone(),
            next: req.call.name.clone(),
        };
        match &self.config.mode {
            Mode::Interrupt => {
                add_waiting(&req.ctx, &req.call.id);
                let payload = serde_json::json!({
                    "checkpoint": question,
                    "question": format!(
                        "The agent made {} tool calls ({}). Go on?",
                        question.calls, question.progress
                    ),
                });
                ResponseFuture::ready(ToolResponse::review(
                    &req.call,
                    payload,
                    [DecisionKind::Approve, DecisionKind::Reject],
                ))
            }
            Mode::Inline(checkpoint) => {
                let checkpoint = Arc::clone(checkpoint);
                let timeout = self.config.timeout;
                let generation = budget.counts().generation;
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::boxed(async move {
                    let asking = budget.0.asking.lock().await;
                    if budget.counts().stopped {
                        // Another call of the round was told to stop.
                        return Ok(ToolResponse::error(&req.call, not_executed(every)));
                    }
                    // Another call of the round got a fresh budget while this one waited.
                    let renewed = budget.counts().generation != generation && budget.take(every);
                    if !renewed {
                        let asked = checkpoint.ask(question, req.ctx.clone());
                        let reason = match tokio::time::timeout(timeout, asked).await {
                            Ok(Ok(true)) => None,
                            Ok(Ok(false)) => Some("declined".to_owned()),
                            Ok(Err(error)) => Some(format!("the checkpoint failed: {error}")),
                            Err(_) => Some(format!(
                                "no answer within {} s",
                                timeout.as_secs_f64().round()
                            )),
                        };
                        if let Some(reason) = reason {
                            budget.counts().stopped = true;
                            return Ok(stopped(&req, every, reason));
                        }
                        budget.renew();
                    }
                    drop(asking);
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    let response = inner.call(req).await?;
                    record(&budget, &response.result.name, &response);
                    Ok(response)
                })
            }
        }
    }
}

fn stop<F, E>(req: &ToolRequest, every: u32, reason: &str) -> ResponseFuture<F, E> {
    ResponseFuture::ready(stopped(req, every, reason.to_owned()))
}

/// The answer to a call the checkpoint did not let run: the run stops.
fn stopped(req: &ToolRequest, every: u32, reason: String) -> ToolResponse {
    let reason = StopReason::Checkpoint {
        calls: every,
        reason,
    };
    ToolResponse::error(&req.call, not_executed(every)).with_action(ToolAction::Stop(reason))
}

fn record(budget: &Budget, tool: &str, response: &ToolResponse) {
    if matches!(response.action, ToolAction::Interrupt(_)) {
        return;
    }
    budget
        .counts()
        .progress
        .push(tool, !response.result.is_error);
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<ToolResponse, E>> + Send>>;

pin_project! {
    /// The response future of [`CheckpointService`]: the inner future (its result recorded
    /// for the next question), a ready answer, or a boxed wait for the checkpoint (inline
    /// mode, once per budget).
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        Tracked { #[pin] future: F, budget: Budget },
        Ready { response: Option<ToolResponse> },
        Boxed { future: BoxFuture<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    fn tracked(future: F, budget: Budget) -> Self {
        Self {
            kind: Kind::Tracked { future, budget },
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Tracked { future, budget } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => {
                    record(budget, &response.result.name, &response);
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
