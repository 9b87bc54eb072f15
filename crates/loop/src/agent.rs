//! The agent service: the loop.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::stream::{self, StreamExt};
use pin_project_lite::pin_project;
use serde_json::Value;
use tokio_util::sync::WaitForCancellationFuture;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, BoxError, CancellationToken, ContentPart, Error,
    ErrorKind, Event, GenerationOptions, History, Interrupt, Message, ModelRequest, ModelResponse,
    Outcome, Role, RunContext, Session, StopReason, ToolAction, ToolCall, ToolRequest,
    ToolResponse, ToolResult, ToolSpec, Usage,
};
use tower_service::Service;
use tracing::Instrument;

/// How the tool calls of one round run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolExecution {
    /// One after the other, in call order. A tool response that stops the loop skips the
    /// calls after it (they get a "not executed" result).
    #[default]
    Sequential,
    /// Up to `limit` at once. Results are still appended in call order; every call of the
    /// round runs, even when one of them stops the loop.
    Concurrent {
        /// The most calls running at once (at least 1).
        limit: usize,
    },
}

/// The loop's configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The most model calls in one run (at least 1).
    pub max_rounds: u32,
    /// How tool calls run.
    pub tool_execution: ToolExecution,
    /// The tools offered to the model.
    pub tool_specs: Arc<[ToolSpec]>,
    /// The system instructions of every model call.
    pub system: Option<Arc<str>>,
    /// The generation options of every model call.
    pub options: GenerationOptions,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_rounds: AgentBuilder::DEFAULT_MAX_ROUNDS,
            tool_execution: ToolExecution::Sequential,
            tool_specs: Arc::from(Vec::new()),
            system: None,
            options: GenerationOptions::default(),
        }
    }
}

/// Builds an [`Agent`].
#[derive(Debug, Clone, Default)]
pub struct AgentBuilder {
    config: AgentConfig,
}

impl AgentBuilder {
    /// The default for [`AgentBuilder::max_rounds`].
    pub const DEFAULT_MAX_ROUNDS: u32 = 32;

    /// A builder with the defaults: 32 rounds, sequential tools, no tools offered, no system
    /// prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// The system instructions of every model call.
    pub fn system(mut self, system: impl Into<Arc<str>>) -> Self {
        self.config.system = Some(system.into());
        self
    }

    /// The most model calls in one run; 0 counts as 1. When the model still asks for tools
    /// after that many calls, the run ends with [`StopReason::MaxRounds`].
    pub fn max_rounds(mut self, max_rounds: u32) -> Self {
        self.config.max_rounds = max_rounds.max(1);
        self
    }

    /// Run the tool calls of a round one after the other (the default).
    pub fn sequential_tools(mut self) -> Self {
        self.config.tool_execution = ToolExecution::Sequential;
        self
    }

    /// Run up to `limit` tool calls of a round at once; 0 counts as 1.
    pub fn concurrent_tools(mut self, limit: usize) -> Self {
        self.config.tool_execution = ToolExecution::Concurrent {
            limit: limit.max(1),
        };
        self
    }

    /// The tools offered to the model, e.g. `tool_set.specs()`.
    pub fn tool_specs(mut self, specs: impl Into<Arc<[ToolSpec]>>) -> Self {
        self.config.tool_specs = specs.into();
        self
    }

    /// The generation options of every model call.
    pub fn options(mut self, options: GenerationOptions) -> Self {
        self.config.options = options;
        self
    }

    /// The agent driving `model` and `tools`.
    pub fn build<M, T>(self, model: M, tools: T) -> Agent<M, T> {
        Agent {
            model,
            tools,
            config: Arc::new(self.config),
        }
    }
}

/// The agent service: the loop that drives a model service and a tool service round by
/// round.
///
/// Each round: check cancellation; call the model with the history; append its message;
/// emit `RoundCompleted`; run its tool calls and append their results in call order. The run
/// ends when the model calls no tool ([`Outcome::Completed`]), a tool response stops the loop
/// or `max_rounds` is reached ([`Outcome::Stopped`]), the run is cancelled
/// ([`Outcome::Cancelled`]) or a tool response interrupts it ([`Outcome::Interrupted`]).
///
/// Bad input never fails the run: an unknown tool, malformed arguments, a tool error or a
/// panicking tool each become an error result the model sees. A model error fails the run
/// with `Err`; the error carries the session with every tool call answered
/// ([`Error::take_session`]).
///
/// The agent is always ready; each call clones the model and tool services and drives them
/// to readiness before every use. `Clone + Send + 'static` when the services are, so one
/// composed stack serves many sessions at once.
///
/// ```
/// use tower::{service_fn, ServiceExt};
/// use tower_agent_core::{AgentRequest, Error, ModelRequest, ModelResponse, Session, ToolRequest, ToolResponse};
/// use tower_agent_loop::Agent;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let model = service_fn(|req: ModelRequest| async move {
///     Ok::<_, Error>(ModelResponse::text(format!("{} messages", req.messages.len())))
/// });
/// let tools = service_fn(|req: ToolRequest| async move {
///     Ok::<_, Error>(ToolResponse::success(&req.call, "unused"))
/// });
/// let agent = Agent::builder().build(model, tools);
///
/// let res = agent.oneshot(AgentRequest::new(Session::new(), "hello")).await?;
/// assert_eq!(res.text().as_deref(), Some("1 messages"));
/// assert_eq!(res.session.history.len(), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Agent<M, T> {
    model: M,
    tools: T,
    config: Arc<AgentConfig>,
}

impl Agent<(), ()> {
    /// A builder.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::new()
    }
}

impl<M, T> Agent<M, T> {
    /// An agent with the default configuration.
    pub fn new(model: M, tools: T) -> Self {
        AgentBuilder::new().build(model, tools)
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The model service.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tool service.
    pub fn tools(&self) -> &T {
        &self.tools
    }
}

impl<M, T> fmt::Debug for Agent<M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<M, T> Service<AgentRequest> for Agent<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Clone + Send + 'static,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    type Response = AgentResponse;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<AgentResponse, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: AgentRequest) -> Self::Future {
        let AgentRequest {
            mut session,
            input,
            ctx,
        } = request;
        // The session's durable state lives in the context during the run.
        ctx.absorb_state(std::mem::take(&mut session.state));
        let span = tracing::info_span!(
            "invoke_agent",
            gen_ai.operation.name = "invoke_agent",
            gen_ai.conversation.id = %ctx.session_id(),
            run_id = %ctx.run_id(),
        );
        let run = Run {
            model: self.model.clone(),
            tools: self.tools.clone(),
            config: Arc::clone(&self.config),
            session,
            ctx,
            usage: Usage::default(),
            rounds: 0,
            scratch: RoundTools::default(),
            call_ids: IdSet::default(),
        };
        Box::pin(run.run(input).instrument(span))
    }
}

/// One run's state.
struct Run<M, T> {
    model: M,
    tools: T,
    config: Arc<AgentConfig>,
    session: Session,
    ctx: RunContext,
    usage: Usage,
    rounds: u32,
    /// Reused every round, so a round allocates no bookkeeping of its own.
    scratch: RoundTools,
    /// Hashes of every tool call id in the history, so new calls get unique ids.
    call_ids: IdSet,
}

/// What the tools of one round produced.
#[derive(Default)]
struct RoundTools {
    results: Vec<ToolResult>,
    interrupts: Vec<Interrupt>,
    stop: Option<StopReason>,
    cancelled: bool,
    error: Option<Error>,
}

/// How one tool call ended.
enum ToolOutcome {
    Response(ToolResponse),
    Failed(Error),
    Panicked(String),
}

impl ToolOutcome {
    /// Whether the model will see an error (an interrupt is not one).
    fn is_error(&self) -> bool {
        match self {
            ToolOutcome::Response(r) => {
                r.result.is_error && !matches!(r.action, ToolAction::Interrupt { .. })
            }
            ToolOutcome::Failed(_) | ToolOutcome::Panicked(_) => true,
        }
    }
}

/// Build and emit an event only when something listens (evaluates to the emit's result).
/// Observers are awaited; a full stream is waited on only until the run is cancelled (see
/// `RunContext::emit`).
macro_rules! emit {
    ($ctx:expr, $event:expr) => {
        if $ctx.events().is_enabled() {
            $ctx.emit($event).await
        } else {
            Ok(())
        }
    };
}

const NOT_DECIDED: &str =
    "not executed: the run was interrupted here and continued with new input instead of a decision";
const RUN_FAILED: &str = "not executed: the run failed before this tool call completed";
const DANGLING: &str =
    "cancelled: the previous run ended before this tool call completed (resumed from a checkpoint)";

impl<M, T> Run<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Send,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    async fn run(mut self, input: AgentInput) -> Result<AgentResponse, Error> {
        let result = self.drive(input).await;
        self.finish(result).await
    }

    async fn drive(&mut self, input: AgentInput) -> Result<Outcome, Error> {
        let (run_id, session_id) = (self.ctx.run_id(), self.ctx.session_id());
        emit!(
            self.ctx,
            Event::RunStarted {
                run_id: run_id.into(),
                session_id: session_id.into(),
            }
        )?;

        if let Some(outcome) = self.prepare(input).await? {
            return Ok(outcome);
        }

        loop {
            if self.ctx.is_cancelled() {
                return Ok(Outcome::Cancelled);
            }
            if self.rounds >= self.config.max_rounds {
                return Ok(Outcome::Stopped {
                    reason: StopReason::MaxRounds {
                        limit: self.config.max_rounds,
                    },
                });
            }
            self.rounds += 1;
            let round = self.rounds;
            emit!(self.ctx, Event::RoundStarted { round })?;
            self.discard_stale_commit();

            let request = ModelRequest {
                system: self.config.system.clone(),
                messages: self.session.history.clone(),
                tools: Arc::clone(&self.config.tool_specs),
                options: self.config.options.clone(),
                ctx: self.ctx.with_round(round),
            };
            let span = tracing::info_span!("chat", gen_ai.operation.name = "chat", round);
            // Not started once cancelled; dropped if cancelled while pending.
            let response = cancellable(
                self.ctx.cancellation_token(),
                call_model(&mut self.model, request).instrument(span),
            )
            .await;
            // The request is gone: a history committed by a layer replaces ours before the
            // model's message is appended.
            let committed = self.apply_commit();
            let response = match response {
                None => return Ok(Outcome::Cancelled),
                Some(Err(error))
                    if error.kind() == ErrorKind::Cancelled && self.ctx.is_cancelled() =>
                {
                    return Ok(Outcome::Cancelled);
                }
                Some(Err(error)) => return Err(error),
                Some(Ok(response)) => response,
            };
            let ModelResponse {
                mut message, usage, ..
            } = response;
            self.usage += usage;
            committed?;
            message.role = Role::Assistant;
            self.normalize(&mut message, round);
            if message.has_text() {
                emit!(
                    self.ctx,
                    Event::Text {
                        round,
                        text: message.text(),
                    }
                )?;
            }
            self.session.history.push(message);
            let [.., message] = &self.session.history[..] else {
                unreachable!("a message was just appended");
            };
            emit!(
                self.ctx,
                Event::RoundCompleted {
                    round,
                    message: message.clone(),
                    history: Some(self.session.history.clone()),
                    usage,
                }
            )?;
            if !message.has_tool_calls() {
                return Ok(Outcome::Completed {
                    message: message.clone(),
                });
            }
            let mut out = std::mem::take(&mut self.scratch);
            execute(
                &mut self.tools,
                &self.ctx,
                round,
                self.config.tool_execution,
                &message.content,
                None,
                &mut out,
            )
            .await;
            if let Some(outcome) = self.absorb_round(out, false)? {
                return Ok(outcome);
            }
        }
    }

    /// Check the session, repair what a crash left, and apply the input. An outcome when the
    /// run ends before the first round.
    async fn prepare(&mut self, input: AgentInput) -> Result<Option<Outcome>, Error> {
        let outcome = match input {
            AgentInput::Resume(value) => {
                check_interrupts(&self.session)?;
                self.answer_dangling_calls();
                if self.session.interrupts.is_empty() {
                    return Err(Error::bad_request(
                        "cannot resume: the session has no pending interrupt",
                    ));
                }
                let calls: Vec<ContentPart> = std::mem::take(&mut self.session.interrupts)
                    .into_iter()
                    .map(|i| ContentPart::ToolCall(i.call))
                    .collect();
                let mut out = std::mem::take(&mut self.scratch);
                execute(
                    &mut self.tools,
                    &self.ctx,
                    0,
                    self.config.tool_execution,
                    &calls,
                    Some(&value),
                    &mut out,
                )
                .await;
                self.absorb_round(out, true)?
            }
            AgentInput::Continue => {
                check_interrupts(&self.session)?;
                self.answer_dangling_calls();
                if self.session.interrupts.is_empty() {
                    None
                } else {
                    // Nothing was decided: the calls keep waiting.
                    Some(Outcome::Interrupted {
                        interrupts: std::mem::take(&mut self.session.interrupts),
                    })
                }
            }
            AgentInput::Messages(messages) => {
                // The user moved on: calls that waited for a decision are answered as not
                // executed. An interrupt that matches no open call (a stale session) is
                // dropped: there is nothing left to answer.
                for interrupt in std::mem::take(&mut self.session.interrupts) {
                    // A duplicate finds its call answered already: it is dropped too.
                    let open = open_calls(&self.session.history)
                        .iter()
                        .any(|call| call.id == interrupt.call.id);
                    if open {
                        let result = ToolResult::error(&interrupt.call, NOT_DECIDED);
                        self.session.history.push(Message::tool_result(result));
                    } else {
                        tracing::warn!(call_id = %interrupt.call.id, "dropped a stale interrupt");
                    }
                }
                self.answer_dangling_calls();
                order_results(&mut self.session.history);
                self.session.history.extend(messages);
                None
            }
            other => {
                return Err(Error::bad_request(format!(
                    "this agent does not support the input {other:?}"
                )));
            }
        };
        // Every call id in the session, the input included, so new calls get unique ones.
        self.call_ids.clear();
        self.call_ids.reserve(self.session.history.len() / 2 + 16);
        self.call_ids.extend(
            self.session
                .history
                .iter()
                .flat_map(Message::tool_calls)
                .map(|call| id_hash(&call.id)),
        );
        Ok(outcome)
    }

    /// Calls a previous run left unanswered without waiting for a decision (a process that
    /// stopped after `RoundCompleted`) get a cancelled result: the model sees why. Running
    /// them again could repeat their side effects.
    fn answer_dangling_calls(&mut self) {
        answer_open_calls(
            &mut self.session.history,
            &self.session.interrupts,
            DANGLING,
        );
    }

    /// Make the model's message safe to append: only text, reasoning and calls, each call with
    /// an id no other call in the session uses.
    fn normalize(&mut self, message: &mut Message, round: u32) {
        if message
            .content
            .iter()
            .any(|part| matches!(part, ContentPart::ToolResult(_)))
        {
            // A model cannot answer calls; a result part would break the history.
            message
                .content
                .retain(|part| !matches!(part, ContentPart::ToolResult(_)));
        }
        let mut index = 0;
        for part in &mut message.content {
            let ContentPart::ToolCall(call) = part else {
                continue;
            };
            index += 1;
            if call.id.is_empty() || !self.call_ids.insert(id_hash(&call.id)) {
                let prefix: String = self.ctx.run_id().chars().take(8).collect();
                let mut id = format!("call_{prefix}_{round}_{index}");
                while !self.call_ids.insert(id_hash(&id)) {
                    id.push('_');
                }
                call.id = id;
            }
        }
    }

    /// Append a round's results; the outcome if the round ends the run. `resumed`: the results
    /// answer calls that waited, and are put back in call order.
    fn absorb_round(
        &mut self,
        mut out: RoundTools,
        resumed: bool,
    ) -> Result<Option<Outcome>, Error> {
        self.session
            .history
            .extend(out.results.drain(..).map(Message::tool_result));
        let mut interrupts = std::mem::take(&mut out.interrupts);
        let stop = out.stop.take();
        let cancelled = std::mem::take(&mut out.cancelled);
        let error = out.error.take();
        // Keep the (empty) buffers for the next round.
        self.scratch = out;
        // Calls that would wait for a decision cannot wait when the run ends otherwise.
        let closing = if error.is_some() {
            Some(RUN_FAILED.to_owned())
        } else if cancelled {
            Some(ToolResult::CANCELLED.to_owned())
        } else {
            stop.as_ref().map(not_executed)
        };
        let closed = closing.is_some() && !interrupts.is_empty();
        if let Some(content) = closing {
            for interrupt in interrupts.drain(..) {
                let result = ToolResult::error(&interrupt.call, content.clone());
                self.session.history.push(Message::tool_result(result));
            }
        }
        if resumed || closed {
            order_results(&mut self.session.history);
        }
        if let Some(error) = error {
            return Err(error);
        }
        if cancelled {
            return Ok(Some(Outcome::Cancelled));
        }
        if let Some(reason) = stop {
            return Ok(Some(Outcome::Stopped { reason }));
        }
        if !interrupts.is_empty() {
            return Ok(Some(Outcome::Interrupted { interrupts }));
        }
        Ok(None)
    }

    /// Apply the history a layer committed during the model call, after checking it.
    fn apply_commit(&mut self) -> Result<(), Error> {
        let Some(history) = self.ctx.take_committed_history() else {
            return Ok(());
        };
        if let Err(defect) = history.validate() {
            return Err(Error::bad_request(format!(
                "a layer committed an invalid history ({defect}); the session was left as it was"
            )));
        }
        self.call_ids = history
            .iter()
            .flat_map(Message::tool_calls)
            .map(|call| id_hash(&call.id))
            .collect();
        self.session.history = history;
        Ok(())
    }

    /// Commits are made during a model call; one made elsewhere is dropped.
    fn discard_stale_commit(&mut self) {
        if self.ctx.take_committed_history().is_some() {
            tracing::warn!(
                "a history committed outside a model call was discarded; commit from a \
                 before_model or after_model layer"
            );
        }
    }

    async fn finish(mut self, result: Result<Outcome, Error>) -> Result<AgentResponse, Error> {
        self.discard_stale_commit();
        self.session.state = self.ctx.state_snapshot();
        match result {
            Ok(outcome) => {
                if let Outcome::Interrupted { interrupts } = &outcome {
                    self.session.interrupts = interrupts.clone();
                }
                let emitted = emit!(
                    self.ctx,
                    Event::RunFinished {
                        outcome: outcome.clone(),
                    }
                );
                self.ctx.events().close();
                if let Err(error) = emitted {
                    return Err(error.with_session(self.session));
                }
                let mut response = AgentResponse::new(self.session, outcome);
                response.usage = self.usage;
                response.rounds = self.rounds;
                Ok(response)
            }
            Err(error) => {
                // Whatever failed, leave a history the model can be called with again.
                answer_open_calls(
                    &mut self.session.history,
                    &self.session.interrupts,
                    RUN_FAILED,
                );
                // The run already failed: an observer failing on this event changes nothing.
                let _ = emit!(
                    self.ctx,
                    Event::RunFailed {
                        error: error.clone(),
                    }
                );
                self.ctx.events().close();
                Err(error.with_session(self.session))
            }
        }
    }
}

fn not_executed(reason: &StopReason) -> String {
    match reason {
        StopReason::Tool { name, reason, .. } => {
            format!("not executed: the run was stopped by `{name}`: {reason}")
        }
        StopReason::MaxRounds { limit } => {
            format!("not executed: the run reached its limit of {limit} rounds")
        }
        _ => "not executed: the run was stopped".to_owned(),
    }
}

/// Why a service call produced no response.
enum CallFailure {
    Failed(Error),
    Panicked(String),
}

/// Drive `service` to readiness and call it; an error or a panic becomes a `CallFailure`
/// instead of failing or unwinding through the loop.
async fn call_service<S, Req>(service: &mut S, request: Req) -> Result<S::Response, CallFailure>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    let call = AssertUnwindSafe(async move {
        let ready = service.ready().await.map_err(Into::into)?;
        ready.call(request).await.map_err(Into::into)
    });
    match call.catch_unwind().await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(CallFailure::Failed(Error::from_boxed(error))),
        Err(panic) => Err(CallFailure::Panicked(panic_message(&*panic))),
    }
}

async fn call_model<M>(model: &mut M, request: ModelRequest) -> Result<ModelResponse, Error>
where
    M: Service<ModelRequest, Response = ModelResponse>,
    M::Error: Into<BoxError>,
{
    call_service(model, request)
        .await
        .map_err(|failure| match failure {
            CallFailure::Failed(error) => error,
            CallFailure::Panicked(message) => {
                Error::other(format!("the model service panicked: {message}"))
            }
        })
}

async fn call_tool<T>(tools: &mut T, request: ToolRequest) -> ToolOutcome
where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
    match call_service(tools, request).await {
        Ok(response) => ToolOutcome::Response(response),
        Err(CallFailure::Failed(error)) => ToolOutcome::Failed(error),
        Err(CallFailure::Panicked(message)) => ToolOutcome::Panicked(message),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Run the tool calls of one round. Never fails: every call gets a result, an interrupt, or
/// (on cancellation, stop or error) a synthetic result.
async fn execute<T>(
    tools: &mut T,
    ctx: &RunContext,
    round: u32,
    mode: ToolExecution,
    parts: &[ContentPart],
    resume: Option<&Value>,
    out: &mut RoundTools,
) where
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    let events = ctx.events().is_enabled();
    let token = ctx.cancellation_token();
    match mode {
        ToolExecution::Sequential => {
            for call in parts.iter().filter_map(as_call) {
                if let Some(reason) = &out.stop {
                    out.results
                        .push(ToolResult::error(call, not_executed(reason)));
                    continue;
                }
                if out.error.is_some() {
                    out.results.push(ToolResult::error(call, RUN_FAILED));
                    continue;
                }
                if out.cancelled {
                    out.results.push(ToolResult::cancelled(call));
                    continue;
                }
                if events {
                    if let Err(error) = ctx.emit(started(round, call)).await {
                        out.error = Some(error);
                        out.results.push(ToolResult::error(call, RUN_FAILED));
                        continue;
                    }
                }
                let request = ToolRequest {
                    call: (*call).clone(),
                    ctx: ctx.with_round(round),
                    resume: resume.cloned(),
                };
                let span = tool_span(call);
                // Not started if the run is cancelled (e.g. while the event waited).
                let outcome = cancellable(token, call_tool(tools, request).instrument(span)).await;
                let is_error = absorb(out, call, outcome, token);
                if events {
                    if let Err(error) = ctx.emit(finished(round, call, is_error)).await {
                        out.error.get_or_insert(error);
                    }
                }
            }
        }
        ToolExecution::Concurrent { limit } => {
            let calls: Vec<&ToolCall> = parts.iter().filter_map(as_call).collect();
            // Each future owns what it needs (no borrows), which keeps the run future `Send`.
            let mut running = Vec::with_capacity(calls.len());
            for (index, call) in calls.iter().enumerate() {
                let request = ToolRequest {
                    call: (*call).clone(),
                    ctx: ctx.with_round(round),
                    resume: resume.cloned(),
                };
                running.push(run_one(index, tools.clone(), request, events));
            }
            let mut running = stream::iter(running).buffer_unordered(limit.max(1));
            // `None`: the call did not finish (cancelled, or the round failed first).
            let mut slots: Vec<Option<ToolOutcome>> = calls.iter().map(|_| None).collect();
            loop {
                let next = tokio::select! {
                    biased;
                    _ = token.cancelled() => break,
                    next = running.next() => next,
                };
                let Some((index, outcome)) = next else { break };
                match outcome {
                    Ok(None) => {}
                    Ok(Some(outcome)) => {
                        let is_error = outcome.is_error();
                        slots[index] = Some(outcome);
                        if events {
                            if let Err(error) =
                                ctx.emit(finished(round, calls[index], is_error)).await
                            {
                                out.error = Some(error);
                                break;
                            }
                        }
                    }
                    Err(error) => {
                        out.error = Some(error);
                        break;
                    }
                }
            }
            drop(running);
            for (call, slot) in calls.iter().zip(slots) {
                match slot {
                    Some(outcome) => {
                        absorb(out, call, Some(outcome), token);
                    }
                    None if out.error.is_some() => {
                        out.results.push(ToolResult::error(call, RUN_FAILED));
                    }
                    None => {
                        out.cancelled = true;
                        out.results.push(ToolResult::cancelled(call));
                    }
                }
            }
        }
    }
}

fn as_call(part: &ContentPart) -> Option<&ToolCall> {
    match part {
        ContentPart::ToolCall(call) => Some(call),
        _ => None,
    }
}

pin_project! {
    /// `token.run_until_cancelled(future)`, as tokio-util has it (`None`: not started because
    /// the run was already cancelled, or dropped when cancelled while pending; when both are
    /// ready the future wins), built so that the hot path stays cheap: the cancellation
    /// future is created only once `future` is pending, and nothing is moved into an extra
    /// `async fn`. tokio-util's `run_until_cancelled` and `with_cancellation_token` cost
    /// 1,100–1,300 more instructions per round here (`benches/instructions.sh`).
    struct Cancellable<'a, F> {
        #[pin]
        future: F,
        token: &'a CancellationToken,
        started: bool,
        #[pin]
        wait: Option<WaitForCancellationFuture<'a>>,
    }
}

fn cancellable<F: Future>(token: &CancellationToken, future: F) -> Cancellable<'_, F> {
    Cancellable {
        future,
        token,
        started: false,
        wait: None,
    }
}

impl<F: Future> Future for Cancellable<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.started {
            if this.token.is_cancelled() {
                return Poll::Ready(None);
            }
            *this.started = true;
        }
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Some(output));
        }
        if this.wait.is_none() {
            this.wait.set(Some(this.token.cancelled()));
        }
        match this.wait.as_pin_mut() {
            Some(wait) => wait.poll(cx).map(|()| None),
            None => Poll::Pending,
        }
    }
}

/// One call of a concurrent round: announce it, run it.
async fn run_one<T>(
    index: usize,
    mut service: T,
    request: ToolRequest,
    events: bool,
) -> (usize, Result<Option<ToolOutcome>, Error>)
where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
    let ctx = request.ctx.clone();
    if events {
        if let Err(error) = ctx.emit(started(ctx.round(), &request.call)).await {
            return (index, Err(error));
        }
    }
    let span = tool_span(&request.call);
    let outcome = cancellable(
        ctx.cancellation_token(),
        call_tool(&mut service, request).instrument(span),
    )
    .await;
    (index, Ok(outcome))
}

fn tool_span(call: &ToolCall) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
    )
}

fn started(round: u32, call: &ToolCall) -> Event {
    Event::ToolStarted {
        round,
        call_id: call.id.clone(),
        name: call.name.clone(),
    }
}

fn finished(round: u32, call: &ToolCall, is_error: bool) -> Event {
    Event::ToolFinished {
        round,
        call_id: call.id.clone(),
        name: call.name.clone(),
        is_error,
    }
}

/// Turn one call's outcome (`None`: cancelled while running) into a result, an interrupt or
/// a stop. Returns whether the model sees an error.
fn absorb(
    out: &mut RoundTools,
    call: &ToolCall,
    outcome: Option<ToolOutcome>,
    token: &CancellationToken,
) -> bool {
    let result = match outcome {
        None => {
            out.cancelled = true;
            ToolResult::cancelled(call)
        }
        Some(ToolOutcome::Failed(error))
            if error.kind() == ErrorKind::Cancelled && token.is_cancelled() =>
        {
            out.cancelled = true;
            ToolResult::cancelled(call)
        }
        Some(ToolOutcome::Failed(error)) => {
            ToolResult::error(call, format!("tool `{}` failed: {error}", call.name))
        }
        Some(ToolOutcome::Panicked(message)) => {
            ToolResult::error(call, format!("tool `{}` panicked: {message}", call.name))
        }
        Some(ToolOutcome::Response(response)) => {
            let ToolResponse {
                mut result, action, ..
            } = response;
            // The result answers this call, whatever the service wrote.
            if result.call_id != call.id {
                result.call_id.clone_from(&call.id);
            }
            if result.name != call.name {
                result.name.clone_from(&call.name);
            }
            match action {
                ToolAction::Interrupt { payload } => {
                    out.interrupts.push(Interrupt {
                        call: call.clone(),
                        payload,
                    });
                    return false;
                }
                ToolAction::Stop { reason } => {
                    out.stop.get_or_insert(StopReason::Tool {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        reason,
                    });
                }
                _ => {}
            }
            result
        }
    };
    let is_error = result.is_error;
    out.results.push(result);
    is_error
}

/// A set of call-id hashes. The ids are hashed once with FNV-1a (they come from the model,
/// not an adversary that could flood one bucket, and a collision only renames a call), so the
/// set itself needs no second hash.
type IdSet = HashSet<u64, std::hash::BuildHasherDefault<PassThrough>>;

fn id_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// Every pending interrupt must be an unanswered call of the last assistant message, once.
fn check_interrupts(session: &Session) -> Result<(), Error> {
    if session.interrupts.is_empty() {
        return Ok(());
    }
    let open = open_calls(&session.history);
    for (index, interrupt) in session.interrupts.iter().enumerate() {
        let id = &interrupt.call.id;
        if session.interrupts[..index].iter().any(|i| &i.call.id == id) {
            return Err(Error::bad_request(format!(
                "the session lists the pending interrupt for call `{id}` twice"
            )));
        }
        if !open.iter().any(|call| &call.id == id) {
            return Err(Error::bad_request(format!(
                "the session's pending interrupt for call `{id}` does not match an unanswered \
                 call of its last assistant message"
            )));
        }
    }
    Ok(())
}

/// The calls of the last assistant message that have no result yet.
fn open_calls(history: &History) -> Vec<&ToolCall> {
    let Some(start) = history.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let answered: Vec<&str> = history[start + 1..]
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.call_id.as_str())
        .collect();
    history[start]
        .tool_calls()
        .filter(|c| !answered.contains(&c.id.as_str()))
        .collect()
}

/// Put the tool messages after the last assistant message in the order of its calls (after
/// results of calls that waited were appended). Copies nothing when already in order.
fn order_results(history: &mut History) {
    let Some(start) = history.iter().rposition(|m| m.role == Role::Assistant) else {
        return;
    };
    let position = |message: &Message, calls: &Message| {
        message
            .tool_results()
            .next()
            .and_then(|r| calls.tool_calls().position(|c| c.id == r.call_id))
            .unwrap_or(usize::MAX)
    };
    let calls = &history[start];
    if history[start + 1..].is_sorted_by_key(|m| position(m, calls)) {
        return;
    }
    let messages = history.make_mut();
    let (head, tail) = messages.split_at_mut(start + 1);
    let calls = &head[start];
    tail.sort_by_key(|m| position(m, calls));
}

/// Append a synthetic error result for each call of the last assistant message that has
/// none, so the history stays valid after a failure. Calls in `pending` keep waiting.
fn answer_open_calls(history: &mut History, pending: &[Interrupt], content: &str) {
    let missing: Vec<ToolResult> = open_calls(history)
        .into_iter()
        .filter(|c| !pending.iter().any(|p| p.call.id == c.id))
        .map(|c| ToolResult::error(c, content))
        .collect();
    history.extend(missing.into_iter().map(Message::tool_result));
}
