//! One run: the round state machine, what a response does to the session, and the end of a
//! run.

use std::sync::Arc;

use tower_agent_core::{
    AgentInput, AgentResponse, BoxError, CallIds, ContentPart, DescribeTools, Error, ErrorKind,
    Event, FinishReason, History, Interrupt, Message, ModelRequest, ModelResponse, Outcome,
    Progress, PromptCache, Repair, Role, RunTools, Steering, StopReason, ToolCall, ToolRequest,
    ToolResponse, ToolResult, Usage,
};
use tower_service::Service;

use super::call::{call, ignore};
use super::early::Early;
use super::input::check_input;
use super::state::{BeforeInput, Run};
use super::tools::{RUN_FAILED, RoundTools, not_executed};
use super::truncated::AfterCut;

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

/// What a model call gave the loop.
enum Answer {
    /// The model's message, the call's own usage, the read-only calls it started early, and
    /// whether it was cut off at its length limit.
    Message(Message, Usage, Option<Early>, bool),
    /// The run ends here.
    End(Outcome),
}

impl<M, T> Run<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Send,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + DescribeTools + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    /// The run, to its end. A future made of an `async` block, not an `async fn`: an `async
    /// fn` keeps its arguments apart from the locals it moves them to, so the run (over 500
    /// bytes) would be in its future twice.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments beside the locals it moves them to"
    )]
    pub(super) fn run(
        mut self,
        input: AgentInput,
    ) -> impl Future<Output = Result<AgentResponse, Error>> {
        async move {
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
                Err(error) => return Box::pin(self.refuse(error)).await,
            };
            // The session's durable state lives in the context during the run.
            self.ctx
                .absorb_state(std::mem::take(&mut self.session.state));
            // A call that keeps progress (a sub-agent) finds there how to have the run save.
            self.saving.offer(&self.ctx);
            self.steering = self.ctx.extension::<Steering>();
            // The tools' hints, for the layers that do not wrap the tools (a retry policy).
            self.ctx
                .insert_extension(RunTools::new(self.tools.tool_specs()));
            let result = self.drive(input, replay).await;
            // Boxed, as the resume and a concurrent round are: ending a run takes its own copy of
            // the run, and every run's future would carry it from the start.
            Box::pin(self.finish(result)).await
        }
    }

    /// The rounds: call the model, append its message, run its tool calls, append their
    /// results; until the model calls no tool or something ends the run.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments beside the locals it moves them to"
    )]
    fn drive(
        &mut self,
        input: AgentInput,
        replay: bool,
    ) -> impl Future<Output = Result<Outcome, Error>> {
        async move {
            // Boxed: resuming runs the decided calls, a future as large as a round's tools that
            // every run's future would carry for its whole life (it holds its largest step).
            if let Some(outcome) = Box::pin(self.prepare(input, replay)).await? {
                return Ok(outcome);
            }
            // The input (and the results of calls a resume decided) are saved before the model
            // is called.
            if self.saving.is_on() {
                self.save().await?;
            }
            // The room a cut answer's second ask gets (`Truncation::AskAgain`).
            let mut room = None;
            loop {
                if self.ctx.is_cancelled() {
                    return Ok(cancelled_outcome());
                }
                // A safe point: what the host sent meanwhile goes in, before the model call.
                self.steer().await?;
                if self.rounds >= self.config.max_rounds {
                    let limit = self.config.max_rounds;
                    return Ok(stopped(StopReason::MaxRounds { limit }));
                }
                self.rounds += 1;
                let round = self.rounds;
                emit!(self.ctx, Event::RoundStarted { round })?;

                let asked_again = room.is_some();
                let max_tokens = room.take().or(self.config.options.max_tokens);
                let (mut message, usage, mut early, cut) =
                    match self.call_model(round, max_tokens).await? {
                        Answer::Message(message, usage, early, cut) => (message, usage, early, cut),
                        Answer::End(outcome) => return Ok(outcome),
                    };
                // A cut answer is never acted on as complete: its early runs are aborted, and its
                // calls do not run.
                if cut {
                    early = None;
                    let after = self
                        .cut_off(round, &message, max_tokens, asked_again)
                        .await?;
                    if let Some(AfterCut::AskAgain(more)) = after {
                        room = Some(more);
                        continue;
                    }
                }
                // Dropped (its runs aborted) unless the round adopts them.
                let calls = self.normalize(&mut message, round);
                // The runs of calls the message does not have stop now.
                if let Some(early) = &early {
                    early.keep(message.tool_calls());
                }
                if message.has_text() {
                    emit!(
                        self.ctx,
                        Event::Text {
                            round,
                            text: message.text()
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
                if cut {
                    match self.after_cut(max_tokens)? {
                        AfterCut::End(outcome) => return Ok(outcome),
                        _ => {
                            if self.saving.is_on() {
                                self.save().await?;
                            }
                            continue;
                        }
                    }
                }
                if calls == 0 {
                    // Messages the host sent while the model answered: the run goes on.
                    if self.steering.as_ref().is_some_and(Steering::pending) {
                        continue;
                    }
                    return Ok(Outcome::Completed {
                        message: message.clone(),
                    });
                }
                // The model's message is the last.
                let at = self.session.history.len() - 1;
                // Repeats of a call of the same message are answered, not run (by option).
                let only = match self.config.dedupe_calls {
                    true => self.answer_repeats(at),
                    false => None,
                };
                let only = only.as_deref();
                // The calls are saved before they run, with the write-ahead record of those
                // that start first: a process that dies meanwhile resumes knowing which were in
                // flight (and recovers them), never running them again blindly.
                if self.saving.is_on() {
                    self.mark_round(at, only);
                    self.save().await?;
                }
                let out = self.execute(round, at, only, None, early).await;
                if let Some(outcome) = self.absorb_round(out).await? {
                    return Ok(outcome);
                }
                // Each result was saved as it came; what the round changed after them (their
                // order, calls that waited answered) is saved now.
                if self.saving.is_on() {
                    self.save().await?;
                }
            }
        }
    }

    /// Add the messages the host sent since the last safe point, and save them. Between
    /// rounds only: the last message is never a call waiting for its result.
    async fn steer(&mut self) -> Result<(), Error> {
        let Some(steering) = &self.steering else {
            return Ok(());
        };
        let messages = steering.take();
        if messages.is_empty() {
            return Ok(());
        }
        self.session.history.extend(messages);
        if self.saving.is_on() {
            self.save().await?;
        }
        Ok(())
    }

    /// Save the session as it stands (its history, the run's state, the interrupts it waits
    /// on) with the run's saver, if it has one; unless the last save wrote the same.
    pub(super) async fn save(&mut self) -> Result<(), Error> {
        self.saving.save(&self.session, &self.ctx).await
    }

    /// Put the session back as it was before the run's new messages: a layer refused the
    /// run's first model call, so the model never answered them.
    fn withdraw_input(&mut self) {
        let Some(before) = self.before_input.take() else {
            return;
        };
        let BeforeInput {
            mark,
            users,
            interrupts,
        } = *before;
        let history = &mut self.session.history;
        let len = history.len();
        if history.kept(&mark) == mark.len() {
            // What the input appended (the results it gave calls that waited, the input) ends
            // the history unchanged: the session goes back to what it was, what waited waits.
            history.make_mut().truncate(mark.len());
            self.session.interrupts = interrupts;
        } else if users > 0
            && len >= users
            && history[len - users..].iter().all(|m| m.role == Role::User)
        {
            // A layer rewrote the history (a summary): the input's user messages still end it;
            // they leave, what else the input changed stays (calls that waited stay answered).
            history.make_mut().truncate(len - users);
        } else {
            return;
        }
        self.start = self.session.history.len();
        self.call_ids = CallIds::of(self.session.history.iter());
    }

    /// Call the model with the history, and apply what its response did: the history a layer
    /// committed, the usage, a stop. The model's message, or the outcome the run ends with.
    async fn call_model(&mut self, round: u32, max_tokens: Option<u32>) -> Result<Answer, Error> {
        // The request lives in this block only: a local moved into the call would keep its
        // place in the run's future while the call runs.
        let (calling, early) = {
            let mut options = Arc::clone(&self.config.options);
            if options.max_tokens != max_tokens {
                Arc::make_mut(&mut options).max_tokens = max_tokens;
            }
            let mut request = ModelRequest {
                system: self.config.system.clone(),
                messages: self.session.history.clone(),
                // Asked every round: a tool service may change what it serves.
                tools: match &self.config.tool_specs {
                    Some(specs) => Arc::clone(specs),
                    None => self.tools.tool_specs(),
                },
                options,
                ctx: self.ctx.with_round(round),
                deltas: self.deltas.clone(),
                cache: PromptCache::default(),
            };
            // Above every layer's filter: it starts the calls the layers let through.
            let mut early = None;
            if self.config.early_tool_start {
                if let Some((runs, filter)) =
                    Early::new(&request.tools, &self.tools, &request.ctx, self.keys)
                {
                    request.deltas.filter(filter);
                    early = Some(runs);
                }
            }
            // The model side of the round: every model layer's work, a provider's `chat`
            // spans beneath.
            let span = tracing::info_span!("model", round = i64::from(round));
            let token = self.ctx.cancellation_token();
            (call(&mut self.model, request, token, span, ignore), early)
        };
        let answer = calling.await;
        // Every return below without a message drops `early`: its runs are aborted.
        if let Some(early) = &early {
            early.close();
        }
        // The readers end up with what the history gets: the message, or nothing.
        let kept = match &answer {
            Some(Ok(response)) if response.stop.is_none() && response.pause.is_none() => {
                Some(&response.message)
            }
            _ => None,
        };
        if self.ctx.events().is_enabled() {
            self.deltas
                .settle(&self.ctx.with_round(round), kept)
                .await?;
        }
        // Only the run's first model call can withdraw its input.
        let first = self.before_input.take();
        let response = match answer {
            None => return Ok(Answer::End(cancelled_outcome())),
            Some(Ok(response)) => response,
            Some(Err(failure)) => {
                let mut error = failure.into_model_error();
                // What the layers did before the call failed (a summary) is kept.
                self.usage += error.usage();
                if let Some(history) = error.take_history() {
                    self.commit(history)?;
                }
                if error.kind() == ErrorKind::Cancelled && self.ctx.is_cancelled() {
                    return Ok(Answer::End(cancelled_outcome()));
                }
                return Err(error);
            }
        };
        let ModelResponse {
            mut message,
            usage,
            history,
            stop,
            refused,
            pause,
            side_usage,
            finish_reason,
            ..
        } = response;
        self.usage += usage + side_usage;
        if let Some(history) = history {
            self.commit(history)?;
        }
        // A layer stopped the run at this call: its calls could not be answered. A first call
        // refused leaves nothing refused in the session: the input is withdrawn.
        if let Some(reason) = stop {
            if refused {
                self.before_input = first;
                self.withdraw_input();
            }
            return Ok(Answer::End(stopped(reason)));
        }
        // A layer paused the run before the model (a stop of an outer layer wins): what the
        // run did stays (its input too), and a resume by the pause's key calls the model again.
        if let Some(pause) = pause {
            return Ok(Answer::End(Outcome::Interrupted {
                interrupts: vec![*pause],
            }));
        }
        message.role = Role::Assistant;
        let cut = finish_reason == FinishReason::Length;
        Ok(Answer::Message(message, usage, early, cut))
    }

    /// Make the model's message safe to append: only text, reasoning and calls, each call with
    /// an id no other call in the session uses. Returns how many calls it has.
    fn normalize(&mut self, message: &mut Message, round: u32) -> usize {
        // A model cannot answer calls: result parts in its message would break the history.
        message
            .content
            .retain(|part| !matches!(part, ContentPart::ToolResult(_)));
        let mut calls = 0;
        for part in &mut message.content {
            if let ContentPart::ToolCall(call) = part {
                call.key = Some(self.keys.key(round, calls));
                calls += 1;
                if call.id.is_empty() || !self.call_ids.insert(&call.id) {
                    call.id = self.fresh_id(round, calls);
                }
            }
        }
        calls
    }

    /// Answer each call of the message at `at` that repeats an earlier call of it (same tool,
    /// same arguments as JSON): it is not run. The positions of the calls left to run, or
    /// `None` when nothing repeats.
    fn answer_repeats(&mut self, at: usize) -> Option<Vec<usize>> {
        let calls: Vec<&ToolCall> = self.session.history[at].tool_calls().collect();
        let parsed: Vec<Option<serde_json::Value>> = calls
            .iter()
            .map(|call| serde_json::from_str(&call.arguments).ok())
            .collect();
        let mut repeats = Vec::new();
        for (j, call) in calls.iter().enumerate() {
            let first = (0..j).find(|&i| {
                calls[i].name == call.name && parsed[i].is_some() && parsed[i] == parsed[j]
            });
            if let Some(i) = first {
                let text = format!(
                    "not executed: this call repeats call `{}` of the same message (the same tool \
                     with the same arguments), whose result answers both",
                    calls[i].id
                );
                repeats.push(ToolResult::error(call, text));
            }
        }
        if repeats.is_empty() {
            return None;
        }
        let repeated: Vec<String> = repeats.iter().map(|r| r.call_id.clone()).collect();
        let only = calls
            .iter()
            .enumerate()
            .filter(|(_, call)| !repeated.contains(&call.id))
            .map(|(position, _)| position)
            .collect();
        for result in repeats {
            self.session.history.push(Message::tool_result(result));
        }
        Some(only)
    }

    /// A new id, taken, for the `index`-th call of `round` whose own was empty or taken.
    fn fresh_id(&mut self, round: u32, index: usize) -> String {
        let prefix: String = self.ctx.run_id().chars().take(8).collect();
        let mut id = format!("call_{prefix}_{round}_{index}");
        while !self.call_ids.insert(&id) {
            id.push('_');
        }
        id
    }

    /// Apply what the tool responses of a round did (usage, a stop, interrupts) and put its
    /// results in call order; the outcome if the round ends the run.
    pub(super) async fn absorb_round(&mut self, out: RoundTools) -> Result<Option<Outcome>, Error> {
        let RoundTools {
            mut interrupts,
            usage,
            stop,
            cancelled,
            error,
            in_order,
        } = out;
        self.usage += usage;
        // Calls that would wait for a decision cannot wait when the run ends otherwise.
        let closing = if error.is_some() {
            Some(RUN_FAILED.to_owned())
        } else if cancelled {
            Some(ToolResult::CANCELLED.to_owned())
        } else {
            stop.as_deref().map(not_executed)
        };
        let closed = closing.is_some() && !interrupts.is_empty();
        if let Some(content) = closing.filter(|_| closed) {
            // Rare (a run ending with calls that would wait): boxed, so that the round's
            // future, which every run holds while it waits on its model, stays small.
            let waiting = std::mem::take(&mut interrupts);
            if let Err(told) = Box::pin(self.close_waiting(waiting, content)).await {
                return Err(error.unwrap_or(told));
            }
        }
        // Results that came as the calls finished, resumed calls after the others, calls that
        // waited answered last: in call order now.
        if !in_order || closed {
            self.session.history.order_results();
        }
        if let Some(error) = error {
            return Err(error);
        }
        if cancelled {
            return Ok(Some(cancelled_outcome()));
        }
        if let Some(reason) = stop {
            return Ok(Some(stopped(*reason)));
        }
        if !interrupts.is_empty() {
            return Ok(Some(Outcome::Interrupted { interrupts }));
        }
        Ok(None)
    }

    /// Answer the calls that would have waited for a decision with `content`, an error: the
    /// run ends otherwise. Each started, and finishes here.
    async fn close_waiting(
        &mut self,
        waiting: Vec<Interrupt>,
        content: String,
    ) -> Result<(), Error> {
        for interrupt in waiting {
            let result = ToolResult::error(&interrupt.call, content.clone());
            self.session.history.push(Message::tool_result(result));
            let finished = Event::ToolFinished {
                round: self.rounds,
                call_id: interrupt.call.id,
                name: interrupt.call.name,
                is_error: true,
            };
            emit!(self.ctx, finished)?;
        }
        Ok(())
    }

    /// Make `history`, which a layer committed, the session's, after checking it.
    fn commit(&mut self, history: History) -> Result<(), Error> {
        if let Err(defect) = history.validate() {
            return Err(Error::bad_request(format!(
                "a layer committed an invalid history ({defect}); the session was left as it was"
            )));
        }
        // The run's own messages are the newest: they keep their place from the end.
        let own = self.session.history.len().saturating_sub(self.start);
        self.start = history.len().saturating_sub(own);
        self.call_ids = CallIds::of(history.iter());
        self.session.history = history;
        Ok(())
    }

    /// End the run: write the state back, tell the observers and the stream, close the stream.
    /// An observer failing on `RunFinished` fails the run: every consumer then gets
    /// `RunFailed`, so a stream reader always sees the run end.
    async fn finish(mut self, result: Result<Outcome, Error>) -> Result<AgentResponse, Error> {
        // The host's later messages are refused: the run is over.
        if let Some(steering) = &self.steering {
            steering.close();
        }
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
                // Saved before anyone hears the run finished.
                let saved = self.save().await;
                let finished = Event::RunFinished {
                    outcome: outcome.clone(),
                };
                let told = match saved {
                    Ok(()) => emit!(self.ctx, finished),
                    Err(error) => Err(error),
                };
                match told {
                    Ok(()) => {
                        self.ctx.events().close();
                        let mut response = AgentResponse::new(self.session, outcome);
                        response.usage = self.usage;
                        response.rounds = self.rounds;
                        return Ok(response);
                    }
                    Err(error) => error,
                }
            }
            Err(error) => {
                // Whatever failed, leave a history the model can be called with again.
                {
                    let pending = &self.session.interrupts;
                    let started = std::mem::take(&mut self.session.started);
                    let wait = |call: &ToolCall| pending.iter().any(|i| i.call.id == call.id);
                    let answer = |call: &ToolCall| match call.key {
                        Some(key) if started.contains(&key) => {
                            ToolResult::error(call, ToolResult::ENDED_WHILE_RUNNING)
                        }
                        _ => ToolResult::error(call, RUN_FAILED),
                    };
                    let how = Repair::new().wait(&wait).answer(&answer);
                    self.session.history.repair(&how);
                }
                // What the run did is saved, unless saving is what failed (the error says
                // why: another writer, a lost store); the error carries the session anyway.
                if !self.saving.failed {
                    if let Err(failed) = self.save().await {
                        tracing::warn!(error = %failed, "the failed run's session was not saved");
                    }
                }
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
        Err(error.with_session(self.session).with_usage(self.usage))
    }
}
