//! `WorkflowObserver`: the lifecycle of a workflow's agents as hooks, each a no-op unless
//! implemented.

use std::fmt;

use crate::events::{
    AgentEnded, AgentFailed, AgentStarted, IterationEnded, IterationStarted, ProgressSummary,
};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Error, Event, Observer, Outcome};

/// Hooks on a workflow's lifecycle, each with the path of the agent it is about
/// (`coding_loop/2/reviewer`; the outermost agent's own events have the path `""`). Implement
/// only the ones you need; add it to a run with [`workflow_observer`].
///
/// Hooks are called on the run's task, in order, and must not block: hand slow work to a
/// channel or a task (or write an [`Observer`], which is async).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tower_agent_core::Outcome;
/// use tower_agent_workflow::{workflow_observer, WorkflowObserver};
///
/// #[derive(Default)]
/// struct Log(Mutex<Vec<String>>);
///
/// impl WorkflowObserver for Log {
///     fn agent_ended(&self, path: &str, _outcome: &Outcome) {
///         self.0.lock().unwrap().push(format!("{path} done"));
///     }
/// }
///
/// let observer = workflow_observer(Log::default());
/// # let _ = observer;
/// ```
pub trait WorkflowObserver: Send + Sync + 'static {
    /// A nested agent is about to run.
    fn agent_started(&self, path: &str) {
        let _ = path;
    }
    /// A nested agent's run ended normally.
    fn agent_ended(&self, path: &str, outcome: &Outcome) {
        let _ = (path, outcome);
    }
    /// A nested agent's run failed.
    fn agent_failed(&self, path: &str, error: &Error) {
        let _ = (path, error);
    }
    /// A loop's iteration is about to run.
    fn iteration_started(&self, path: &str, iteration: u32) {
        let _ = (path, iteration);
    }
    /// A loop's iteration ended; `next` says whether another follows.
    fn iteration_ended(&self, path: &str, iteration: u32, next: bool, reason: &str) {
        let _ = (path, iteration, next, reason);
    }
    /// An agent is about to call a tool.
    fn tool_started(&self, path: &str, name: &str) {
        let _ = (path, name);
    }
    /// A tool call finished.
    fn tool_finished(&self, path: &str, name: &str, is_error: bool) {
        let _ = (path, name, is_error);
    }
    /// An agent's model answered with text.
    fn text(&self, path: &str, text: &str) {
        let _ = (path, text);
    }
    /// A progress summary of the run ([`ProgressLayer`](crate::progress)).
    fn progress(&self, summary: &str) {
        let _ = summary;
    }
}

/// An [`Observer`] calling the hooks of `observer`: add it to the outermost request
/// (`AgentRequest::with_observer`).
pub fn workflow_observer<W: WorkflowObserver>(observer: W) -> WorkflowObserverAdapter<W> {
    WorkflowObserverAdapter { observer }
}

/// The observer [`workflow_observer`] returns.
pub struct WorkflowObserverAdapter<W> {
    observer: W,
}

impl<W> fmt::Debug for WorkflowObserverAdapter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowObserverAdapter")
            .finish_non_exhaustive()
    }
}

impl<W: WorkflowObserver> WorkflowObserverAdapter<W> {
    fn dispatch(&self, event: &Event, path: &str) {
        let o = &self.observer;
        match event {
            Event::Nested { path, event } => self.dispatch(event, path),
            Event::Layer(event) => {
                if let Some(AgentStarted { path }) = event.downcast_ref() {
                    o.agent_started(path);
                } else if let Some(AgentEnded { path, outcome }) = event.downcast_ref() {
                    o.agent_ended(path, outcome);
                } else if let Some(AgentFailed { path, error }) = event.downcast_ref() {
                    o.agent_failed(path, error);
                } else if let Some(IterationStarted { path, iteration }) = event.downcast_ref() {
                    o.iteration_started(path, *iteration);
                } else if let Some(ended) = event.downcast_ref::<IterationEnded>() {
                    o.iteration_ended(&ended.path, ended.iteration, ended.next, &ended.reason);
                } else if let Some(ProgressSummary { summary }) = event.downcast_ref() {
                    o.progress(summary);
                }
            }
            Event::ToolStarted { name, .. } => o.tool_started(path, name),
            Event::ToolFinished { name, is_error, .. } => o.tool_finished(path, name, *is_error),
            Event::Text { text, .. } => o.text(path, text),
            _ => {}
        }
    }
}

impl<W: WorkflowObserver> Observer for WorkflowObserverAdapter<W> {
    fn on_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        self.dispatch(event, "");
        Box::pin(std::future::ready(Ok(())))
    }
}
