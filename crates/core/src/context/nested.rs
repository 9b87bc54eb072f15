//! Contexts of nested agents: a workflow's steps, sub-agents called as tools.

use std::sync::{Arc, Mutex};

use super::{Extensions, RunContext, Shared};
use crate::error::Error;
use crate::event::{Event, EventSink, Observer};

/// Where a nested context belongs: the outermost run's context and its own path.
#[derive(Clone)]
pub(super) struct Nesting {
    root: RunContext,
    path: Arc<str>,
}

/// Forwards a nested run's events to the outermost run, tagged with the nested path.
struct Forward {
    root: RunContext,
    path: Arc<str>,
}

impl Observer for Forward {
    fn on_event<'a>(&'a self, event: &'a Event) -> crate::event::BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.root.emit(Event::Nested {
            path: Arc::clone(&self.path),
            event: Box::new(event.clone()),
        }))
    }
}

impl RunContext {
    /// A context for a model call a layer makes on the side of this run (a summarizer, a
    /// judge): the run's ids and its cancellation, nothing else. None of the run's events
    /// (the side call's text does not stream into the run), state or extensions; its
    /// [`root`](RunContext::root) is the run's, so a cost budget counts it.
    ///
    /// ```
    /// use tower_agent_core::{Event, RunContext, observer_fn};
    ///
    /// let run = RunContext::new()
    ///     .with_session_id("s1")
    ///     .with_observer(observer_fn(|_: &Event| async { Ok(()) }));
    /// let side = run.side_call();
    /// assert_eq!((side.run_id(), side.session_id()), (run.run_id(), "s1"));
    /// assert!(!side.events().is_enabled(), "the run's observers are not the side call's");
    /// run.cancel();
    /// assert!(side.is_cancelled(), "the run's cancellation reaches it");
    /// ```
    pub fn side_call(&self) -> RunContext {
        let mut side = RunContext::new()
            .with_run_id(Arc::clone(&self.shared.run_id))
            .with_session_id(Arc::clone(&self.shared.session_id))
            .with_cancellation(self.shared.cancel.clone());
        side.shared_mut().side_of = Some(self.root());
        side
    }

    /// A context for an agent nested in this run (a step of a workflow, a sub-agent called
    /// as a tool) named `name`: its own run id (the outermost run's id and the path), the same
    /// session id, the same cancellation token (the nested run is part of this one:
    /// cancelling either cancels both), and an event sink that forwards every event of the nested run to the
    /// outermost run's sink as [`Event::Nested`], tagged with the nested agent's path:
    /// this context's path (if it is itself nested), a `/`, and `name`. When nothing listens
    /// to the outermost run's events (no observer, no stream), the nested sink is disabled
    /// too. The nested run's JSON state and extensions are its own.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_core::Error> {
    /// use tower_agent_core::{Event, RunContext};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let record = seen.clone();
    /// let root = RunContext::new().with_observer(tower_agent_core::observer_fn(move |e: &Event| {
    ///     let (path, inner) = e.origin();
    ///     record.lock().unwrap().push(format!("{}:{}", path.unwrap_or("-"), inner.name()));
    ///     async { Ok(()) }
    /// }));
    /// let step = root.nested("coding_loop").nested("2").nested("reviewer");
    /// assert_eq!(step.path().as_deref(), Some("coding_loop/2/reviewer"));
    /// step.emit(Event::RoundStarted { round: 1 }).await?;
    /// assert_eq!(*seen.lock().unwrap(), ["coding_loop/2/reviewer:round_started"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nested(&self, name: &str) -> RunContext {
        let path = match &self.shared.nesting {
            Some(nesting) => {
                let mut path = String::with_capacity(nesting.path.len() + 1 + name.len());
                path.push_str(&nesting.path);
                path.push('/');
                path.push_str(name);
                path.into()
            }
            None => Arc::from(name),
        };
        self.nested_at(path)
    }

    /// [`RunContext::nested`] with the nested agent's whole path given (this context's path,
    /// if it is nested, is not prepended): for a workflow that has built it already.
    pub fn nested_at(&self, path: Arc<str>) -> RunContext {
        // An agent nested in a side call (a judge's) belongs to the side call: none of its
        // events reach the run.
        let root = match &self.shared.nesting {
            Some(nesting) => nesting.root.clone(),
            None => self.clone(),
        };
        // Nobody listens to the outermost run: the nested one's sink stays disabled, and its
        // agents build no events at all.
        let events = if root.events().is_enabled() {
            EventSink::new().with_observer(Forward {
                root: root.clone(),
                path: Arc::clone(&path),
            })
        } else {
            EventSink::new()
        };
        // Unique within the outermost run, and no random id to draw.
        let root_id = root.run_id();
        let mut run_id = String::with_capacity(root_id.len() + 1 + path.len());
        run_id.push_str(root_id);
        run_id.push('/');
        run_id.push_str(&path);
        Self::from_shared(Shared {
            run_id: run_id.into(),
            session_id: Arc::clone(&self.shared.session_id),
            // Part of the outer run: one token (a child token costs a lock and a node per
            // nested run).
            cancel: self.cancellation_token().clone(),
            events,
            state: Mutex::new(None),
            extensions: Mutex::new(Extensions::default()),
            nesting: Some(Box::new(Nesting { root, path })),
            side_of: None,
        })
    }

    /// The outermost run's context: this one when it is not nested, the run's for a
    /// [side call](RunContext::side_call). Where a run, the agents nested in it and the calls
    /// made on its side keep what they share (a cost budget's ledger) in its extensions.
    ///
    /// ```
    /// use tower_agent_core::RunContext;
    ///
    /// let run = RunContext::new();
    /// run.insert_extension(7_u32);
    /// let step = run.nested("plan").nested("research");
    /// assert_eq!(step.extension::<u32>(), None, "a nested run's extensions are its own");
    /// assert_eq!(step.root().extension::<u32>(), Some(7), "its root's are the run's");
    /// assert_eq!(run.root().extension::<u32>(), Some(7));
    /// let side = run.side_call();
    /// assert_eq!(side.extension::<u32>(), None, "a side call's extensions are its own");
    /// assert_eq!(side.root().extension::<u32>(), Some(7), "its root is the run's");
    /// assert!(side.is_side_call() && !run.is_side_call() && !step.is_side_call());
    /// ```
    pub fn root(&self) -> RunContext {
        match (&self.shared.nesting, &self.shared.side_of) {
            (Some(nesting), _) => nesting.root.clone(),
            (None, Some(run)) => run.clone(),
            (None, None) => self.clone(),
        }
    }

    /// Whether this context is a [side call](RunContext::side_call)'s.
    pub fn is_side_call(&self) -> bool {
        self.shared.side_of.is_some()
    }

    /// This context's path when it belongs to a nested agent ([`RunContext::nested`]).
    pub fn path(&self) -> Option<Arc<str>> {
        self.shared.nesting.as_ref().map(|n| Arc::clone(&n.path))
    }
}
