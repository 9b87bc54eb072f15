//! Every input repairs the session the same way, and input that does not fit the session is
//! refused with the session exactly as it came.

mod common;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, AgentResponse, Decisions, Error, ErrorKind, Event, Flow, Interrupt,
    Message, ModelResponse, Outcome, ServiceBuilderExt, Session, ToolResult, observer_fn,
};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{calculator, call};

/// `[user, assistant(c1), user]`: a call left without a result before a later message.
fn dangling_before_a_later_message() -> Session {
    Session::new().with_history(vec![
        Message::user("add 1 and 2"),
        Message::assistant_with_calls("", [call("c1", "add", json!({"a": 1, "b": 2}))]),
        Message::user("are you there?"),
    ])
}

#[tokio::test]
async fn continue_answers_a_dangling_call_right_after_its_message() {
    let model = ScriptedModel::new([ModelResponse::text("yes")]);
    let res = Agent::new(model.clone(), calculator())
        .oneshot(AgentRequest::new(
            dangling_before_a_later_message(),
            AgentInput::Continue,
        ))
        .await
        .unwrap();
    let history = &res.session.history;
    assert_valid_history(history);
    let answer = history[2]
        .tool_results()
        .next()
        .expect("c1 answered at index 2");
    assert_eq!(
        (answer.call_id.as_str(), answer.content.as_str()),
        ("c1", ToolResult::UNANSWERED)
    );
    assert_eq!(history[3].text(), "are you there?");
    // The model saw the repaired history.
    assert_valid_history(&model.requests()[0].messages);
}

#[tokio::test]
async fn new_messages_repair_the_same_way() {
    let model = ScriptedModel::new([ModelResponse::text("yes")]);
    let res = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(
            dangling_before_a_later_message(),
            "hello?",
        ))
        .await
        .unwrap();
    assert_valid_history(&res.session.history);
    assert!(res.session.history[2].tool_results().next().is_some());
    assert_eq!(res.session.history[4].text(), "hello?");
}

#[tokio::test]
async fn calls_without_results_further_up_or_in_the_input_are_answered_in_place() {
    // A host-built history with an old dangling call, and input that ends with a call.
    let session = Session::new().with_history(vec![
        Message::user("add"),
        Message::assistant_with_calls("", [call("old", "add", json!({}))]),
        Message::user("never mind"),
        Message::assistant("ok"),
    ]);
    let input = vec![
        Message::user("imported"),
        Message::assistant_with_calls("", [call("imp", "add", json!({}))]),
    ];
    let model = ScriptedModel::new([ModelResponse::text("done")]);
    let res = Agent::new(model.clone(), calculator())
        .oneshot(AgentRequest::new(session, input))
        .await
        .unwrap();
    let history = &res.session.history;
    assert_valid_history(history);
    assert_valid_history(&model.requests()[0].messages);
    assert_eq!(
        history[2].tool_results().next().map(|r| r.call_id.as_str()),
        Some("old")
    );
    assert_eq!(
        history[7].tool_results().next().map(|r| r.call_id.as_str()),
        Some("imp")
    );

    // Continue on such a history repairs it too, leaving a pending call at the end alone.
    let mut session = Session::new().with_history(vec![
        Message::assistant_with_calls("", [call("old", "add", json!({}))]),
        Message::user("later"),
        Message::assistant_with_calls("", [call("wait", "add", json!({}))]),
    ]);
    session
        .interrupts
        .push(Interrupt::new(call("wait", "add", json!({})), json!(null)));
    let res = Agent::new(ScriptedModel::new([]), calculator())
        .oneshot(AgentRequest::new(session, AgentInput::Continue))
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));
    assert!(res.session.history[1].tool_results().next().is_some());
    tower_agent_test::assert_valid_history_with_pending(&res.session.history, &["wait"]);
}

/// The session as it came, compared field by field after a refusal.
fn assert_unchanged(err: &Error, before: &Session) {
    assert_eq!(err.kind(), ErrorKind::BadRequest, "{err}");
    assert_eq!(
        err.session(),
        Some(before),
        "the refused session is returned as it came"
    );
}

#[tokio::test]
async fn refused_requests_return_the_session_untouched() {
    // A pending interrupt for a call the history does not hold, with a dangling call that a
    // repair would answer, and state that a run would merge.
    let mut session = Session::new().with_history(vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("c1", "add", json!({}))]),
    ]);
    session
        .interrupts
        .push(Interrupt::new(call("c9", "add", json!({})), json!(null)));
    session.state.insert("mine".into(), json!(1));
    let before = session.clone();
    for input in [
        AgentInput::Continue,
        AgentInput::Resume(Decisions::all(&session.interrupts, json!(true))),
    ] {
        let request = AgentRequest::new(session.clone(), input);
        request.ctx.set_state("from_the_context", 2);
        let err = Agent::new(ScriptedModel::new([]), calculator())
            .oneshot(request)
            .await
            .unwrap_err();
        assert_unchanged(&err, &before);
    }

    // Resuming a session with nothing pending.
    let plain = dangling_before_a_later_message();
    let err = Agent::new(ScriptedModel::new([]), calculator())
        .oneshot(AgentRequest::new(
            plain.clone(),
            AgentInput::Resume(Decisions::new()),
        ))
        .await
        .unwrap_err();
    assert_unchanged(&err, &plain);
}

#[tokio::test]
async fn a_pending_call_must_stand_at_the_end_of_the_history() {
    let mut session = dangling_before_a_later_message();
    session.interrupts.push(Interrupt::new(
        call("c1", "add", json!({"a": 1, "b": 2})),
        json!(null),
    ));
    let before = session.clone();
    let tool = StubTool::interrupting("add", json!("approve?"));
    let err = Agent::new(ScriptedModel::new([]), ToolSet::new().tool(tool.clone()))
        .oneshot(AgentRequest::resume_all(session, json!("ok")))
        .await
        .unwrap_err();
    assert_unchanged(&err, &before);
    assert!(tool.calls().is_empty(), "nothing ran");
}

#[tokio::test]
async fn resume_refuses_an_interrupt_that_is_not_the_call_in_the_history() {
    let history = vec![
        Message::user("clean up"),
        Message::assistant_with_calls("", [call("c1", "rm", json!({"path": "/tmp/x"}))]),
    ];
    let stored = [
        call("c1", "rm", json!({"path": "/"})), // other arguments
        call("c1", "wipe", json!({"path": "/tmp/x"})), // another tool
    ];
    for stored in stored {
        let mut session = Session::new().with_history(history.clone());
        session.interrupts.push(Interrupt::new(stored, json!(null)));
        let before = session.clone();
        let rm = StubTool::returning("rm", "removed");
        let wipe = StubTool::returning("wipe", "wiped");
        let tools = ToolSet::new().tool(rm.clone()).tool(wipe.clone());
        let err = Agent::new(ScriptedModel::new([]), tools)
            .oneshot(AgentRequest::resume_all(session, json!("yes")))
            .await
            .unwrap_err();
        assert_unchanged(&err, &before);
        assert!(err.to_string().contains("`c1`"), "{err}");
        assert!(
            rm.calls().is_empty() && wipe.calls().is_empty(),
            "nothing ran"
        );
    }
}

#[tokio::test]
async fn an_observer_failing_on_run_finished_ends_the_stream_with_run_failed() {
    for fails_on_run_failed_too in [false, true] {
        observer_fails_at_the_end(fails_on_run_failed_too).await;
    }
}

async fn observer_fails_at_the_end(fails_on_run_failed_too: bool) {
    let model = ScriptedModel::new([ModelResponse::text("done")]);
    let (request, mut stream) = AgentRequest::new(Session::new(), "hi").with_event_stream(16);
    let recorder = tower_agent_test::EventRecorder::new();
    let request = request.with_observer(observer_fn(move |event: &Event| {
        let fails = matches!(event, Event::RunFinished { .. })
            || (fails_on_run_failed_too && matches!(event, Event::RunFailed { .. }));
        async move {
            if fails {
                Err(Error::other("disk full"))
            } else {
                Ok(())
            }
        }
    }));
    // A second observer is told of the failure even when the first one fails on it.
    let request = request.with_observer(recorder.clone());
    let err = Agent::new(model, calculator())
        .oneshot(request)
        .await
        .expect_err("the observer's error fails the run");
    assert_eq!(err.kind(), ErrorKind::Observer);
    assert_eq!(err.session().map(|s| s.history.len()), Some(2));
    let mut names = Vec::new();
    while let Some(event) = stream.recv().await {
        names.push(event.name());
    }
    assert_eq!(names.last(), Some(&"run_failed"), "{names:?}");
    assert!(!names.contains(&"run_finished"), "{names:?}");
    assert_eq!(recorder.names().last(), Some(&"run_failed"));
}

#[tokio::test]
async fn a_before_agent_answer_keeps_the_session_valid() {
    let mut session = Session::new().with_history(vec![
        Message::user("delete it"),
        Message::assistant_with_calls("", [call("c1", "rm", json!({}))]),
    ]);
    session.interrupts.push(Interrupt::new(
        call("c1", "rm", json!({})),
        json!("approve?"),
    ));
    let model = ScriptedModel::new([]);
    let agent = ServiceBuilder::new()
        .before_agent(|req: AgentRequest| async move {
            req.ctx.set_state("answered_by", "before_agent");
            Ok(Flow::Answer(req.answer("We are closed today.")))
        })
        .service(Agent::new(model.clone(), calculator()));
    let res: AgentResponse = agent
        .oneshot(AgentRequest::new(session, "never mind"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("We are closed today."));
    assert!(matches!(res.outcome, Outcome::Completed { .. }));
    assert_valid_history(&res.session.history);
    assert_eq!(
        res.session.history[2]
            .tool_results()
            .next()
            .map(|r| r.content.as_str()),
        Some(ToolResult::NOT_DECIDED)
    );
    assert_eq!(res.session.history[3].text(), "never mind");
    assert!(res.session.interrupts.is_empty());
    assert_eq!(res.session.state["answered_by"], json!("before_agent"));
    assert_eq!(model.request_count(), 0, "the loop did not run");
}
