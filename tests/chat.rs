//! Chat hosts: a cancel keyword cancels a spawned run.

use serde_json::json;
use tower_agent::chat::CancelOnKeyword;
use tower_agent::prelude::*;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

#[tokio::test]
async fn a_keyword_message_cancels_a_spawned_run_with_its_summary() {
    let hang = StubTool::hanging("deploy");
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        ToolCall::new("c1", "add", json!({"a": 1, "b": 1})),
        ToolCall::new("c2", "deploy", json!({})),
    ])]);
    let tools = ToolSet::new()
        .tool(StubTool::returning("add", "2"))
        .tool(hang.clone());
    let agent = Agent::new(model, tools);
    let run = agent.spawn(AgentRequest::new(Session::new(), "ship it"));
    while hang.calls().is_empty() {
        tokio::task::yield_now().await;
    }
    assert!(!run.cancel_on_keyword("how is it going?"));
    assert!(run.cancel_on_keyword("Stop."));
    let res = run.join().await.unwrap();
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Cancelled. Was working on: add ✓ → deploy ✗")
    );
    assert_valid_history(&res.session.history);
}
