//! `Sequential`: agents one after the other, on one session or each on its own.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::json;
use tower_agent_core::{AgentInput, AgentRequest, AgentResponse, Error, Message, Outcome, Session};
use tower_service::Service;

use crate::common::{
    Scope, SharedAgent, Totals, WorkflowFuture, absorb_state, boxed, cancelled, clear_position,
    keep_input, nested_saver, position, run_agent, saved_start, saver_at, set_position,
    with_position,
};

#[derive(Clone)]
struct Step {
    name: Arc<str>,
    agent: SharedAgent,
    input: Option<AgentInput>,
}

/// How the steps share the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// One session: each step sees everything before it and appends to it. The first step
    /// gets the request's input; a later one its own input ([`Sequential::step_with_input`])
    /// or, by default, [`AgentInput::Continue`] (some providers want a user message last:
    /// give the step an input then).
    #[default]
    Shared,
    /// Each step on a session of its own, with the previous step's final answer as its input
    /// (the first gets the request's input). The workflow's session gets the input and the last
    /// step's final answer; a paused step's session is kept in the workflow's session state
    /// until it is resumed.
    Isolated,
}

/// Runs agent services one after the other, stopping at the first that does not complete
/// (interrupted, cancelled, stopped, failed) with that outcome; see the [crate docs](crate).
///
/// ```
/// use tower::ServiceExt;
/// use tower_agent_core::{AgentRequest, Error, ModelResponse, Session};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::ScriptedModel;
/// use tower_agent_tools::ToolSet;
/// use tower_agent_workflow::Sequential;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let coder = Agent::new(ScriptedModel::new([ModelResponse::text("fn add() {}")]), ToolSet::new());
/// let reviewer = Agent::new(ScriptedModel::new([ModelResponse::text("Looks good.")]), ToolSet::new());
/// let pipeline = Sequential::new("pipeline")
///     .step("coder", coder)
///     .step_with_input("reviewer", reviewer, "Review the code above.");
/// let res = pipeline.oneshot(AgentRequest::new(Session::new(), "Write add().")).await?;
/// assert_eq!(res.text().as_deref(), Some("Looks good."));
/// // One session: the task, the code, the review request, the review.
/// assert_eq!(res.session.history.len(), 4);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Sequential {
    name: Arc<str>,
    steps: Arc<[Step]>,
    mode: Mode,
}

impl Sequential {
    /// A workflow named `name` (the first part of its agents' paths when it is outermost),
    /// with no step yet.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            steps: Arc::from(Vec::new()),
            mode: Mode::Shared,
        }
    }

    fn push(mut self, step: Step) -> Self {
        let mut steps = self.steps.to_vec();
        steps.push(step);
        self.steps = steps.into();
        self
    }

    /// Add the agent `agent`, named `name` in paths, after the steps added before.
    pub fn step<S>(self, name: impl Into<Arc<str>>, agent: S) -> Self
    where
        S: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        self.push(Step {
            name: name.into(),
            agent: boxed(agent),
            input: None,
        })
    }

    /// Add a step that starts from `input` in the shared mode (not as the first step, which
    /// gets the request's input).
    pub fn step_with_input<S>(
        self,
        name: impl Into<Arc<str>>,
        agent: S,
        input: impl Into<AgentInput>,
    ) -> Self
    where
        S: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        self.push(Step {
            name: name.into(),
            agent: boxed(agent),
            input: Some(input.into()),
        })
    }

    /// Run each step on a session of its own ([`Mode::Isolated`]).
    pub fn isolated(mut self) -> Self {
        self.mode = Mode::Isolated;
        self
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Sequential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequential")
            .field("name", &self.name)
            .field(
                "steps",
                &self.steps.iter().map(|s| &*s.name).collect::<Vec<_>>(),
            )
            .field("mode", &self.mode)
            .finish()
    }
}

impl Service<AgentRequest> for Sequential {
    type Response = AgentResponse;
    type Error = Error;
    type Future = WorkflowFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Each step is driven to readiness when its turn comes.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: AgentRequest) -> WorkflowFuture {
        let this = self.clone();
        WorkflowFuture::new(async move {
            match this.mode {
                Mode::Shared => this.run_shared(req).await,
                Mode::Isolated => this.run_isolated(req).await,
            }
        })
    }
}

/// The step a run starts at: 0 for new messages, else the saved one.
fn start(session: &mut Session, path: &str, input: &AgentInput) -> usize {
    saved_start(session, path, input, "step")
        .and_then(|step| usize::try_from(step).ok())
        .unwrap_or(0)
}

impl Sequential {
    async fn run_shared(self, req: AgentRequest) -> Result<AgentResponse, Error> {
        let AgentRequest {
            mut session,
            input,
            ctx,
            saver,
        } = req;
        absorb_state(&ctx, &mut session);
        let scope = Scope::of(&ctx, &self.name);
        let first = start(&mut session, &scope.path, &input);
        let mut input = Some(input);
        let mut totals = Totals::default();
        let mut last = None;
        for (index, step) in self.steps.iter().enumerate().skip(first) {
            let here = || json!({ "step": index });
            let input = input
                .take()
                .or_else(|| step.input.clone())
                .unwrap_or(AgentInput::Continue);
            if ctx.is_cancelled() {
                // The step's input is kept: continuing runs the step on it.
                keep_input(&mut session, input);
                set_position(&mut session, &scope.path, here());
                return Ok(totals.response(session, cancelled()));
            }
            // The step saves the workflow's session, standing at this step.
            let saves = saver_at(saver.as_ref(), &scope.path, here());
            let res = run_agent(
                step.agent.get(),
                &ctx,
                scope.child(&ctx, &step.name),
                session,
                input,
                saves,
            )
            .await
            .map_err(|error| with_position(error, &scope.path, here()))?;
            totals.add(&res);
            session = res.session;
            if !matches!(res.outcome, Outcome::Completed { .. }) {
                set_position(&mut session, &scope.path, here());
                return Ok(totals.response(session, res.outcome));
            }
            last = Some(res.outcome);
            // The step is done: the workflow is saved standing at the next one, its input kept,
            // so that a process that dies now resumes there, not in the step it finished.
            if let (Some(saver), Some(next)) = (&saver, self.steps.get(index + 1)) {
                let mut ahead = session.clone();
                keep_input(
                    &mut ahead,
                    next.input.clone().unwrap_or(AgentInput::Continue),
                );
                set_position(&mut ahead, &scope.path, json!({ "step": index + 1 }));
                if let Err(error) = saver.save(&ahead).await {
                    return Err(error.with_session(session));
                }
            }
        }
        clear_position(&mut session, &scope.path);
        let outcome = last.unwrap_or_else(|| Outcome::Completed {
            message: session
                .history
                .last()
                .cloned()
                .unwrap_or_else(|| Message::assistant("")),
        });
        Ok(totals.response(session, outcome))
    }

    async fn run_isolated(self, req: AgentRequest) -> Result<AgentResponse, Error> {
        let AgentRequest {
            mut session,
            input,
            ctx,
            saver,
        } = req;
        absorb_state(&ctx, &mut session);
        let scope = Scope::of(&ctx, &self.name);
        let first = start(&mut session, &scope.path, &input);
        // A paused step's own session, kept in the state.
        let saved: Option<Session> = (first > 0 || !matches!(input, AgentInput::Messages(_)))
            .then(|| position(&session, &scope.path))
            .flatten()
            .and_then(|p| serde_json::from_value(p.get("session")?.clone()).ok());
        // The calls a resumed step waits on, shown on the workflow's session until it ran.
        let mut waiting = Vec::new();
        let mut input = match input {
            AgentInput::Messages(messages) => {
                session.push_input(messages.clone());
                AgentInput::Messages(messages)
            }
            other => {
                waiting = std::mem::take(&mut session.interrupts);
                other
            }
        };
        let mut own = saved;
        let mut totals = Totals::default();
        let mut last = None;
        for (index, step) in self.steps.iter().enumerate().skip(first) {
            let mut sub = own
                .take()
                .unwrap_or_else(|| Session::with_id(format!("{}/{}", session.id, step.name)));
            if ctx.is_cancelled() {
                // The step's input is kept in its session: continuing runs the step on it.
                keep_input(&mut sub, input);
                session.interrupts = std::mem::take(&mut waiting);
                let here = json!({ "step": index, "session": sub });
                set_position(&mut session, &scope.path, here);
                return Ok(totals.response(session, cancelled()));
            }
            // The step saves its own session into the workflow's, kept with its position.
            let saves = {
                let (outer, path) = (session.clone(), Arc::clone(&scope.path));
                nested_saver(saver.as_ref(), move |sub| {
                    let mut outer = outer.clone();
                    set_position(&mut outer, &path, json!({ "step": index, "session": sub }));
                    outer
                })
            };
            let result = run_agent(
                step.agent.get(),
                &ctx,
                scope.child(&ctx, &step.name),
                sub,
                input,
                saves,
            )
            .await;
            let res = match result {
                Ok(res) => res,
                Err(mut error) => {
                    // The workflow's session goes back, with the step's own to resume from
                    // and the calls it still waits on.
                    session.interrupts = std::mem::take(&mut waiting);
                    let sub = error.take_session();
                    set_position(
                        &mut session,
                        &scope.path,
                        json!({ "step": index, "session": sub }),
                    );
                    return Err(error.with_session(session));
                }
            };
            // The resumed step ran: its calls no longer wait.
            waiting.clear();
            totals.add(&res);
            match &res.outcome {
                Outcome::Completed { message } => {
                    input = AgentInput::Messages(vec![Message::user(message.text())]);
                    last = Some(res.outcome.clone());
                    // Saved standing at the next step, its session holding its input: a
                    // process that dies now resumes there, not in the step it finished.
                    if let (Some(saver), Some(next)) = (&saver, self.steps.get(index + 1)) {
                        let mut sub = Session::with_id(format!("{}/{}", session.id, next.name));
                        keep_input(&mut sub, input.clone());
                        let mut ahead = session.clone();
                        let here = json!({ "step": index + 1, "session": sub });
                        set_position(&mut ahead, &scope.path, here);
                        if let Err(error) = saver.save(&ahead).await {
                            return Err(error.with_session(session));
                        }
                    }
                }
                outcome => {
                    if let Outcome::Interrupted { interrupts } = outcome {
                        session.interrupts = interrupts.clone();
                    }
                    let here = json!({ "step": index, "session": res.session });
                    set_position(&mut session, &scope.path, here);
                    return Ok(totals.response(session, res.outcome));
                }
            }
        }
        clear_position(&mut session, &scope.path);
        let outcome = match last {
            Some(Outcome::Completed { message }) => {
                session.history.push(message.clone());
                Outcome::Completed { message }
            }
            _ => Outcome::Completed {
                message: Message::assistant(""),
            },
        };
        Ok(totals.response(session, outcome))
    }
}
