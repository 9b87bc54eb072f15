//! Call limits on a real agent: per run and per session, global and per tool, each exit.

#![cfg(feature = "limits")]

use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, ErrorKind, ModelResponse, Outcome, Session, StopReason,
    ToolCall,
};
use tower_agent_layers::limits::{CallLimitsLayer, Exit, Limit, STATE_KEY};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

fn search(id: &str) -> ToolCall {
    ToolCall::new(id, "search", json!({}))
}

/// A model that asks for `calls` searches every round, and a search tool.
fn kit(per_round: usize) -> (ScriptedModel, StubTool) {
    let model = ScriptedModel::from_fn(move |req| {
        let round = req.ctx.round();
        Ok(ModelResponse::tool_calls(
            (0..per_round).map(|i| search(&format!("r{round}_{i}"))),
        ))
    });
    (model, StubTool::returning("search", "hits"))
}

async fn run(
    limits: &CallLimitsLayer,
    model: ScriptedModel,
    tool: &StubTool,
    session: Session,
    concurrent: bool,
) -> Result<AgentResponse, Error> {
    let model = ServiceBuilder::new().layer(limits.clone()).service(model);
    let tools = ServiceBuilder::new()
        .layer(limits.clone())
        .service(ToolSet::new().tool(tool.clone()));
    let builder = Agent::builder().max_rounds(10);
    let builder = if concurrent {
        builder.concurrent_tools(8)
    } else {
        builder
    };
    builder
        .build(model, tools)
        .oneshot(AgentRequest::new(session, "go"))
        .await
}

fn stopped_by(res: &AgentResponse) -> (String, u32) {
    match &res.outcome {
        Outcome::Stopped {
            reason: StopReason::Limit { name, limit },
            ..
        } => (name.clone(), *limit),
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[tokio::test]
async fn a_model_limit_allows_exactly_its_number_of_calls() {
    let (model, tool) = kit(1);
    let limits = CallLimitsLayer::new().model_calls(Limit::per_run(3));
    let res = run(&limits, model.clone(), &tool, Session::new(), false)
        .await
        .unwrap();
    assert_eq!(stopped_by(&res), ("model calls per run".into(), 3));
    assert_eq!(model.request_count(), 3, "reached is not exceeded");
    assert_eq!(tool.calls().len(), 3, "every call of the 3 rounds ran");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_model_limit_can_fail_the_run_with_its_session() {
    let (model, tool) = kit(1);
    let limits = CallLimitsLayer::new().model_calls(Limit::per_run(2).exit(Exit::Error));
    let mut err = run(&limits, model.clone(), &tool, Session::new(), false)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitReached);
    assert!(
        err.to_string()
            .contains("the limit of 2 model calls per run was reached"),
        "{err}"
    );
    assert!(!err.kind().is_transient());
    let session = err.take_session().expect("the session comes back");
    assert_valid_history(&session.history);
    assert_eq!(model.request_count(), 2);
}

#[tokio::test]
async fn continue_gives_blocked_calls_an_error_result_and_goes_on() {
    for concurrent in [false, true] {
        let (_, tool) = kit(0);
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([search("a"), search("b"), search("c")]),
            ModelResponse::text("enough"),
        ]);
        let limits = CallLimitsLayer::new().tool("search", Limit::per_run(2).exit(Exit::Continue));
        let res = run(&limits, model, &tool, Session::new(), concurrent)
            .await
            .unwrap();
        assert_eq!(res.text().as_deref(), Some("enough"), "{concurrent}");
        assert_eq!(tool.calls().len(), 2, "{concurrent}");
        let results: Vec<_> = res
            .session
            .history
            .iter()
            .flat_map(|m| m.tool_results())
            .collect();
        assert_eq!(results.len(), 3, "a result for every call");
        let blocked: Vec<_> = results.iter().filter(|r| r.is_error).collect();
        assert_eq!(blocked.len(), 1);
        assert_eq!(
            blocked[0].content,
            "not executed: the limit of 2 `search` calls per run was reached; do not call it \
             again in this run"
        );
        assert_valid_history(&res.session.history);
    }
}

#[tokio::test]
async fn end_answers_a_whole_parallel_batch_and_stops() {
    for concurrent in [false, true] {
        let (model, tool) = kit(4);
        let limits = CallLimitsLayer::new().tool_calls(Limit::per_run(6));
        let res = run(&limits, model.clone(), &tool, Session::new(), concurrent)
            .await
            .unwrap();
        assert_eq!(stopped_by(&res), ("tool calls per run".into(), 6));
        assert_eq!(tool.calls().len(), 6, "{concurrent}");
        assert_eq!(model.request_count(), 2, "no model call after the stop");
        let Outcome::Stopped { progress, .. } = &res.outcome else {
            unreachable!()
        };
        assert_eq!(progress.len(), 8, "both batches, every call");
        assert_eq!(progress.steps().filter(|s| s.ok).count(), 6);
        assert_valid_history(&res.session.history);
    }
}

#[tokio::test]
async fn error_refuses_the_message_before_any_of_its_calls_runs() {
    let (model, tool) = kit(3);
    let limits = CallLimitsLayer::new().tool("search", Limit::per_run(4).exit(Exit::Error));
    let mut err = run(&limits, model, &tool, Session::new(), true)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitReached);
    // Round 1's three calls ran; round 2 asked for three more: none of them ran.
    assert_eq!(tool.calls().len(), 3);
    let session = err.take_session().unwrap();
    assert_valid_history(&session.history);
    let calls = session.history.iter().flat_map(|m| m.tool_calls()).count();
    assert_eq!(calls, 3, "the refused message is not in the history");
}

#[tokio::test]
async fn session_counts_persist_in_the_session_state() {
    let limits = CallLimitsLayer::new().tool_calls(Limit::per_session(3));
    let two = ScriptedModel::new([
        ModelResponse::tool_calls([search("a"), search("b")]),
        ModelResponse::text("first"),
    ]);
    let tool = StubTool::returning("search", "hits");
    let first = run(&limits, two, &tool, Session::new(), false)
        .await
        .unwrap();
    assert_eq!(first.text().as_deref(), Some("first"));
    assert_eq!(first.session.state[STATE_KEY.name()], json!({"tools": 2}));

    // Another process: the session from JSON.
    let saved: Session =
        serde_json::from_str(&serde_json::to_string(&first.session).unwrap()).unwrap();
    let two_more = ScriptedModel::new([ModelResponse::tool_calls([search("c"), search("d")])]);
    let second = run(&limits, two_more, &tool, saved, false).await.unwrap();
    assert_eq!(stopped_by(&second), ("tool calls per session".into(), 3));
    assert_eq!(tool.calls().len(), 3);
    assert_eq!(
        second.session.state[STATE_KEY.name()]["tools"],
        Value::from(3)
    );
}

#[cfg(feature = "approval")]
#[tokio::test]
async fn a_call_that_waited_is_counted_once() {
    use tower_agent_core::Decision;
    use tower_agent_layers::approval::{ApprovalLayer, Gate};

    let limits = CallLimitsLayer::new().tool_calls(Limit::per_session(2));
    let approval = ApprovalLayer::builder()
        .gate("search", Gate::new())
        .build()
        .unwrap();
    let tool = StubTool::returning("search", "hits");
    let tools = ServiceBuilder::new()
        .layer(limits.clone())
        .layer(approval)
        .service(ToolSet::new().tool(tool.clone()));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([search("a")]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(model, tools);
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    // It did not run: it counts when it does.
    assert_eq!(
        paused.session.state[STATE_KEY.name()]["tools"],
        Value::from(0)
    );
    let done = agent
        .oneshot(AgentRequest::resume_all(paused.session, Decision::Approve))
        .await
        .unwrap();
    assert_eq!(done.text().as_deref(), Some("done"));
    assert_eq!(
        done.session.state[STATE_KEY.name()]["tools"],
        Value::from(1)
    );
    assert_eq!(tool.calls().len(), 1);
}

/// A call that pauses did not run: its sibling in the same message is not refused for it.
#[cfg(feature = "approval")]
#[tokio::test]
async fn a_call_that_pauses_does_not_use_up_a_limit_for_its_siblings() {
    use tower_agent_core::{Decision, Outcome};
    use tower_agent_layers::approval::{ApprovalLayer, Gate};

    let limits = CallLimitsLayer::new().tool_calls(Limit::per_run(1));
    let approval = ApprovalLayer::builder()
        .gate("write", Gate::new())
        .build()
        .unwrap();
    let search_tool = StubTool::returning("search", "hits");
    let write_tool = StubTool::returning("write", "written");
    let tools = ServiceBuilder::new()
        .layer(limits.clone())
        .layer(approval)
        .service(
            ToolSet::new()
                .tool(search_tool.clone())
                .tool(write_tool.clone()),
        );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("w", "write", json!({})), search("s")]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::builder().sequential_tools().build(model, tools);
    let paused = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(
        matches!(paused.outcome, Outcome::Interrupted { .. }),
        "the write waits, the search ran: {:?}",
        paused.outcome
    );
    assert_eq!(search_tool.calls().len(), 1);
    // The resumed run runs the write: the one call of that run.
    let done = agent
        .oneshot(AgentRequest::resume_all(paused.session, Decision::Approve))
        .await
        .unwrap();
    assert_eq!(done.text().as_deref(), Some("done"));
    assert_eq!(write_tool.calls().len(), 1);
}

#[tokio::test]
async fn a_model_call_refused_further_in_counts_against_no_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower_agent_core::{Flow, ModelRequest, before_model};

    // Inside the limits, a layer that refuses the first call it sees (as a budget does).
    let refused_once = Arc::new(AtomicBool::new(false));
    let refuse = before_model(move |req: ModelRequest| {
        let first = !refused_once.swap(true, Ordering::SeqCst);
        async move {
            if first {
                let reason = StopReason::Limit {
                    name: "a budget inside".into(),
                    limit: 0,
                };
                return Ok(Flow::Answer(ModelResponse::refuse(reason)));
            }
            Ok(Flow::Continue(req))
        }
    });
    let limits = CallLimitsLayer::new().model_calls(Limit::per_session(1));
    let scripted = ScriptedModel::new([ModelResponse::text("answered")]);
    let model = ServiceBuilder::new()
        .layer(limits.clone())
        .layer(refuse)
        .service(scripted.clone());
    let agent = Agent::new(model, ToolSet::new());
    let first = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "one"))
        .await
        .expect("a refusal is an outcome");
    assert!(matches!(first.outcome, Outcome::Stopped { .. }));
    // The refused call used none of the session's one model call.
    let second = agent
        .oneshot(AgentRequest::new(first.session, "two"))
        .await
        .expect("the next run");
    assert_eq!(second.text().as_deref(), Some("answered"));
    assert_eq!(scripted.request_count(), 1);
}
