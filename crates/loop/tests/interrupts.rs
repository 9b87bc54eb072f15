//! Interrupts: a tool asks for a decision, the run resumes later, maybe elsewhere.

mod common;

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, Decisions, ErrorKind, ModelResponse, Outcome, Session,
};
use tower_agent_loop::Agent;
use tower_agent_test::{
    ScriptedModel, StubTool, assert_valid_history, assert_valid_history_with_pending,
};
use tower_agent_tools::ToolSet;

use common::{calculator, call, results};

fn agent(model: ScriptedModel, ask: StubTool) -> Agent<ScriptedModel, ToolSet> {
    Agent::new(model, calculator().tool(ask))
}

#[tokio::test]
async fn interrupt_then_resume_in_another_process() {
    let ask = StubTool::interrupting("deploy", json!({"question": "deploy to prod?"}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            call("c1", "add", json!({"a": 1, "b": 1})),
            call("c2", "deploy", json!({"env": "prod"})),
        ]),
        ModelResponse::text("deployed"),
    ]);
    let res = agent(model.clone(), ask.clone())
        .oneshot(AgentRequest::new(Session::new(), "ship it"))
        .await
        .unwrap();
    let Outcome::Interrupted { interrupts } = &res.outcome else {
        panic!("expected an interrupt, got {:?}", res.outcome);
    };
    assert_eq!(interrupts.len(), 1);
    assert_eq!(interrupts[0].call.id, "c2");
    assert_eq!(interrupts[0].payload["question"], "deploy to prod?");
    assert_eq!(res.session.interrupts, *interrupts);
    assert_valid_history_with_pending(&res.session.history, &["c2"]);
    assert!(
        res.session.history.validate().is_err(),
        "c2 waits for a decision"
    );

    // Another process: a fresh agent, the session from JSON.
    let saved = serde_json::to_string(&res.session).unwrap();
    let session: Session = serde_json::from_str(&saved).unwrap();
    let res = agent(model.clone(), ask.clone())
        .oneshot(AgentRequest::resume_all(session, json!("approved")))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("deployed"));
    assert!(res.session.interrupts.is_empty());
    let resumed = ask.requests();
    assert_eq!(resumed.len(), 2);
    assert_eq!(resumed[1].resume, Some(json!("approved")));
    assert_eq!(
        results(&res.session.history)[1],
        ("c2".into(), false, r#"resumed with "approved""#.into())
    );
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn new_input_answers_pending_calls_and_continue_keeps_them() {
    let ask = StubTool::interrupting("ask", json!({}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "ask", json!({}))]),
        ModelResponse::text("fine, something else"),
    ]);
    let agent = agent(model, ask);
    let res = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));

    // Continue without a decision: still interrupted, nothing lost.
    let again = agent
        .clone()
        .oneshot(AgentRequest::new(res.session, AgentInput::Continue))
        .await
        .unwrap();
    assert!(matches!(again.outcome, Outcome::Interrupted { .. }));
    assert_eq!(again.session.interrupts.len(), 1);

    // New input instead of a decision: the pending call is answered as not executed.
    let res = agent
        .oneshot(AgentRequest::new(again.session, "never mind"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("fine, something else"));
    let got = results(&res.session.history);
    assert!(got[0].1 && got[0].2.starts_with("not executed"), "{got:?}");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn resume_without_pending_is_a_typed_error_keeping_the_session() {
    let agent = agent(ScriptedModel::new([]), StubTool::returning("x", ""));
    let mut err = agent
        .oneshot(AgentRequest::new(
            Session::with_id("s"),
            AgentInput::Resume(Decisions::new()),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert_eq!(err.take_session().unwrap().id, "s");
}

#[tokio::test]
async fn resumed_results_are_put_back_in_call_order() {
    let ask = StubTool::interrupting("ask", json!({}));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            call("c1", "ask", json!({})),
            call("c2", "add", json!({"a": 1, "b": 1})),
        ]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(model, calculator().tool(ask));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    let res = agent
        .oneshot(AgentRequest::resume_all(paused.session, json!("yes")))
        .await
        .unwrap();
    let ids: Vec<String> = results(&res.session.history)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids, ["c1", "c2"]);
    assert_valid_history(&res.session.history);
}
