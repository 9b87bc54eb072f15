//! Where a run saves its session as it goes: the saver a session store attaches to the
//! run's context.

use std::fmt;
use std::sync::Arc;

use super::{RunContext, lock};
use crate::error::Error;
use crate::event::BoxFuture;
use crate::session::Session;

/// Where the agent saves the session during a run, so that a process that dies loses at most
/// the step in flight.
///
/// The agent calls [`save`](Saver::save) with the input before the first model call (and, on a
/// resume, before the decided calls run), after appending the model's message when it calls
/// tools (so a call in flight is known on resume, and answered then), after appending their
/// results when the run goes on, and once at the run's end with the session the run returns
/// (its pending interrupts among it; also when the run fails). A save's error fails the run
/// with it (a lost store, another writer): the run stops instead of going on unsaved.
///
/// The results of one round's calls are saved together: when tools run concurrently, a
/// process that dies during a round loses the results of the calls of that round that had
/// finished (they are answered as not completed on resume).
///
/// A session store's layer attaches one (`tower_agent_sessions::StoreLayer`); write one by
/// hand to save elsewhere:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower_agent_core::{Saver, Error, RunContext, Session};
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
/// let ctx = RunContext::new();
/// ctx.set_saver(saved.clone());
/// assert!(ctx.saver().is_some());
/// assert!(ctx.nested("step").saver().is_none(), "a nested run saves nothing of its own");
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

/// The saver of a context, shared by its clones.
#[derive(Clone, Default)]
pub(super) struct Slot(Option<Arc<dyn Saver>>);

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

impl RunContext {
    /// Save the run's session with `saver` as it goes (see [`Saver`]); replaces any
    /// saver set before. Every clone of this context sees it; a nested or side context
    /// does not (a step of a workflow or a sub-agent is saved with the session it belongs to).
    pub fn set_saver(&self, saver: impl Saver) {
        lock(&self.shared.saver).0 = Some(Arc::new(saver));
    }

    /// The saver the run saves its session with, if one was set.
    pub fn saver(&self) -> Option<Arc<dyn Saver>> {
        lock(&self.shared.saver).0.clone()
    }
}
