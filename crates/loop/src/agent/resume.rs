//! The start of a run: repair what a crashed run left, and apply the input (new messages,
//! continue, resume).
//!
//! One repair serves every input, core's [`History::repair`]: each synthetic result is placed
//! right after its own call, never after a later message. The last assistant message is
//! repaired first (a session the agent left can need nothing else); the one pass over the
//! history that collects the call ids also checks the rest (a history built or edited by the
//! host, or input messages), and only when that check fails is the whole history repaired.
//!
//! [`History::repair`]: tower_agent_core::History::repair

use tower_agent_core::{
    AgentInput, BoxError, CallIds, DescribeTools, Error, Message, ModelRequest, ModelResponse,
    Outcome, Repair, Role, StopReason, ToolCall, ToolRequest, ToolResponse,
};
use tower_service::Service;

use super::state::{BeforeInput, Run};

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
        // A replay takes what became of every call from the journal.
        if !replay {
            let rerun = matches!(input, AgentInput::Continue);
            if let Some(mut outcome) = self.recover(rerun).await? {
                // The run ends before its input: the calls left are answered as any input
                // would have them, but those that wait (a call run again paused for a
                // decision), beside those that waited already.
                if let Outcome::Interrupted { interrupts } = &mut outcome {
                    self.session.interrupts.append(interrupts);
                    interrupts.clone_from(&self.session.interrupts);
                }
                self.session.answer_dangling_calls();
                return Ok(Some(outcome));
            }
        }
        let outcome = match input {
            AgentInput::Resume(_) if replay => {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                self.start = self.session.history.len();
                Some(self.replayed())
            }
            // A pause before a model call: the model is called again, the answer in the
            // run's context for the layer that paused.
            AgentInput::Resume(decisions)
                if self.session.interrupts.iter().any(|i| i.before_model) =>
            {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                self.start = self.session.history.len();
                let paused = std::mem::take(&mut self.session.interrupts);
                self.ctx.set_resumed(
                    paused
                        .iter()
                        .filter_map(|p| {
                            Some((p.call.id.clone(), decisions.get(&p.call.id)?.clone()))
                        })
                        .collect(),
                );
                None
            }
            AgentInput::Resume(decisions) => {
                self.session.answer_dangling_calls();
                self.index_and_repair(false);
                // The calls that waited belong to this run's work: they stand in the last
                // assistant message (the input's check made sure).
                let at = self
                    .session
                    .history
                    .iter()
                    .rposition(|m| m.role == Role::Assistant)
                    .unwrap_or(0);
                self.start = at;
                let waiting = std::mem::take(&mut self.session.interrupts);
                let positions: Vec<usize> = self
                    .session
                    .history
                    .get(at)
                    .into_iter()
                    .flat_map(Message::tool_calls)
                    .enumerate()
                    .filter(|(_, call)| waiting.iter().any(|w| w.call.id == call.id))
                    .map(|(position, _)| position)
                    .collect();
                // The decided calls are saved as in flight before they run, in the write-ahead
                // record: a process that dies meanwhile recovers them, never runs them twice.
                if self.saving.is_on() {
                    self.mark_round(at, Some(&positions));
                    self.save().await?;
                }
                let out = self
                    .execute(0, at, Some(&positions), Some(&decisions), None)
                    .await;
                self.absorb_round(out).await?
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
                // Calls a crashed run left in flight are answered first: a withdrawn input
                // leaves them answered, and only what waited for a decision waits again.
                self.session.answer_dangling_calls();
                let mark = self.session.history.mark();
                let interrupts = self.session.interrupts.clone();
                // Only user messages can be told apart once a layer rewrote the history.
                let users = match messages.iter().all(|m| m.role == Role::User) {
                    true => messages.len(),
                    false => 0,
                };
                self.session.push_input(messages);
                // The input itself may end with calls: nothing waits any more.
                self.index_and_repair(true);
                self.before_input = Some(Box::new(BeforeInput {
                    mark,
                    users,
                    interrupts,
                }));
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

    /// Recover the calls the session's last assistant message left without a result (the
    /// process running them died): those the write-ahead record ([`Session::started`]) says
    /// had started are asked what became of them ([`ToolRequest::recover`]: never run again
    /// blindly), and with `rerun` (a `Continue`) those that may repeat run again. Their results
    /// are saved as they come; the calls left (that may not repeat and had not started) are
    /// answered by the input's own repair. An outcome when a recovered call ended the run.
    ///
    /// [`Session::started`]: tower_agent_core::Session::started
    async fn recover(&mut self, rerun: bool) -> Result<Option<Outcome>, Error> {
        // Nothing started and nothing to run again: the common start of a run.
        if self.session.started.is_empty() && !rerun {
            return Ok(None);
        }
        let history = &self.session.history;
        let Some(at) = history.iter().rposition(|m| m.role == Role::Assistant) else {
            return Ok(None);
        };
        let answered: Vec<&str> = history[at + 1..]
            .iter()
            .flat_map(Message::tool_results)
            .map(|result| result.call_id.as_str())
            .collect();
        let (started, waiting) = (&self.session.started, &self.session.interrupts);
        let positions: Vec<usize> = history[at]
            .tool_calls()
            .enumerate()
            .filter(|(_, call)| {
                !answered.contains(&call.id.as_str())
                    && !waiting.iter().any(|w| w.call.id == call.id)
            })
            .filter(|(_, call)| match call.key {
                Some(key) if started.contains(&key) => true,
                _ => rerun && self.may_repeat(&call.name),
            })
            .map(|(position, _)| position)
            .collect();
        if positions.is_empty() {
            return Ok(None);
        }
        self.recovering = self.session.started.clone();
        let out = self.execute(0, at, Some(&positions), None, None).await;
        self.recovering = Vec::new();
        self.absorb_round(out).await
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
    /// ones, and in the same pass check that the history needs no repair; if it does, repair
    /// it ([`History::repair`]). `to_the_end`: calls at the very end count too (no call
    /// waits).
    fn index_and_repair(&mut self, to_the_end: bool) {
        self.call_ids.clear();
        let pending = &self.session.interrupts;
        let wait = |call: &ToolCall| pending.iter().any(|i| i.call.id == call.id);
        let how = match to_the_end {
            true => Repair::new(),
            false => Repair::new().keep_frontier().wait(&wait),
        };
        if how.check(&self.session.history, 0, &mut self.call_ids) {
            return;
        }
        let report = self.session.history.repair(&how);
        tracing::warn!(%report, "repaired the history of the run's input");
        self.call_ids = CallIds::of(self.session.history.iter());
    }
}
