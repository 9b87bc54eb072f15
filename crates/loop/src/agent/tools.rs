//! Executing the tool calls of one round.

use futures_util::stream::{self, StreamExt};
use tower_agent_core::{
    BoxError, CancellationToken, ContentPart, Decisions, Error, ErrorKind, Event, Interrupt,
    Message, Pause, RunContext, StopReason, ToolAction, ToolCall, ToolRequest, ToolResponse,
    ToolResult,
};
use tower_service::Service;

use super::ToolExecution;
use super::call::{self, CallFailure, tool_span};
use super::rounds::RUN_FAILED;

/// What the tools of one round produced.
#[derive(Default)]
pub(super) struct RoundTools {
    /// One tool-result message per call, in call order: appended to the history as they are.
    pub(super) results: Vec<Message>,
    pub(super) interrupts: Vec<Interrupt>,
    pub(super) stop: Option<StopReason>,
    pub(super) cancelled: bool,
    pub(super) error: Option<Error>,
}

impl RoundTools {
    /// Add the result of a call.
    #[inline]
    fn answer(&mut self, result: ToolResult) {
        self.results.push(Message::tool_result(result));
    }

    /// Whether every call got a result and nothing ends the run.
    #[inline]
    pub(super) fn is_plain(&self) -> bool {
        self.interrupts.is_empty() && self.stop.is_none() && !self.cancelled && self.error.is_none()
    }
}

/// How one tool call ended.
type ToolOutcome = Result<ToolResponse, CallFailure>;

/// Whether the model will see an error (an interrupt is not one).
fn is_error(outcome: &ToolOutcome) -> bool {
    match outcome {
        Ok(r) => r.result.is_error && !matches!(r.action, ToolAction::Interrupt(_)),
        Err(_) => true,
    }
}

/// Run the tool calls of one round. Never fails: every call gets a result, an interrupt, or
/// (on cancellation, stop or error) a synthetic result.
pub(super) async fn execute<T>(
    tools: &mut T,
    ctx: &RunContext,
    round: u32,
    mode: ToolExecution,
    parts: &[ContentPart],
    resume: Option<&Decisions>,
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
                if answered_unrun(out, ctx, call) {
                    continue;
                }
                if events {
                    if let Err(error) = ctx.emit(started(round, call)).await {
                        out.error = Some(error);
                        out.answer(ToolResult::error(call, RUN_FAILED));
                        continue;
                    }
                }
                let request = || tool_request(call, ctx, round, resume);
                // Not started if the run is cancelled (e.g. while the event waited).
                let outcome = call::call(&mut *tools, request, token, tool_span(call)).await;
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
                let request = tool_request(call, ctx, round, resume);
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
                        let is_error = is_error(&outcome);
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
                        out.answer(ToolResult::error(call, RUN_FAILED));
                    }
                    None => {
                        out.cancelled = true;
                        out.answer(ToolResult::cancelled(call));
                    }
                }
            }
        }
    }
}

/// Run the one tool call of a sequential round when nobody listens: no loop, no events and
/// no second future around it (about 70 instructions less a round than [`execute`]).
pub(super) async fn execute_quietly<T>(
    tools: &mut T,
    ctx: &RunContext,
    round: u32,
    call: &ToolCall,
    out: &mut RoundTools,
) where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
    if answered_unrun(out, ctx, call) {
        return;
    }
    let token = ctx.cancellation_token();
    let request = || tool_request(call, ctx, round, None);
    let outcome = call::call(tools, request, token, tool_span(call)).await;
    absorb(out, call, outcome, token);
}

/// Answer `call` without running it when an earlier call of the round stopped the run, failed
/// it or saw it cancelled (or a layer stopped the run): whether it did.
#[inline]
fn answered_unrun(out: &mut RoundTools, ctx: &RunContext, call: &ToolCall) -> bool {
    if out.stop.is_none() && out.error.is_none() && !out.cancelled && !ctx.is_stopping() {
        return false;
    }
    answer_unrun(out, ctx, call)
}

#[cold]
#[inline(never)]
fn answer_unrun(out: &mut RoundTools, ctx: &RunContext, call: &ToolCall) -> bool {
    // A layer that stopped the run stops it before the next call.
    if out.stop.is_none() && ctx.is_stopping() {
        out.stop = ctx.take_stop();
    }
    let result = if let Some(reason) = &out.stop {
        ToolResult::error(call, not_executed(reason))
    } else if out.error.is_some() {
        ToolResult::error(call, RUN_FAILED)
    } else if out.cancelled {
        ToolResult::cancelled(call)
    } else {
        return false;
    };
    out.answer(result);
    true
}

/// The request for `call`, with its decision when the round resumes. Inlined into the
/// closure that makes it at the moment of the call, so it is built in place.
#[inline(always)]
fn tool_request(
    call: &ToolCall,
    ctx: &RunContext,
    round: u32,
    resume: Option<&Decisions>,
) -> ToolRequest {
    ToolRequest {
        call: call.clone(),
        ctx: ctx.with_round(round),
        resume: match resume {
            Some(decisions) => decisions.get(&call.id).cloned(),
            None => None,
        },
    }
}

fn as_call(part: &ContentPart) -> Option<&ToolCall> {
    match part {
        ContentPart::ToolCall(call) => Some(call),
        _ => None,
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
    let outcome = call::call(&mut service, || request, ctx.cancellation_token(), span).await;
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
                ToolAction::Interrupt(pause) => {
                    let Pause { payload, allowed } = *pause;
                    out.interrupts
                        .push(Interrupt::new(call.clone(), payload).with_allowed(allowed));
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
    out.answer(result);
    is_error
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
