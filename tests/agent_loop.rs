//! End-to-end scenarios of the agent loop, as a host application writes them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::service_fn;
use tower_agent::Tool as _;
use tower_agent::prelude::*;
use tower_agent::{History, StopReason, Usage};
use tower_agent_test::{
    EventRecorder, ScriptedModel, StubTool, assert_valid_history, assert_valid_history_with_pending,
};

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

fn results(history: &[Message]) -> Vec<(String, bool, String)> {
    history
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| (r.call_id.clone(), r.is_error, r.content.clone()))
        .collect()
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

fn calculator() -> ToolSet {
    ToolSet::new().tool(tool_fn(
        "add",
        "Add two integers.",
        |args: AddArgs| async move { Ok::<_, Error>(args.a + args.b) },
    ))
}

async fn run(model: ScriptedModel, tools: ToolSet, input: &str) -> Result<AgentResponse, Error> {
    let agent = Agent::builder()
        .tool_specs(tools.specs())
        .build(model, tools);
    agent
        .oneshot(AgentRequest::new(Session::new(), input))
        .await
}

#[tokio::test]
async fn completes_and_sums_usage() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 2, "b": 3}))]).with_usage(Usage {
            input_tokens: 10,
            output_tokens: 2,
        }),
        ModelResponse::text("5").with_usage(Usage {
            input_tokens: 20,
            output_tokens: 1,
        }),
    ]);
    let res = run(model.clone(), calculator(), "2+3?").await.unwrap();
    assert_eq!(res.text().as_deref(), Some("5"));
    assert_eq!(res.rounds, 2);
    assert_eq!(
        res.usage,
        Usage {
            input_tokens: 30,
            output_tokens: 3
        }
    );
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
        } => {
            assert_eq!(
                (call_id.as_str(), name.as_str(), reason.as_str()),
                ("c2", "halt", "budget spent")
            );
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
    assert_eq!(
        res.outcome,
        Outcome::Stopped {
            reason: StopReason::MaxRounds { limit: 3 }
        }
    );
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
    let agent = Agent::builder().concurrent_tools(3).build(model, slow);
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
async fn tool_result_parts_from_the_model_are_dropped() {
    let bogus = ToolResult::success(&call("x", "add", json!({})), "forged");
    let model = ScriptedModel::new([ModelResponse::from_parts(vec![
        tower_agent::ContentPart::Text { text: "hi".into() },
        tower_agent::ContentPart::ToolResult(bogus),
    ])]);
    let res = run(model, calculator(), "go").await.unwrap();
    assert_eq!(res.session.history.last().unwrap().content.len(), 1);
    assert_valid_history(&res.session.history);
}

mod cancellation {
    use super::*;

    #[tokio::test]
    async fn before_the_first_model_call() {
        let model = ScriptedModel::new([ModelResponse::text("never")]);
        let token = CancellationToken::new();
        token.cancel();
        let agent = Agent::new(model.clone(), calculator());
        let res = agent
            .oneshot(AgentRequest::new(Session::new(), "hi").with_cancellation(token))
            .await
            .unwrap();
        assert_eq!(res.outcome, Outcome::Cancelled);
        assert_eq!(model.request_count(), 0);
        assert_eq!(res.session.history.len(), 1, "the input is kept");
    }

    #[tokio::test]
    async fn during_the_model_call() {
        let called = Arc::new(AtomicUsize::new(0));
        let c = called.clone();
        let model = service_fn(move |_req: ModelRequest| {
            c.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<ModelResponse, Error>>()
        });
        let agent = Agent::new(model, calculator());
        let token = CancellationToken::new();
        let run = tokio::spawn(
            agent.oneshot(AgentRequest::new(Session::new(), "hi").with_cancellation(token.clone())),
        );
        while called.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        token.cancel();
        let res = run.await.unwrap().unwrap();
        assert_eq!(res.outcome, Outcome::Cancelled);
        assert_valid_history(&res.session.history);
    }

    #[tokio::test]
    async fn between_tool_calls() {
        // The first tool cancels the run; the second must not run.
        let canceller = StubTool::from_fn("cancel", |req: &ToolRequest| {
            req.ctx.cancel();
            ToolResponse::success(&req.call, "cancelling")
        });
        let after = StubTool::returning("after", "ran");
        let model = ScriptedModel::new([ModelResponse::tool_calls([
            call("c1", "cancel", json!({})),
            call("c2", "after", json!({})),
        ])]);
        let tools = ToolSet::new().tool(canceller).tool(after.clone());
        let res = run(model.clone(), tools, "go").await.unwrap();
        assert_eq!(res.outcome, Outcome::Cancelled);
        assert!(after.calls().is_empty());
        let got = results(&res.session.history);
        assert_eq!(got[0], ("c1".into(), false, "cancelling".into()));
        assert_eq!(got[1], ("c2".into(), true, ToolResult::CANCELLED.into()));
        assert_eq!(model.request_count(), 1);
        assert_valid_history(&res.session.history);
    }

    #[tokio::test]
    async fn during_a_tool_call_sequential_and_concurrent() {
        for concurrent in [false, true] {
            let model = ScriptedModel::new([ModelResponse::tool_calls([
                call("c1", "add", json!({"a": 1, "b": 1})),
                call("c2", "hang", json!({})),
                call("c3", "add", json!({"a": 2, "b": 2})),
            ])]);
            let hang = StubTool::hanging("hang");
            let tools = calculator().tool(hang.clone());
            let builder = Agent::builder();
            let builder = if concurrent {
                builder.concurrent_tools(3)
            } else {
                builder
            };
            let agent = builder.build(model, tools);
            let token = CancellationToken::new();
            let run =
                tokio::spawn(agent.oneshot(
                    AgentRequest::new(Session::new(), "go").with_cancellation(token.clone()),
                ));
            while hang.calls().is_empty() {
                tokio::task::yield_now().await;
            }
            token.cancel();
            let res = run.await.unwrap().unwrap();
            assert_eq!(res.outcome, Outcome::Cancelled, "concurrent: {concurrent}");
            let got = results(&res.session.history);
            assert_eq!(
                got[0],
                ("c1".into(), false, "2".into()),
                "concurrent: {concurrent}"
            );
            assert_eq!(got[1].2, ToolResult::CANCELLED, "concurrent: {concurrent}");
            // Sequentially c3 never started; concurrently it ran beside the hanging c2.
            let c3 = if concurrent {
                "4"
            } else {
                ToolResult::CANCELLED
            };
            assert_eq!(got[2].2, c3, "concurrent: {concurrent}");
            assert_valid_history(&res.session.history);
        }
    }

    #[tokio::test]
    async fn a_cancelled_session_can_continue() {
        let model = ScriptedModel::new([ModelResponse::text("back")]);
        let token = CancellationToken::new();
        token.cancel();
        let agent = Agent::new(model, calculator());
        let res = agent
            .clone()
            .oneshot(AgentRequest::new(Session::new(), "hi").with_cancellation(token))
            .await
            .unwrap();
        let res = agent
            .oneshot(AgentRequest::new(res.session, AgentInput::Continue))
            .await
            .unwrap();
        assert_eq!(res.text().as_deref(), Some("back"));
    }
}

mod interrupts {
    use super::*;

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
            .oneshot(AgentRequest::new(
                session,
                AgentInput::Resume(json!("approved")),
            ))
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
                AgentInput::Resume(json!(true)),
            ))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert_eq!(err.take_session().unwrap().id, "s");
    }
}

mod events {
    use super::*;

    #[tokio::test]
    async fn are_emitted_in_order() {
        let model = ScriptedModel::new([
            ModelResponse::new(Message::assistant_with_calls(
                "let me add",
                [call("c1", "add", json!({"a": 1, "b": 1}))],
            )),
            ModelResponse::text("2"),
        ]);
        let recorder = EventRecorder::new();
        let agent = Agent::new(model, calculator());
        agent
            .oneshot(AgentRequest::new(Session::new(), "1+1").with_observer(recorder.clone()))
            .await
            .unwrap();
        assert_eq!(
            recorder.names(),
            [
                "run_started",
                "round_started",
                "text",
                "round_completed",
                "tool_started",
                "tool_finished",
                "round_started",
                "text",
                "round_completed",
                "run_finished",
            ]
        );
        let events = recorder.events();
        match &events[3] {
            Event::RoundCompleted {
                round,
                message,
                history,
                ..
            } => {
                assert_eq!(*round, 1);
                assert!(message.has_tool_calls());
                let history = history.as_ref().expect("observers get the snapshot");
                assert_eq!(history.len(), 2, "user + assistant, before the tool ran");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            &events[5],
            Event::ToolFinished {
                is_error: false,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn an_observer_error_stops_the_run_and_is_returned() {
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))]),
            ModelResponse::text("2"),
        ]);
        let failing = observer_fn(|event: &Event| {
            let fail = matches!(event, Event::ToolStarted { .. });
            async move {
                if fail {
                    Err(Error::other("audit log unavailable"))
                } else {
                    Ok(())
                }
            }
        });
        let agent = Agent::new(model.clone(), calculator());
        let mut err = agent
            .oneshot(AgentRequest::new(Session::new(), "1+1").with_observer(failing))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Observer);
        assert!(err.to_string().contains("audit log unavailable"));
        assert_eq!(model.request_count(), 1, "the run stopped");
        let session = err.take_session().unwrap();
        assert_valid_history(&session.history);
    }
}

mod state {
    use super::*;

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
            .before_model(|mut req: ModelRequest| async move {
                if req.ctx.round() == 1 {
                    req.messages.push(Message::user("(reminder: be brief)"));
                } else {
                    let kept: History = req.messages.iter().skip(1).cloned().collect();
                    req.ctx.commit_history(kept);
                }
                Ok(Flow::Continue(req))
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
}

#[tokio::test]
async fn a_stack_of_all_six_points_and_observers_serves_sessions_from_other_tasks() {
    fn assert_clone_send_static<T: Clone + Send + 'static>(_: &T) {}
    let model = ServiceBuilder::new()
        .observe(ObserveLayer::new().on_request(|_: &ModelRequest| {}))
        .after_model(|res: ModelResponse, _: RunContext| async move { Ok(Flow::Continue(res)) })
        .before_model(|req: ModelRequest| async move { Ok(Flow::Continue(req)) })
        .service(ScriptedModel::from_fn(|_| Ok(ModelResponse::text("hi"))));
    let tools = ServiceBuilder::new()
        .after_tool(|res: ToolResponse, _: RunContext| async move { Ok(Flow::Continue(res)) })
        .before_tool(|req: ToolRequest| async move { Ok(Flow::Continue(req)) })
        .service(calculator());
    let agent = ServiceBuilder::new()
        .after_agent(|res: AgentResponse, _: RunContext| async move { Ok(Flow::Continue(res)) })
        .before_agent(|req: AgentRequest| async move { Ok(Flow::Continue(req)) })
        .service(Agent::new(model, tools));
    assert_clone_send_static(&agent);
    // One composed stack, several sessions at once, each on its own task.
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let agent = agent.clone();
            tokio::spawn(agent.oneshot(AgentRequest::new(Session::with_id(format!("s{i}")), "hi")))
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let res = run.await.unwrap().unwrap();
        assert_eq!(res.session.id, format!("s{i}"));
        assert_eq!(res.text().as_deref(), Some("hi"));
    }
}

#[tokio::test]
async fn a_streaming_provider_emits_deltas_inside_its_round() {
    // The contract for providers: deltas go through the request's context.
    let model = service_fn(|req: ModelRequest| async move {
        for delta in ["Hel", "lo"] {
            req.ctx
                .emit(Event::TextDelta {
                    round: req.ctx.round(),
                    delta: delta.into(),
                })
                .await?;
        }
        Ok::<_, Error>(ModelResponse::text("Hello"))
    });
    let recorder = EventRecorder::new();
    Agent::new(model, calculator())
        .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
        .await
        .unwrap();
    assert_eq!(
        recorder.names(),
        [
            "run_started",
            "round_started",
            "text_delta",
            "text_delta",
            "text",
            "round_completed",
            "run_finished"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn per_tool_middleware_bounds_one_tool_only() {
    // A concurrent round of six calls: `slow` is limited to one at a time, `fast` is not.
    let probe = |name: &'static str, in_flight: Arc<AtomicUsize>, peak: Arc<AtomicUsize>| {
        StubTool::from_fn(name, move |req: &ToolRequest| {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            ToolResponse::success(&req.call, "ok")
        })
    };
    let (slow_now, slow_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let slow = probe("slow", slow_now.clone(), slow_peak.clone());
    // Each call holds its permit until the stub's response is built; a delay makes calls
    // overlap, and the counter is decremented by an after_tool callback.
    let delayed = |tool: StubTool, now: Arc<AtomicUsize>| {
        ServiceBuilder::new()
            .after_tool(move |res: ToolResponse, _: RunContext| {
                let now = now.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(Flow::Continue(res))
                }
            })
            .service(tool)
    };
    let tools = ToolSet::new().service(
        StubTool::returning("slow", "").spec(),
        ServiceBuilder::new()
            .concurrency_limit(1)
            .service(delayed(slow, slow_now)),
    );
    let (fast_now, fast_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let fast = probe("fast", fast_now.clone(), fast_peak.clone());
    let tools = tools.service(
        StubTool::returning("fast", "").spec(),
        delayed(fast, fast_now),
    );
    let calls = (0..6).map(|i| {
        call(
            &format!("c{i}"),
            if i % 2 == 0 { "slow" } else { "fast" },
            json!({}),
        )
    });
    let model = ScriptedModel::new([ModelResponse::tool_calls(calls), ModelResponse::text("ok")]);
    let res = Agent::builder()
        .concurrent_tools(6)
        .build(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_valid_history(&res.session.history);
    assert_eq!(
        slow_peak.load(Ordering::SeqCst),
        1,
        "the limited tool ran one at a time"
    );
    assert_eq!(
        fast_peak.load(Ordering::SeqCst),
        3,
        "the other ran all its calls at once"
    );
}

mod robustness {
    use super::*;

    #[tokio::test]
    async fn commits_outside_a_model_call_are_discarded_and_bad_commits_refused() {
        // A tool tries to commit: ignored, the session keeps its history.
        let committer = StubTool::from_fn("commit", |req: &ToolRequest| {
            req.ctx.commit_history(History::new());
            ToolResponse::success(&req.call, "committed")
        });
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([call("c1", "commit", json!({}))]),
            ModelResponse::text("done"),
        ]);
        let res = run(model, ToolSet::new().tool(committer), "go")
            .await
            .unwrap();
        assert_eq!(res.session.history.len(), 4, "user, call, result, answer");
        assert_valid_history(&res.session.history);

        // A before_model layer commits a history that splits a call from its result.
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 1}))]),
            ModelResponse::text("unreachable"),
        ]);
        let model = ServiceBuilder::new()
            .before_model(|req: ModelRequest| async move {
                if req.ctx.round() == 2 {
                    let broken: History = req.messages.iter().take(2).cloned().collect();
                    req.ctx.commit_history(broken);
                }
                Ok(Flow::Continue(req))
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
        assert!(
            results(sent)[0]
                .2
                .starts_with("cancelled: the previous run ended")
        );
    }

    #[tokio::test]
    async fn stale_interrupts_are_refused() {
        let mut session = Session::new().with_history(vec![Message::user("hi")]);
        session.interrupts.push(tower_agent::Interrupt {
            call: call("ghost", "add", json!({})),
            payload: json!(null),
        });
        let mut err = Agent::new(ScriptedModel::new([]), calculator())
            .oneshot(AgentRequest::new(session, AgentInput::Resume(json!(true))))
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
            .oneshot(AgentRequest::new(
                paused.session,
                AgentInput::Resume(json!("yes")),
            ))
            .await
            .unwrap();
        let ids: Vec<String> = results(&res.session.history)
            .into_iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(ids, ["c1", "c2"]);
        assert_valid_history(&res.session.history);
    }

    #[tokio::test]
    async fn cancellation_during_a_resumed_call() {
        let hang = StubTool::hanging("slow_approval");
        let session = Session::new().with_history(vec![
            Message::user("go"),
            Message::assistant_with_calls("", [call("c1", "slow_approval", json!({}))]),
        ]);
        let mut session = session;
        session.interrupts.push(tower_agent::Interrupt {
            call: call("c1", "slow_approval", json!({})),
            payload: json!({}),
        });
        let agent = Agent::new(ScriptedModel::new([]), ToolSet::new().tool(hang.clone()));
        let run = agent.spawn(AgentRequest::new(session, AgentInput::Resume(json!("ok"))));
        while hang.calls().is_empty() {
            tokio::task::yield_now().await;
        }
        run.cancel();
        let res = run.join().await.unwrap();
        assert_eq!(res.outcome, Outcome::Cancelled);
        assert_eq!(results(&res.session.history)[0].2, ToolResult::CANCELLED);
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
        let errors: Vec<bool> = recorder
            .tools_finished()
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        assert_eq!(errors, [false, false], "an interrupt is not an error");

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
}

mod cancellation_and_events {
    use super::*;

    /// An observer that cancels the run when it sees `trigger`, after yielding once (as an
    /// observer doing real I/O would).
    fn cancel_on(trigger: &'static str, token: CancellationToken) -> impl tower_agent::Observer {
        observer_fn(move |event: &Event| {
            let hit = event.name() == trigger;
            let token = token.clone();
            async move {
                tokio::task::yield_now().await;
                if hit {
                    token.cancel();
                }
                Ok(())
            }
        })
    }

    #[tokio::test]
    async fn nothing_starts_after_a_cancel_that_lands_during_an_event() {
        for (trigger, concurrent) in [
            ("round_started", false),
            ("tool_started", false),
            ("tool_started", true),
        ] {
            let model =
                ScriptedModel::new([ModelResponse::tool_calls([call("c1", "t", json!({}))])]);
            let tool = StubTool::returning("t", "side effect!");
            let builder = if concurrent {
                Agent::builder().concurrent_tools(2)
            } else {
                Agent::builder()
            };
            let agent = builder.build(model.clone(), ToolSet::new().tool(tool.clone()));
            let token = CancellationToken::new();
            let recorder = EventRecorder::new();
            let req = AgentRequest::new(Session::new(), "go")
                .with_cancellation(token.clone())
                .with_observer(cancel_on(trigger, token))
                .with_observer(recorder.clone());
            let res = agent.oneshot(req).await.unwrap();
            let case = format!("{trigger}, concurrent: {concurrent}");
            assert_eq!(res.outcome, Outcome::Cancelled, "{case}");
            assert!(
                tool.calls().is_empty(),
                "the tool ran after the cancel ({case})"
            );
            if trigger == "round_started" {
                assert_eq!(
                    model.request_count(),
                    0,
                    "the model was called after the cancel"
                );
            }
            assert_valid_history(&res.session.history);
            // The final event reached every observer, though the run was cancelled and the
            // first observer awaits before returning.
            match recorder.events().last() {
                Some(Event::RunFinished { outcome }) => assert_eq!(*outcome, Outcome::Cancelled),
                other => panic!("last event {other:?} ({case})"),
            }
        }
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
    async fn new_input_drops_stale_interrupts_and_duplicates_are_refused() {
        let ghost = tower_agent::Interrupt {
            call: call("ghost", "add", json!({})),
            payload: json!(null),
        };
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
        let twice = tower_agent::Interrupt {
            call: pending,
            payload: json!(null),
        };
        session.interrupts = vec![twice.clone(), twice];
        let err = Agent::new(ScriptedModel::new([]), calculator())
            .oneshot(AgentRequest::new(session, AgentInput::Resume(json!(true))))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }
}
