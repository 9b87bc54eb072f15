//! The start of a run: check the input against the session, repair what a crashed run left,
//! and apply the input (new messages, continue, resume).
//!
//! One repair path serves every input: [`History::answer_unanswered`] places each synthetic
//! result right after its own call, never after a later message.
//!
//! [`History::answer_unanswered`]: tower_agent_core::History::answer_unanswered

use tower_agent_core::{
    AgentInput, BoxError, ContentPart, Error, Message, ModelRequest, ModelResponse, Outcome,
    Session, ToolRequest, ToolResponse,
};
use tower_service::Service;

use super::ids::id_hash;
use super::rounds::Run;
use super::tools::execute;

/// Whether `input` fits `session`; checked before anything changes, so a refused request
/// returns the session exactly as it came.
pub(super) fn check_input(session: &Session, input: &AgentInput) -> Result<(), Error> {
    match input {
        AgentInput::Messages(_) => Ok(()),
        AgentInput::Continue => check_interrupts(session),
        AgentInput::Resume(_) => {
            if session.interrupts.is_empty() {
                return Err(Error::bad_request(
                    "cannot resume: the session has no pending interrupt",
                ));
            }
            check_interrupts(session)
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
    T: Service<ToolRequest, Response = ToolResponse> + Clone + Send + 'static,
    T::Error: Into<BoxError>,
    T::Future: Send,
{
    /// Apply the (checked) input. An outcome when the run ends before the first round.
    ///
    /// Calls a previous run left without a result and without waiting for a decision (a
    /// process that stopped after `RoundCompleted`) get a cancelled result: the model sees
    /// why. Running them again could repeat their side effects.
    pub(super) async fn prepare(&mut self, input: AgentInput) -> Result<Option<Outcome>, Error> {
        let outcome = match input {
            AgentInput::Resume(value) => {
                self.session.answer_dangling_calls();
                let calls: Vec<ContentPart> = std::mem::take(&mut self.session.interrupts)
                    .into_iter()
                    .map(|i| ContentPart::ToolCall(i.call))
                    .collect();
                execute(
                    &mut self.tools,
                    &self.ctx,
                    0,
                    self.config.tool_execution,
                    &calls,
                    Some(&value),
                    &mut self.scratch,
                )
                .await;
                self.absorb_round(true)?
            }
            AgentInput::Continue => {
                self.session.answer_dangling_calls();
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
                None
            }
            other => {
                return Err(Error::bad_request(format!(
                    "this agent does not support the input {other:?}"
                )));
            }
        };
        // Every call id in the session, the input included, so new calls get unique ones.
        self.call_ids.clear();
        self.call_ids.reserve(self.session.history.len() / 2 + 16);
        self.call_ids.extend(
            self.session
                .history
                .iter()
                .flat_map(Message::tool_calls)
                .map(|call| id_hash(&call.id)),
        );
        Ok(outcome)
    }
}
