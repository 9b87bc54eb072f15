//! Read-only tools started while the model still streams (`early_tool_start`).
//!
//! The loop puts an [`EarlyFilter`] on the model request, above every layer's filter: it sees
//! the tool calls the stream closed ([`Delta::ToolCall`]) after the layers let them through
//! (the redaction, for one, has redacted their arguments). A call to a read-only tool starts
//! at once, on its own task, through the whole tool stack. When the model's message is in,
//! the round keeps the early runs whose call stands in the message with the same id, name and
//! arguments, and waits for their results instead of calling the tools again. Every other
//! run is aborted: at once when the message is in, every run when the stream restarts (a
//! retry, a fallback, a repair), and every run when [`Early`] is dropped (the call failed,
//! the run ended).
//!
//! Each early run's request carries a [`Tentative`]: the loop keeps it when the round adopts
//! the run, and discards it when the run is aborted, so the layers that counted the call (call
//! limits, the checkpoint) give it back. A discarded early run counts against nothing.

use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::task::AbortOnDropHandle;
use tower_agent_core::stream::{Delta, StreamFilter};
use tower_agent_core::{
    BoxError, Error, RunContext, Tentative, ToolCall, ToolRequest, ToolResponse, ToolSpec,
};
use tower_service::Service;

use super::call::{self, CallFailure, record_tool, tool_span};
use super::key::CallKeys;

/// How an early run ended: as [`call::call`] says.
type EarlyOutcome = Option<Result<ToolResponse, CallFailure>>;

/// An early run; aborted, and discarded, when dropped before the round adopts it.
pub(super) struct EarlyRun {
    task: AbortOnDropHandle<EarlyOutcome>,
    tentative: Tentative,
}

impl Drop for EarlyRun {
    fn drop(&mut self) {
        // Nothing once the round kept it.
        self.tentative.discard();
    }
}

impl EarlyRun {
    /// Adopt the run and wait for it: its outcome, a panic as one, an abort as a
    /// cancellation.
    pub(super) async fn finish(mut self) -> EarlyOutcome {
        self.tentative.keep();
        match (&mut self.task).await {
            Ok(outcome) => outcome,
            Err(error) if error.is_panic() => Some(Err(CallFailure::Panicked(
                "the early run of the tool panicked".to_owned(),
            ))),
            Err(_) => None,
        }
    }
}

/// The early runs of one model call, held by the loop; dropping it aborts them all.
pub(super) struct Early {
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    runs: Vec<(ToolCall, EarlyRun)>,
    /// The model call is over: nothing more starts (a clone of the request may outlive it).
    closed: bool,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Early {
    /// Early runs for a model call offered `specs`, with the filter that starts them; `None`
    /// when no offered tool is read-only (or no tokio runtime can run them).
    pub(super) fn new<T>(
        specs: &Arc<[ToolSpec]>,
        tools: &T,
        ctx: &RunContext,
        keys: CallKeys,
    ) -> Option<(Self, EarlyFilter<T>)>
    where
        T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send,
    {
        let any = specs.iter().any(|spec| spec.read_only);
        if !any || tokio::runtime::Handle::try_current().is_err() {
            return None;
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let filter = EarlyFilter {
            shared: Arc::clone(&shared),
            specs: Arc::clone(specs),
            tools: tools.clone(),
            ctx: ctx.clone(),
            keys,
            closed: 0,
        };
        Some((Self { shared }, filter))
    }

    /// The model call is over: start nothing more.
    pub(super) fn close(&self) {
        lock(&self.shared).closed = true;
    }

    /// Keep the runs of `calls` (same id, name and arguments); abort the others.
    pub(super) fn keep<'c>(&self, calls: impl Iterator<Item = &'c ToolCall>) {
        let calls: Vec<&ToolCall> = calls.collect();
        lock(&self.shared)
            .runs
            .retain(|(early, _)| calls.contains(&early));
    }

    /// The early run of `call`, if one started with the same id, name and arguments.
    pub(super) fn adopt(&self, call: &ToolCall) -> Option<EarlyRun> {
        let mut shared = lock(&self.shared);
        let at = shared.runs.iter().position(|(early, _)| early == call)?;
        Some(shared.runs.swap_remove(at).1)
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        shared.closed = true;
        shared.runs.clear();
    }
}

/// Starts the read-only calls the stream closes; see the [module docs](self).
pub(super) struct EarlyFilter<T> {
    shared: Arc<Mutex<Shared>>,
    specs: Arc<[ToolSpec]>,
    tools: T,
    ctx: RunContext,
    keys: CallKeys,
    /// The calls the stream closed so far: the next one's position in the message.
    closed: usize,
}

impl<T> EarlyFilter<T> {
    /// Whether `call` may start now: a read-only tool, an id the message will keep (an empty
    /// one is replaced), not started yet, the call not over.
    fn starts(&self, shared: &Shared, call: &ToolCall) -> bool {
        let read_only = |spec: &ToolSpec| spec.read_only && spec.name == call.name;
        !shared.closed
            && !call.id.is_empty()
            && self.specs.iter().any(read_only)
            && !shared.runs.iter().any(|(early, _)| early.id == call.id)
    }
}

impl<T> StreamFilter for EarlyFilter<T>
where
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
        if let Delta::ToolCall(streamed) = &delta {
            let position = self.closed;
            self.closed += 1;
            let mut shared = lock(&self.shared);
            if self.starts(&shared, streamed) {
                // The key the round gives the call when the message is in: the same call.
                let mut call = streamed.clone();
                call.key = Some(self.keys.key(self.ctx.round(), position));
                let mut tools = self.tools.clone();
                let tentative = Tentative::new();
                let request = ToolRequest {
                    call: call.clone(),
                    ctx: self.ctx.clone(),
                    resume: None,
                    early: Some(tentative.clone()),
                    recover: false,
                };
                let token = self.ctx.cancellation_token().clone();
                let run = tokio::spawn(async move {
                    let span = tool_span(&request.call);
                    call::call(&mut tools, request, &token, span, record_tool).await
                });
                let run = EarlyRun {
                    task: AbortOnDropHandle::new(run),
                    tentative,
                };
                shared.runs.push((call, run));
            }
        }
        out.push(delta);
        Ok(())
    }

    fn restart(&mut self) {
        self.closed = 0;
        lock(&self.shared).runs.clear();
    }
}
