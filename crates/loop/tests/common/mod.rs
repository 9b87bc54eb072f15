//! Helpers shared by the loop's integration tests: a calculator tool set, a one-shot run,
//! the tool results of a history, and a saver that keeps every version.

// Each test file uses some of these helpers, not all of them.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, PoisonError};

use schemars::JsonSchema;
use serde::Deserialize;
use tower::ServiceExt;
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{AgentRequest, AgentResponse, Error, Message, Saver, Session, ToolCall};
use tower_agent_loop::Agent;
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{ToolSet, tool_fn};

/// Every session the loop saved, in order.
#[derive(Clone, Default)]
pub(crate) struct Saves(Arc<Mutex<Vec<Session>>>);

impl Saves {
    pub(crate) fn all(&self) -> Vec<Session> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What a store holds: the last version saved.
    pub(crate) fn last(&self) -> Session {
        self.all().pop().expect("a version was saved")
    }
}

impl Saver for Saves {
    fn save<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<(), Error>> {
        let saves = self.0.clone();
        Box::pin(async move {
            saves
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(session.clone());
            Ok(())
        })
    }
}

pub(crate) fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

pub(crate) fn results(history: &[Message]) -> Vec<(String, bool, String)> {
    history
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| (r.call_id.clone(), r.is_error, r.content.clone()))
        .collect()
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

pub(crate) fn calculator() -> ToolSet {
    ToolSet::new().tool(tool_fn(
        "add",
        "Add two integers.",
        |args: AddArgs| async move { Ok::<_, Error>(args.a + args.b) },
    ))
}

pub(crate) async fn run(
    model: ScriptedModel,
    tools: ToolSet,
    input: &str,
) -> Result<AgentResponse, Error> {
    // The tool set says which tools it serves: the model is offered them.
    let agent = Agent::new(model, tools);
    agent
        .oneshot(AgentRequest::new(Session::new(), input))
        .await
}
