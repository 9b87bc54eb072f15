//! The journal layer: model and tool calls become steps the durable handler journals.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tower_agent_core::{
    BoxError, DescribeTools, Error, ErrorKind, ModelRequest, ModelResponse, RunContext,
    ToolRequest, ToolResponse, ToolSpec,
};
use tower_layer::Layer;
use tower_service::Service;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One call to journal: its name, the call itself (made only when the journal has no result
/// for it), and where its recorded result goes.
pub(crate) struct Step {
    pub(crate) name: String,
    pub(crate) call: BoxFuture<Value>,
    pub(crate) reply: oneshot::Sender<Journaled>,
}

/// What the journal gave a step.
pub(crate) enum Journaled {
    /// The recorded result (made now, or taken from the journal on a replay).
    Recorded(Value),
    /// The invocation was cancelled.
    Cancelled,
    /// The journal refused the step.
    Failed(String),
}

/// Where a run's steps go: the handler that journals them.
#[derive(Clone)]
pub(crate) struct Steps(pub(crate) mpsc::UnboundedSender<Step>);

tokio::task_local! {
    /// The steps of the durable run on this task: set around the run, unset inside a step.
    static STEPS: Option<Steps>;
}

/// Run `run` with its journal layers sending their calls to `steps`: every call the run makes
/// on its task, its nested agents' (a workflow's steps) and its layers' side calls among them.
pub(crate) async fn within<F: Future>(steps: Steps, run: F) -> F::Output {
    STEPS.scope(Some(steps), run).await
}

/// The steps of the durable run this task is in, if any.
fn current() -> Option<Steps> {
    STEPS.try_with(Clone::clone).ok().flatten()
}

/// A call's result as the journal keeps it: the response, or the error (kind and message).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Recorded<T> {
    Ok(T),
    Err { kind: ErrorKind, message: String },
}

impl<T: Serialize> Recorded<T> {
    fn of(result: Result<T, Error>) -> Value {
        let recorded = match result {
            Ok(response) => Recorded::Ok(response),
            Err(error) => Recorded::Err {
                kind: error.kind(),
                message: error.message().to_owned(),
            },
        };
        serde_json::to_value(recorded).unwrap_or_else(|e| {
            let failure: Recorded<()> = Recorded::Err {
                kind: ErrorKind::Other,
                message: format!("the result could not be recorded: {e}"),
            };
            serde_json::to_value(failure).unwrap_or(Value::Null)
        })
    }
}

impl Steps {
    /// Journal `call` as the step `name`; its result, recorded or replayed.
    async fn journal<T: DeserializeOwned>(
        &self,
        name: String,
        call: BoxFuture<Value>,
    ) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        let gone = || Error::other("the durable run ended before this step was journaled");
        // What the call makes is inside this step: a sub-agent called as a tool journals
        // nothing of its own (a step cannot hold steps).
        let call = Box::pin(STEPS.scope(None, call));
        self.0
            .send(Step { name, call, reply })
            .map_err(|_| gone())?;
        match answer.await.map_err(|_| gone())? {
            Journaled::Recorded(value) => match serde_json::from_value(value) {
                Ok(Recorded::Ok(response)) => Ok(response),
                Ok(Recorded::Err { kind, message }) => Err(Error::new(kind, message)),
                Err(e) => Err(Error::new(
                    ErrorKind::InvalidResponse,
                    format!("the journaled result cannot be read: {e}"),
                )),
            },
            Journaled::Cancelled => Err(Error::cancelled()),
            Journaled::Failed(message) => Err(Error::backend(message)),
        }
    }
}

/// Journal the model or tool calls of a stack: under [`DurableAgent`](crate::DurableAgent),
/// each call is a step of the invocation's journal (Restate's `ctx.run`), made once; a replay
/// after a crash takes its result from the journal and does not call the inner service again.
/// Outside a durable run, calls pass through.
///
/// The durable run is the task it runs on: the calls of its nested agents (a workflow's steps)
/// are journaled too, each in its place; a call made inside a step (a sub-agent called as a
/// tool) is part of that step. A call made on a task the run spawned is not journaled.
///
/// Place it innermost: around the provider (the `provider_layer` slot) and around the tools
/// (the `tool_layer` slot), so that every other layer runs again on a replay, with the same
/// results, and keeps its own state right. A failed call is journaled too (its error's kind
/// and message): a retry layer outside it makes each attempt a step of its own.
///
/// A tool call is two steps: one that records it started (write-ahead), then the call. A
/// journaled call never runs again (exactly once). A call in flight when the process died
/// (started, not recorded) is not run blindly on the replay: it reaches the tools as a
/// recovery ([`ToolRequest::recover`]), and the tool's reconcile step says what became of it,
/// looked up by the call's key ([`ToolCall::key`](tower_agent_core::ToolCall::key), the same
/// on the replay); a tool that may repeat runs again.
#[derive(Clone, Copy, Debug, Default)]
pub struct JournalLayer;

impl JournalLayer {
    /// The layer.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for JournalLayer {
    type Service = Journal<S>;

    fn layer(&self, inner: S) -> Journal<S> {
        Journal { inner }
    }
}

/// The service [`JournalLayer`] makes.
#[derive(Clone)]
pub struct Journal<S> {
    inner: S,
}

impl<S> fmt::Debug for Journal<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal").finish_non_exhaustive()
    }
}

impl<S: DescribeTools> DescribeTools for Journal<S> {
    fn tool_specs(&self) -> std::sync::Arc<[ToolSpec]> {
        self.inner.tool_specs()
    }
}

/// A request whose calls [`JournalLayer`] journals: a model request or a tool request.
pub trait JournaledRequest: sealed::Sealed + Send + 'static {
    /// What the call answers, as the journal records it.
    type Response: Serialize + DeserializeOwned + Send + 'static;

    /// The step's name: what it calls, after the nested agent's path (a workflow's step).
    fn step_name(&self) -> String;

    /// The name of the step that records, before the call, that it started (the write-ahead
    /// record of a call with effects: a tool call); `None` for a model call.
    fn started_step(&self) -> Option<String>;

    /// This request, recovering a call an attempt before the replay started and did not
    /// record ([`ToolRequest::recover`]).
    fn recovering(self) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tower_agent_core::ModelRequest {}
    impl Sealed for tower_agent_core::ToolRequest {}
}

/// `what`, after the path of the nested agent `ctx` belongs to.
fn on_path(ctx: &RunContext, what: String) -> String {
    match ctx.path() {
        Some(path) => format!("{path}: {what}"),
        None => what,
    }
}

impl JournaledRequest for ModelRequest {
    type Response = ModelResponse;

    fn step_name(&self) -> String {
        on_path(&self.ctx, format!("model (round {})", self.ctx.round()))
    }

    fn started_step(&self) -> Option<String> {
        None
    }

    fn recovering(self) -> Self {
        self
    }
}

impl JournaledRequest for ToolRequest {
    type Response = ToolResponse;

    fn step_name(&self) -> String {
        on_path(
            &self.ctx,
            format!("tool {} {}", self.call.name, self.call.id),
        )
    }

    fn started_step(&self) -> Option<String> {
        Some(format!("{} started", self.step_name()))
    }

    fn recovering(mut self) -> Self {
        self.recover = true;
        self
    }
}

fn into_error(error: impl Into<BoxError>) -> Error {
    Error::from_boxed(error.into())
}

impl<S, R> Service<R> for Journal<S>
where
    R: JournaledRequest,
    S: Service<R, Response = R::Response> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = R::Response;
    type Error = Error;
    type Future = BoxFuture<Result<R::Response, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx).map_err(into_error)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(steps) = current() else {
            return Box::pin(async move { inner.call(request).await.map_err(into_error) });
        };
        let name = request.step_name();
        let Some(started) = request.started_step() else {
            // Called only when the journal has no result for this step.
            let call =
                Box::pin(
                    async move { Recorded::of(inner.call(request).await.map_err(into_error)) },
                );
            return Box::pin(async move { steps.journal(name, call).await });
        };
        Box::pin(async move {
            // Write-ahead: a step records that the call started. Its closure runs only the
            // first time; on a replay the journal has it, and a call whose own step the
            // journal lacks then was in flight when the service died: it is recovered.
            let first = Arc::new(AtomicBool::new(false));
            let marked = Arc::clone(&first);
            let mark = Box::pin(async move {
                marked.store(true, Ordering::SeqCst);
                Recorded::of(Ok(()))
            });
            steps.journal::<()>(started, mark).await?;
            let request = match first.load(Ordering::SeqCst) {
                true => request,
                false => request.recovering(),
            };
            // Called only when the journal has no result for this step.
            let call =
                Box::pin(
                    async move { Recorded::of(inner.call(request).await.map_err(into_error)) },
                );
            steps.journal(name, call).await
        })
    }
}
