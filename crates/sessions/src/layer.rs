//! The layer that runs an agent on sessions kept in a store.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tower_agent_core::event::BoxFuture as CoreFuture;
use tower_agent_core::{AgentInput, AgentRequest, AgentResponse, Error, ErrorKind, Saver, Session};
use tower_agent_loop::SessionMark;
use tower_layer::Layer;
use tower_service::Service;

use crate::{BoxFuture, SessionStore, StoreError, Version};

impl From<StoreError> for Error {
    /// A store's failure as a run's error, of the kind a host acts on, with the [`StoreError`]
    /// as its source:
    ///
    /// | store error | kind | the host |
    /// |---|---|---|
    /// | [`StoreError::Conflict`] | [`ErrorKind::Conflict`] | loads the session again |
    /// | [`StoreError::InvalidId`] | [`ErrorKind::BadRequest`] | fixes the caller's id |
    /// | [`StoreError::Corrupt`], [`StoreError::Schema`], [`StoreError::Backend`] | [`ErrorKind::Backend`] | looks at the store |
    fn from(error: StoreError) -> Self {
        let kind = match &error {
            StoreError::Conflict { .. } => ErrorKind::Conflict,
            StoreError::InvalidId { .. } => ErrorKind::BadRequest,
            StoreError::Corrupt { .. } | StoreError::Schema { .. } | StoreError::Backend(_) => {
                ErrorKind::Backend
            }
        };
        Error::new(kind, error.to_string()).with_source(error)
    }
}

/// Run an agent on sessions kept in a [`SessionStore`]: a request names its session by id, the
/// store supplies it, and the run saves it as it goes.
///
/// For each request, the layer loads the session stored under the request's session id:
///
/// - a request with a **blank** session (`Session::with_id(id)`: no message, no state, no
///   interrupt) runs on the stored one, or on a new session when none is stored;
/// - a request with a session of its own starts a new stored session; when one is stored
///   under that id already, the run is refused ([`ErrorKind::BadRequest`], its source a
///   [`StoreError::Conflict`]): change a stored session with [`SessionStore::save`], then
///   run it by id.
///
/// The layer gives the request a [`Saver`] ([`AgentRequest::saver`]), and the run saves through
/// it at every step: the input (after the layers inside this one made of it what they do:
/// redaction, input guardrails, patching) before the first model call, the model's message
/// before its tool calls run, each result as its call finishes, and the session the run ends
/// with (its pending interrupts among it; also a failed run's). A workflow saves through the
/// agents it runs, into its own session. A service that saves nothing as it goes (a hand-made
/// one) is saved when its run ends; so is a session a layer changed after the loop's last save.
/// A process that dies loses at most the calls in flight; the next run of the session answers
/// them (they are not run again). Each save names the version the one before wrote: when
/// another writer saved the session meanwhile, the run fails with [`ErrorKind::Conflict`] and
/// overwrites nothing.
///
/// # Errors
///
/// Before the inner service is called, nothing saved:
///
/// - [`ErrorKind::BadRequest`]: the session id is not one ([`StoreError::InvalidId`] as the
///   source); a session of the request's own over a stored one (see above); or
///   [`AgentInput::Continue`] or [`AgentInput::Resume`] on a blank session with nothing
///   stored under its id (there is nothing to continue).
/// - [`ErrorKind::Backend`]: the store failed to load the session.
///
/// During the run, a failed save stops it (its error carries the run's session):
/// [`ErrorKind::Conflict`] when another writer saved the session since the run loaded it (load
/// it again and start over from what is stored), [`ErrorKind::Backend`] when the store failed.
/// (The mapping of every [`StoreError`] is on `impl From<StoreError> for Error`.)
///
/// Place it outermost among the agent's layers, so that the session every layer sees is the
/// stored one, and everything they did is saved (the agent builder of `tower-agent` does).
///
/// ```
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_agent_core::{AgentRequest, DescribedTools, Error, ModelResponse, Session};
/// use tower_agent_core::{ToolRequest, ToolResponse};
/// use tower_agent_loop::Agent;
/// use tower_agent_sessions::{InMemorySessions, SessionStore, StoreLayer};
/// use tower_agent_test::ScriptedModel;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let store = InMemorySessions::new();
/// let model = ScriptedModel::new([ModelResponse::text("hello"), ModelResponse::text("again")]);
/// let tools = DescribedTools::none(service_fn(|r: ToolRequest| async move {
///     Ok::<_, Error>(ToolResponse::success(&r.call, ""))
/// }));
/// let agent = StoreLayer::new(store.clone()).layer(Agent::new(model, tools));
///
/// agent.clone().oneshot(AgentRequest::new(Session::with_id("chat-1"), "hi")).await?;
/// let res = agent.oneshot(AgentRequest::new(Session::with_id("chat-1"), "again")).await?;
/// assert_eq!(res.session.history.len(), 4, "the second run went on from the first");
/// let stored = store.load("chat-1").await?.expect("saved");
/// assert_eq!(stored.session, res.session);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct StoreLayer {
    store: Arc<dyn SessionStore>,
}

impl StoreLayer {
    /// Keep the sessions of the runs in `store`.
    pub fn new(store: impl SessionStore) -> Self {
        Self::shared(Arc::new(store))
    }

    /// Keep them in a store shared with the host.
    pub fn shared(store: Arc<dyn SessionStore>) -> Self {
        Self { store }
    }
}

impl fmt::Debug for StoreLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLayer").finish_non_exhaustive()
    }
}

impl<A> Layer<A> for StoreLayer {
    type Service = StoreService<A>;

    fn layer(&self, inner: A) -> StoreService<A> {
        StoreService {
            inner,
            store: Arc::clone(&self.store),
        }
    }
}

/// An agent whose sessions are kept in a store: see [`StoreLayer`].
#[derive(Clone)]
pub struct StoreService<A> {
    inner: A,
    store: Arc<dyn SessionStore>,
}

impl<A> fmt::Debug for StoreService<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreService").finish_non_exhaustive()
    }
}

/// Whether a request's session says nothing but its id.
fn is_blank(session: &Session) -> bool {
    session.history.is_empty() && session.state.is_empty() && session.interrupts.is_empty()
}

impl<A> Service<AgentRequest> for StoreService<A>
where
    A: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
    A::Future: Send,
{
    type Response = AgentResponse;
    type Error = Error;
    type Future = BoxFuture<'static, Result<AgentResponse, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: AgentRequest) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = Arc::clone(&self.store);
        Box::pin(async move {
            let id = request.session.id.clone();
            let version = match store.load(&id).await? {
                Some(stored) if is_blank(&request.session) => {
                    request.session = stored.session;
                    Some(stored.version)
                }
                Some(stored) => {
                    let message = format!(
                        "session `{id}` is stored (at {}): run it by id (`Session::with_id`), \
                         or change it with `SessionStore::save` first",
                        stored.version
                    );
                    let conflict = StoreError::Conflict {
                        id,
                        expected: None,
                        found: Some(stored.version),
                    };
                    return Err(Error::bad_request(message).with_source(conflict));
                }
                None if is_blank(&request.session)
                    && matches!(request.input, AgentInput::Continue | AgentInput::Resume(_)) =>
                {
                    return Err(Error::bad_request(format!(
                        "session `{id}` is not stored: nothing to continue (start it with \
                         messages)"
                    )));
                }
                None => None,
            };
            // What is stored already is not written again (a run a layer answered without
            // changing the session).
            let saved = version.map(|_| SessionMark::of(&request.session));
            let saves = Arc::new(Saves {
                store,
                last: Mutex::new(Last {
                    version,
                    saved,
                    failed: false,
                }),
            });
            request.saver = Some(Arc::clone(&saves) as Arc<dyn Saver>);
            // The loop saves as it goes; a service that does not, or a layer that changed the
            // session after the loop's last save, is saved here.
            match inner.call(request).await {
                Ok(response) => {
                    saves.finish(&response.session).await?;
                    Ok(response)
                }
                Err(mut error) => {
                    if let Some(session) = error.take_session() {
                        if let Err(failed) = saves.finish(&session).await {
                            tracing::warn!(error = %failed, "the failed run's session was not saved");
                        }
                        error = error.with_session(session);
                    }
                    Err(error)
                }
            }
        })
    }
}

/// One run's saves: each names the version the one before wrote.
struct Saves {
    store: Arc<dyn SessionStore>,
    last: Mutex<Last>,
}

/// What the last save wrote, to tell whether the session the run returns is saved already.
struct Last {
    version: Option<Version>,
    saved: Option<SessionMark>,
    failed: bool,
}

impl Saves {
    fn last(&self) -> MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Save the session the run ended with, unless the run saved it already (the loop does,
    /// at its end), a save failed (the run's error says why), or it is a new session the run
    /// left empty (an input a guardrail refused: nothing is stored).
    async fn finish(&self, session: &Session) -> Result<(), Error> {
        let done = {
            let last = self.last();
            let saved = last.saved.as_ref();
            last.failed
                || saved.is_some_and(|saved| saved.is(session))
                || (last.version.is_none() && is_blank(session))
        };
        if done {
            return Ok(());
        }
        self.save(session).await
    }
}

impl Saver for Saves {
    fn save<'a>(&'a self, session: &'a Session) -> CoreFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let expected = {
                let last = self.last();
                // What is stored already (loaded, or saved last) is not written again.
                if last.saved.as_ref().is_some_and(|saved| saved.is(session)) {
                    return Ok(());
                }
                last.version
            };
            let saved = self.store.save(session, expected).await;
            let mut last = self.last();
            match saved {
                Ok(version) => {
                    last.version = Some(version);
                    last.saved = Some(SessionMark::of(session));
                    Ok(())
                }
                Err(error) => {
                    last.failed = true;
                    Err(error.into())
                }
            }
        })
    }
}

/// The store outermost on the agent: every built-in sees the stored session, and what each did
/// is saved.
impl tower_agent_loop::Builtin for StoreLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::AgentSlot;
        stacks.agent(AgentSlot::Store, self);
    }
}
