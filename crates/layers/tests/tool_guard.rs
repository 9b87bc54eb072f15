//! The tool guard in an agent: a denied call is answered and the run goes on, a revised call
//! runs with the policy's arguments and the history shows them; with the call limits and
//! approval in their canonical places, a denied call counts and never reaches a human, and a
//! human approves the revised arguments.
#![cfg(feature = "tool_guard")]

use serde_json::{Value, json};
use tower::ServiceExt;
use tower_agent_core::{
    AgentRequest, Event, Message, ModelResponse, RunContext, Session, ToolCall,
};
use tower_agent_layers::tool_guard::{ToolGuardLayer, ToolGuarded, ToolVerdict};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

fn shell(id: &str, cmd: &str) -> ModelResponse {
    ModelResponse::tool_calls([ToolCall::new(id, "shell", json!({ "cmd": cmd }))])
}

/// Denies `rm`, wraps everything else in a timeout, leaves timed commands alone.
fn policy() -> ToolGuardLayer {
    ToolGuardLayer::new(|call: ToolCall, _: RunContext| async move {
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or_default();
        let cmd = args["cmd"].as_str().unwrap_or_default().to_owned();
        if cmd.starts_with("rm") {
            ToolVerdict::deny("deleting files is not allowed")
        } else if cmd == "bad" {
            ToolVerdict::revise(json!("not an object"))
        } else if cmd.starts_with("timeout ") {
            ToolVerdict::Allow
        } else {
            ToolVerdict::revise(json!({ "cmd": format!("timeout 60 {cmd}") }))
        }
    })
}

fn calls_in(session: &Session) -> Vec<(String, String)> {
    session
        .history
        .iter()
        .flat_map(Message::tool_calls)
        .map(|call| (call.id.clone(), call.arguments.clone()))
        .collect()
}

fn results_in(session: &Session) -> Vec<(String, bool, String)> {
    session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.clone(), r.is_error, r.content.clone()))
        .collect()
}

#[tokio::test]
async fn a_denied_call_is_answered_with_the_reason_and_the_run_goes_on() {
    let tool = StubTool::returning("shell", "ran");
    let model = ScriptedModel::new([shell("c1", "rm -rf build"), ModelResponse::text("I won't.")]);
    let agent = Agent::builder()
        .with(policy())
        .build(model.clone(), ToolSet::new().tool(tool.clone()));
    let recorder = EventRecorder::new();
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "clean up").with_observer(recorder.clone()))
        .await
        .expect("the run ends");

    assert_eq!(res.text().as_deref(), Some("I won't."));
    assert!(
        tool.calls().is_empty(),
        "a denied call never reaches the tool"
    );
    let results = results_in(&res.session);
    assert_eq!(results.len(), 1);
    let (id, is_error, content) = &results[0];
    assert_eq!((id.as_str(), *is_error), ("c1", true));
    assert!(
        content.contains("deleting files is not allowed"),
        "{content}"
    );
    // The model's next request carries the denial.
    let second = &model.requests()[1];
    assert!(
        second
            .messages
            .iter()
            .flat_map(Message::tool_results)
            .any(|r| r.content.contains("denied by policy"))
    );
    let guarded: Vec<ToolGuarded> = recorder
        .events()
        .iter()
        .filter_map(|e| e.downcast_ref::<ToolGuarded>().cloned())
        .collect();
    assert_eq!(guarded.len(), 1);
    assert_eq!(guarded[0].call_id, "c1");
    assert_eq!(guarded[0].revised, None);
    assert_eq!(guarded[0].reason, "deleting files is not allowed");
    assert!(
        recorder
            .events()
            .iter()
            .any(|e| matches!(e, Event::Layer(l) if l.name() == "tool_guarded"))
    );
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_revised_call_runs_with_the_policy_arguments_and_the_history_shows_them() {
    let tool = StubTool::returning("shell", "built");
    let model = ScriptedModel::new([
        shell("c1", "make"),
        shell("c2", "timeout 5 make test"),
        ModelResponse::text("Built."),
    ]);
    let agent = Agent::builder()
        .with(policy())
        .build(model.clone(), ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "build"))
        .await
        .expect("the run ends");

    assert_eq!(res.text().as_deref(), Some("Built."));
    let ran: Vec<String> = tool.calls().into_iter().map(|c| c.arguments).collect();
    assert_eq!(
        ran,
        [
            r#"{"cmd":"timeout 60 make"}"#,
            r#"{"cmd":"timeout 5 make test"}"#
        ]
    );
    // The session's calls are the calls that ran; the allowed one is as the model wrote it.
    let calls = calls_in(&res.session);
    assert_eq!(calls[0].1, r#"{"cmd":"timeout 60 make"}"#);
    assert_eq!(
        serde_json::from_str::<Value>(&calls[1].1).expect("json"),
        json!({"cmd": "timeout 5 make test"})
    );
    // And so does the model's next request.
    let second = &model.requests()[1];
    let shown: Vec<&str> = second
        .messages
        .iter()
        .flat_map(Message::tool_calls)
        .map(|c| c.arguments.as_str())
        .collect();
    assert_eq!(shown, [r#"{"cmd":"timeout 60 make"}"#]);
    assert!(results_in(&res.session).iter().all(|(_, error, _)| !error));
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn arguments_revised_to_something_not_an_object_deny_the_call() {
    let tool = StubTool::returning("shell", "ran");
    let model = ScriptedModel::new([shell("c1", "bad"), ModelResponse::text("ok")]);
    let agent = Agent::builder()
        .with(policy())
        .build(model, ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run ends");
    assert!(tool.calls().is_empty());
    let (_, is_error, content) = &results_in(&res.session)[0];
    assert!(*is_error);
    assert!(content.contains("not a JSON object"), "{content}");
}

/// Approval of every `shell` call, by interrupt.
#[cfg(feature = "approval")]
fn approval() -> tower_agent_layers::ApprovalLayer {
    use tower_agent_layers::approval::{ApprovalLayer, Gate};
    ApprovalLayer::builder()
        .gate("shell", Gate::new())
        .build()
        .expect("valid")
}

/// In their canonical places: the limits outside the guard count a denied call (a model that
/// insists is stopped), and approval inside it is never asked about a denied call.
#[cfg(all(feature = "limits", feature = "approval"))]
#[tokio::test]
async fn a_denied_call_counts_against_the_limits_and_never_reaches_approval() {
    use tower_agent_core::{Outcome, StopReason};
    use tower_agent_layers::limits::{CallLimitsLayer, Limit};

    let tool = StubTool::returning("shell", "ran");
    let model = ScriptedModel::new([
        shell("c1", "rm a"),
        shell("c2", "rm b"),
        shell("c3", "rm c"),
        ModelResponse::text("unreachable"),
    ]);
    let agent = Agent::builder()
        .with(approval())
        .with(CallLimitsLayer::new().tool_calls(Limit::per_run(2)))
        .with(policy())
        .build(model, ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "clean up"))
        .await
        .expect("the run ends");
    assert!(tool.calls().is_empty());
    assert!(
        matches!(
            &res.outcome,
            Outcome::Stopped {
                reason: StopReason::Limit { .. },
                ..
            }
        ),
        "two denied calls used up the limit, no approval was asked: {:?}",
        res.outcome
    );
    assert!(res.session.interrupts.is_empty());
    assert_valid_history(&res.session.history);
}

/// Approval inside the guard: the human is asked about the call as the policy revised it,
/// the call runs with those arguments on resume, and the history then shows them.
#[cfg(feature = "approval")]
#[tokio::test]
async fn a_human_approves_the_revised_arguments() {
    use tower_agent_core::{Decision, Outcome};
    use tower_agent_layers::approval::ReviewRequest;

    let tool = StubTool::returning("shell", "built");
    let model = ScriptedModel::new([shell("c1", "make"), ModelResponse::text("Built.")]);
    let agent = Agent::builder()
        .with(approval())
        .with(policy())
        .build(model, ToolSet::new().tool(tool.clone()));
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "build"))
        .await
        .expect("the run pauses");
    let Outcome::Interrupted { .. } = &paused.outcome else {
        panic!("approval asks: {:?}", paused.outcome);
    };
    // The human reviews the revised arguments; the session keeps the call as the model wrote
    // it until it runs (on resume the guard revises it again, then approval lets it through).
    let review = ReviewRequest::from_interrupt(&paused.session.interrupts[0]).expect("a review");
    assert_eq!(review.arguments, json!({"cmd": "timeout 60 make"}));
    assert_eq!(
        paused.session.interrupts[0].call.arguments,
        r#"{"cmd":"make"}"#
    );
    assert!(tool.calls().is_empty());

    let done = agent
        .oneshot(AgentRequest::resume_all(paused.session, Decision::Approve))
        .await
        .expect("the run ends");
    assert_eq!(done.text().as_deref(), Some("Built."));
    assert_eq!(tool.calls()[0].arguments, r#"{"cmd":"timeout 60 make"}"#);
    assert_eq!(calls_in(&done.session)[0].1, r#"{"cmd":"timeout 60 make"}"#);
    assert_valid_history(&done.session.history);
}
