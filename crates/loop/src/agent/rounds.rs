//! One run: the round state machine, history commits, and the end of a run.

use std::sync::Arc;

use tower_agent_core::{
    AgentInput, AgentResponse, BoxError, CallIdSet, ContentPart, Error, ErrorKind, Event, History,
    Message, ModelRequest, ModelResponse, Outcome, Progress, Role, RunContext, Session, StopReason,
    ToolRequest, ToolResponse, ToolResult, Usage,
};
use tower_service::Service;

use super::call::call_checked;
use super::resume::check_input;
use super::tools::{RoundTools, execute, execute_quietly, not_executed};
use super::{AgentConfig, ToolExecution};

/// One run's state.
pub(super) struct Run<M, T> {
    pub(super) model: M,
    pub(super) tools: T,
    pub(super) config: Arc<AgentConfig>,
    pub(super) session: Session,
    pub(super) ctx: RunContext,
    pub(super) usage: Usage,
    pub(super) rounds: u32,
    /// Reused every round, so a round allocates no bookkeeping of its own.
    pub(super) scratch: RoundTools,
    /// Hashes of every tool call id in the history, so new calls get unique ids.
    pub(super) call_ids: CallIdSet,
    /// Where this run's work starts in the history, for the progress of a stopped or
    /// cancelled run.
    pub(super) start: usize,
}

/// The result of a call left without one when the run failed.
pub(super) const RUN_FAILED: &str = "not executed: the run failed before this tool call completed";

/// A cancelled outcome; its progress is filled in when the run ends.
fn cancelled_outcome() -> Outcome {
    Outcome::Cancelled {
        progress: Progress::default(),
    }
}

/// A stopped outcome; its progress is filled in when the run ends.
fn stopped(reason: StopReason) -> Outcome {
    Outcome::Stopped {
        reason,
        progress: Progress::default(),
    }
}

/// Drop a history committed outside a model call, saying so.
#[cold]
#[inline(never)]
fn discard(stale: History) {
    drop(stale);
    tracing::warn!(
        "a history committed outside a model call was discarded; commit from a before_model \
         or after_model layer"
    );
}

/// A model cannot answer calls: result parts in its message would break the history.
#[cold]
#[inline(never)]
fn strip_results(message: &mut Message) {
    message
        .content
        .retain(|part| !matches!(part, ContentPart::ToolResult(_)));
}

/// Write the arguments calls ran with into the calls of the history (newest first: the calls
/// of the round just run).
fn record_arguments(history: &mut History, mut rewrites: Vec<(String, String)>) {
    let messages = history.make_mut();
    for message in messages.iter_mut().rev() {
        if rewrites.is_empty() {
            break;
        }
        for part in &mut message.content {
            if let ContentPart::ToolCall(call) = part {
                if let Some(index) = rewrites.iter().position(|(id, _)| *id == call.id) {
                    call.arguments = rewrites.swap_remove(index).1;
                }
            }
        }
    }
}

impl<M, T> Run<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Send,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    pub(super) async fn run(mut self, input: AgentInput) -> Result<AgentResponse, Error> {
        let (run_id, session_id) = (self.ctx.run_id(), self.ctx.session_id());
        let started = emit!(
            self.ctx,
            Event::RunStarted {
                run_id: run_id.into(),
                session_id: session_id.into(),
            }
        );
        // An input that does not fit the session is refused before anything changes.
        let replay = match started.and_then(|()| check_input(&self.session, &input)) {
            Ok(replay) => replay,
            Err(error) => return self.refuse(error).await,
        };
        // The session's durable state lives in the context during the run.
        self.ctx
            .absorb_state(std::mem::take(&mut self.session.state));
        let result = self.drive(input, replay).await;
        self.finish(result).await
    }

    async fn drive(&mut self, input: AgentInput, replay: bool) -> Result<Outcome, Error> {
        if let Some(outcome) = self.prepare(input, replay).await? {
            return Ok(outcome);
        }

        // The run's listeners are fixed when it starts.
        let listening = self.ctx.events().is_enabled();
        loop {
            if self.ctx.is_cancelled() {
                return Ok(cancelled_outcome());
            }
            if let Some(reason) = self.ctx.take_stop() {
                return Ok(stopped(reason));
            }
            if self.rounds >= self.config.max_rounds {
                return Ok(stopped(StopReason::MaxRounds {
                    limit: self.config.max_rounds,
                }));
            }
            self.rounds += 1;
            let round = self.rounds;
            if listening {
                self.ctx.emit(Event::RoundStarted { round }).await?;
            }
            self.discard_stale_commit();

            let (config, history, ctx) = (&self.config, &self.session.history, &self.ctx);
            let request = || ModelRequest {
                system: config.system.clone(),
                messages: history.clone(),
                tools: Arc::clone(&config.tool_specs),
                options: config.options.clone(),
                ctx: ctx.with_round(round),
            };
            let span = tracing::info_span!("chat", gen_ai.operation.name = "chat", round);
            // Not started once cancelled; dropped if cancelled while pending.
            let response = call_checked(
                &mut self.model,
                request,
                self.ctx.cancellation_token(),
                span,
                // Without listeners nothing ran since the check above.
                !listening,
            )
            .await;
            // The request is gone: a history committed by a layer replaces ours before the
            // model's message is appended.
            let committed = self.apply_commit();
            let ModelResponse {
                mut message, usage, ..
            } = match response {
                Some(Ok(response)) => response,
                None => return Ok(cancelled_outcome()),
                Some(Err(failure)) => {
                    let error = failure.into_model_error();
                    if error.kind() == ErrorKind::Cancelled && self.ctx.is_cancelled() {
                        return Ok(cancelled_outcome());
                    }
                    return Err(error);
                }
            };
            self.usage += usage;
            committed?;
            // A layer stopped the run during the call: its calls could not be answered.
            if let Some(reason) = self.ctx.take_stop() {
                return Ok(stopped(reason));
            }
            message.role = Role::Assistant;
            let calls = self.normalize(&mut message, round);
            if listening && message.has_text() {
                let text = message.text();
                self.ctx.emit(Event::Text { round, text }).await?;
            }
            if calls == 1 && !listening && self.config.tool_execution == ToolExecution::Sequential {
                // One call nobody listens to: no round loop, no event, and the message joins
                // the history with its result, in one write.
                let Some(call) = message.tool_calls().next() else {
                    unreachable!("one call");
                };
                execute_quietly(&mut self.tools, &self.ctx, round, call, &mut self.scratch).await;
                match self.absorb_round(Some(message), false)? {
                    Some(outcome) => return Ok(outcome),
                    None => continue,
                }
            }
            self.session.history.push(message);
            let [.., message] = &self.session.history[..] else {
                unreachable!("a message was just appended");
            };
            if listening {
                let event = Event::RoundCompleted {
                    round,
                    message: message.clone(),
                    history: Some(self.session.history.clone()),
                    usage,
                };
                self.ctx.emit(event).await?;
            }
            if calls == 0 {
                return Ok(Outcome::Completed {
                    message: message.clone(),
                });
            }
            execute(
                &mut self.tools,
                &self.ctx,
                round,
                self.config.tool_execution,
                &message.content,
                None,
                &mut self.scratch,
            )
            .await;
            if let Some(outcome) = self.absorb_round(None, false)? {
                return Ok(outcome);
            }
        }
    }

    /// Make the model's message safe to append: only text, reasoning and calls, each call with
    /// an id no other call in the session uses. Returns how many calls it has.
    fn normalize(&mut self, message: &mut Message, round: u32) -> usize {
        let mut calls = 0;
        let mut results = false;
        for part in &mut message.content {
            match part {
                ContentPart::ToolCall(call) => {
                    calls += 1;
                    if call.id.is_empty() || !self.call_ids.insert(&call.id) {
                        call.id = self.fresh_id(round, calls);
                    }
                }
                ContentPart::ToolResult(_) => results = true,
                _ => {}
            }
        }
        if results {
            strip_results(message);
        }
        calls
    }

    /// An id for the `index`-th call of `round` whose own was empty or taken.
    #[cold]
    #[inline(never)]
    fn fresh_id(&mut self, round: u32, index: usize) -> String {
        let prefix: String = self.ctx.run_id().chars().take(8).collect();
        let mut id = format!("call_{prefix}_{round}_{index}");
        while !self.call_ids.insert(&id) {
            id.push('_');
        }
        id
    }

    /// Append a round's results (after `message`, the model's message, when it is not in the
    /// history yet); the outcome if the round ends the run. `resumed`: the results answer
    /// calls that waited, and are put back in call order.
    pub(super) fn absorb_round(
        &mut self,
        message: Option<Message>,
        resumed: bool,
    ) -> Result<Option<Outcome>, Error> {
        // In place: the (empty) buffers are kept for the next round.
        let out = &mut self.scratch;
        let history = self.session.history.make_mut();
        if let Some(message) = message {
            history.push(message);
        }
        history.append(&mut out.results);
        // The usual round: every call answered, nothing else to apply.
        if !resumed
            && out.is_plain()
            && !self.ctx.has_recorded_arguments()
            && !self.ctx.is_stopping()
        {
            return Ok(None);
        }
        self.settle_round(resumed)
    }

    /// The rest of [`Run::absorb_round`], for a round that ends the run, answers calls that
    /// waited, or recorded arguments.
    #[inline(never)]
    fn settle_round(&mut self, resumed: bool) -> Result<Option<Outcome>, Error> {
        let out = &mut self.scratch;
        let mut interrupts = std::mem::take(&mut out.interrupts);
        // Arguments a layer says a call ran with; not for a call that waits (it must stay the
        // call stored) or was closed unrun.
        let mut executed = self.ctx.take_recorded_arguments();
        if !executed.is_empty() {
            executed.retain(|(id, _)| !interrupts.iter().any(|i| i.call.id == *id));
        }
        let stop = out.stop.take();
        let cancelled = std::mem::take(&mut out.cancelled);
        let error = out.error.take();
        let stop = stop.or_else(|| self.ctx.take_stop());
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
            self.session.history.order_results();
        }
        // Also when the run fails: the session it returns records what ran.
        if !executed.is_empty() {
            record_arguments(&mut self.session.history, executed);
        }
        if let Some(error) = error {
            return Err(error);
        }
        if cancelled {
            return Ok(Some(cancelled_outcome()));
        }
        if let Some(reason) = stop {
            return Ok(Some(stopped(reason)));
        }
        if !interrupts.is_empty() {
            return Ok(Some(Outcome::Interrupted { interrupts }));
        }
        Ok(None)
    }

    /// Apply the history a layer committed during the model call, after checking it.
    #[inline]
    fn apply_commit(&mut self) -> Result<(), Error> {
        match self.ctx.take_committed_history() {
            None => Ok(()),
            Some(history) => self.commit(history),
        }
    }

    #[inline(never)]
    fn commit(&mut self, history: History) -> Result<(), Error> {
        if let Err(defect) = history.validate() {
            return Err(Error::bad_request(format!(
                "a layer committed an invalid history ({defect}); the session was left as it was"
            )));
        }
        // The run's own messages are the newest: they keep their place from the end.
        let own = self.session.history.len().saturating_sub(self.start);
        self.start = history.len().saturating_sub(own);
        self.call_ids.clear();
        self.call_ids.extend(
            history
                .iter()
                .flat_map(Message::tool_calls)
                .map(|call| call.id.as_str()),
        );
        self.session.history = history;
        Ok(())
    }

    /// Commits are made during a model call; one made elsewhere is dropped.
    #[inline]
    fn discard_stale_commit(&mut self) {
        if let Some(stale) = self.ctx.take_committed_history() {
            discard(stale);
        }
    }

    /// End the run: write the state back, tell the observers and the stream, close the stream.
    /// An observer failing on `RunFinished` fails the run: every consumer then gets
    /// `RunFailed`, so a stream reader always sees the run end.
    async fn finish(mut self, result: Result<Outcome, Error>) -> Result<AgentResponse, Error> {
        self.discard_stale_commit();
        self.session.state = self.ctx.state_snapshot();
        let error = match result {
            Ok(mut outcome) => {
                if let Outcome::Cancelled { progress } | Outcome::Stopped { progress, .. } =
                    &mut outcome
                {
                    let start = self.start.min(self.session.history.len());
                    *progress = Progress::of(&self.session.history[start..]);
                }
                if let Outcome::Interrupted { interrupts } = &outcome {
                    self.session.interrupts = interrupts.clone();
                }
                let emitted = emit!(
                    self.ctx,
                    Event::RunFinished {
                        outcome: outcome.clone(),
                    }
                );
                match emitted {
                    Ok(()) => {
                        self.ctx.events().close();
                        let mut response = AgentResponse::new(self.session, outcome);
                        // Nested runs (sub-agents) recorded theirs in the context.
                        response.usage = self.usage + self.ctx.take_recorded_usage();
                        response.rounds = self.rounds;
                        return Ok(response);
                    }
                    Err(error) => error,
                }
            }
            Err(error) => {
                // Whatever failed, leave a history the model can be called with again.
                let pending = &self.session.interrupts;
                self.session.history.answer_unanswered(
                    |call| pending.iter().any(|i| i.call.id == call.id),
                    |call| ToolResult::error(call, RUN_FAILED),
                );
                error
            }
        };
        self.refuse(error).await
    }

    /// Fail the run with `error` and the session as it stands: tell every observer (one
    /// failing now changes nothing) and the stream, close the stream.
    async fn refuse(self, error: Error) -> Result<AgentResponse, Error> {
        let events = self.ctx.events();
        if events.is_enabled() {
            let event = Event::RunFailed {
                error: error.clone(),
            };
            events
                .emit_final(event, self.ctx.cancellation_token())
                .await;
        }
        events.close();
        let usage = self.usage + self.ctx.take_recorded_usage();
        Err(error.with_session(self.session).with_usage(usage))
    }
}
