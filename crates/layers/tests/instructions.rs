//! The instructions layer on a real agent.

#![cfg(feature = "instructions")]

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{AgentRequest, ModelRequest, ModelResponse, Session, ToolCall};
use tower_agent_layers::instructions::InstructionsLayer;
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

#[tokio::test]
async fn instructions_see_the_request_and_the_run_state() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "ls", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let layer = InstructionsLayer::new()
        .text("Be brief.")
        .with(|req: &ModelRequest| {
            req.ctx
                .state::<String>("user_language")
                .map(|lang| format!("Answer in {lang}."))
        })
        .with(|req: &ModelRequest| Some(format!("Round {}.", req.ctx.round())));
    let inner = ServiceBuilder::new().layer(layer).service(model.clone());
    let mut session = Session::new();
    session
        .state
        .insert("user_language".into(), json!("French"));
    Agent::builder()
        .system("Base.")
        .build(
            inner,
            ToolSet::new().tool(StubTool::returning("ls", "a.txt")),
        )
        .oneshot(AgentRequest::new(session, "go"))
        .await
        .expect("completes");
    let systems: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r.system.as_deref().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        systems,
        [
            "Base.\n\nBe brief.\n\nAnswer in French.\n\nRound 1.",
            "Base.\n\nBe brief.\n\nAnswer in French.\n\nRound 2.",
        ]
    );
}
