//! The loop's rounds: completion and usage, max rounds, a tool that stops the loop,
//! concurrent tools, call ids, and model errors and panics.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tower::{ServiceExt, service_fn};
use tower_agent_core::{
    AgentInput, AgentRequest, DescribedTools, Error, ErrorKind, Event, Message, ModelRequest,
    ModelResponse, Outcome, Role, Session, StopReason, ToolCall, ToolRequest, ToolResponse,
    ToolResult, Usage, observer_fn,
};
use tower_agent_loop::Agent;
use tower_agent_test::{
    EventRecorder, ScriptedModel, StubTool, assert_valid_history, assert_valid_history_with_pending,
};

use common::{calculator, call, results, run};

#[tokio::test]
async fn completes_and_sums_usage() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 2, "b": 3}))])
            .with_usage(Usage::new(10, 2).with_cached(4)),
        ModelResponse::text("5").with_usage(Usage::new(20, 1)),
    ]);
    let res = run(model.clone(), calculator(), "2+3?").await.unwrap();
    assert_eq!(res.text().as_deref(), Some("5"));
    assert_eq!(res.rounds, 2);
    assert_eq!(res.usage, Usage::new(30, 3).with_cached(4));
    assert_eq!(
        results(&res.session.history),
        [("c1".into(), false, "5".into())]
    );
    assert_valid_history(&res.session.history);
    // The model saw the tool specs and, in round 2, the result.
    let requests = model.requests();
    assert_eq!(requests[0].tools[0].name, "add");
    assert_eq!(requests[1].messages.len(), 3);
    assert_eq!(requests[1].ctx.round(), 2);
}

#[tokio::test]
async fn a_tool_can_stop_the_loop_and_later_calls_are_skipped() {
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "add", json!({"a": 1, "b": 1})),
        call("c2", "halt", json!({})),
        call("c3", "add", json!({"a": 2, "b": 2})),
    ])]);
    let tools = calculator().tool(StubTool::stopping("halt", "halted", "budget spent"));
    let res = run(model.clone(), tools, "go").await.unwrap();
    match &res.outcome {
        Outcome::Stopped {
            reason:
                StopReason::Tool {
                    call_id,
                    name,
                    reason,
                },
            progress,
        } => {
            assert_eq!(
                (call_id.as_str(), name.as_str(), reason.as_str()),
                ("c2", "halt", "budget spent")
            );
            // The call after the stop did not run: it counts as failed.
            assert_eq!(progress.to_string(), "add ✓ → halt ✓ → add ✗");
        }
        other => panic!("unexpected outcome {other:?}"),
    }
    let got = results(&res.session.history);
    assert_eq!(got[0], ("c1".into(), false, "2".into()));
    assert_eq!(got[1], ("c2".into(), false, "halted".into()));
    assert!(
        got[2].1
            && got[2]
                .2
                .contains("not executed: the run was stopped by `halt`")
    );
    assert_eq!(model.request_count(), 1, "no model call after a stop");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn max_rounds_stops_with_a_valid_history() {
    let model = ScriptedModel::from_fn(|req| {
        let n = req.ctx.round();
        Ok(ModelResponse::tool_calls([call(
            &format!("c{n}"),
            "add",
            json!({"a": n, "b": 0}),
        )]))
    });
    let agent = Agent::builder()
        .max_rounds(3)
        .build(model.clone(), calculator());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "loop"))
        .await
        .unwrap();
    let Outcome::Stopped { reason, progress } = &res.outcome else {
        panic!("unexpected outcome {:?}", res.outcome);
    };
    assert_eq!(reason, &StopReason::MaxRounds { limit: 3 });
    assert_eq!(progress.to_string(), "add ✓ → add ✓ → add ✓");
    assert_eq!(res.rounds, 3);
    assert_eq!(model.request_count(), 3);
    assert_eq!(results(&res.session.history).len(), 3);
    assert_valid_history(&res.session.history);
}

#[tokio::test(start_paused = true)]
async fn concurrent_tools_append_in_call_order_within_the_bound() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (f, p) = (in_flight.clone(), peak.clone());
    // Later calls finish first: call i sleeps (10 - i) ms.
    let slow = service_fn(move |req: ToolRequest| {
        let (f, p) = (f.clone(), p.clone());
        async move {
            let now = f.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            let i: u64 = req.call.id[1..].parse().unwrap();
            tokio::time::sleep(Duration::from_millis(10 - i)).await;
            f.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Error>(ToolResponse::success(&req.call, format!("done {i}")))
        }
    });
    let calls: Vec<ToolCall> = (0..6)
        .map(|i| call(&format!("c{i}"), "slow", json!({})))
        .collect();
    let model = ScriptedModel::new([ModelResponse::tool_calls(calls), ModelResponse::text("ok")]);
    let recorder = EventRecorder::new();
    let agent = Agent::builder()
        .concurrent_tools(3)
        .build(model, DescribedTools::none(slow));
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go").with_observer(recorder.clone()))
        .await
        .unwrap();
    let ids: Vec<String> = results(&res.session.history)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids, ["c0", "c1", "c2", "c3", "c4", "c5"]);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "at most 3 at once, and really concurrent"
    );
    let finished: Vec<String> = recorder
        .tools_finished()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_ne!(finished, ids, "completion order differs from call order");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn model_errors_return_the_session_and_the_run_resumes() {
    let model = ScriptedModel::with_results([
        Ok(ModelResponse::tool_calls([call(
            "c1",
            "add",
            json!({"a": 1, "b": 2}),
        )])),
        Err(Error::rate_limited(Some(Duration::from_secs(1)), "429")),
        Ok(ModelResponse::text("3")),
    ]);
    let agent = Agent::new(model.clone(), calculator());
    let mut err = agent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "1+2"))
        .await
        .unwrap_err();
    assert!(err.is_transient());
    let session = err
        .take_session()
        .expect("the failed run returns its session");
    assert_eq!(
        session.history.len(),
        3,
        "user, assistant call, result: nothing lost"
    );
    assert_valid_history(&session.history);

    // Saved and restored elsewhere, then continued.
    let session: Session = serde_json::from_str(&serde_json::to_string(&session).unwrap()).unwrap();
    let res = agent
        .oneshot(AgentRequest::new(session, AgentInput::Continue))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("3"));
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_panicking_model_is_an_error_not_a_crash() {
    let model = service_fn(|_req: ModelRequest| async move {
        if true {
            panic!("provider bug");
        }
        Ok::<_, Error>(ModelResponse::text("unreachable"))
    });
    let agent = Agent::new(model, calculator());
    let mut err = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the model service panicked: provider bug"),
        "{err}"
    );
    assert_eq!(err.take_session().unwrap().history.len(), 1);
}

#[tokio::test]
async fn calls_get_ids_unique_in_the_whole_session() {
    // A provider that sends no ids, or reuses them (some do), run after run.
    let model = ScriptedModel::from_fn(|req| {
        Ok(match req.messages.last().map(|m| m.role) {
            Some(Role::Tool) => ModelResponse::text("ok"),
            _ => ModelResponse::tool_calls([
                call("", "add", json!({"a": 1, "b": 1})),
                call("dup", "add", json!({"a": 2, "b": 2})),
                call("dup", "add", json!({"a": 3, "b": 3})),
            ]),
        })
    });
    let agent = Agent::new(model, calculator());
    let mut req = AgentRequest::new(Session::new(), "go");
    req.ctx = req.ctx.with_run_id("run1-abcdef");
    let first = agent.clone().oneshot(req).await.unwrap();
    let ids: Vec<String> = results(&first.session.history)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids, ["call_run1-abc_1_1", "dup", "call_run1-abc_1_3"]);

    // The next run of the same session gets the same answers from the model: no id repeats.
    let mut req = AgentRequest::new(first.session, "again");
    req.ctx = req.ctx.with_run_id("run2-abcdef");
    let second = agent.oneshot(req).await.unwrap();
    let ids: Vec<String> = results(&second.session.history)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids.len(), 6);
    assert_eq!(
        &ids[3..],
        [
            "call_run2-abc_1_1",
            "call_run2-abc_1_2",
            "call_run2-abc_1_3"
        ]
    );
    assert_valid_history(&second.session.history);
}

#[tokio::test]
async fn ids_of_input_messages_are_not_reused() {
    let earlier = call("c1", "add", json!({"a": 1, "b": 1}));
    let input = vec![
        Message::assistant_with_calls("", [earlier.clone()]),
        Message::tool_result(ToolResult::success(&earlier, "2")),
        Message::user("again"),
    ];
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 2, "b": 2}))]),
        ModelResponse::text("4"),
    ]);
    let res = Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), input))
        .await
        .unwrap();
    let ids: Vec<String> = results(&res.session.history)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[1], "c1", "the reused id was renamed");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn concurrent_rounds_stop_interrupt_and_fail_like_sequential_ones() {
    // Stop: every call of the round ran (concurrent mode), then the loop stopped.
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "halt", json!({})),
        call("c2", "add", json!({"a": 1, "b": 1})),
    ])]);
    let tools = calculator().tool(StubTool::stopping("halt", "halted", "enough"));
    let agent = Agent::builder().concurrent_tools(4).build(model, tools);
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Stopped { .. }));
    assert_eq!(
        results(&res.session.history)[1],
        ("c2".into(), false, "2".into())
    );
    assert_valid_history(&res.session.history);

    // Interrupt: the other call ran; the interrupted one waits; no error is reported.
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "ask", json!({})),
        call("c2", "add", json!({"a": 1, "b": 1})),
    ])]);
    let recorder = EventRecorder::new();
    let tools = calculator().tool(StubTool::interrupting("ask", json!({})));
    let agent = Agent::builder().concurrent_tools(4).build(model, tools);
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go").with_observer(recorder.clone()))
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));
    assert_valid_history_with_pending(&res.session.history, &["c1"]);
    // The paused call has not finished (it finishes in the run that resumes it); the other
    // did, without an error.
    assert_eq!(
        recorder.tools_finished(),
        [("c2".to_owned(), false)],
        "an interrupt is neither an error nor a finished call"
    );

    // Observer failure mid-round: the run fails, every call is answered.
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "add", json!({"a": 1, "b": 1})),
        call("c2", "add", json!({"a": 2, "b": 2})),
    ])]);
    let failing = observer_fn(|event: &Event| {
        let fail = matches!(event, Event::ToolFinished { .. });
        async move {
            if fail {
                Err(Error::other("audit down"))
            } else {
                Ok(())
            }
        }
    });
    let agent = Agent::builder()
        .concurrent_tools(4)
        .build(model, calculator());
    let mut err = agent
        .oneshot(AgentRequest::new(Session::new(), "go").with_observer(failing))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Observer);
    assert_valid_history(&err.take_session().unwrap().history);
}

/// The agent's options are shared by its requests, never copied a round: a layer that changes
/// one request's (`options_mut`) changes that request only, not the next round's nor the
/// agent's.
#[tokio::test]
async fn a_layer_changing_one_requests_options_leaves_the_agents() {
    use tower_agent_core::{Flow, GenerationOptions, before_model};

    let script = || {
        [
            ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 2}))]),
            ModelResponse::tool_calls([call("c2", "add", json!({"a": 3, "b": 4}))]),
            ModelResponse::text("done"),
        ]
    };
    let model = ScriptedModel::new(script().into_iter().chain(script()));
    let hot = tower::ServiceBuilder::new()
        .layer(before_model(|mut req: ModelRequest| async move {
            if req.ctx.round() == 1 {
                req.options_mut().temperature = Some(0.9);
            }
            Ok(Flow::Continue(req))
        }))
        .service(model.clone());
    let agent = Agent::builder()
        .options(GenerationOptions::new().temperature(0.1).max_tokens(50))
        .build(hot, calculator());
    for _ in 0..2 {
        let res = agent
            .clone()
            .oneshot(AgentRequest::new(Session::new(), "go"))
            .await
            .unwrap();
        assert_eq!(res.rounds, 3);
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 6);
    let temperatures: Vec<_> = requests.iter().map(|r| r.options.temperature).collect();
    let expected = [Some(0.9), Some(0.1), Some(0.1)];
    assert_eq!(temperatures, [expected, expected].concat());
    assert!(requests.iter().all(|r| r.options.max_tokens == Some(50)));
    // The rounds the layer left alone, of both runs, point at the agent's options.
    for r in [2, 4, 5] {
        assert!(
            Arc::ptr_eq(&requests[1].options, &requests[r].options),
            "{r}"
        );
    }
    assert!(!Arc::ptr_eq(&requests[0].options, &requests[1].options));
}
