//! Interrupts: a tool asks for a decision, the run resumes later, maybe elsewhere.

mod common;

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentInput, AgentRequest, Decision, DecisionKind, Decisions, ErrorKind, ModelResponse, Outcome,
    Session, StopReason, ToolResponse,
};
use tower_agent_loop::{Agent, ResumeError};
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

/// Two calls wait, a sibling runs: each waiting call gets its own value on resume, the
/// sibling is not run again, and results stay in call order.
#[tokio::test]
async fn decisions_are_keyed_by_call_id() {
    let ask = StubTool::interrupting("ask", json!({"question": "which file?"}));
    let sibling = StubTool::returning("list", "a.txt b.txt");
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            call("c1", "ask", json!({})),
            call("c2", "list", json!({})),
            call("c3", "ask", json!({})),
        ]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(
        model.clone(),
        ToolSet::new().tool(ask.clone()).tool(sibling.clone()),
    );
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(paused.session.interrupts.len(), 2);
    assert_eq!(sibling.calls().len(), 1, "the sibling ran at once");
    let decisions = Decisions::new()
        .with("c3", json!("b.txt"))
        .with("c1", json!("a.txt"));
    let res = agent
        .oneshot(AgentRequest::resume(paused.session, decisions))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("done"));
    assert_eq!(sibling.calls().len(), 1, "the sibling is not run again");
    let resumed: Vec<_> = ask.requests()[2..]
        .iter()
        .map(|r| (r.call.id.clone(), r.resume.clone()))
        .collect();
    assert_eq!(
        resumed,
        [
            ("c1".to_string(), Some(json!("a.txt"))),
            ("c3".to_string(), Some(json!("b.txt")))
        ]
    );
    let got = results(&res.session.history);
    let ids: Vec<&str> = got.iter().map(|(id, ..)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3"], "call order kept");
    assert_eq!(got[0].2, r#"resumed with "a.txt""#);
    assert_valid_history(&res.session.history);
}

/// A review that allows only approve and reject.
fn reviewed(name: &str) -> StubTool {
    StubTool::from_fn(name, |req| match &req.resume {
        None => ToolResponse::review(
            &req.call,
            json!("run it?"),
            [DecisionKind::Approve, DecisionKind::Reject],
        ),
        Some(decision) => ToolResponse::success(&req.call, format!("ran after {decision}")),
    })
}

#[tokio::test]
async fn wrong_decisions_are_refused_and_change_nothing() {
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "rm", json!({})),
        call("c2", "rm", json!({})),
    ])]);
    let rm = reviewed("rm");
    let agent = Agent::new(model, ToolSet::new().tool(rm.clone()));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "clean"))
        .await
        .unwrap();
    let session = paused.session;
    assert_eq!(
        session.interrupts[0].allowed,
        [DecisionKind::Approve, DecisionKind::Reject]
    );
    let approve = json!(Decision::Approve);
    let cases = [
        (
            Decisions::new()
                .with("c1", approve.clone())
                .with("c2", approve.clone())
                .with("c9", approve.clone()),
            "no call `c9`",
        ),
        (
            Decisions::new().with("c1", approve.clone()),
            "call `c2` (tool `rm`) waits for a decision and got none",
        ),
        (
            Decisions::new()
                .with("c1", approve.clone())
                .with("c2", Decision::respond("done")),
            "call `c2` allows approve, reject; got `respond`",
        ),
        (
            Decisions::new()
                .with("c1", approve)
                .with("c2", json!("yes")),
            "a value that is not a decision",
        ),
        (Decisions::new(), "waits for a decision and got none"),
    ];
    for (decisions, expected) in cases {
        let mut err = agent
            .clone()
            .oneshot(AgentRequest::resume(session.clone(), decisions))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
        let source = std::error::Error::source(&err).expect("a typed source");
        assert!(source.downcast_ref::<ResumeError>().is_some(), "{source:?}");
        assert_eq!(err.take_session().unwrap(), session, "{expected}");
    }
    assert_eq!(rm.calls().len(), 2, "only the first run's two calls");
}

#[tokio::test]
async fn resuming_twice_runs_each_call_once() {
    let rm = reviewed("rm");
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "rm", json!({}))]),
        ModelResponse::text("removed"),
    ]);
    let agent = Agent::new(model.clone(), ToolSet::new().tool(rm.clone()));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "clean"))
        .await
        .unwrap();
    let decisions = Decisions::new().with("c1", Decision::Approve);
    let first = agent
        .clone()
        .oneshot(AgentRequest::resume(paused.session, decisions.clone()))
        .await
        .unwrap();
    assert_eq!(first.text().as_deref(), Some("removed"));
    // The same resume delivered again, on the session the first one saved.
    let saved: Session =
        serde_json::from_str(&serde_json::to_string(&first.session).unwrap()).unwrap();
    let second = agent
        .oneshot(AgentRequest::resume(saved, decisions))
        .await
        .unwrap();
    assert_eq!(rm.calls().len(), 2, "asked once, run once");
    assert_eq!(model.request_count(), 2, "no model call on the replay");
    assert_eq!(second.outcome, first.outcome);
    assert_eq!(second.session.history, first.session.history);
    assert_eq!(second.rounds, 0);
}

#[tokio::test]
async fn a_replay_reports_calls_that_wait_again_and_stops_otherwise() {
    // The first resume ran c1 and stopped at a new review (c2).
    let rm = reviewed("rm");
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "rm", json!({}))]),
        ModelResponse::tool_calls([call("c2", "rm", json!({}))]),
    ]);
    let agent = Agent::new(model.clone(), ToolSet::new().tool(rm.clone()));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "clean"))
        .await
        .unwrap();
    let first = agent
        .clone()
        .oneshot(AgentRequest::resume_all(paused.session, Decision::Approve))
        .await
        .unwrap();
    let Outcome::Interrupted { interrupts } = &first.outcome else {
        panic!("{:?}", first.outcome);
    };
    assert_eq!(interrupts[0].call.id, "c2");
    let replay = Decisions::new().with("c1", Decision::Approve);
    let again = agent
        .clone()
        .oneshot(AgentRequest::resume(first.session.clone(), replay.clone()))
        .await
        .unwrap();
    assert_eq!(again.outcome, first.outcome, "c2 still waits");
    assert_eq!(again.session, first.session);
    assert_eq!(rm.calls().len(), 3, "c1 asked and run, c2 asked");

    // Once c2 is answered by new input, a replay of c1's decision ends stopped.
    let mut session = first.session;
    session.push_input([]);
    let res = agent
        .oneshot(AgentRequest::resume(session, replay))
        .await
        .unwrap();
    assert!(
        matches!(
            res.outcome,
            Outcome::Stopped {
                reason: StopReason::Replayed,
                ..
            }
        ),
        "{:?}",
        res.outcome
    );
    assert_eq!(rm.calls().len(), 3);
}

#[tokio::test]
async fn the_history_records_the_arguments_a_call_ran_with() {
    let edited = StubTool::from_fn("shell", |req| {
        ToolResponse::success(&req.call, "listed").ran_with(r#"{"cmd":"ls"}"#)
    });
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "shell", json!({"cmd": "rm -rf /"}))]),
        ModelResponse::text("ok"),
    ]);
    let agent = Agent::new(model.clone(), ToolSet::new().tool(edited));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    let calls: Vec<_> = res
        .session
        .history
        .iter()
        .flat_map(|m| m.tool_calls())
        .collect();
    assert_eq!(calls[0].arguments, r#"{"cmd":"ls"}"#);
    // The model's next request shows what ran.
    let seen = &model.requests()[1].messages;
    let call = seen.iter().flat_map(|m| m.tool_calls()).next().unwrap();
    assert_eq!(call.arguments, r#"{"cmd":"ls"}"#);
    assert_valid_history(&res.session.history);
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Pick {
    pattern: String,
}

/// A typed tool asks the human a question of its own, without any layer, and reads the
/// answer when the run is resumed in another process.
#[tokio::test]
async fn a_typed_tool_asks_and_reads_the_answer() {
    use tower_agent_tools::{Reply, ToolContext, tool_fn};
    let delete = tool_fn(
        "delete",
        "Delete one file.",
        |args: Pick, cx: ToolContext| async move {
            match cx.resume_as::<String>() {
                None => Ok(Reply::ask(
                    json!({"question": format!("which file matching {}?", args.pattern)}),
                )),
                Some(Ok(file)) => Ok(Reply::Done(format!("deleted {file}"))),
                Some(Err(error)) => Err(format!("expected a file name: {error}")),
            }
        },
    );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "delete", json!({"pattern": "*.log"}))]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(model, ToolSet::new().tool(delete));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "clean the logs"))
        .await
        .unwrap();
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!("{:?}", paused.outcome);
    };
    assert_eq!(
        interrupts[0].payload["question"],
        "which file matching *.log?"
    );
    assert!(interrupts[0].allowed.is_empty(), "any answer");
    let saved = serde_json::to_string(&paused.session).unwrap();
    let session: Session = serde_json::from_str(&saved).unwrap();
    let res = agent
        .oneshot(AgentRequest::resume(
            session,
            Decisions::new().with("c1", "old.log"),
        ))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("done"));
    assert_eq!(
        results(&res.session.history)[0],
        ("c1".into(), false, "deleted old.log".into())
    );
}
