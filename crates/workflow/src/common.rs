//! What the workflows share: boxed agents, paths, positions in the session state, totals.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tower::ServiceExt;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, Error, Event, Outcome, Progress, RunContext, Saver,
    Session, Shared, StateKey, Usage,
};
use tower_service::Service;

pub(crate) use tower_agent_core::BoxAgent;

/// A workflow's step or inner agent: boxed and shared, so that the workflow is `Sync` without
/// asking it of the agent. Each run takes a clone.
pub(crate) type SharedAgent = Shared<BoxAgent>;

/// Box `agent`.
pub(crate) fn boxed<S>(agent: S) -> SharedAgent
where
    S: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    Shared::new(BoxAgent::new(agent))
}

/// Where workflows keep their positions in the session's state, by path (each read alone:
/// one that cannot be read does not spoil the others).
pub const STATE_KEY: StateKey<BTreeMap<String, Value>> = StateKey::new("tower_agent.workflow");

/// Where a workflow stands: its path, and how its children's contexts are made.
pub(crate) struct Scope {
    /// The workflow's path: its context's when nested, else its name.
    pub(crate) path: Arc<str>,
}

impl Scope {
    pub(crate) fn of(ctx: &RunContext, name: &str) -> Self {
        Self {
            path: ctx.path().unwrap_or_else(|| name.into()),
        }
    }

    /// The path and the context of the child `name` (a step, an iteration).
    pub(crate) fn child(&self, ctx: &RunContext, name: &str) -> (Arc<str>, RunContext) {
        let mut path = String::with_capacity(self.path.len() + 1 + name.len());
        path.push_str(&self.path);
        path.push('/');
        path.push_str(name);
        let path: Arc<str> = path.into();
        let child = ctx.nested_at(Arc::clone(&path));
        (path, child)
    }
}

/// The position the workflow at `path` saved in `session`.
pub(crate) fn position(session: &Session, path: &str) -> Option<Value> {
    STATE_KEY.get(&session.state).remove(path)
}

/// Where the workflow at `path` starts: nowhere saved for new messages (their run starts
/// over, and the saved position and those of the workflows nested in it are forgotten), else
/// the saved `key` (`"step"`, `"iteration"`), if any.
pub(crate) fn saved_start(
    session: &mut Session,
    path: &str,
    input: &AgentInput,
    key: &str,
) -> Option<u64> {
    if let AgentInput::Messages(_) = input {
        clear_position(session, path);
        return None;
    }
    position(session, path)?.get(key)?.as_u64()
}

/// Save the position of the workflow at `path`.
pub(crate) fn set_position(session: &mut Session, path: &str, position: Value) {
    STATE_KEY.update_or_reset(&mut session.state, |all| {
        all.insert(path.to_owned(), position);
    });
}

/// Forget the position of the workflow at `path` and of the workflows nested in it (and the
/// key, when nothing is left): a fresh start or a finished run must not leave an inner
/// workflow a stale place to resume from.
pub(crate) fn clear_position(session: &mut Session, path: &str) {
    STATE_KEY.update_or_reset(&mut session.state, |all| {
        all.retain(|key, _| {
            let nested = key.len() > path.len()
                && key.starts_with(path)
                && key[path.len()..].starts_with('/');
            key != path && !nested
        });
    });
}

/// Keep an input that a cancelled workflow did not deliver: new messages go into `session`, so
/// that continuing runs the step on them; a resume or a continue changes nothing.
pub(crate) fn keep_input(session: &mut Session, input: AgentInput) {
    if let AgentInput::Messages(messages) = input {
        session.push_input(messages);
    }
}

/// Save a position into the session an error carries.
pub(crate) fn with_position(mut error: Error, path: &str, position: Value) -> Error {
    match error.take_session() {
        Some(mut session) => {
            set_position(&mut session, path, position);
            error.with_session(session)
        }
        None => error,
    }
}

/// Usage and rounds added up over the agents a workflow ran.
#[derive(Default)]
pub(crate) struct Totals {
    usage: Usage,
    rounds: u32,
}

impl Totals {
    pub(crate) fn add(&mut self, res: &AgentResponse) {
        self.usage += res.usage;
        self.rounds += res.rounds;
    }

    /// Tokens a judge used.
    pub(crate) fn add_usage(&mut self, usage: Usage) {
        self.usage += usage;
    }

    pub(crate) fn response(&self, session: Session, outcome: Outcome) -> AgentResponse {
        let mut res = AgentResponse::new(session, outcome);
        res.usage = self.usage;
        res.rounds = self.rounds;
        res
    }
}

/// A cancelled outcome (the workflow's own progress is its agents').
pub(crate) fn cancelled() -> Outcome {
    Outcome::Cancelled {
        progress: Progress::default(),
    }
}

/// Saves the session of an agent a workflow runs as the workflow's session: `into` makes the
/// workflow's session (with its position) from the agent's, and the workflow's saver saves it.
struct Nested<F> {
    parent: Arc<dyn Saver>,
    into: F,
}

impl<F> Saver for Nested<F>
where
    F: Fn(&Session) -> Session + Send + Sync + 'static,
{
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
        let outer = (self.into)(session);
        Box::pin(async move { self.parent.save(&outer).await })
    }
}

/// Where an agent the workflow runs saves: into the workflow's session, made by `into`, when
/// the workflow saves at all.
pub(crate) fn nested_saver<F>(parent: Option<&Arc<dyn Saver>>, into: F) -> Option<Arc<dyn Saver>>
where
    F: Fn(&Session) -> Session + Send + Sync + 'static,
{
    let parent = Arc::clone(parent?);
    Some(Arc::new(Nested { parent, into }))
}

/// Where an agent run on the workflow's own session saves: that session, with the workflow at
/// `path` standing at `position` (so that a run that dies there resumes there).
pub(crate) fn saver_at(
    parent: Option<&Arc<dyn Saver>>,
    path: &Arc<str>,
    position: Value,
) -> Option<Arc<dyn Saver>> {
    let path = Arc::clone(path);
    nested_saver(parent, move |session| {
        let mut session = session.clone();
        set_position(&mut session, &path, position.clone());
        session
    })
}

/// Run `agent` on `session` with `input` in the context `ctx` of the child at `path`, between
/// `AgentStarted` and `AgentEnded` / `AgentFailed` emitted to `parent`; it saves with `saver`.
pub(crate) async fn run_agent(
    mut agent: BoxAgent,
    parent: &RunContext,
    (path, ctx): (Arc<str>, RunContext),
    session: Session,
    input: tower_agent_core::AgentInput,
    saver: Option<Arc<dyn Saver>>,
) -> Result<AgentResponse, Error> {
    let emitted = emit(parent, || {
        Event::layer(crate::events::AgentStarted {
            path: Arc::clone(&path),
        })
    })
    .await;
    if let Err(error) = emitted {
        return Err(error.with_session(session));
    }
    let result = match agent.ready().await {
        Ok(agent) => {
            agent
                .call(AgentRequest {
                    session,
                    input,
                    ctx,
                    saver,
                })
                .await
        }
        Err(error) => Err(error.with_session(session)),
    };
    match result {
        Ok(res) => {
            let emitted = emit(parent, || {
                Event::layer(crate::events::AgentEnded {
                    path,
                    outcome: res.outcome.clone(),
                })
            })
            .await;
            match emitted {
                Ok(()) => Ok(res),
                Err(error) => Err(error.with_session(res.session)),
            }
        }
        Err(error) => {
            // The failure is reported; an observer failing on it does not hide it.
            let _ = emit(parent, || {
                Event::layer(crate::events::AgentFailed {
                    path,
                    error: error.clone(),
                })
            })
            .await;
            Err(error)
        }
    }
}

/// Bring the state a layer outside put in the context into the session, as the agent does.
pub(crate) fn absorb_state(ctx: &RunContext, session: &mut Session) {
    // The usual case, a context with no state of its own: nothing to bring.
    if ctx.with_state(|state| state.is_empty()) {
        return;
    }
    ctx.absorb_state(std::mem::take(&mut session.state));
    session.state = ctx.state_snapshot();
}

/// Emit the event `make` builds, when anything listens.
pub(crate) async fn emit(ctx: &RunContext, make: impl FnOnce() -> Event) -> Result<(), Error> {
    if !ctx.events().is_enabled() {
        return Ok(());
    }
    ctx.emit(make()).await
}

/// The response future of a workflow ([`Sequential`](crate::Sequential),
/// [`Loop`](crate::Loop)): boxed, behind a name, so that it can change without breaking users.
pub struct WorkflowFuture {
    future: tower_agent_core::event::BoxFuture<'static, Result<AgentResponse, Error>>,
}

impl WorkflowFuture {
    pub(crate) fn new(
        future: impl std::future::Future<Output = Result<AgentResponse, Error>> + Send + 'static,
    ) -> Self {
        Self {
            future: Box::pin(future),
        }
    }
}

impl std::fmt::Debug for WorkflowFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowFuture").finish_non_exhaustive()
    }
}

impl std::future::Future for WorkflowFuture {
    type Output = Result<AgentResponse, Error>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.future.as_mut().poll(cx)
    }
}
