//! Read-only tools started while the model still streams (`early_tool_start`).
//!
//! The loop puts an [`EarlyFilter`] on the model request, above every layer's filter: it sees
//! the tool calls the stream closed ([`Delta::ToolCall`]) after the layers let them through.
//! A call to a read-only tool starts at once, on its own task, through the whole tool stack.
//! When the model's message is in, the round adopts each early run whose call stands in the
//! message with the same id, name and arguments, and waits for its result instead of calling
//! the tool again. Everything else is aborted: runs the message does not have, every run when
//! the stream restarts (a retry, a fallback, a repair), every run when the call fails or the
//! run ends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;
use tower_agent_core::stream::{Delta, StreamFilter};
use tower_agent_core::{
    BoxError, Error, RunContext, ToolCall, ToolRequest, ToolResponse, ToolSpec,
};
use tower_service::Service;

use super::call::{self, CallFailure, tool_span};

/// How an early run ended: as [`call::call`] says.
pub(super) type EarlyOutcome = Option<Result<ToolResponse, CallFailure>>;

/// The early runs of one model call, held by the loop; dropping it aborts those not adopted.
pub(super) struct Early {
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    runs: Vec<(ToolCall, JoinHandle<EarlyOutcome>)>,
    /// The model call is over: nothing more starts.
    closed: bool,
}

impl Shared {
    fn abort_all(&mut self) {
        for (_, run) in self.runs.drain(..) {
            run.abort();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Early {
    /// Early runs for a model call offered `specs`, with the filter that starts them; `None`
    /// when no offered tool is read-only (or no tokio runtime can run them).
    pub(super) fn new<T>(
        specs: &[ToolSpec],
        tools: &T,
        ctx: &RunContext,
    ) -> Option<(Self, EarlyFilter<T>)>
    where
        T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
        T::Error: Into<BoxError>,
        T::Future: Send,
    {
        let read_only: HashSet<String> = specs
            .iter()
            .filter(|spec| spec.read_only)
            .map(|spec| spec.name.clone())
            .collect();
        if read_only.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            return None;
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let filter = EarlyFilter {
            shared: Arc::clone(&shared),
            read_only,
            tools: tools.clone(),
            ctx: ctx.clone(),
        };
        Some((Self { shared }, filter))
    }

    /// The model call is over: start nothing more.
    pub(super) fn close(&self) {
        lock(&self.shared).closed = true;
    }

    /// Abort the runs none of `calls` matches (id, name and arguments).
    pub(super) fn keep<'c>(&self, calls: impl Iterator<Item = &'c ToolCall>) {
        let calls: Vec<&ToolCall> = calls.collect();
        lock(&self.shared).runs.retain(|(early, run)| {
            let kept = calls.contains(&early);
            if !kept {
                run.abort();
            }
            kept
        });
    }

    /// The early run of `call`, if one started with the same id, name and arguments.
    pub(super) fn adopt(&self, call: &ToolCall) -> Option<EarlyRun> {
        let mut shared = lock(&self.shared);
        let at = shared.runs.iter().position(|(early, _)| early == call)?;
        Some(EarlyRun(shared.runs.swap_remove(at).1))
    }
}

/// An early run a round adopted: aborted if dropped before it finished (the round failed,
/// was cancelled, or an earlier call stopped the run).
pub(super) struct EarlyRun(JoinHandle<EarlyOutcome>);

impl EarlyRun {
    /// Wait for the run: its outcome, a panic as one, an abort as a cancellation.
    pub(super) async fn finish(mut self) -> EarlyOutcome {
        match (&mut self.0).await {
            Ok(outcome) => outcome,
            Err(error) if error.is_panic() => Some(Err(CallFailure::Panicked(
                "the early run of the tool panicked".to_owned(),
            ))),
            Err(_) => None,
        }
    }
}

impl Drop for EarlyRun {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        shared.closed = true;
        shared.abort_all();
    }
}

/// Starts the read-only calls the stream closes; see the [module docs](self).
pub(super) struct EarlyFilter<T> {
    shared: Arc<Mutex<Shared>>,
    read_only: HashSet<String>,
    tools: T,
    ctx: RunContext,
}

impl<T> StreamFilter for EarlyFilter<T>
where
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    fn delta(&mut self, delta: Delta, out: &mut Vec<Delta>) -> Result<(), Error> {
        if let Delta::ToolCall(call) = &delta {
            let mut shared = lock(&self.shared);
            let started = shared.runs.iter().any(|(early, _)| early.id == call.id);
            if self.read_only.contains(&call.name) && !shared.closed && !started {
                let mut tools = self.tools.clone();
                let request = ToolRequest {
                    call: call.clone(),
                    ctx: self.ctx.clone(),
                    resume: None,
                };
                let token = self.ctx.cancellation_token().clone();
                let run = tokio::spawn(async move {
                    let span = tool_span(&request.call);
                    call::call(&mut tools, request, &token, span).await
                });
                shared.runs.push((call.clone(), run));
            }
        }
        out.push(delta);
        Ok(())
    }

    fn restart(&mut self) {
        lock(&self.shared).abort_all();
    }
}
