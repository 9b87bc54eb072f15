//! Where a run saves its session as it goes: the saver a session store gives the run in its
//! request.

use std::sync::Arc;

use crate::error::Error;
use crate::event::BoxFuture;
use crate::session::Session;

/// Where the agent saves the session during a run, so that a process that dies loses at most
/// the step in flight.
///
/// The agent service that runs a request saves through the request's saver
/// ([`AgentRequest::saver`](crate::AgentRequest::saver)); nothing else does. The loop calls
/// [`save`](Saver::save):
///
/// 1. with the input applied, before the first model call (and, on a resume, before the
///    decided calls run). The input has passed the agent service's layers by then (redaction,
///    input guardrails, patching): nothing they would change is ever saved;
/// 2. after appending the model's message when it calls tools, before they run (a call in
///    flight is known on resume, and answered then, never run again blindly);
/// 3. each time a tool result comes, as the call finishes: its siblings still running stay
///    unanswered in that version, so a process that dies loses at most the calls in flight
///    and never reports a finished one as not done;
/// 4. after the round, when what it did after its results (the arguments calls ran with,
///    their order) changed the session;
/// 5. once at the run's end with the session the run returns (its pending interrupts among
///    it; also when the run fails).
///
/// A save of a session the run saved last already writes nothing. A save's error fails the
/// run with it (a lost store, another writer): the run stops instead of going on unsaved.
/// A workflow gives each agent it runs a saver that saves into the workflow's session, so a
/// workflow killed in a later step keeps the steps before.
///
/// A session store's layer gives one (`tower_agent_sessions::StoreLayer`); write one by hand to
/// save elsewhere:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower_agent_core::{AgentRequest, Saver, Error, Session};
/// use tower_agent_core::event::BoxFuture;
///
/// #[derive(Default)]
/// struct Lengths(Mutex<Vec<usize>>);
///
/// impl Saver for Lengths {
///     fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
///         Box::pin(async move {
///             self.0.lock().unwrap().push(session.history.len());
///             Ok(())
///         })
///     }
/// }
///
/// let saved = Arc::new(Lengths::default());
/// let request = AgentRequest::new(Session::with_id("s1"), "hi").with_saver(saved.clone());
/// assert!(request.saver.is_some());
/// ```
pub trait Saver: Send + Sync + 'static {
    /// Save `session` (the run's id, history, state and, at the end, its interrupts).
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>>;
}

impl<C: Saver + ?Sized> Saver for Arc<C> {
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
        (**self).save(session)
    }
}

/// A running tool call's way to have its run save the session now: the session as it stands
/// (the results of the calls beside it that finished), with the run's state as the call left
/// it. A call that keeps its progress in the run's state
/// ([`RunContext::update`](crate::RunContext::update)) saves it this way as it goes, so a
/// process that dies keeps it: a sub-agent saves each of its steps into the parent's session.
///
/// When its run has a saver, the loop puts one in the run's context
/// ([`RunSaves::of`]) and saves for the calls that ask, between its own saves, never at the
/// same time. A call started early (while the model still streams) waits in
/// [`save`](RunSaves::save) until the round runs.
///
/// ```
/// use tower_agent_core::{Error, RunSaves};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let (saves, mut asked) = RunSaves::channel();
/// let waiting = tokio::spawn(async move { saves.save().await });
/// // The run's side: save, then say how it went.
/// let reply = asked.recv().await.expect("a call asked");
/// let _ = reply.send(Ok(()));
/// waiting.await.expect("the call ended")?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RunSaves {
    asks: tokio::sync::mpsc::UnboundedSender<SaveReply>,
}

/// Where the run says how a save a call asked for went.
pub type SaveReply = tokio::sync::oneshot::Sender<Result<(), Error>>;

impl RunSaves {
    /// A handle for calls, and the run's end: each save a call asks for comes as a
    /// [`SaveReply`] to answer once the session is saved.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<SaveReply>) {
        let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
        (Self { asks }, asked)
    }

    /// The handle of the run `ctx` belongs to, when the run saves (the loop put it there).
    pub fn of(ctx: &crate::RunContext) -> Option<RunSaves> {
        ctx.extension::<RunSaves>()
    }

    /// Have the run save its session now, with the state as it stands. Fails with the save's
    /// error, or as [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled) when the run ended
    /// before it saved.
    pub async fn save(&self) -> Result<(), Error> {
        let (reply, replied) = tokio::sync::oneshot::channel();
        if self.asks.send(reply).is_err() {
            return Err(ended());
        }
        replied.await.unwrap_or_else(|_| Err(ended()))
    }
}

impl std::fmt::Debug for RunSaves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSaves").finish_non_exhaustive()
    }
}

fn ended() -> Error {
    Error::new(
        crate::error::ErrorKind::Cancelled,
        "the run ended before it saved",
    )
}
