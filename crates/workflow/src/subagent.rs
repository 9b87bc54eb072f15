//! Sub-agents as tools: any agent service called by a model as a tool (`task`-style
//! delegation).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, Decisions, Error, Interrupt, Outcome, RunSaves, Saver,
    Session, StateKey, ToolAction, ToolCall, ToolRequest, ToolResponse, ToolSpec, event::BoxFuture,
};
use tower_agent_tools::{ResponseFuture, Tool};
use tower_service::Service;

use crate::common::{SharedAgent, boxed};

/// The run-state key under which a paused sub-agent's session waits, by call id.
pub const SUBAGENT_STATE_KEY: StateKey<BTreeMap<String, Value>> =
    StateKey::new("tower_agent.subagents");

/// An agent service offered to a model as a tool: the tool's `task` argument becomes the
/// sub-agent's input (a user message), its final answer the tool's result.
///
/// - Each call runs the sub-agent on a fresh session of its own
///   (`{session}/{tool}/{call id}`), in a nested context
///   ([`RunContext::nested`](tower_agent_core::RunContext::nested)): its events reach the
///   parent run's observers as `Event::Nested`, with the path `{tool}[{call id}]` under the
///   parent's; it shares the parent's cancellation token (cancelling the parent cancels it); the tokens it used are added to the parent
///   run's usage (in [`ToolResponse::usage`](tower_agent_core::ToolResponse::usage)).
/// - Several calls in one model message run side by side when the agent runs tools
///   concurrently.
/// - A sub-agent that waits for a human interrupts the parent run at this call: the review's
///   payload lists the sub-agent's waiting calls (`{"agent": .., "interrupts": [..]}`), and its
///   session is kept in the parent's session state (under [`SUBAGENT_STATE_KEY`]) until the
///   parent is resumed. The parent's decision for this call is handed to the sub-agent: a map
///   from the sub-agent's call ids to decisions, or one decision for all its waiting calls.
///   Decisions the sub-agent refuses (a waiting call left without one, a kind its call does not
///   allow) leave it waiting, and the parent with it (the payload's `error` says why). When the
///   parent moves on with new messages instead, the kept session stays in the state, unused.
/// - When the parent run saves (a session store), the sub-agent saves each of its steps into
///   the parent's session: its session is kept in the parent's session state (under
///   [`SUBAGENT_STATE_KEY`], by call id) and the parent's session is saved with it
///   ([`RunSaves`]), so a process that dies keeps the steps it took. The entry goes
///   when the call ends. A parent that goes on after such a crash answers the call as not
///   done and leaves the entry, unused.
/// - A sub-agent that stops, is cancelled or fails gives an error result the parent's model
///   sees (with the outcome's summary or the error), not an error of the parent run.
///
/// ```
/// use serde_json::json;
/// use tower::ServiceExt;
/// use tower_agent_core::{AgentRequest, Error, ModelResponse, Session, ToolCall};
/// use tower_agent_loop::Agent;
/// use tower_agent_test::ScriptedModel;
/// use tower_agent_tools::ToolSet;
/// use tower_agent_workflow::AgentTool;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let researcher = Agent::new(
///     ScriptedModel::new([ModelResponse::text("Paris has 2.1 million people.")]),
///     ToolSet::new(),
/// );
/// let tools = ToolSet::new().tool(AgentTool::new("research", "Research a question.", researcher));
/// let lead = Agent::builder().tool_specs(tools.specs()).build(
///     ScriptedModel::new([
///         ModelResponse::tool_calls([ToolCall::new("c1", "research", json!({"task": "Population of Paris?"}))]),
///         ModelResponse::text("About 2.1 million."),
///     ]),
///     tools,
/// );
/// let res = lead.oneshot(AgentRequest::new(Session::new(), "How many people live in Paris?")).await?;
/// assert_eq!(res.text().as_deref(), Some("About 2.1 million."));
/// assert_eq!(res.session.history[2].tool_results().next().map(|r| r.content.as_str()),
///            Some("Paris has 2.1 million people."));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AgentTool {
    spec: Arc<ToolSpec>,
    agent: SharedAgent,
}

impl AgentTool {
    /// The agent `agent`, offered as the tool `name` with `description`; its parameters are
    /// `{"task": string}`.
    pub fn new<S>(name: impl Into<String>, description: impl Into<String>, agent: S) -> Self
    where
        S: Service<AgentRequest, Response = AgentResponse, Error = Error> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        let parameters = json!({
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "description": "What the sub-agent should do, with everything it needs to know: it sees nothing else of this conversation."
                }
            },
            "required": ["task"],
            "additionalProperties": false
        });
        Self {
            spec: Arc::new(ToolSpec::new(name, description, parameters)),
            agent: boxed(agent),
        }
    }
}

impl fmt::Debug for AgentTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl Service<ToolRequest> for AgentTool {
    type Response = ToolResponse;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The sub-agent is driven to readiness in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ToolRequest) -> ResponseFuture {
        let agent = self.agent.get();
        let name = self.spec.name.clone();
        ResponseFuture::new(run(agent, name, req))
    }
}

impl Tool for AgentTool {
    fn spec(&self) -> ToolSpec {
        (*self.spec).clone()
    }
}

/// What the model sends.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    task: String,
}

async fn run(
    mut agent: crate::common::BoxAgent,
    name: String,
    req: ToolRequest,
) -> Result<ToolResponse, Error> {
    use tower::ServiceExt;

    let ToolRequest {
        call, ctx, resume, ..
    } = req;
    let saves = RunSaves::of(&ctx);
    // Each kept session read alone: one that cannot be read does not spoil the others.
    let saved = ctx
        .get(&SUBAGENT_STATE_KEY)
        .remove(&call.id)
        .and_then(|session| serde_json::from_value::<Session>(session).ok());
    // The paused session, kept until the resume is known to have gone through.
    let mut paused = None;
    let (session, input) = match (resume, saved) {
        (Some(value), Some(session)) => {
            let decisions = decisions_for(&session.interrupts, value);
            paused = Some(session.clone());
            (session, AgentInput::Resume(decisions))
        }
        _ => {
            // An object only: serde would map a list onto the fields by position.
            let parsed = call
                .parse_arguments::<Value>()
                .map_err(|e| e.to_string())
                .and_then(|value| match value {
                    Value::Object(_) => {
                        serde_json::from_value::<Args>(value).map_err(|e| e.to_string())
                    }
                    _ => Err("the arguments are not a JSON object".to_owned()),
                });
            let task = match parsed {
                Ok(args) => args.task,
                Err(error) => {
                    return Ok(ToolResponse::error(
                        &call,
                        format!(
                            "invalid arguments for `{name}`: {error}; expected {{\"task\": \
                             \"...\"}}"
                        ),
                    ));
                }
            };
            let id = format!("{}/{name}/{}", ctx.session_id(), call.id);
            (Session::with_id(id), AgentInput::from(task))
        }
    };
    let nested = ctx.nested(&format!("{name}[{}]", call.id));
    let result = match agent.ready().await {
        Ok(agent) => {
            agent
                .call(AgentRequest {
                    session,
                    input,
                    ctx: nested,
                    // Each of its saves keeps it in the parent's session state and saves
                    // the parent's session; its result goes there as the call's result.
                    saver: saves.map(|saves| {
                        Arc::new(IntoParent {
                            ctx: ctx.clone(),
                            call_id: call.id.clone(),
                            saves,
                        }) as Arc<dyn Saver>
                    }),
                })
                .await
        }
        Err(error) => Err(error),
    };
    let res = match (result, paused) {
        (Ok(res), _) => res,
        // The decisions did not fit the sub-agent's waiting calls (or it failed on them): it
        // keeps waiting, and so does the parent, saying why.
        (Err(error), Some(session)) => {
            keep(&ctx, &call.id, &session);
            let mut response = pause(&call, &name, &session.interrupts);
            if let ToolAction::Interrupt(pause) = &mut response.action {
                pause.payload["error"] = Value::String(error.to_string());
            }
            return Ok(response);
        }
        (Err(error), None) => {
            forget(&ctx, &call.id);
            return Ok(ToolResponse::error(
                &call,
                format!("the sub-agent `{name}` failed: {error}"),
            )
            .with_usage(error.usage()));
        }
    };
    let usage = res.usage;
    let response = match res.outcome {
        Outcome::Completed { message } => {
            forget(&ctx, &call.id);
            ToolResponse::success(&call, message.text())
        }
        Outcome::Interrupted { interrupts } => {
            keep(&ctx, &call.id, &res.session);
            pause(&call, &name, &interrupts)
        }
        outcome => {
            forget(&ctx, &call.id);
            let summary = outcome
                .summary()
                .unwrap_or_else(|| "the sub-agent did not finish".to_owned());
            ToolResponse::error(
                &call,
                format!("the sub-agent `{name}` did not finish: {summary}"),
            )
        }
    };
    // The sub-agent's tokens count in the parent run's usage.
    Ok(response.with_usage(usage))
}

/// The parent's pause at `call` for the sub-agent's waiting calls: the payload lists them. One
/// waiting call: the decisions it allows are the parent call's too (the parent checks them).
/// Several: any value (one decision for all, or a map by call id), checked by the sub-agent.
fn pause(call: &ToolCall, name: &str, interrupts: &[Interrupt]) -> ToolResponse {
    let payload = json!({
        "agent": name,
        "interrupts": interrupts
            .iter()
            .map(|i| {
                let mut waiting = json!({"call": i.call, "payload": i.payload, "allowed": i.allowed});
                // A pause before the sub-agent's model call: `call` only names it.
                if i.before_model {
                    waiting["before_model"] = Value::Bool(true);
                }
                waiting
            })
            .collect::<Vec<_>>(),
    });
    let allowed = match interrupts {
        [only] => only.allowed.clone(),
        _ => Vec::new(),
    };
    ToolResponse::review(call, payload, allowed)
}

/// The sub-agent's decisions from the parent's value for this call: a map keyed by the
/// sub-agent's waiting call ids, or one decision for all of them.
fn decisions_for(interrupts: &[Interrupt], value: Value) -> Decisions {
    if let Value::Object(map) = &value {
        if !map.is_empty()
            && map
                .keys()
                .all(|k| interrupts.iter().any(|i| i.call.id == *k))
        {
            return map
                .iter()
                .fold(Decisions::new(), |d, (id, v)| d.with(id.clone(), v.clone()));
        }
    }
    Decisions::all(interrupts, value)
}

/// Where a running sub-agent saves: its session, kept in the parent's state under its call id,
/// saved with the parent's session.
struct IntoParent {
    ctx: tower_agent_core::RunContext,
    call_id: String,
    saves: RunSaves,
}

impl Saver for IntoParent {
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            keep(&self.ctx, &self.call_id, session);
            self.saves.save().await
        })
    }
}

/// Keep a paused sub-agent's session in the parent's state until it is resumed.
fn keep(ctx: &tower_agent_core::RunContext, call_id: &str, session: &Session) {
    let Ok(session) = serde_json::to_value(session) else {
        return;
    };
    ctx.update_or_reset(&SUBAGENT_STATE_KEY, |all| {
        all.insert(call_id.to_owned(), session);
    });
}

/// Forget a sub-agent's kept session.
fn forget(ctx: &tower_agent_core::RunContext, call_id: &str) {
    ctx.update_or_reset(&SUBAGENT_STATE_KEY, |all| {
        all.remove(call_id);
    });
}
