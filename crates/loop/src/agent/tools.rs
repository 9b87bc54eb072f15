//! Executing the tool calls of one round.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tower_agent_core::{
    BoxError, CallKey, CancellationToken, ContentPart, Decisions, DescribeTools, Error, ErrorKind,
    Event, History, Interrupt, Message, ModelRequest, ModelResponse, Pause, RunContext, RunSaves,
    SaveReply, StopReason, ToolAction, ToolCall, ToolRequest, ToolResponse, ToolResult, ToolSpec,
    Usage,
};
use tower_service::Service;

use super::ToolExecution;
use super::call::{self, CallFailure, record_tool, tool_span};
use super::early::{Early, EarlyRun};
use super::state::Run;

/// The result of a call left without one when the run failed.
pub(super) const RUN_FAILED: &str = "not executed: the run failed before this tool call completed";

/// What the tools of one round did besides their results (which go into the history as they
/// come): everything else the round's responses carried.
#[derive(Default)]
pub(super) struct RoundTools {
    pub(super) interrupts: Vec<Interrupt>,
    /// Tokens the tools used (sub-agents).
    pub(super) usage: Usage,
    /// Boxed: rare, and every run's future holds a round's `RoundTools` while a tool runs.
    pub(super) stop: Option<Box<StopReason>>,
    pub(super) cancelled: bool,
    pub(super) error: Option<Error>,
    /// The results went into the history in call order (every call of a message, one after
    /// the other).
    pub(super) in_order: bool,
}

impl RoundTools {
    /// The result of `call` when an earlier call of the round stopped the run, failed it or
    /// saw it cancelled: it is not run.
    pub(super) fn unrun(&self, call: &ToolCall) -> Option<ToolResult> {
        if let Some(reason) = &self.stop {
            Some(ToolResult::error(call, not_executed(reason)))
        } else if self.error.is_some() {
            Some(ToolResult::error(call, RUN_FAILED))
        } else if self.cancelled {
            Some(ToolResult::cancelled(call))
        } else {
            None
        }
    }
}

/// How one tool call ended.
type ToolOutcome = Result<ToolResponse, CallFailure>;

/// Whether the model will see an error (an interrupt is not one).
fn is_error(outcome: &ToolOutcome) -> bool {
    match outcome {
        Ok(r) => r.result.is_error && !r.is_interrupt(),
        Err(_) => true,
    }
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
    /// Run the tool calls of the message at `at` in the history (those at the positions
    /// `only` lists, or all of them). Never fails: every call gets a result, an interrupt, or
    /// (on cancellation, stop or error) a synthetic result. A call that started `early` is
    /// waited for instead of run again (the caller has aborted the early runs no call
    /// matches).
    ///
    /// Each result goes into the history as it comes (concurrent calls in the order they
    /// finish; the caller puts them in call order), and the session is saved then: a process
    /// that dies loses only the calls still running. A save that fails ends the round (the
    /// calls not run yet are answered "not executed: the run failed"). The calls are read from
    /// the history where they stand, never copied but into their requests.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments beside the locals it moves them to"
    )]
    pub(super) fn execute(
        &mut self,
        round: u32,
        at: usize,
        only: Option<&[usize]>,
        resume: Option<&Decisions>,
        early: Option<Early>,
    ) -> impl Future<Output = RoundTools> {
        async move {
            match self.config.tool_execution {
                ToolExecution::Sequential => self.sequential(round, at, only, resume, early).await,
                // Boxed: the concurrent round's future is large, and every run's future would be
                // as large (a run's future holds its largest step, whichever it is waiting on).
                ToolExecution::Concurrent { limit } => {
                    let limit = (limit, false);
                    Box::pin(self.concurrent(limit, round, at, only, resume, early)).await
                }
                ToolExecution::ConcurrentReads { limit } => {
                    let limit = (limit, true);
                    Box::pin(self.concurrent(limit, round, at, only, resume, early)).await
                }
            }
        }
    }

    /// The calls one after the other, in call order.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments beside the locals it moves them to"
    )]
    fn sequential(
        &mut self,
        round: u32,
        at: usize,
        only: Option<&[usize]>,
        resume: Option<&Decisions>,
        early: Option<Early>,
    ) -> impl Future<Output = RoundTools> {
        async move {
            let mut out = RoundTools::default();
            let count = count(&self.session.history, at, only);
            let position = |k: usize| only.map_or(k, |positions| positions[k]);
            out.in_order = only.is_none();
            for k in 0..count {
                let (at, pos) = (at, position(k));
                let call = call_at(&self.session.history, at, pos);
                let mut adopted = None;
                if let Some(result) = out.unrun(call) {
                    // A call that started early ran, or runs, and counted as it started:
                    // after a stop by an earlier call it keeps its result (after a
                    // failure or a cancellation it is dropped with the others).
                    if out.error.is_none() && !out.cancelled {
                        adopted = early.as_ref().and_then(|early| early.adopt(call));
                    }
                    if adopted.is_none() {
                        self.answer_unrun(result);
                        continue;
                    }
                }
                if let Err(error) = emit!(self.ctx, started(round, call)) {
                    out.error = Some(error);
                    let call = call_at(&self.session.history, at, pos);
                    self.answer_unrun(ToolResult::error(call, RUN_FAILED));
                    continue;
                }
                // Write-ahead: a call that may not repeat is saved as started before it runs
                // (usually by the save before it, which marked it already).
                if adopted.is_none() {
                    self.mark(at, pos);
                    if let Err(error) = self.save_marks().await {
                        out.error = Some(error);
                        let call = call_at(&self.session.history, at, pos);
                        self.answer(ToolResult::error(call, RUN_FAILED));
                        continue;
                    }
                }
                let call = call_at(&self.session.history, at, pos);
                let adopted =
                    adopted.or_else(|| early.as_ref().and_then(|early| early.adopt(call)));
                // The outcome lives in this block only (it would keep its place in the run's
                // future while the result is saved).
                let answered = {
                    let outcome = match adopted {
                        Some(run) => run.finish().await,
                        None => {
                            let request =
                                tool_request(call, &self.ctx, round, resume, &self.recovering);
                            let span = tool_span(call);
                            let (tools, token) = (&mut self.tools, self.ctx.cancellation_token());
                            // The saves the call asks for while it runs (a sub-agent's
                            // steps), when the run saves.
                            match self.saving.take_asks() {
                                None => call::call(tools, request, token, span, record_tool).await,
                                Some(asks) => {
                                    let running =
                                        call::call(tools, request, token, span, record_tool);
                                    let (session, ctx) = (&self.session, &self.ctx);
                                    // Boxed, as the concurrent round is: only runs that save
                                    // and have a call that asks pay for it.
                                    Box::pin(self.saving.serving(asks, session, ctx, running)).await
                                }
                            }
                        }
                    };
                    self.answer_with(&mut out, at, pos, outcome)
                };
                if answered.is_some() {
                    // The next call's write-ahead goes with this result's save.
                    if k + 1 < count {
                        let next = position(k + 1);
                        if out
                            .unrun(call_at(&self.session.history, at, next))
                            .is_none()
                        {
                            self.mark(at, next);
                        }
                    }
                    self.save_result(&mut out).await;
                }
                // A call that waits for a decision has not finished: it finishes when resumed.
                if let Some(is_error) = answered {
                    let call = call_at(&self.session.history, at, pos);
                    if let Err(error) = emit!(self.ctx, finished(round, call, is_error)) {
                        out.error.get_or_insert(error);
                    }
                }
            }
            out
        }
    }

    /// Up to `limit` calls at once, with `in_turn` those that may not repeat one at a time in
    /// call order; each result goes into the history as it comes.
    async fn concurrent(
        &mut self,
        (limit, in_turn): (usize, bool),
        round: u32,
        at: usize,
        only: Option<&[usize]>,
        resume: Option<&Decisions>,
        early: Option<Early>,
    ) -> RoundTools {
        let mut out = RoundTools::default();
        let token = self.ctx.cancellation_token().clone();
        let count = count(&self.session.history, at, only);
        let position = |k: usize| only.map_or(k, |positions| positions[k]);
        // Write-ahead: the calls that may not repeat are saved as started before any runs
        // (usually by the save before the round, which marked them already).
        for k in 0..count {
            self.mark(at, position(k));
        }
        if let Err(error) = self.save_marks().await {
            out.error = Some(error);
            for k in 0..count {
                let call = call_at(&self.session.history, at, position(k));
                self.answer(ToolResult::error(call, RUN_FAILED));
            }
            return out;
        }
        // Each future owns what it needs (no borrows), which keeps the run future `Send`.
        // The calls that run in turn take the turn in call order (tokio's lock is fair).
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        let running: Vec<_> = (0..count)
            .map(|k| {
                let call = call_at(&self.session.history, at, position(k));
                let request = tool_request(call, &self.ctx, round, resume, &self.recovering);
                let adopted = early.as_ref().and_then(|early| early.adopt(call));
                let turn = (in_turn && !self.may_repeat(&call.name)).then(|| Arc::clone(&turn));
                run_one(k, self.tools.clone(), request, adopted, turn)
            })
            .collect();
        let mut running = stream::iter(running).buffer_unordered(limit.max(1));
        let mut done = vec![false; count];
        // The saves the calls ask for while they run (a sub-agent's steps), served
        // between the results' saves.
        let mut asks = self.saving.take_asks();
        loop {
            let next = tokio::select! {
                biased;
                _ = token.cancelled() => break,
                Some(reply) = next_ask(&mut asks) => {
                    self.saving.serve(reply, &self.session, &self.ctx).await;
                    continue;
                }
                next = running.next() => next,
            };
            let Some((k, outcome)) = next else { break };
            match outcome {
                // Cancelled before it ended: answered below.
                Ok(None) => {}
                Ok(Some(outcome)) => {
                    done[k] = true;
                    let is_error = is_error(&outcome);
                    let pos = position(k);
                    // A call that waits for a decision has not finished: it finishes when
                    // resumed.
                    if self.answer_with(&mut out, at, pos, Some(outcome)).is_some() {
                        self.save_result(&mut out).await;
                        let call = call_at(&self.session.history, at, pos);
                        let told = emit!(self.ctx, finished(round, call, is_error));
                        if let Err(error) = told {
                            out.error.get_or_insert(error);
                        }
                    }
                    if out.error.is_some() {
                        break;
                    }
                }
                Err(error) => {
                    out.error = Some(error);
                    break;
                }
            }
        }
        drop(running);
        self.saving.put_back(asks);
        for (k, done) in done.into_iter().enumerate() {
            if done {
                continue;
            }
            let call = call_at(&self.session.history, at, position(k));
            let result = if out.error.is_some() {
                ToolResult::error(call, RUN_FAILED)
            } else {
                out.cancelled = true;
                ToolResult::cancelled(call)
            };
            self.answer_unrun(result);
        }
        out
    }

    /// Append the result of a call to the history; the call leaves the write-ahead record.
    fn answer(&mut self, result: ToolResult) {
        if !self.session.started.is_empty() {
            self.unmark(&result.call_id);
        }
        self.session.history.push(Message::tool_result(result));
    }

    /// Append the synthetic result of a call the run ends without (cancelled, stopped,
    /// failed): when the write-ahead record says it may have started, [`ToolResult::ENDED_WHILE_RUNNING`]
    /// instead, since it may have taken effect.
    fn answer_unrun(&mut self, mut result: ToolResult) {
        if !self.session.started.is_empty() && self.unmark(&result.call_id) {
            result.content = ToolResult::ENDED_WHILE_RUNNING.to_owned();
        }
        self.session.history.push(Message::tool_result(result));
    }

    /// Take the call `id` out of the write-ahead record (it has a result, or waits for a
    /// decision): the next save drops it. Whether it was there. The calls of the session's
    /// last assistant message are the only ones that can be in it.
    fn unmark(&mut self, id: &str) -> bool {
        let history = &self.session.history;
        let key = history
            .iter()
            .rev()
            .find(|message| message.has_tool_calls())
            .and_then(|message| message.tool_calls().find(|call| call.id == id))
            .and_then(|call| call.key);
        let Some(key) = key else { return false };
        let before = self.session.started.len();
        self.session.started.retain(|started| *started != key);
        self.session.started.len() < before
    }

    /// Put the call at `pos` of the message at `at` in the write-ahead record when it may not
    /// repeat ([`ToolSpec::may_repeat`]) and the run saves: the next save records that it
    /// started. A call without a key (a history written by hand) is not recorded.
    pub(super) fn mark(&mut self, at: usize, pos: usize) {
        if !self.saving.is_on() {
            return;
        }
        let call = call_at(&self.session.history, at, pos);
        let Some(key) = call.key else { return };
        if self.session.started.contains(&key) || self.may_repeat(&call.name) {
            return;
        }
        self.session.started.push(key);
    }

    /// Put the calls of the message at `at` (those at the positions `only` lists, or all) that
    /// run first in the write-ahead record, for the save before the round: all of them when
    /// they run concurrently, the first when one after the other (each next one goes with the
    /// save of the result before it).
    pub(super) fn mark_round(&mut self, at: usize, only: Option<&[usize]>) {
        let count = match self.config.tool_execution {
            ToolExecution::Sequential => count(&self.session.history, at, only).min(1),
            ToolExecution::Concurrent { .. } | ToolExecution::ConcurrentReads { .. } => {
                count(&self.session.history, at, only)
            }
        };
        for k in 0..count {
            self.mark(at, only.map_or(k, |positions| positions[k]));
        }
    }

    /// Whether the tool `name` may repeat: read-only or idempotent, by its spec.
    pub(super) fn may_repeat(&self, name: &str) -> bool {
        self.tools
            .tool_specs()
            .iter()
            .find(|spec| spec.name == name)
            .is_some_and(ToolSpec::may_repeat)
    }

    /// Save the write-ahead record before calls run: nothing is written when the last save
    /// holds it already.
    async fn save_marks(&mut self) -> Result<(), Error> {
        match self.saving.is_on() && !self.saving.failed {
            true => self.save().await,
            false => Ok(()),
        }
    }

    /// Save the result [`answer_with`](Self::answer_with) put in the history. A failed save
    /// fails the run; the calls after it are not run.
    async fn save_result(&mut self, out: &mut RoundTools) {
        if self.saving.is_on() && !self.saving.failed {
            if let Err(error) = self.save().await {
                out.error.get_or_insert(error);
            }
        }
    }

    /// Turn one call's outcome (`None`: cancelled while running) into a result, an interrupt
    /// or a stop; a result goes into the history, to be saved with
    /// [`save_result`](Self::save_result). Whether the model sees an error; `None` when there
    /// is no result (an interrupt). Not `async`: the outcome would stay in the run's future
    /// while the result is saved.
    fn answer_with(
        &mut self,
        out: &mut RoundTools,
        at: usize,
        pos: usize,
        outcome: Option<ToolOutcome>,
    ) -> Option<bool> {
        let call = call_at(&self.session.history, at, pos);
        // A recovery that failed could not say what became of the call: not a failed call.
        let outcome = match outcome {
            Some(Err(failure)) if call.key.is_some_and(|key| self.recovering.contains(&key)) => {
                let failure = match failure {
                    CallFailure::Failed(error) => error.to_string(),
                    CallFailure::Panicked(message) => format!("it panicked: {message}"),
                };
                let text = format!(
                    "{} (asking the tool what became of it failed: {failure})",
                    ToolResult::OUTCOME_UNKNOWN
                );
                Some(Ok(ToolResponse::error(call, text)))
            }
            other => other,
        };
        let token = self.ctx.cancellation_token();
        let Some((result, arguments)) = absorb(out, call, outcome, token) else {
            // It waits for a decision: not running any more.
            let id = call.id.clone();
            self.unmark(&id);
            return None;
        };
        // The call stands as it ran, before its result is saved: an edited call is never saved
        // with the model's arguments next to its result.
        if let Some(arguments) = arguments {
            let message = &mut self.session.history.tail_mut(at)[0];
            let mut calls = message.content.iter_mut().filter_map(|part| match part {
                ContentPart::ToolCall(call) => Some(call),
                _ => None,
            });
            if let Some(call) = calls.nth(pos) {
                call.arguments = arguments;
            }
        }
        let is_error = result.is_error;
        match out.cancelled && result.content == ToolResult::CANCELLED {
            true => self.answer_unrun(result),
            false => self.answer(result),
        }
        Some(is_error)
    }
}

/// How many calls of the message at `at` run: those at the positions `only` lists, or all.
fn count(history: &History, at: usize, only: Option<&[usize]>) -> usize {
    match only {
        Some(positions) => positions.len(),
        None => history[at].tool_calls().count(),
    }
}

/// The call at position `pos` of the message at `at`.
fn call_at(history: &History, at: usize, pos: usize) -> &ToolCall {
    history[at]
        .tool_calls()
        .nth(pos)
        .expect("the round's calls stand in its message")
}

/// The request for `call`, with its decision when the round resumes; a recovery when an
/// earlier run started it (its key is among those `recovering`).
fn tool_request(
    call: &ToolCall,
    ctx: &RunContext,
    round: u32,
    resume: Option<&Decisions>,
    recovering: &[CallKey],
) -> ToolRequest {
    ToolRequest {
        call: call.clone(),
        ctx: ctx.with_round(round),
        resume: match resume {
            Some(decisions) => decisions.get(&call.id).cloned(),
            None => None,
        },
        early: None,
        recover: call.key.is_some_and(|key| recovering.contains(&key)),
    }
}

/// The next save a call asks for, when the run saves.
async fn next_ask(
    asks: &mut Option<(RunSaves, UnboundedReceiver<SaveReply>)>,
) -> Option<SaveReply> {
    match asks {
        Some((_, asked)) => asked.recv().await,
        None => std::future::pending().await,
    }
}

/// One call of a concurrent round: wait for its `turn` if it runs in turn, announce it, run
/// it (or wait for its early run).
async fn run_one<T>(
    index: usize,
    mut service: T,
    request: ToolRequest,
    early: Option<EarlyRun>,
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
) -> (usize, Result<Option<ToolOutcome>, Error>)
where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
    let _turn = match &turn {
        Some(turn) => Some(turn.lock().await),
        None => None,
    };
    let ctx = request.ctx.clone();
    if let Err(error) = emit!(ctx, started(ctx.round(), &request.call)) {
        return (index, Err(error));
    }
    let outcome = match early {
        Some(run) => run.finish().await,
        None => {
            let span = tool_span(&request.call);
            let token = ctx.cancellation_token();
            call::call(&mut service, request, token, span, record_tool).await
        }
    };
    (index, Ok(outcome))
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

/// Turn one call's outcome (`None`: cancelled while running) into its result and the
/// arguments it ran with when they are not the model's, or `None` for an interrupt; a stop
/// and its usage go into `out`.
fn absorb(
    out: &mut RoundTools,
    call: &ToolCall,
    outcome: Option<ToolOutcome>,
    token: &CancellationToken,
) -> Option<(ToolResult, Option<String>)> {
    let result = match outcome {
        None => {
            out.cancelled = true;
            ToolResult::cancelled(call)
        }
        Some(Err(CallFailure::Failed(error)))
            if error.kind() == ErrorKind::Cancelled && token.is_cancelled() =>
        {
            out.cancelled = true;
            ToolResult::cancelled(call)
        }
        Some(Err(CallFailure::Failed(error))) => {
            ToolResult::error(call, format!("tool `{}` failed: {error}", call.name))
        }
        Some(Err(CallFailure::Panicked(message))) => {
            ToolResult::error(call, format!("tool `{}` panicked: {message}", call.name))
        }
        Some(Ok(response)) => {
            let ToolResponse {
                mut result,
                action,
                arguments,
                usage,
            } = response;
            out.usage += usage;
            // The result answers this call, whatever the service wrote.
            if result.call_id != call.id {
                result.call_id.clone_from(&call.id);
            }
            if result.name != call.name {
                result.name.clone_from(&call.name);
            }
            match action {
                ToolAction::Interrupt(pause) => {
                    // A call that waits stays the call stored: its arguments are not rewritten.
                    let Pause { payload, allowed } = *pause;
                    out.interrupts
                        .push(Interrupt::new(call.clone(), payload).with_allowed(allowed));
                    return None;
                }
                ToolAction::Stop(reason) => {
                    out.stop.get_or_insert_with(|| Box::new(reason));
                }
                _ => {}
            }
            return Some((result, arguments));
        }
    };
    Some((result, None))
}

pub(super) fn not_executed(reason: &StopReason) -> String {
    match reason {
        StopReason::Tool { name, reason, .. } => {
            format!("not executed: the run was stopped by `{name}`: {reason}")
        }
        StopReason::MaxRounds { limit } => {
            format!("not executed: the run reached its limit of {limit} rounds")
        }
        other => format!("not executed: the run was stopped: {other}"),
    }
}
