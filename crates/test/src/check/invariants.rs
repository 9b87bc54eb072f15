//! The invariants a case checks after each run and in each saved version.

use std::collections::HashMap;

use serde_json::Value;
use tower_agent_core::history::validate;
use tower_agent_core::{CallKey, Message, Session, ToolResult};

use crate::lock;

use super::case::{Case, Violation, violation};
use super::trace::{Step, Trace};
use super::world::inputs_in;

impl Case<'_> {
    /// A session a run saved or returned: valid (only the calls in flight at its end and those
    /// waiting for a decision lack results), no secret in it, and every call answered in an
    /// earlier version answered the same way (a finished call is never reported otherwise).
    pub(super) fn check_version(&mut self, session: &Session) -> Result<(), Violation> {
        let mut pending: Vec<&str> = session
            .interrupts
            .iter()
            .map(|i| i.call.id.as_str())
            .collect();
        pending.extend(session.history.open_calls().iter().map(|c| c.id.as_str()));
        validate(&session.history, &pending)
            .map_err(|e| violation(format!("a saved version is broken: {e}")))?;
        // A call that waits for a decision has no result yet.
        for interrupt in &session.interrupts {
            let answered = session
                .history
                .iter()
                .flat_map(Message::tool_results)
                .any(|result| result.call_id == interrupt.call.id);
            if answered {
                return Err(violation(format!(
                    "call `{}` waits for a decision, yet it has a result",
                    interrupt.call.id
                )));
            }
        }
        let json = serde_json::to_string(session)
            .map_err(|e| violation(format!("a session does not serialize: {e}")))?;
        self.check_no_secret("a saved version", &json)?;
        self.check_ran_as_shown(session)?;
        self.check_keys(session)?;
        self.check_effects_once(session)?;
        for result in session.history.iter().flat_map(Message::tool_results) {
            match self.results.get(&result.call_id) {
                Some(earlier) if *earlier != result.content => {
                    return Err(violation(format!(
                        "call `{}` was answered `{earlier}`, then `{}`",
                        result.call_id, result.content
                    )));
                }
                Some(_) => {}
                None => {
                    self.results
                        .insert(result.call_id.clone(), result.content.clone());
                }
            }
        }
        Ok(())
    }

    /// A call the tools ran and the loop announced as finished is in the version saved before
    /// the announcement: a finished call's result is saved as it comes, never reported as not
    /// done after a crash.
    pub(super) fn check_finished_saved(&self, trace: &Trace) -> Result<(), Violation> {
        let executed = lock(&self.world.counts).executed.clone();
        let log = lock(&trace.0);
        let mut last: Option<&Session> = None;
        for step in &log.steps {
            match step {
                Step::Saved(session) => last = Some(session),
                Step::Finished(id) if executed.contains(id) => {
                    let saved = last.is_some_and(|session| {
                        session
                            .history
                            .iter()
                            .flat_map(Message::tool_results)
                            .any(|result| &result.call_id == id)
                    });
                    if !saved {
                        return Err(violation(format!(
                            "call `{id}` finished, yet no version saved by then holds its result"
                        )));
                    }
                }
                Step::Finished(_) => {}
            }
        }
        Ok(())
    }

    /// A call whose result the tools gave ran with the arguments and the key `session` shows
    /// for it (a guard's revision, a human's edit): the model reads the call that ran. A call
    /// answered without running (a synthetic result) is not compared.
    pub(super) fn check_ran_as_shown(&self, session: &Session) -> Result<(), Violation> {
        let counts = lock(&self.world.counts);
        let synthetic = [
            ToolResult::TRUNCATED,
            ToolResult::CANCELLED,
            ToolResult::NOT_DECIDED,
            ToolResult::UNANSWERED,
            ToolResult::MALFORMED,
            ToolResult::OUTCOME_UNKNOWN,
            ToolResult::NOT_RUN,
            ToolResult::ENDED_WHILE_RUNNING,
        ];
        let answered: HashMap<&str, &str> = session
            .history
            .iter()
            .flat_map(Message::tool_results)
            .map(|r| (r.call_id.as_str(), r.content.as_str()))
            .collect();
        for call in session.history.iter().flat_map(Message::tool_calls) {
            let Some(content) = answered.get(call.id.as_str()) else {
                continue;
            };
            let Some((ran, key)) = counts.ran_with.get(&call.id) else {
                continue;
            };
            if synthetic.iter().any(|text| content.starts_with(text)) {
                continue;
            }
            if *key != call.key {
                return Err(violation(format!(
                    "call `{}` ran with the key {key:?}, yet the session shows {:?}",
                    call.id, call.key
                )));
            }
            let shown = serde_json::from_str::<Value>(&call.arguments).ok();
            if shown != serde_json::from_str::<Value>(ran).ok() {
                return Err(violation(format!(
                    "call `{}` ran with {ran}, yet the session shows {}",
                    call.id, call.arguments
                )));
            }
        }
        Ok(())
    }

    /// Tool effects happen once: a call of a tool that may not repeat ran at most once,
    /// through kills, cancellations and the recoveries after them; a call the session says
    /// did not run never ran, and one it says ran (its own result) did.
    pub(super) fn check_effects_once(&self, session: &Session) -> Result<(), Violation> {
        let counts = lock(&self.world.counts);
        if let Some((key, times)) = counts.effects.iter().find(|(_, times)| **times > 1) {
            return Err(violation(format!(
                "the effect of the call with key {key} happened {times} times"
            )));
        }
        for call in session.history.iter().flat_map(Message::tool_calls) {
            let Some(key) = call.key else { continue };
            let result = session
                .history
                .iter()
                .flat_map(Message::tool_results)
                .find(|result| result.call_id == call.id);
            let Some(result) = result else { continue };
            let ran = counts.effects.contains_key(&key);
            if result.content == ToolResult::NOT_RUN && ran {
                return Err(violation(format!(
                    "call `{}` is said not to have run, yet it did",
                    call.id
                )));
            }
            let recovered_done = counts
                .recovered
                .iter()
                .any(|(k, outcome)| *k == key && *outcome == "done");
            if recovered_done && !ran {
                return Err(violation(format!(
                    "call `{}` was recovered as done, yet it never ran",
                    call.id
                )));
            }
        }
        Ok(())
    }

    /// Each call the model made has a key of its own, and keeps it in every later version
    /// (through saves, resumes, kills, summaries); a generated leftover has none.
    pub(super) fn check_keys(&mut self, session: &Session) -> Result<(), Violation> {
        let mut owners: HashMap<CallKey, &str> = HashMap::new();
        for call in session.history.iter().flat_map(Message::tool_calls) {
            let Some(key) = call.key else {
                continue;
            };
            if let Some(other) = owners.insert(key, &call.id) {
                if other != call.id {
                    return Err(violation(format!(
                        "calls `{other}` and `{}` have the same key",
                        call.id
                    )));
                }
            }
            match self.keys.get(&call.id) {
                Some(earlier) if *earlier != key => {
                    return Err(violation(format!(
                        "call `{}` had the key {earlier}, then {key}",
                        call.id
                    )));
                }
                Some(_) => {}
                None => {
                    self.keys.insert(call.id.clone(), key);
                }
            }
        }
        Ok(())
    }

    /// The secret appears nowhere in `text`.
    pub(super) fn check_no_secret(&self, what: &str, text: &str) -> Result<(), Violation> {
        match &self.world.secret {
            Some(secret) if text.contains(secret.as_str()) => Err(violation(format!(
                "the secret reached {what}: {}",
                excerpt(text, secret)
            ))),
            _ => Ok(()),
        }
    }

    /// No call ran twice: a call in flight when its process died is never run again. No call
    /// of an answer cut off at its length limit ran.
    pub(super) fn check_executed_once(&self) -> Result<(), Violation> {
        let counts = lock(&self.world.counts);
        if let Some(cut) = counts.cut_ran.first() {
            return Err(violation(format!(
                "call `{cut}` of an answer cut off at its length limit ran"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        match counts.executed.iter().find(|id| !seen.insert(id.as_str())) {
            Some(twice) => Err(violation(format!("call `{twice}` ran twice"))),
            None => Ok(()),
        }
    }

    pub(super) fn check_pairs(&self) -> Result<(), Violation> {
        let pending: Vec<&str> = self
            .session
            .interrupts
            .iter()
            .map(|i| i.call.id.as_str())
            .collect();
        validate(&self.session.history, &pending)
            .map_err(|e| violation(format!("the history is broken: {e}")))
    }

    pub(super) fn check_nothing_lost(&self) -> Result<(), Violation> {
        let kept = inputs_in(self.session.history.iter());
        match self.sent.iter().find(|sent| !kept.contains(sent)) {
            Some(lost) => Err(violation(format!(
                "`{lost}`, which the user sent, is neither in the history nor in a summary"
            ))),
            None => Ok(()),
        }
    }
}

/// A run stopped by a limit of `limit` tool calls ran that many to a result the model sees:
/// the calls the loop announced finished in the run, but those answered "not executed" or
/// cancelled (the refused call, its siblings).
pub(super) fn check_limit_counted_calls_that_ran(
    trace: &Trace,
    last: &Session,
    limit: u32,
) -> Result<(), Violation> {
    let log = lock(&trace.0);
    let versions = log.steps.iter().filter_map(|step| match step {
        Step::Saved(session) => Some(session),
        Step::Finished(_) => None,
    });
    let mut results = HashMap::new();
    for session in versions.chain(std::iter::once(last)) {
        for result in session.history.iter().flat_map(Message::tool_results) {
            results.insert(result.call_id.clone(), result.content.clone());
        }
    }
    let finished: Vec<(&String, Option<&String>)> = log
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Finished(id) => Some((id, results.get(id))),
            Step::Saved(_) => None,
        })
        .collect();
    let ran = |content: &String| {
        !content.starts_with("not executed") && content.as_str() != ToolResult::CANCELLED
    };
    let count = finished
        .iter()
        .filter(|(_, content)| content.is_some_and(ran))
        .count();
    if count < limit as usize {
        return Err(violation(format!(
            "a limit of {limit} tool calls per run stopped a run that ran {count}: something \
             counted that did not run; the calls it finished: {finished:?}"
        )));
    }
    Ok(())
}

/// Some text around `needle` in `text`.
fn excerpt(text: &str, needle: &str) -> String {
    let at = text.find(needle).unwrap_or(0);
    let start = text[..at]
        .char_indices()
        .rev()
        .nth(80)
        .map_or(0, |(i, _)| i);
    let end = text[at..]
        .char_indices()
        .nth(needle.len() + 80)
        .map_or(text.len(), |(i, _)| at + i);
    format!("…{}…", &text[start..end])
}
