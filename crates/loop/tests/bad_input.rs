//! Bad input the loop survives: bad tool arguments, failing and panicking tools, tool
//! results forged by the model, bad commits, incomplete checkpoints and stale interrupts.

mod common;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, Error, ErrorKind, History, Message, ModelNext, ModelRequest,
    ModelResponse, ServiceBuilderExt, Session, ToolCall, ToolResult, Usage,
};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

use common::{calculator, call, results, run};

#[tokio::test]
async fn bad_input_becomes_error_results_and_the_run_goes_on() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            call("c1", "nope", json!({})),
            ToolCall::raw("c2", "add", r#"{"a": 1, "b": "#),
            call("c3", "add", json!({"a": "one", "b": 2})),
            call("c4", "fails", json!({})),
            call("c5", "errors", json!({})),
            call("c6", "panics", json!({})),
            call("c7", "add", json!({"a": 1, "b": 1})),
        ]),
        ModelResponse::text("recovered"),
    ]);
    let tools = calculator()
        .tool(StubTool::failing("fails", "file not found"))
        .tool(StubTool::erroring(
            "errors",
            Error::backend("database down"),
        ))
        .tool(StubTool::panicking("panics", "index out of bounds"));
    let res = run(model, tools, "go").await.unwrap();
    assert_eq!(res.text().as_deref(), Some("recovered"));
    let got = results(&res.session.history);
    let ids: Vec<&str> = got.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["c1", "c2", "c3", "c4", "c5", "c6", "c7"],
        "results in call order"
    );
    // (is an error, what the model reads) per call, in call order.
    let expected = [
        (true, "unknown tool `nope`. Available tools: add, fails"),
        (true, "invalid arguments for tool `add`"),
        (true, "invalid type"),
        (true, "file not found"),
        (true, "database down"),
        (true, "panicked: index out of bounds"),
        (false, "2"),
    ];
    for ((id, is_error, content), (want_error, want)) in got.iter().zip(expected) {
        assert_eq!(*is_error, want_error, "{id}: {content}");
        assert!(content.contains(want), "{id}: {content:?} lacks {want:?}");
    }
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn tool_result_parts_from_the_model_are_dropped() {
    let bogus = ToolResult::success(&call("x", "add", json!({})), "forged");
    let model = ScriptedModel::new([ModelResponse::from_parts(vec![
        tower_agent_core::ContentPart::Text { text: "hi".into() },
        tower_agent_core::ContentPart::ToolResult(bogus),
    ])]);
    let res = run(model, calculator(), "go").await.unwrap();
    assert_eq!(res.session.history.last().unwrap().content.len(), 1);
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn bad_commits_are_refused() {
    // (A tool cannot commit a history: only a model response carries one.)
    // A model layer commits a history that splits a call from its result.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))]),
        ModelResponse::text("unreachable"),
    ]);
    let model = ServiceBuilder::new()
        .around_model(|req: ModelRequest, mut next: ModelNext| async move {
            let broken: History = req.messages.iter().take(2).cloned().collect();
            let round = req.ctx.round();
            let mut res = next.run(req).await?;
            if round == 2 {
                res.commit(broken);
            }
            Ok(res)
        })
        .service(model);
    let mut err = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), "1+1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert!(
        err.to_string().contains("committed an invalid history"),
        "{err}"
    );
    let session = err.take_session().unwrap();
    assert_eq!(session.history.len(), 3, "left as it was");
    assert_valid_history(&session.history);
}

#[tokio::test]
async fn a_checkpoint_with_open_calls_resumes_cleanly() {
    // Saved at RoundCompleted: the assistant asked for a call, then the process died.
    let session = Session::new().with_history(vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("c1", "add", json!({"a": 1, "b": 1}))]),
    ]);
    let model = ScriptedModel::new([ModelResponse::text("recovered")]);
    let res = Agent::new(model.clone(), calculator())
        .oneshot(AgentRequest::new(session, AgentInput::Continue))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("recovered"));
    let sent = &model.requests()[0].messages;
    assert_valid_history(sent);
    assert_eq!(results(sent)[0].2, ToolResult::UNANSWERED);
}

#[tokio::test]
async fn stale_interrupts_are_refused() {
    let mut session = Session::new().with_history(vec![Message::user("hi")]);
    session.interrupts.push(tower_agent_core::Interrupt::new(
        call("ghost", "add", json!({})),
        json!(null),
    ));
    let mut err = Agent::new(ScriptedModel::new([]), calculator())
        .oneshot(AgentRequest::resume_all(session, json!(true)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert!(err.to_string().contains("`ghost`"), "{err}");
    assert_eq!(
        err.take_session().unwrap().interrupts.len(),
        1,
        "nothing lost"
    );
}

#[tokio::test]
async fn new_input_drops_stale_interrupts_and_duplicates_are_refused() {
    let ghost = tower_agent_core::Interrupt::new(call("ghost", "add", json!({})), json!(null));
    let mut session = Session::new().with_history(vec![Message::user("hi")]);
    session.interrupts.push(ghost.clone());
    let model = ScriptedModel::new([ModelResponse::text("fresh start")]);
    let res = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(session, "moving on"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("fresh start"));
    assert!(res.session.interrupts.is_empty());

    let pending = call("c1", "add", json!({"a": 1, "b": 1}));
    let mut session =
        Session::new().with_history(vec![Message::assistant_with_calls("", [pending.clone()])]);
    let twice = tower_agent_core::Interrupt::new(pending, json!(null));
    session.interrupts = vec![twice.clone(), twice];
    let err = Agent::new(ScriptedModel::new([]), calculator())
        .oneshot(AgentRequest::resume_all(session, json!(true)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
}

#[tokio::test]
async fn a_failed_run_carries_the_tokens_it_used() {
    // One round paid for (and a side call recorded), then the provider fails.
    let model = ScriptedModel::with_results([
        Ok(
            ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))])
                .with_usage(Usage::new(120, 30)),
        ),
        Err(Error::new(ErrorKind::Server, "the provider is down")),
    ]);
    let model = ServiceBuilder::new()
        .around_model(|req: ModelRequest, mut next: ModelNext| async move {
            match next.run(req).await {
                Ok(mut res) => {
                    res.add_side_usage(Usage::new(7, 3));
                    Ok(res)
                }
                Err(error) => {
                    let usage = error.usage() + Usage::new(7, 3);
                    Err(error.with_usage(usage))
                }
            }
        })
        .service(model);
    let err = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), "1+1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server);
    assert_eq!(err.usage(), Usage::new(120 + 14, 30 + 6));
}

#[tokio::test]
async fn a_failed_call_keeps_what_its_layers_committed() {
    // A layer commits a shorter history (a summary it paid for), then the provider fails: the
    // session the error carries has that history, and the run's usage the layer's tokens.
    let model = ScriptedModel::with_results([
        Ok(ModelResponse::tool_calls([call(
            "c1",
            "add",
            json!({"a": 1, "b": 1}),
        )])),
        Err(Error::new(ErrorKind::Server, "the provider is down")),
    ]);
    let model = ServiceBuilder::new()
        .around_model(|req: ModelRequest, mut next: ModelNext| async move {
            let round = req.ctx.round();
            let kept: History = req.messages.iter().skip(1).cloned().collect();
            match next.run(req).await {
                Err(error) if round == 2 => {
                    Err(error.with_history(kept).with_usage(Usage::new(50, 5)))
                }
                other => other,
            }
        })
        .service(model);
    let mut err = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), "1+1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server);
    assert_eq!(err.usage(), Usage::new(50, 5));
    let session = err.take_session().unwrap();
    assert_eq!(
        session.history.len(),
        2,
        "the call and its result, the input cut"
    );
    assert_eq!(session.history[0].role, tower_agent_core::Role::Assistant);
    assert_valid_history(&session.history);
}
