//! Executing the tool calls of one round.

use futures_util::stream::{self, StreamExt};
use tower_agent_core::{
    BoxError, CancellationToken, Decisions, Error, ErrorKind, Event, Interrupt, Message, Pause,
    RunContext, StopReason, ToolAction, ToolCall, ToolRequest, ToolResponse, ToolResult, Usage,
};
use tower_service::Service;

use super::ToolExecution;
use super::call::{self, CallFailure, record_tool, tool_span};
use super::early::{Early, EarlyRun};

/// The result of a call left without one when the run failed.
pub(super) const RUN_FAILED: &str = "not executed: the run failed before this tool call completed";

/// What the tools of one round produced: everything the round's responses carried.
#[derive(Default)]
pub(super) struct RoundTools {
    /// One tool-result message per call that got a result, in call order.
    pub(super) results: Vec<Message>,
    pub(super) interrupts: Vec<Interrupt>,
    /// Arguments calls ran with instead of the model's: `(call id, arguments)`.
    pub(super) arguments: Vec<(String, String)>,
    /// Tokens the tools used (sub-agents).
    pub(super) usage: Usage,
    pub(super) stop: Option<StopReason>,
    pub(super) cancelled: bool,
    pub(super) error: Option<Error>,
}

impl RoundTools {
    /// Add the result of a call.
    fn answer(&mut self, result: ToolResult) {
        self.results.push(Message::tool_result(result));
    }

    /// Answer `call` without running it when an earlier call of the round stopped the run,
    /// failed it or saw it cancelled: whether it did.
    fn answered_unrun(&mut self, call: &ToolCall) -> bool {
        let result = if let Some(reason) = &self.stop {
            ToolResult::error(call, not_executed(reason))
        } else if self.error.is_some() {
            ToolResult::error(call, RUN_FAILED)
        } else if self.cancelled {
            ToolResult::cancelled(call)
        } else {
            return false;
        };
        self.answer(result);
        true
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

/// Run the tool calls of one round. Never fails: every call gets a result, an interrupt, or
/// (on cancellation, stop or error) a synthetic result. A call that started `early` is waited
/// for instead of run again (the caller has aborted the early runs no call matches).
pub(super) async fn execute<T>(
    tools: &mut T,
    ctx: &RunContext,
    round: u32,
    mode: ToolExecution,
    calls: impl Iterator<Item = &ToolCall> + Send,
    resume: Option<&Decisions>,
    early: Option<Early>,
) -> RoundTools
where
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    let mut out = RoundTools::default();
    let token = ctx.cancellation_token();
    match mode {
        ToolExecution::Sequential => {
            for call in calls {
                if out.answered_unrun(call) {
                    continue;
                }
                if let Err(error) = emit!(ctx, started(round, call)) {
                    out.error = Some(error);
                    out.answer(ToolResult::error(call, RUN_FAILED));
                    continue;
                }
                let outcome = match early.as_ref().and_then(|early| early.adopt(call)) {
                    Some(run) => run.finish().await,
                    None => {
                        let request = tool_request(call, ctx, round, resume);
                        let span = tool_span(call);
                        call::call(&mut *tools, request, token, span, record_tool).await
                    }
                };
                let is_error = absorb(&mut out, call, outcome, token);
                if let Err(error) = emit!(ctx, finished(round, call, is_error)) {
                    out.error.get_or_insert(error);
                }
            }
        }
        ToolExecution::Concurrent { limit } => {
            let calls: Vec<&ToolCall> = calls.collect();
            // Each future owns what it needs (no borrows), which keeps the run future `Send`.
            let running: Vec<_> = calls
                .iter()
                .enumerate()
                .map(|(index, call)| {
                    let request = tool_request(call, ctx, round, resume);
                    let adopted = early.as_ref().and_then(|early| early.adopt(call));
                    run_one(index, tools.clone(), request, adopted)
                })
                .collect();
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
                        if let Err(error) = emit!(ctx, finished(round, calls[index], is_error)) {
                            out.error = Some(error);
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
            for (call, slot) in calls.iter().zip(slots) {
                match slot {
                    Some(outcome) => {
                        absorb(&mut out, call, Some(outcome), token);
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
    out
}

/// The request for `call`, with its decision when the round resumes.
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

/// One call of a concurrent round: announce it, run it (or wait for its early run).
async fn run_one<T>(
    index: usize,
    mut service: T,
    request: ToolRequest,
    early: Option<EarlyRun>,
) -> (usize, Result<Option<ToolOutcome>, Error>)
where
    T: Service<ToolRequest, Response = ToolResponse>,
    T::Error: Into<BoxError>,
{
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
                    return false;
                }
                ToolAction::Stop(reason) => {
                    out.stop.get_or_insert(reason);
                }
                _ => {}
            }
            if let Some(arguments) = arguments {
                out.arguments.push((call.id.clone(), arguments));
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
