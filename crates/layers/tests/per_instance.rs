//! Per-run state belongs to the layer value that keeps it: two layers of one type in one run
//! never share it (memory files, the checkpoint's budget).

#![cfg(all(feature = "memory", feature = "checkpoint"))]

use serde_json::json;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{AgentRequest, Error, ModelResponse, Outcome, Session, ToolCall};
use tower_agent_layers::checkpoint::CheckpointLayer;
use tower_agent_layers::memory::{MemoryLayer, MemorySource};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// A memory source whose only file says its name.
#[derive(Clone)]
struct Named(&'static str);

impl MemorySource for Named {
    fn read<'a>(&'a self, _path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(async move { Ok(Some(format!("notes of {}", self.0))) })
    }
}

#[tokio::test]
async fn two_memory_layers_in_one_run_show_each_their_own_files() {
    let team = MemoryLayer::new().file(Named("team"), "TEAM.md");
    let user = MemoryLayer::new().file(Named("user"), "USER.md");
    let scripted = ScriptedModel::new([ModelResponse::text("ok")]);
    let model = ServiceBuilder::new()
        .layer(team.clone())
        .layer(user.clone())
        .service(scripted.clone());
    let agent = ServiceBuilder::new()
        .layer(team)
        .layer(user)
        .service(Agent::new(model, ToolSet::new()));
    agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("the run");
    let system = scripted.requests()[0]
        .system
        .clone()
        .expect("a system prompt");
    assert_eq!(system.matches("notes of team").count(), 1, "{system}");
    assert_eq!(system.matches("notes of user").count(), 1, "{system}");
}

#[tokio::test]
async fn two_checkpoints_in_one_run_count_on_budgets_of_their_own() {
    // Each allows two calls; the run makes two: neither asks.
    let outer = CheckpointLayer::interrupting().every(2);
    let inner = CheckpointLayer::interrupting().every(2);
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "step", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new("c2", "step", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let tools = outer.layer(inner.layer(ToolSet::new().tool(StubTool::returning("step", "ok"))));
    let res = Agent::new(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run");
    assert!(
        matches!(res.outcome, Outcome::Completed { .. }),
        "two calls fit each budget of two: {:?}",
        res.outcome
    );
}
