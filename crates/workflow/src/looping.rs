//! `Loop`: an agent, iteration after iteration, until a judge says stop.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::json;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, Error, Event, Message, Outcome, Progress, StopReason,
};
use tower_service::Service;

use crate::common::{
    Scope, SharedAgent, Totals, WorkflowFuture, absorb_state, boxed, cancelled, clear_position,
    emit, keep_input, run_agent, saved_start, saver_at, set_position, with_position,
};
use crate::judge::{Judge, JudgeRequest, Verdict};

type NextInput = Arc<dyn Fn(u32, &Verdict) -> AgentInput + Send + Sync>;

/// Runs an inner agent service (a [`Sequential`](crate::Sequential) of a coder and a reviewer,
/// say) iteration after iteration, on one session, until its [`Judge`] says stop or the
/// maximum of iterations is reached; see the [crate docs](crate).
///
/// - The first iteration gets the request's input; each later one, by default, a user message
///   with the judge's reason (`The judge asked for another iteration: …`);
///   [`Loop::next_input`] changes it.
/// - The judge stops the loop: the outcome is the last iteration's (completed).
/// - The limit ([`Loop::max_iterations`], 10) is reached with the judge still asking for more:
///   `Outcome::Stopped` with [`StopReason::MaxIterations`].
/// - The judge cannot decide ([`Verdict::Undecided`]): `Outcome::Stopped` with
///   [`StopReason::Judge`].
/// - An iteration that does not complete (interrupted, cancelled, stopped) ends the loop with
///   its outcome; the iteration is saved in the session state, and resuming (or continuing)
///   the saved session runs that iteration's inner agent with the input, then goes on.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use tower::ServiceExt;
/// use tower_agent_core::{AgentRequest, Error, ModelResponse, Session};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::ScriptedModel;
/// use tower_agent_tools::ToolSet;
/// use tower_agent_workflow::{judge_fn, JudgeRequest, Loop, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let writer = Agent::new(
///     ScriptedModel::new([ModelResponse::text("draft 1"), ModelResponse::text("draft 2")]),
///     ToolSet::new(),
/// );
/// let judge = judge_fn(|req: &JudgeRequest| {
///     let done = req.text() == "draft 2";
///     async move { Ok(if done { Verdict::stop("good") } else { Verdict::proceed("shorter") }) }
/// });
/// let writing = Loop::new("writing", writer, judge);
/// let res = writing.oneshot(AgentRequest::new(Session::new(), "Write a haiku.")).await?;
/// assert_eq!(res.text().as_deref(), Some("draft 2"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Loop {
    name: Arc<str>,
    inner: SharedAgent,
    judge: Arc<dyn Judge>,
    max_iterations: u32,
    next_input: NextInput,
}

impl Loop {
    /// The default of [`Loop::max_iterations`].
    pub const DEFAULT_MAX_ITERATIONS: u32 = 10;

    /// A loop named `name` over `inner`, judged by `judge`.
    pub fn new<S>(name: impl Into<Arc<str>>, inner: S, judge: impl Judge) -> Self
    where
        S: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        Self {
            name: name.into(),
            inner: boxed(inner),
            judge: Arc::new(judge),
            max_iterations: Self::DEFAULT_MAX_ITERATIONS,
            next_input: Arc::new(|_, verdict| {
                AgentInput::Messages(vec![Message::user(format!(
                    "The judge asked for another iteration: {}",
                    verdict.reason()
                ))])
            }),
        }
    }

    /// Run at most `n` iterations (at least one).
    pub fn max_iterations(mut self, n: u32) -> Self {
        self.max_iterations = n.max(1);
        self
    }

    /// The input of the iteration after iteration `n`, from the judge's verdict.
    pub fn next_input(
        mut self,
        f: impl Fn(u32, &Verdict) -> AgentInput + Send + Sync + 'static,
    ) -> Self {
        self.next_input = Arc::new(f);
        self
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Loop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loop")
            .field("name", &self.name)
            .field("max_iterations", &self.max_iterations)
            .finish_non_exhaustive()
    }
}

impl Service<AgentRequest> for Loop {
    type Response = AgentResponse;
    type Error = Error;
    type Future = WorkflowFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The inner agent is driven to readiness before each iteration.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: AgentRequest) -> WorkflowFuture {
        let this = self.clone();
        WorkflowFuture::new(this.run(req))
    }
}

impl Loop {
    async fn run(self, req: AgentRequest) -> Result<AgentResponse, Error> {
        let AgentRequest {
            mut session,
            input,
            ctx,
            saver,
        } = req;
        absorb_state(&ctx, &mut session);
        let scope = Scope::of(&ctx, &self.name);
        let mut iteration = saved_start(&mut session, &scope.path, &input, "iteration")
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1);
        let mut input = input;
        let mut totals = Totals::default();
        loop {
            let here = || json!({ "iteration": iteration });
            if ctx.is_cancelled() {
                // The iteration's input is kept: continuing runs the iteration on it.
                keep_input(&mut session, input);
                set_position(&mut session, &scope.path, here());
                return Ok(totals.response(session, cancelled()));
            }
            let started = emit(&ctx, || {
                Event::layer(crate::events::IterationStarted {
                    path: Arc::clone(&scope.path),
                    iteration,
                })
            })
            .await;
            if let Err(error) = started {
                return Err(error.with_session(session));
            }
            let name = iteration.to_string();
            // The iteration saves the workflow's session, standing at this iteration.
            let saves = saver_at(saver.as_ref(), &scope.path, here());
            let res = run_agent(
                self.inner.get(),
                &ctx,
                scope.child(&ctx, &name),
                session,
                input,
                saves,
            )
            .await
            .map_err(|error| with_position(error, &scope.path, here()))?;
            totals.add(&res);
            if !matches!(res.outcome, Outcome::Completed { .. }) {
                session = res.session;
                set_position(&mut session, &scope.path, here());
                let reason = match &res.outcome {
                    Outcome::Interrupted { .. } => "interrupted: waiting for a decision",
                    Outcome::Cancelled { .. } => "cancelled",
                    _ => "stopped",
                };
                self.ended(&ctx, &scope, iteration, false, || reason.to_owned())
                    .await
                    .map_err(|e| e.with_session(session.clone()))?;
                return Ok(totals.response(session, res.outcome));
            }
            let request = JudgeRequest {
                path: Arc::clone(&scope.path),
                iteration,
                response: res,
                ctx: ctx.clone(),
            };
            let judged = self.judge.judge(&request).await;
            let AgentResponse {
                session: after,
                outcome,
                ..
            } = request.response;
            session = after;
            let verdict = match judged {
                Ok(judged) => {
                    totals.add_usage(judged.usage);
                    judged.verdict
                }
                Err(error) => {
                    clear_position(&mut session, &scope.path);
                    return Err(error.with_session(session));
                }
            };
            let (next, outcome) = match &verdict {
                Verdict::Stop { .. } => (false, outcome),
                Verdict::Undecided { reason } => (
                    false,
                    Outcome::Stopped {
                        reason: StopReason::Judge {
                            reason: reason.clone(),
                        },
                        progress: Progress::default(),
                    },
                ),
                Verdict::Continue { .. } if iteration >= self.max_iterations => (
                    false,
                    Outcome::Stopped {
                        reason: StopReason::MaxIterations {
                            limit: self.max_iterations,
                        },
                        progress: Progress::default(),
                    },
                ),
                Verdict::Continue { .. } => (true, outcome),
            };
            let limit = self.max_iterations;
            let reason = || match (&verdict, next) {
                (Verdict::Continue { .. }, false) => format!(
                    "{} (the limit of {limit} iterations is reached)",
                    verdict.reason()
                ),
                _ => verdict.reason().to_owned(),
            };
            if let Err(error) = self.ended(&ctx, &scope, iteration, next, reason).await {
                return Err(error.with_session(session));
            }
            if !next {
                clear_position(&mut session, &scope.path);
                return Ok(totals.response(session, outcome));
            }
            input = (self.next_input)(iteration, &verdict);
            iteration += 1;
        }
    }

    async fn ended(
        &self,
        ctx: &tower_agent_core::RunContext,
        scope: &Scope,
        iteration: u32,
        next: bool,
        reason: impl FnOnce() -> String,
    ) -> Result<(), Error> {
        emit(ctx, || {
            Event::layer(crate::events::IterationEnded {
                path: Arc::clone(&scope.path),
                iteration,
                next,
                reason: reason(),
            })
        })
        .await
    }
}
