//! A model answer cut off at its length limit is never acted on as complete: its calls are
//! not run, the observers are told, and the agent's `Truncation` says what the run does.

use serde_json::json;
use tower::ServiceExt;
use tower_agent_core::{
    AgentRequest, ErrorKind, Event, FinishReason, GenerationOptions, Message, ModelResponse,
    Outcome, Session, StopReason, ToolCall, ToolResult,
};
use tower_agent_loop::{AgentBuilder, Truncation};
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

/// An answer cut off in the middle of a call to `refund`.
fn cut_call() -> ModelResponse {
    let mut res = ModelResponse::new(Message::assistant_with_calls(
        "Refunding.",
        [ToolCall::raw("c1", "refund", r#"{"order": "A-1", "amo"#)],
    ));
    res.finish_reason = FinishReason::Length;
    res
}

fn cut_text() -> ModelResponse {
    let mut res = ModelResponse::text("The three reasons are: first, the");
    res.finish_reason = FinishReason::Length;
    res
}

fn refund() -> StubTool {
    StubTool::returning("refund", "refunded")
}

fn options() -> GenerationOptions {
    GenerationOptions::new().max_tokens(64)
}

#[tokio::test]
async fn a_cut_call_is_not_run_and_the_run_stops_saying_why() {
    let tool = refund();
    let model = ScriptedModel::new([cut_call()]);
    let recorder = EventRecorder::new();
    let agent = AgentBuilder::new()
        .options(options())
        .build(model, ToolSet::new().tool(tool.clone()));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Refund A-1.").with_observer(recorder.clone()))
        .await
        .expect("the run");
    assert!(tool.calls().is_empty(), "a cut call never runs");
    let Outcome::Stopped { reason, .. } = &res.outcome else {
        panic!("stopped, not {:?}", res.outcome);
    };
    assert_eq!(
        *reason,
        StopReason::Truncated {
            max_tokens: Some(64)
        }
    );
    assert_valid_history(&res.session.history);
    let result = res.session.history[2]
        .tool_results()
        .next()
        .expect("the call is answered");
    assert_eq!(result.content, ToolResult::TRUNCATED);
    assert!(result.is_error);
    assert!(recorder.events().iter().any(|e| matches!(
        e,
        Event::Truncated {
            round: 1,
            calls: 1,
            max_tokens: Some(64)
        }
    )));
}

#[tokio::test]
async fn a_cut_text_is_kept_and_is_not_a_completion() {
    let model = ScriptedModel::new([cut_text()]);
    let res = AgentBuilder::new()
        .build(model, ToolSet::new())
        .oneshot(AgentRequest::new(Session::new(), "Why?"))
        .await
        .expect("the run");
    assert!(matches!(
        res.outcome,
        Outcome::Stopped {
            reason: StopReason::Truncated { max_tokens: None },
            ..
        }
    ));
    assert_eq!(
        res.session.history[1].text(),
        "The three reasons are: first, the"
    );
}

#[tokio::test]
async fn fail_fails_the_run_with_a_typed_error_and_the_session() {
    let tool = refund();
    let model = ScriptedModel::new([cut_call()]);
    let error = AgentBuilder::new()
        .when_truncated(Truncation::Fail)
        .build(model, ToolSet::new().tool(tool.clone()))
        .oneshot(AgentRequest::new(Session::new(), "Refund A-1."))
        .await
        .expect_err("the run fails");
    assert_eq!(error.kind(), ErrorKind::Truncated);
    let mut error = error;
    let session = error.take_session().expect("the session comes with it");
    assert_valid_history(&session.history);
    assert_eq!(session.history.len(), 3);
    assert!(tool.calls().is_empty());
}

#[tokio::test]
async fn continue_calls_the_model_again_with_the_cut_answer() {
    let tool = refund();
    let model = ScriptedModel::new([
        cut_call(),
        ModelResponse::tool_calls([ToolCall::new(
            "c2",
            "refund",
            json!({"order": "A-1", "amount": 5}),
        )]),
        ModelResponse::text("Refunded."),
    ]);
    let res = AgentBuilder::new()
        .when_truncated(Truncation::Continue)
        .build(model.clone(), ToolSet::new().tool(tool.clone()))
        .oneshot(AgentRequest::new(Session::new(), "Refund A-1."))
        .await
        .expect("the run");
    assert_eq!(res.text().as_deref(), Some("Refunded."));
    assert_eq!(tool.calls().len(), 1, "only the whole call ran");
    assert_eq!(tool.calls()[0].id, "c2");
    let second = &model.requests()[1];
    assert_eq!(second.messages.len(), 3, "the cut answer and its result");
    assert_eq!(
        second.messages[2]
            .tool_results()
            .next()
            .map(|r| r.content.as_str()),
        Some(ToolResult::TRUNCATED)
    );
}

#[tokio::test]
async fn ask_again_sends_the_request_once_more_with_room() {
    let tool = refund();
    let model = ScriptedModel::new([cut_call(), ModelResponse::text("Done.")]);
    let res = AgentBuilder::new()
        .options(options())
        .when_truncated(Truncation::AskAgain { max_tokens: 512 })
        .build(model.clone(), ToolSet::new().tool(tool.clone()))
        .oneshot(AgentRequest::new(Session::new(), "Refund A-1."))
        .await
        .expect("the run");
    assert_eq!(res.text().as_deref(), Some("Done."));
    let requests = model.requests();
    assert_eq!(requests[0].options.max_tokens, Some(64));
    assert_eq!(requests[1].options.max_tokens, Some(512));
    assert_eq!(requests[1].messages.len(), 1, "the cut answer was dropped");
    assert_eq!(res.session.history.len(), 2);
    assert!(tool.calls().is_empty());
}

#[tokio::test]
async fn ask_again_cut_again_stops() {
    let model = ScriptedModel::new([cut_call(), cut_text()]);
    let res = AgentBuilder::new()
        .when_truncated(Truncation::AskAgain { max_tokens: 512 })
        .build(model.clone(), ToolSet::new().tool(refund()))
        .oneshot(AgentRequest::new(Session::new(), "Refund A-1."))
        .await
        .expect("the run");
    assert!(matches!(
        res.outcome,
        Outcome::Stopped {
            reason: StopReason::Truncated {
                max_tokens: Some(512)
            },
            ..
        }
    ));
    assert_eq!(model.request_count(), 2, "asked again once");
}
