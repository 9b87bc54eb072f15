//! What a run's events look like on the wire: a name and a JSON object each.

use serde_json::{Value, json};
use tower_agent_core::{Error, Event, Interrupt, Outcome};

/// The server-sent event for `event`: its name and data; `None` for what a client of a run
/// does not need (the history snapshots of observers, a layer's own events but as a name and
/// a line).
pub(crate) fn event(event: &Event) -> Option<(&'static str, Value)> {
    Some(match event {
        Event::RunStarted { run_id, session_id } => (
            "run_started",
            json!({ "run_id": &**run_id, "session_id": &**session_id }),
        ),
        Event::RoundStarted { round } => ("round_started", json!({ "round": round })),
        Event::TextDelta { round, delta } => {
            ("text_delta", json!({ "round": round, "text": delta }))
        }
        Event::Retract { round } => ("retract", json!({ "round": round })),
        Event::ToolStarted {
            round,
            call_id,
            name,
        } => (
            "tool_started",
            json!({ "round": round, "call_id": call_id, "name": name }),
        ),
        Event::ToolFinished {
            round,
            call_id,
            name,
            is_error,
        } => (
            "tool_finished",
            json!({ "round": round, "call_id": call_id, "name": name, "ok": !is_error }),
        ),
        Event::ToolRecovered {
            round,
            call_id,
            name,
            outcome,
        } => (
            "tool_recovered",
            json!({ "round": round, "call_id": call_id, "name": name, "outcome": outcome }),
        ),
        Event::Retrying {
            round,
            attempt,
            delay,
            error,
        } => (
            "retrying",
            json!({
                "round": round,
                "attempt": attempt,
                "delay_ms": u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "error": error.to_string(),
            }),
        ),
        Event::Warning { source, message } => {
            ("warning", json!({ "source": source, "message": message }))
        }
        Event::Truncated {
            round,
            calls,
            max_tokens,
        } => (
            "truncated",
            json!({ "round": round, "calls": calls, "max_tokens": max_tokens }),
        ),
        Event::Layer(event) => (
            "layer",
            json!({ "name": event.name(), "text": event.to_string() }),
        ),
        Event::RunFinished { outcome } => ("run_finished", self::outcome(outcome)),
        Event::RunFailed { error } => ("run_failed", failure(error)),
        _ => return None,
    })
}

/// How a run ended, for a client: `completed` with the answer's text, `interrupted` with what
/// waits (each call, its question and the decisions it takes), `stopped` with why,
/// `cancelled`.
pub(crate) fn outcome(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Completed { message } => json!({ "outcome": "completed", "text": message.text() }),
        Outcome::Interrupted { interrupts } => json!({
            "outcome": "interrupted",
            "interrupts": interrupts.iter().map(interrupt_json).collect::<Vec<_>>(),
        }),
        Outcome::Stopped { reason, .. } => json!({
            "outcome": "stopped",
            "reason": reason.to_string(),
            "summary": outcome.summary(),
        }),
        Outcome::Cancelled { .. } => {
            json!({ "outcome": "cancelled", "summary": outcome.summary() })
        }
        _ => json!({ "outcome": "other" }),
    }
}

/// A run's error, for a client: its kind and message.
pub(crate) fn failure(error: &Error) -> Value {
    json!({ "error": { "kind": error.kind().name(), "message": error.to_string() } })
}

fn interrupt_json(interrupt: &Interrupt) -> Value {
    let arguments: Value = serde_json::from_str(&interrupt.call.arguments).unwrap_or(Value::Null);
    json!({
        "call_id": interrupt.call.id,
        "name": interrupt.call.name,
        "arguments": arguments,
        "payload": interrupt.payload,
        "allowed": interrupt.allowed,
        "before_model": interrupt.before_model,
    })
}
