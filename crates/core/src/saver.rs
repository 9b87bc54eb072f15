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
