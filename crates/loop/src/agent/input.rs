//! Checking a run's input against its session, before anything changes.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;
use tower_agent_core::decision::DecisionError;
use tower_agent_core::{AgentInput, Decision, Decisions, Error, Interrupt, Message, Session};

/// Whether `input` fits `session`; checked before anything changes, so a refused request
/// returns the session exactly as it came. `Ok(true)`: a resume whose decisions were all
/// applied before (a replay), which runs nothing.
pub(super) fn check_input(session: &Session, input: &AgentInput) -> Result<bool, Error> {
    match input {
        AgentInput::Messages(_) => Ok(false),
        AgentInput::Continue if session.history.is_empty() && session.interrupts.is_empty() => {
            Err(Error::bad_request(format!(
                "nothing to continue: session `{}` has no history (send it a message instead)",
                session.id
            )))
        }
        AgentInput::Continue => check_interrupts(session).map(|()| false),
        AgentInput::Resume(decisions) => {
            check_interrupts(session)?;
            // Only a decision that names no pending call needs the answered ids.
            let mut answered: Option<HashSet<&str>> = None;
            check_decisions(decisions, &session.interrupts, |id| {
                answered
                    .get_or_insert_with(|| {
                        session
                            .history
                            .iter()
                            .flat_map(Message::tool_results)
                            .map(|r| r.call_id.as_str())
                            .collect()
                    })
                    .contains(id)
            })
            .map_err(|error| Error::bad_request(error.to_string()).with_source(error))
        }
        other => Err(Error::bad_request(format!(
            "this agent does not support the input {other:?}"
        ))),
    }
}

/// Every pending interrupt must be, once, an unanswered call at the end of the history, and
/// the very call stored there: same id, tool and arguments. Otherwise resuming would run
/// another call than the one the history shows.
fn check_interrupts(session: &Session) -> Result<(), Error> {
    if session.interrupts.is_empty() {
        return Ok(());
    }
    let open = session.history.open_calls();
    for (index, interrupt) in session.interrupts.iter().enumerate() {
        let stored = &interrupt.call;
        let id = &stored.id;
        if session.interrupts[..index].iter().any(|i| &i.call.id == id) {
            return Err(Error::bad_request(format!(
                "the session lists the pending interrupt for call `{id}` twice"
            )));
        }
        // A pause before a model call has no call in the history; it waits alone.
        if interrupt.before_model {
            if session.interrupts.len() > 1 {
                return Err(Error::bad_request(format!(
                    "the session's pause `{id}` before a model call waits beside other interrupts"
                )));
            }
            continue;
        }
        let Some(call) = open.iter().find(|call| &call.id == id) else {
            return Err(Error::bad_request(format!(
                "the session's pending interrupt for call `{id}` does not match an unanswered \
                 call at the end of its history"
            )));
        };
        if call.name != stored.name || call.arguments != stored.arguments {
            return Err(Error::bad_request(format!(
                "the session's pending interrupt for call `{id}` names tool `{}` with other \
                 arguments than the call in its history (tool `{}`)",
                stored.name, call.name
            )));
        }
    }
    Ok(())
}

/// Why a resume was refused: the session is left exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The session has no call waiting and no call these decisions could answer.
    #[error("cannot resume: the session has no pending interrupt")]
    NothingPending,
    /// A decision names a call the session does not have.
    #[error("cannot resume: no call `{call_id}` in the session")]
    UnknownCall {
        /// The id decided.
        call_id: String,
    },
    /// A waiting call has no decision.
    #[error("cannot resume: call `{call_id}` (tool `{tool}`) waits for a decision and got none")]
    Missing {
        /// The waiting call.
        call_id: String,
        /// Its tool.
        tool: String,
    },
    /// A decision the waiting call does not allow, or a value that is not a decision.
    #[error("cannot resume: call `{call_id}` allows {allowed}; got {got}")]
    NotAllowed {
        /// The waiting call.
        call_id: String,
        /// What it allows, comma separated.
        allowed: String,
        /// What it got.
        got: String,
    },
}

/// Check `decisions` against the calls that wait (`pending`) and those already answered
/// (`answered`): every key names one of them, every pending call has a value, every value
/// fits what its call allows. Returns whether the decisions are a replay: they only name
/// calls already answered (a resume delivered twice), so nothing is to run.
pub(super) fn check_decisions(
    decisions: &Decisions,
    pending: &[Interrupt],
    mut answered: impl FnMut(&str) -> bool,
) -> Result<bool, ResumeError> {
    let mut fresh = 0;
    for (call_id, _) in decisions.iter() {
        if pending.iter().any(|i| i.call.id == call_id) {
            fresh += 1;
        } else if !answered(call_id) {
            return Err(ResumeError::UnknownCall {
                call_id: call_id.to_owned(),
            });
        }
    }
    if fresh == 0 && !decisions.is_empty() {
        return Ok(true);
    }
    if pending.is_empty() {
        return Err(ResumeError::NothingPending);
    }
    for interrupt in pending {
        let Some(value) = decisions.get(&interrupt.call.id) else {
            return Err(ResumeError::Missing {
                call_id: interrupt.call.id.clone(),
                tool: interrupt.call.name.clone(),
            });
        };
        check_value(interrupt, value)?;
    }
    Ok(false)
}

/// Whether `value` may resume `interrupt`'s call: anything when [`Interrupt::allowed`] is
/// empty, else a [`Decision`] of an allowed kind.
fn check_value(interrupt: &Interrupt, value: &Value) -> Result<(), ResumeError> {
    if interrupt.allowed.is_empty() {
        return Ok(());
    }
    let not_allowed = |got: String| ResumeError::NotAllowed {
        call_id: interrupt.call.id.clone(),
        allowed: interrupt
            .allowed
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        got,
    };
    match Decision::deserialize(value) {
        Ok(decision) => decision.check(&interrupt.allowed).map_err(|problem| {
            not_allowed(match problem {
                DecisionError::NotAllowed(kind) => format!("`{kind}`"),
                other => other.to_string(),
            })
        }),
        Err(error) => Err(not_allowed(format!(
            "a value that is not a decision ({error})"
        ))),
    }
}
