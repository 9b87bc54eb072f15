//! The start of a run: check the input against the session, repair what a crashed run left,
//! and apply the input (new messages, continue, resume).
//!
//! One repair serves every input: each synthetic result is placed right after its own call,
//! never after a later message ([`History::answer_unanswered`]). The last assistant message is
//! repaired first (a session the agent left can need nothing else); the one pass over the
//! history that collects the call ids also finds calls without results further up (a history
//! built or edited by the host, or input messages), and only then is the whole history
//! repaired.
//!
//! [`History::answer_unanswered`]: tower_agent_core::History::answer_unanswered

use std::collections::HashSet;

use tower_agent_core::decision::check_decisions;
use tower_agent_core::{
    AgentInput, BoxError, DescribeTools, Error, Message, ModelRequest, ModelResponse, Outcome,
    Role, Session, StopReason, ToolCall, ToolRequest, ToolResponse, ToolResult,
};
use tower_service::Service;

use super::rounds::Run;
use super::tools::execute;

/// Whether `input` fits `session`; checked before anything changes, so a refused request
/// returns the session exactly as it came. `Ok(true)`: a resume whose decisions were all
/// applied before (a replay), which runs nothing.
pub(super) fn check_input(session: &Session, input: &AgentInput) -> Result<bool, Error> {
    match input {
        AgentInput::Messages(_) => Ok(false),
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

impl<M, T> Run<M, T>
where
    M: Service<ModelRequest, Response = ModelResponse> + Send,
    M::Error: Into<BoxError>,
    M::Future: Send,
    T: Service<ToolRequest, Response = ToolResponse> + DescribeTools + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    /// Apply the (checked) input. An outcome when the run ends before the first round.
    ///
    /// Calls a previous run left without a result and without waiting for a decision (a
    /// process that stopped after `RoundCompleted`) get a cancelled result: the model sees
    /// why. Running them again could repeat their side effects.
    pub(super) async fn prepare(
        &mut self,
        input: AgentInput,
        replay: bool,
    ) -> Result<Option<Outcome>, Error> {
        let outcome = match input {
            AgentInput::Resume(_) if replay => {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                self.start = self.session.history.len();
                Some(self.replayed())
            }
            AgentInput::Resume(decisions) => {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                // The calls that waited belong to this run's work.
                self.start = self
                    .session
                    .history
                    .iter()
                    .rposition(|m| m.role == Role::Assistant)
                    .unwrap_or(0);
                let calls: Vec<ToolCall> = std::mem::take(&mut self.session.interrupts)
                    .into_iter()
                    .map(|i| i.call)
                    .collect();
                let mode = self.config.tool_execution;
                let resume = Some(&decisions);
                let out = execute(&mut self.tools, &self.ctx, 0, mode, &calls, resume).await;
                self.absorb_round(out, true)?
            }
            AgentInput::Continue => {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                self.start = self.session.history.len();
                if self.session.interrupts.is_empty() {
                    None
                } else {
                    // Nothing was decided: the calls keep waiting.
                    Some(Outcome::Interrupted {
                        interrupts: std::mem::take(&mut self.session.interrupts),
                    })
                }
            }
            // The user moved on: calls that waited for a decision get a "not executed" result.
            AgentInput::Messages(messages) => {
                self.session.push_input(messages);
                // The input itself may end with calls: nothing waits any more.
                self.index_and_repair(true);
                self.start = self.session.history.len();
                None
            }
            other => {
                return Err(Error::bad_request(format!(
                    "this agent does not support the input {other:?}"
                )));
            }
        };
        Ok(outcome)
    }

    /// The outcome of a resume whose decisions were all applied before: the calls that still
    /// wait, the final answer the session ends with, or [`StopReason::Replayed`].
    fn replayed(&mut self) -> Outcome {
        if !self.session.interrupts.is_empty() {
            return Outcome::Interrupted {
                interrupts: std::mem::take(&mut self.session.interrupts),
            };
        }
        match self.session.history.last() {
            Some(last) if last.role == Role::Assistant && !last.has_tool_calls() => {
                Outcome::Completed {
                    message: last.clone(),
                }
            }
            _ => Outcome::Stopped {
                reason: StopReason::Replayed,
                progress: Default::default(),
            },
        }
    }

    /// Collect every call id of the session (the input included), so that new calls get unique
    /// ones, and in the same pass look for calls without a result; if there is any, repair the
    /// whole history. `to_the_end`: calls at the very end count too (no call waits).
    fn index_and_repair(&mut self, to_the_end: bool) {
        self.call_ids.clear();
        let mut unanswered = false;
        for block in self.session.history.call_blocks() {
            let checked = to_the_end || !block.at_end;
            for call in block.message.tool_calls() {
                self.call_ids.insert(call.id.clone());
                unanswered |= checked && !block.answers(call);
            }
        }
        if unanswered {
            let pending = &self.session.interrupts;
            let answered = self.session.history.answer_unanswered(
                |call| pending.iter().any(|i| i.call.id == call.id),
                |call| ToolResult::error(call, ToolResult::DANGLING),
            );
            tracing::warn!(
                answered,
                "answered calls without results inside the history"
            );
        }
    }
}
