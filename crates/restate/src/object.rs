//! The virtual object that runs an agent service durably, keyed by session id.

use std::fmt;
use std::future::Future;

use restate_sdk::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, Decisions, Error, Interrupt, Outcome, Session, Shared,
    ToolCall,
};
use tower_service::Service;

use crate::journal::{BoxFuture, Journaled, Step, Steps, within};

pub use tower_agent_core::BoxAgent;

/// The state key of the session.
const SESSION: &str = "session";
/// The state key of the calls waiting for a decision.
const PENDING: &str = "pending";

/// What a run is asked to do: go on with a new user message, or continue where it stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The user's message; none: continue the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How a durable run ended (an approval is waited for within the run: it never ends
/// interrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunOutcome {
    /// The model answered.
    Completed,
    /// A limit, a layer or a tool stopped the run.
    Stopped,
    /// The invocation was cancelled.
    Cancelled,
}

/// What a durable run returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// How it ended.
    pub outcome: RunOutcome,
    /// The final answer's text (completed), or why it stopped.
    pub text: String,
    /// The rounds of the whole run, across its approvals.
    pub rounds: u32,
    /// The messages in the session.
    pub messages: usize,
}

impl RunResult {
    fn of(response: &AgentResponse, rounds: u32) -> Self {
        let (outcome, text) = match &response.outcome {
            Outcome::Completed { message } => (RunOutcome::Completed, message.text()),
            Outcome::Cancelled { .. } => (RunOutcome::Cancelled, String::new()),
            Outcome::Stopped { reason, .. } => (RunOutcome::Stopped, reason.to_string()),
            other => (RunOutcome::Stopped, format!("{other:?}")),
        };
        RunResult {
            outcome,
            text,
            rounds,
            messages: response.session.history.len(),
        }
    }
}

/// A call waiting for a decision, and the awakeable that takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The call.
    pub call: ToolCall,
    /// What the host needs to decide.
    pub payload: Value,
    /// A pause before a model call ([`Interrupt::before_model`]): `call` names the pause and
    /// the layer that asked; the value resolved goes to that layer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_model: bool,
    /// The awakeable to resolve with the decision (`{"type": "approve"}`, ...):
    /// `POST /restate/awakeables/{awakeable}/resolve` on the ingress.
    pub awakeable: String,
}

/// Runs an agent service as the Restate virtual object `Agent`, keyed by session id.
///
/// Handlers (on the ingress, `POST /Agent/{session id}/{handler}`):
///
/// - `run` (`{"message": "..."}`, or `{}` to continue): one run of the session, with the
///   session kept in the object's state. Every model and tool call under a [`JournalLayer`]
///   is a journaled step: a replay after a crash takes finished steps from the journal. A run
///   interrupted for approval waits on one awakeable per call (a durable promise), then resumes
///   with the decisions; cancelling the invocation cancels the run.
/// - `pending` (shared): the calls waiting for a decision, with their awakeables.
/// - `session` (shared): the session as stored.
///
/// The run's id is the invocation's id, so the ids the loop makes are the same on a replay.
///
/// [`JournalLayer`]: crate::JournalLayer
pub struct DurableAgent {
    // Shared between the endpoint's threads: each run takes a clone.
    agent: Shared<BoxAgent>,
}

impl DurableAgent {
    /// Run `agent` (any agent service: any stack of layers, any workflow) durably.
    pub fn new<A>(agent: A) -> Self
    where
        A: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
        A::Future: Send + 'static,
    {
        Self {
            agent: Shared::new(BoxAgent::new(agent)),
        }
    }

    fn agent(&self) -> BoxAgent {
        self.agent.get()
    }
}

impl fmt::Debug for DurableAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableAgent").finish_non_exhaustive()
    }
}

/// Run `request` on `agent`, journaling the steps its journal layers send.
async fn drive(
    ctx: &ObjectContext<'_>,
    agent: BoxAgent,
    mut request: AgentRequest,
) -> Result<AgentResponse, Error> {
    request.ctx = request.ctx.with_run_id(ctx.invocation_id());
    let token = request.ctx.cancellation_token().clone();
    journaled(agent, request, |name, call| async {
        // One step at a time, awaited at once: the journal's order is the calls'.
        let journaled = ctx
            .run(|| async move { Ok(Json(call.await)) })
            .name(name)
            .await;
        match journaled {
            Ok(Json(value)) => Journaled::Recorded(value),
            Err(error) if error.code() == 409 => {
                token.cancel();
                Journaled::Cancelled
            }
            Err(error) => Journaled::Failed(error.message().to_owned()),
        }
    })
    .await
}

/// Run `request` on `agent`; each step its journal layers send (named, with the call to make)
/// goes to `journal`, one at a time, in order, and its answer back to the layer.
pub(crate) async fn journaled<J, F>(
    agent: BoxAgent,
    request: AgentRequest,
    mut journal: J,
) -> Result<AgentResponse, Error>
where
    J: FnMut(String, BoxFuture<Value>) -> F,
    F: Future<Output = Journaled>,
{
    let (steps, mut queue) = mpsc::unbounded_channel::<Step>();
    let run = within(Steps(steps), agent.oneshot(request));
    tokio::pin!(run);
    loop {
        tokio::select! {
            biased;
            result = &mut run => return result,
            Some(Step { name, call, reply }) = queue.recv() => {
                let answer = journal(name, call).await;
                // The run may have ended meanwhile (it was cancelled).
                let _ = reply.send(answer);
            }
        }
    }
}

/// A terminal error for the caller, from a run's error.
fn terminal(error: &Error) -> TerminalError {
    TerminalError::new(format!("the run failed: {error}"))
}

#[restate_sdk::object(name = "Agent")]
impl DurableAgent {
    /// One run of the session.
    #[handler]
    async fn run(
        &self,
        ctx: ObjectContext<'_>,
        request: Json<RunRequest>,
    ) -> Result<Json<RunResult>, HandlerError> {
        let key = ctx.key().to_owned();
        let stored = ctx.get::<Json<Session>>(SESSION).await?;
        let input = match request.into_inner().message {
            Some(message) => AgentInput::from(message),
            None => AgentInput::Continue,
        };
        let session = match stored {
            Some(Json(session)) => session,
            // `{}` on a fresh key: nothing to continue, and nothing is stored.
            None if matches!(input, AgentInput::Continue) => {
                let message =
                    format!("session `{key}` is not stored: nothing to continue (send a message)");
                return Err(TerminalError::new_with_code(400, message).into());
            }
            None => Session::with_id(key),
        };
        let mut request = AgentRequest::new(session, input);
        let mut rounds = 0;
        loop {
            let response = match drive(&ctx, self.agent(), request).await {
                Ok(response) => response,
                Err(mut error) => {
                    if let Some(session) = error.take_session() {
                        ctx.set(SESSION, Json(session));
                    }
                    return Err(terminal(&error).into());
                }
            };
            ctx.set(SESSION, Json(response.session.clone()));
            rounds += response.rounds;
            let Outcome::Interrupted { interrupts } = &response.outcome else {
                return Ok(Json(RunResult::of(&response, rounds)));
            };
            let decisions = decide(&ctx, interrupts).await?;
            request = AgentRequest::resume(response.session, decisions);
        }
    }

    /// The calls waiting for a decision.
    #[handler]
    async fn pending(
        &self,
        ctx: SharedObjectContext<'_>,
    ) -> Result<Json<Vec<Pending>>, HandlerError> {
        Ok(Json(
            ctx.get::<Json<Vec<Pending>>>(PENDING)
                .await?
                .map(Json::into_inner)
                .unwrap_or_default(),
        ))
    }

    /// The session as stored.
    #[handler]
    async fn session(
        &self,
        ctx: SharedObjectContext<'_>,
    ) -> Result<Json<Option<Session>>, HandlerError> {
        Ok(Json(
            ctx.get::<Json<Session>>(SESSION)
                .await?
                .map(Json::into_inner),
        ))
    }
}

/// Wait for a decision on each call, each an awakeable resolved over HTTP.
async fn decide(
    ctx: &ObjectContext<'_>,
    interrupts: &[Interrupt],
) -> Result<Decisions, HandlerError> {
    let mut waiting = Vec::with_capacity(interrupts.len());
    let mut pending = Vec::with_capacity(interrupts.len());
    for interrupt in interrupts {
        let (awakeable, decided) = ctx.awakeable::<Json<Value>>();
        pending.push(Pending {
            call: interrupt.call.clone(),
            payload: interrupt.payload.clone(),
            before_model: interrupt.before_model,
            awakeable,
        });
        waiting.push((interrupt.call.id.clone(), decided));
    }
    ctx.set(PENDING, Json(pending));
    let mut decisions = Decisions::new();
    for (call_id, decided) in waiting {
        match decided.await {
            Ok(Json(decision)) => decisions.insert(call_id, decision),
            // Cancelled, or rejected: nothing waits any more.
            Err(error) => {
                ctx.clear(PENDING);
                return Err(error.into());
            }
        }
    }
    ctx.clear(PENDING);
    Ok(decisions)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use tower::Layer;
    use tower_agent_core::ModelResponse;
    use tower_agent_loop::Agent;
    use tower_agent_test::{ScriptedModel, StubTool};
    use tower_agent_tools::ToolSet;
    use tower_agent_workflow::{AgentTool, Sequential};

    use super::*;
    use crate::JournalLayer;

    /// An agent that calls `clock` once, then answers.
    fn clock_agent(answer: &str) -> (BoxAgent, ScriptedModel, StubTool) {
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("c1", "clock", json!({}))]),
            ModelResponse::text(answer),
        ]);
        let clock = StubTool::returning("clock", "12:00");
        let tools = JournalLayer.layer(ToolSet::new().tool(clock.clone()));
        let agent = Agent::new(JournalLayer.layer(model.clone()), tools);
        (BoxAgent::new(agent), model, clock)
    }

    /// A journal that makes each call and keeps its result, by name, in order.
    #[derive(Clone, Default)]
    struct Recording(Arc<Mutex<Vec<(String, Value)>>>);

    impl Recording {
        async fn step(&self, name: String, call: BoxFuture<Value>) -> Journaled {
            let value = call.await;
            self.0
                .lock()
                .expect("not poisoned")
                .push((name, value.clone()));
            Journaled::Recorded(value)
        }

        fn names(&self) -> Vec<String> {
            self.0
                .lock()
                .expect("not poisoned")
                .iter()
                .map(|(n, _)| n.clone())
                .collect()
        }
    }

    fn request(text: &str) -> AgentRequest {
        AgentRequest::new(Session::with_id("s"), text)
    }

    #[tokio::test]
    async fn every_model_and_tool_call_is_a_step_and_a_replay_makes_none() {
        let journal = Recording::default();
        let (agent, model, clock) = clock_agent("It is noon.");
        let res = journaled(agent, request("time?"), |name, call| {
            journal.step(name, call)
        })
        .await
        .expect("runs");
        assert_eq!(
            journal.names(),
            [
                "model (round 1)",
                "tool clock c1 started",
                "tool clock c1",
                "model (round 2)"
            ]
        );
        assert_eq!((model.request_count(), clock.calls().len()), (2, 1));

        // A replay: every step answered from what was recorded, none made.
        let recorded: HashMap<String, Value> = journal
            .0
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect();
        let (agent, model, clock) = clock_agent("never asked");
        let again = journaled(agent, request("time?"), |name, _call| {
            let value = recorded.get(&name).cloned();
            async move { value.map_or(Journaled::Failed(format!("no {name}")), Journaled::Recorded) }
        })
        .await
        .expect("replays");
        assert_eq!(again.text(), res.text());
        assert_eq!((model.request_count(), clock.calls().len()), (0, 0));
        assert_eq!(again.session.history.len(), res.session.history.len());
    }

    #[tokio::test]
    async fn a_call_in_flight_when_the_service_died_is_recovered_on_the_replay_not_run_again() {
        let journal = Recording::default();
        let (agent, ..) = clock_agent("It is noon.");
        journaled(agent, request("time?"), |name, call| {
            journal.step(name, call)
        })
        .await
        .expect("runs");
        // The service died in the tool call: its write-ahead step is journaled, its result is
        // not. The replay asks the tools what became of it; the clock has no reconcile step.
        let mut recorded: HashMap<String, Value> = journal
            .0
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect();
        recorded.remove("tool clock c1");
        let made = Recording::default();
        let (agent, model, clock) = clock_agent("never asked");
        let again = journaled(agent, request("time?"), |name, call| {
            let value = recorded.get(&name).cloned();
            let made = made.clone();
            async move {
                match value {
                    Some(value) => Journaled::Recorded(value),
                    None => made.step(name, call).await,
                }
            }
        })
        .await
        .expect("replays");
        assert_eq!(
            made.names(),
            ["tool clock c1"],
            "only the missing step is made"
        );
        assert_eq!((model.request_count(), clock.calls().len()), (0, 0));
        let result = again
            .session
            .history
            .iter()
            .flat_map(tower_agent_core::Message::tool_results)
            .next()
            .expect("a result");
        assert_eq!(
            result.content,
            tower_agent_core::ToolResult::OUTCOME_UNKNOWN
        );
    }

    #[tokio::test]
    async fn a_workflow_journals_the_calls_of_each_of_its_agents() {
        let journal = Recording::default();
        let (first, ..) = clock_agent("first done");
        let (second, ..) = clock_agent("second done");
        let workflow = Sequential::new("pipeline")
            .step("a", first)
            .step("b", second);
        // The run's id is the invocation's under Restate: the ids the loop gives calls (here
        // the second agent's, whose `c1` is taken) are the same on a replay.
        let mut request = request("go");
        request.ctx = request.ctx.with_run_id("inv12345");
        let res = journaled(BoxAgent::new(workflow), request, |name, call| {
            journal.step(name, call)
        })
        .await
        .expect("runs");
        assert_eq!(res.text().as_deref(), Some("second done"));
        let names = journal.names();
        assert_eq!(
            names,
            [
                "pipeline/a: model (round 1)",
                "pipeline/a: tool clock c1 started",
                "pipeline/a: tool clock c1",
                "pipeline/a: model (round 2)",
                "pipeline/b: model (round 1)",
                "pipeline/b: tool clock call_inv12345_1_1 started",
                "pipeline/b: tool clock call_inv12345_1_1",
                "pipeline/b: model (round 2)",
            ]
        );
    }

    #[tokio::test]
    async fn a_sub_agent_called_as_a_tool_is_inside_its_step() {
        let journal = Recording::default();
        let (helper, helper_model, _) = clock_agent("the helper's answer");
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("h1", "helper", json!({ "task": "t" }))]),
            ModelResponse::text("done"),
        ]);
        let tools = ToolSet::new().tool(AgentTool::new("helper", "Helps.", helper));
        let agent = Agent::new(JournalLayer.layer(model), JournalLayer.layer(tools));
        let res = journaled(BoxAgent::new(agent), request("go"), |name, call| {
            journal.step(name, call)
        })
        .await
        .expect("runs");
        assert_eq!(res.text().as_deref(), Some("done"));
        assert_eq!(
            journal.names(),
            [
                "model (round 1)",
                "tool helper h1 started",
                "tool helper h1",
                "model (round 2)"
            ]
        );
        assert_eq!(
            helper_model.request_count(),
            2,
            "the helper ran inside the tool's step"
        );
    }
}
