//! Run state shared by tools and layers, request-only edits and history commits.

mod common;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, Error, Flow, History, Message, ModelNext, ModelRequest, ModelResponse, Role,
    RunContext, ServiceBuilderExt, Session,
};
use tower_agent_loop::Agent;
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{ToolSet, tool_fn};

use common::{calculator, call};

#[tokio::test]
async fn tools_and_layers_share_state_that_persists_in_the_session() {
    #[derive(Deserialize, JsonSchema)]
    struct Note {
        text: String,
    }
    let remember = tool_fn(
        "remember",
        "Remember.",
        |note: Note, ctx: RunContext| async move {
            let mut notes: Vec<String> = ctx.state("notes").unwrap_or_default();
            notes.push(note.text);
            ctx.set_state("notes", &notes);
            Ok::<_, Error>("saved")
        },
    );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "remember", json!({"text": "buy milk"}))]),
        ModelResponse::text("noted"),
    ]);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let model = ServiceBuilder::new()
        .before_model(move |req: ModelRequest| {
            let notes: Option<Vec<String>> = req.ctx.state("notes");
            s.lock().unwrap().push(notes);
            async move { Ok(Flow::Continue(req)) }
        })
        .service(model);
    let mut session = Session::new();
    session.state.insert("notes".into(), json!(["call mom"]));
    let agent = Agent::new(model, ToolSet::new().tool(remember));
    let res = agent
        .oneshot(AgentRequest::new(session, "remember milk"))
        .await
        .unwrap();
    assert_eq!(res.session.state["notes"], json!(["call mom", "buy milk"]));
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].as_deref(), Some(&["call mom".to_string()][..]));
    assert_eq!(seen[1].as_ref().unwrap().len(), 2);
}

#[tokio::test]
async fn request_edits_are_request_only_and_commits_last() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))]),
        ModelResponse::text("done"),
    ]);
    // Round 1: an edit to the request only. Round 2: a commit that trims the history.
    let model = ServiceBuilder::new()
        .around_model(|mut req: ModelRequest, mut next: ModelNext| async move {
            if req.ctx.round() == 1 {
                req.messages.push(Message::user("(reminder: be brief)"));
                return next.run(req).await;
            }
            let kept: History = req.messages.iter().skip(1).cloned().collect();
            req.messages = kept.clone();
            let mut res = next.run(req).await?;
            res.commit(kept);
            Ok(res)
        })
        .service(model.clone());
    let agent = Agent::new(model, calculator());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "1+1"))
        .await
        .unwrap();
    let texts: Vec<String> = res.session.history.iter().map(|m| m.text()).collect();
    assert!(
        !texts.iter().any(|t| t.contains("reminder")),
        "request-only edit leaked: {texts:?}"
    );
    assert_eq!(
        res.session.history.len(),
        3,
        "the user message was committed away: {texts:?}"
    );
    assert_eq!(res.session.history[0].role, Role::Assistant);
}
