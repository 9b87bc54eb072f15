//! Tool selection in an agent: the model is offered a few tools, and a call to any tool of the
//! tool set still runs.
#![cfg(feature = "select")]

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{AgentRequest, ModelRequest, ModelResponse, Session, SideModel, ToolCall};
use tower_agent_layers::select::ToolSelectLayer;
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

fn tools(names: &[&'static str]) -> (ToolSet, Vec<StubTool>) {
    let stubs: Vec<StubTool> = names
        .iter()
        .map(|name| StubTool::returning(*name, format!("{name} done")))
        .collect();
    let set = stubs
        .iter()
        .fold(ToolSet::new(), |set, stub| set.tool(stub.clone()));
    (set, stubs)
}

fn offered(req: &ModelRequest) -> Vec<String> {
    req.tools.iter().map(|t| t.name.clone()).collect()
}

#[tokio::test]
async fn the_model_sees_the_selection_and_any_call_still_runs() {
    let (set, stubs) = tools(&["search", "forecast", "calendar", "email", "shell"]);
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "forecast", json!({"city": "Oslo"}))]),
        // A tool it was not offered this run (it remembers it from an earlier one).
        ModelResponse::tool_calls([ToolCall::new("c2", "shell", json!({"cmd": "date"}))]),
        ModelResponse::text("Rain, as of today."),
    ]);
    let selector = ScriptedModel::new([ModelResponse::text(r#"{"tools": ["forecast"]}"#)]);
    let select = ToolSelectLayer::model(SideModel::new(selector.clone())).always("search");
    let agent = Agent::new(
        ServiceBuilder::new().layer(select).service(model.clone()),
        set,
    );

    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Will it rain in Oslo?"))
        .await
        .expect("the run ends");
    assert_eq!(res.text().as_deref(), Some("Rain, as of today."));
    for req in model.requests() {
        assert_eq!(offered(&req), ["search", "forecast"]);
    }
    assert_eq!(selector.requests().len(), 1, "once for the run");
    assert_eq!(stubs[1].calls().len(), 1);
    assert_eq!(
        stubs[4].calls().len(),
        1,
        "the call reached the whole tool set"
    );
    let last = res
        .session
        .history
        .iter()
        .rev()
        .find_map(|m| m.tool_results().next().cloned());
    let last = last.expect("a tool result");
    assert_eq!(
        (last.content.as_str(), last.is_error),
        ("shell done", false)
    );
}
