//! What a case's runs did, in order: the check's saver and observer.

use std::sync::{Arc, Mutex};

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, Event, Observer, Saver, Session};

use crate::lock;

/// What a run did, in order: the sessions it saved (the check plays the store, or a store tells
/// it) and the calls the loop told its observers it finished; and, when the check has a secret,
/// every event's text.
#[derive(Clone, Default)]
pub(super) struct Trace(pub(super) Arc<Mutex<TraceLog>>);

#[derive(Default)]
pub(super) struct TraceLog {
    pub(super) steps: Vec<Step>,
    pub(super) events: Vec<String>,
    keep_events: bool,
}

pub(super) enum Step {
    Saved(Session),
    Finished(String),
}

impl Trace {
    pub(super) fn new(keep_events: bool) -> Self {
        let trace = Self::default();
        lock(&trace.0).keep_events = keep_events;
        trace
    }

    /// The sessions saved, in order.
    pub(super) fn versions(&self) -> Vec<Session> {
        let log = lock(&self.0);
        let saved = log.steps.iter().filter_map(|step| match step {
            Step::Saved(session) => Some(session.clone()),
            Step::Finished(_) => None,
        });
        saved.collect()
    }
}

impl Trace {
    /// A session saved.
    pub(super) fn push(&self, session: &Session) {
        lock(&self.0).steps.push(Step::Saved(session.clone()));
    }
}

impl Saver for Trace {
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
        self.push(session);
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Observer for Trace {
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        let mut log = lock(&self.0);
        if let Event::ToolFinished { call_id, .. } = event {
            log.steps.push(Step::Finished(call_id.clone()));
        }
        if log.keep_events {
            log.events.push(format!("{event:?}"));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}
