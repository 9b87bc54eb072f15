//! Checking a run's input against its session, before anything changes.

use std::collections::HashSet;

use tower_agent_core::decision::check_decisions;
use tower_agent_core::{AgentInput, Error, Message, Session};

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
