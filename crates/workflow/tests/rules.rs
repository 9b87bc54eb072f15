//! Tool rules: start constraints, exit requirements, exit tools, heartbeats, attempts.

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, ModelResponse, Outcome, Session, StopReason, ToolCall,
    ToolRequest, ToolResponse,
};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;
use tower_agent_workflow::rules::ToolRulesLayer;

fn calls(res: &AgentResponse) -> Vec<String> {
    res.session
        .history
        .iter()
        .flat_map(|m| m.tool_calls())
        .map(|c| format!("{}:{}", c.id, c.name))
        .collect()
}

async fn run(
    rules: ToolRulesLayer,
    model: &ScriptedModel,
    tools: ToolSet,
    session: Session,
    input: AgentInput,
) -> AgentResponse {
    let model = ServiceBuilder::new()
        .layer(rules.clone())
        .service(model.clone());
    let tools = ServiceBuilder::new().layer(rules).service(tools);
    let res = Agent::new(model, tools)
        .oneshot(AgentRequest::new(session, input))
        .await
        .expect("runs");
    assert_valid_history(&res.session.history);
    res
}

fn tools() -> ToolSet {
    ToolSet::new()
        .tool(StubTool::returning("load_context", "ctx"))
        .tool(StubTool::returning("search", "hits"))
        .tool(StubTool::returning("save_notes", "saved"))
        .tool(StubTool::returning("finish", "bye"))
}

#[tokio::test]
async fn a_start_tool_the_model_skips_is_run_by_the_agent_first() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "search", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new("c2", "search", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let rules = ToolRulesLayer::new().start_with("load_context", json!({"depth": 1}));
    let res = run(rules, &model, tools(), Session::new(), "go".into()).await;
    assert_eq!(
        calls(&res),
        ["rule_load_context_1:load_context", "c2:search"]
    );
    let forced = res.session.history[1]
        .tool_calls()
        .next()
        .cloned()
        .expect("a call");
    assert_eq!(forced.arguments, r#"{"depth":1}"#);
    assert_eq!(res.text().as_deref(), Some("done"));
}

#[tokio::test]
async fn a_start_tool_the_model_calls_itself_is_not_forced() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "load_context", json!({"depth": 3}))]),
        ModelResponse::text("done"),
    ]);
    let rules = ToolRulesLayer::new().start_with("load_context", json!({}));
    let res = run(rules.clone(), &model, tools(), Session::new(), "go".into()).await;
    assert_eq!(calls(&res), ["c1:load_context"]);

    // A later run of the same session: it ran already, nothing is forced.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c9", "search", json!({}))]),
        ModelResponse::text("again"),
    ]);
    let res = run(rules, &model, tools(), res.session, "more".into()).await;
    assert_eq!(calls(&res), ["c1:load_context", "c9:search"]);
}

#[tokio::test]
async fn a_start_tool_that_keeps_failing_stops_the_run_after_its_attempts() {
    let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("hi")));
    let tools = ToolSet::new().tool(StubTool::failing("load_context", "no such project"));
    let rules = ToolRulesLayer::new()
        .start_with("load_context", json!({}))
        .attempts(2);
    let res = run(rules, &model, tools, Session::new(), "go".into()).await;
    assert_eq!(
        calls(&res),
        [
            "rule_load_context_1:load_context",
            "rule_load_context_2:load_context"
        ]
    );
    let Outcome::Stopped {
        reason: StopReason::Layer { reason },
        ..
    } = &res.outcome
    else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(
        reason,
        "tool rule: `load_context` must run first, and it did not succeed in 2 forced attempts"
    );
}

#[tokio::test]
async fn an_exit_requirement_is_forced_before_the_run_ends() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "search", json!({}))]),
        ModelResponse::text("all done"),
        ModelResponse::text("notes saved, done"),
    ]);
    let rules = ToolRulesLayer::new().require_before_exit("save_notes", json!({"all": true}));
    let res = run(rules, &model, tools(), Session::new(), "go".into()).await;
    assert_eq!(calls(&res), ["c1:search", "rule_save_notes_1:save_notes"]);
    assert_eq!(res.text().as_deref(), Some("notes saved, done"));
    assert_eq!(model.request_count(), 3);

    // Not met after its attempts: the run stops, saying why.
    let model = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("done")));
    let tools = ToolSet::new().tool(StubTool::failing("save_notes", "disk full"));
    let rules = ToolRulesLayer::new()
        .require_before_exit("save_notes", json!({}))
        .attempts(1);
    let res = run(rules, &model, tools, Session::new(), "go".into()).await;
    let Outcome::Stopped {
        reason: StopReason::Layer { reason },
        ..
    } = &res.outcome
    else {
        panic!("{:?}", res.outcome);
    };
    assert!(
        reason.contains("`save_notes` must run before the run ends"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_exit_tool_ends_the_run_unless_a_heartbeat_asks_for_more() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "finish", json!({}))]),
        ModelResponse::text("never"),
    ]);
    let rules = ToolRulesLayer::new().exit_on("finish");
    let res = run(rules.clone(), &model, tools(), Session::new(), "go".into()).await;
    assert_eq!(
        res.outcome.clone(),
        Outcome::Stopped {
            reason: StopReason::Tool {
                call_id: "c1".into(),
                name: "finish".into(),
                reason: "tool rule: `finish` ends the run".into(),
            },
            progress: res.outcome.progress().cloned().unwrap_or_default(),
        }
    );
    assert_eq!(model.request_count(), 1);

    // The model asks for a heartbeat in the call: the run goes on.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new(
            "c1",
            "finish",
            json!({"request_heartbeat": true}),
        )]),
        ModelResponse::text("one more thing"),
    ]);
    let res = run(rules.clone(), &model, tools(), Session::new(), "go".into()).await;
    assert_eq!(res.text().as_deref(), Some("one more thing"));

    // The tool's result asks for one: the run goes on too.
    let finish = StubTool::from_fn("finish", |req: &ToolRequest| {
        ToolResponse::success(&req.call, r#"{"saved": 3, "request_heartbeat": true}"#)
    });
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "finish", json!({}))]),
        ModelResponse::text("continued"),
    ]);
    let res = run(
        rules,
        &model,
        ToolSet::new().tool(finish),
        Session::new(),
        "go".into(),
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("continued"));
}

#[tokio::test]
async fn a_heartbeat_overrides_a_tools_own_stop() {
    let stopping = StubTool::from_fn("wait", |req: &ToolRequest| {
        ToolResponse::success(&req.call, "waited").with_action(tower_agent_core::ToolAction::stop(
            &req.call,
            "done waiting",
        ))
    });
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new(
            "c1",
            "wait",
            json!({"request_heartbeat": true}),
        )]),
        ModelResponse::text("after the wait"),
    ]);
    let res = run(
        ToolRulesLayer::new(),
        &model,
        ToolSet::new().tool(stopping),
        Session::new(),
        "go".into(),
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("after the wait"));
}

#[tokio::test]
async fn the_layer_added_through_a_service_builder_acts_the_same() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "search", json!({}))]),
        ModelResponse::tool_calls([ToolCall::new("c2", "search", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let rules = ToolRulesLayer::new().start_with("load_context", json!({}));
    let agent = Agent::new(
        ServiceBuilder::new()
            .layer(rules.clone())
            .service(model.clone()),
        ServiceBuilder::new().layer(rules).service(tools()),
    );
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("runs");
    assert_valid_history(&res.session.history);
    assert_eq!(
        calls(&res),
        ["rule_load_context_1:load_context", "c2:search"]
    );
}
