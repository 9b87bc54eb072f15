//! Sequential and loop workflows: order, modes, outcomes, judges, events and paths, nested
//! interrupts saved, loaded and resumed, cancellation.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, Decision, Error, ErrorKind, ModelResponse, Outcome, ResponseFormat,
    Role, Session, StopReason, ToolCall,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;
use tower_agent_workflow::events::{
    AgentEnded, AgentFailed, AgentStarted, IterationEnded, IterationStarted,
};
use tower_agent_workflow::{
    JudgeRequest, Loop, ModelJudge, STATE_KEY, Sequential, Verdict, WorkflowObserver, judge_fn,
    workflow_observer,
};

fn texts(responses: &[&str]) -> ScriptedModel {
    ScriptedModel::new(responses.iter().map(|t| ModelResponse::text(*t)))
}

fn agent(model: &ScriptedModel) -> Agent<ScriptedModel, ToolSet> {
    Agent::new(model.clone(), ToolSet::new())
}

/// The events as `origin path | event name | the event's own path`.
fn trace(recorder: &EventRecorder) -> Vec<String> {
    recorder
        .events()
        .iter()
        .map(|event| {
            let (origin, inner) = event.origin();
            let own = if let Some(AgentStarted { path, .. }) = inner.downcast_ref() {
                path.to_string()
            } else if let Some(AgentEnded { path, .. }) = inner.downcast_ref() {
                path.to_string()
            } else if let Some(AgentFailed { path, .. }) = inner.downcast_ref() {
                path.to_string()
            } else if let Some(IterationStarted {
                path, iteration, ..
            }) = inner.downcast_ref()
            {
                format!("{path}#{iteration}")
            } else if let Some(IterationEnded {
                path, iteration, ..
            }) = inner.downcast_ref()
            {
                format!("{path}#{iteration}")
            } else {
                String::new()
            };
            format!("{} | {} | {own}", origin.unwrap_or("-"), inner.name())
        })
        .collect()
}

#[tokio::test]
async fn shared_steps_run_in_order_on_one_session() {
    let coder = texts(&["fn add() {}"]);
    let reviewer = texts(&["LGTM"]);
    let pipeline = Sequential::new("pipeline")
        .step("coder", agent(&coder))
        .step_with_input("reviewer", agent(&reviewer), "Review it.");
    let res = pipeline
        .oneshot(AgentRequest::new(Session::with_id("s"), "Write add()."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("LGTM"));
    assert_eq!(res.rounds, 2);
    let history: Vec<String> = res.session.history.iter().map(|m| m.text()).collect();
    assert_eq!(
        history,
        ["Write add().", "fn add() {}", "Review it.", "LGTM"]
    );
    // The reviewer saw everything before it.
    assert_eq!(reviewer.requests()[0].messages.len(), 3);
    assert!(
        !res.session.state.contains_key(STATE_KEY.name()),
        "no position left"
    );

    // Without an input of its own, a later step continues from the history.
    let second = texts(&["done"]);
    let res = Sequential::new("p")
        .step("one", agent(&texts(&["first"])))
        .step("two", agent(&second))
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("runs");
    assert_eq!(second.requests()[0].messages.len(), 2);
    assert_eq!(res.session.history.len(), 3);
}

#[tokio::test]
async fn a_step_that_does_not_complete_ends_the_run_and_continue_goes_on_from_it() {
    let first = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "ls", json!({}))]),
        ModelResponse::text("listed"),
    ]);
    let second = texts(&["summarized"]);
    // The first step may make one model call per run: it stops after its tool call.
    let step_one = Agent::builder().max_rounds(1).build(
        first.clone(),
        ToolSet::new().tool(StubTool::returning("ls", "a b")),
    );
    let pipeline = Sequential::new("p").step("one", step_one).step_with_input(
        "two",
        agent(&second),
        "Summarize.",
    );
    let res = pipeline
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "go"))
        .await
        .expect("runs");
    assert!(matches!(
        res.outcome,
        Outcome::Stopped {
            reason: StopReason::MaxRounds { limit: 1 },
            ..
        }
    ));
    assert_eq!(second.request_count(), 0, "the second step did not run");
    assert_eq!(res.session.state[STATE_KEY.name()]["p"], json!({"step": 0}));

    // Continue: the first step goes on, then the second runs.
    let res = pipeline
        .oneshot(AgentRequest::new(res.session, AgentInput::Continue))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("summarized"));
    assert!(!res.session.state.contains_key(STATE_KEY.name()));
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn isolated_steps_get_the_previous_answer_on_their_own_session() {
    let coder = texts(&["fn add() {}"]);
    let reviewer = texts(&["LGTM"]);
    let pipeline = Sequential::new("p")
        .step("coder", agent(&coder))
        .step("reviewer", agent(&reviewer))
        .isolated();
    let res = pipeline
        .oneshot(AgentRequest::new(Session::with_id("s"), "Write add()."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("LGTM"));
    let seen = &reviewer.requests()[0].messages;
    assert_eq!(seen.len(), 1, "the reviewer's own session");
    assert_eq!(seen[0].text(), "fn add() {}");
    assert_eq!(seen[0].role, Role::User);
    let history: Vec<String> = res.session.history.iter().map(|m| m.text()).collect();
    assert_eq!(history, ["Write add().", "LGTM"]);
}

#[tokio::test]
async fn a_failing_step_fails_the_workflow_with_the_session_and_its_position() {
    let failing = ScriptedModel::with_results([Err(Error::new(ErrorKind::Server, "down"))]);
    let recorder = EventRecorder::new();
    let error = Sequential::new("p")
        .step("one", agent(&texts(&["ok"])))
        .step("two", agent(&failing))
        .oneshot(AgentRequest::new(Session::with_id("s"), "go").with_observer(recorder.clone()))
        .await
        .expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::Server);
    let session = error.session().expect("carries the session");
    assert_eq!(session.state[STATE_KEY.name()]["p"], json!({"step": 1}));
    assert_eq!(
        session.history[1].text(),
        "ok",
        "the first step's work is kept"
    );
    let trace = trace(&recorder);
    assert!(
        trace.contains(&"- | agent_failed | p/two".to_owned()),
        "{trace:#?}"
    );
}

fn approve_after(n: u32) -> impl tower_agent_workflow::Judge {
    judge_fn(move |req: &JudgeRequest| {
        let done = req.iteration >= n;
        async move {
            Ok(if done {
                Verdict::stop("approved")
            } else {
                Verdict::proceed("add tests")
            })
        }
    })
}

#[tokio::test]
async fn a_loop_runs_until_the_judge_says_stop() {
    let writer = texts(&["v1", "v2", "v3"]);
    let res = Loop::new("l", agent(&writer), approve_after(3))
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("v3"));
    assert_eq!(writer.request_count(), 3);
    // Each later iteration got the judge's reason as its input.
    let second = &writer.requests()[1].messages;
    assert_eq!(
        second.last().map(|m| m.text()).as_deref(),
        Some("The judge asked for another iteration: add tests")
    );
}

#[tokio::test]
async fn a_loop_stops_at_its_limit() {
    let writer = texts(&["v1", "v2", "v3"]);
    let recorder = EventRecorder::new();
    let res = Loop::new("l", agent(&writer), approve_after(100))
        .max_iterations(2)
        .next_input(|n, _| AgentInput::from(format!("try {}", n + 1)))
        .oneshot(AgentRequest::new(Session::new(), "Write.").with_observer(recorder.clone()))
        .await
        .expect("runs");
    assert_eq!(
        res.outcome,
        Outcome::Stopped {
            reason: StopReason::MaxIterations { limit: 2 },
            progress: Default::default()
        }
    );
    assert_eq!(writer.request_count(), 2);
    assert_eq!(writer.requests()[1].messages[2].text(), "try 2");
    let last = recorder.events().into_iter().rev().find_map(|e| {
        let ended = e.downcast_ref::<IterationEnded>()?;
        Some((ended.next, ended.reason.clone()))
    });
    assert_eq!(
        last,
        Some((
            false,
            "add tests (the limit of 2 iterations is reached)".to_owned()
        ))
    );
}

#[tokio::test]
async fn a_model_judge_is_parsed_strictly_and_asked_once_more() {
    // Unreadable, then readable.
    let judge_model = ScriptedModel::new([
        ModelResponse::text("I think it is done!"),
        ModelResponse::text(r#"{"decision": "stop", "reason": "tests pass"}"#),
    ]);
    let writer = texts(&["v1"]);
    let res = Loop::new("l", agent(&writer), ModelJudge::new(judge_model.clone()))
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("v1"));
    assert_eq!(judge_model.request_count(), 2);
    // Each request asks for the verdict's shape, strictly.
    for request in judge_model.requests() {
        let Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
            ..
        }) = &request.options.response_format
        else {
            panic!("no response format: {:?}", request.options);
        };
        assert_eq!((name.as_str(), *strict), ("verdict", true));
        assert_eq!(
            schema["required"],
            serde_json::json!(["decision", "reason"])
        );
        assert_eq!(
            schema["properties"]["decision"]["enum"],
            serde_json::json!(["continue", "stop"])
        );
    }
    let again = &judge_model.requests()[1].messages;
    assert!(again[0].text().contains("v1"), "the judge reads the result");
    assert!(again[2].text().starts_with("That is not a valid verdict"));

    // Unreadable twice: the loop stops, saying why.
    let judge_model = ScriptedModel::new([
        ModelResponse::text("yes"),
        ModelResponse::text(r#"{"decision": "stop"}"#),
    ]);
    let res = Loop::new("l", agent(&texts(&["v1"])), ModelJudge::new(judge_model))
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect("runs");
    let Outcome::Stopped {
        reason: StopReason::Judge { reason },
        ..
    } = &res.outcome
    else {
        panic!("{:?}", res.outcome);
    };
    assert!(reason.contains("could not be read twice"), "{reason}");
    assert!(reason.contains("missing field `reason`"), "{reason}");

    // A judge whose model fails fails the loop.
    let judge_model = ScriptedModel::with_results([Err(Error::new(ErrorKind::Auth, "key"))]);
    let error = Loop::new("l", agent(&texts(&["v1"])), ModelJudge::new(judge_model))
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect_err("fails");
    assert_eq!(error.kind(), ErrorKind::Auth);
    assert!(error.session().is_some());
}

#[tokio::test]
async fn events_are_ordered_and_tagged_with_paths() {
    let coder = texts(&["c1", "c2"]);
    let reviewer = texts(&["r1", "r2"]);
    let recorder = EventRecorder::new();
    let coding = Loop::new(
        "coding_loop",
        Sequential::new("pair")
            .step("coder", agent(&coder))
            .step_with_input("reviewer", agent(&reviewer), "Review."),
        approve_after(2),
    );
    coding
        .oneshot(AgentRequest::new(Session::new(), "Build it.").with_observer(recorder.clone()))
        .await
        .expect("runs");
    let trace = trace(&recorder);
    let iteration_two: Vec<&str> = trace
        .iter()
        .map(String::as_str)
        .skip_while(|line| *line != "- | iteration_started | coding_loop#2")
        .collect();
    assert_eq!(
        iteration_two,
        [
            "- | iteration_started | coding_loop#2",
            "- | agent_started | coding_loop/2",
            "coding_loop/2 | agent_started | coding_loop/2/coder",
            "coding_loop/2/coder | run_started | ",
            "coding_loop/2/coder | round_started | ",
            "coding_loop/2/coder | text_delta | ",
            "coding_loop/2/coder | text | ",
            "coding_loop/2/coder | round_completed | ",
            "coding_loop/2/coder | run_finished | ",
            "coding_loop/2 | agent_ended | coding_loop/2/coder",
            "coding_loop/2 | agent_started | coding_loop/2/reviewer",
            "coding_loop/2/reviewer | run_started | ",
            "coding_loop/2/reviewer | round_started | ",
            "coding_loop/2/reviewer | text_delta | ",
            "coding_loop/2/reviewer | text | ",
            "coding_loop/2/reviewer | round_completed | ",
            "coding_loop/2/reviewer | run_finished | ",
            "coding_loop/2 | agent_ended | coding_loop/2/reviewer",
            "- | agent_ended | coding_loop/2",
            "- | iteration_ended | coding_loop#2",
        ]
    );
}

#[derive(Default)]
struct Hooks(Mutex<Vec<String>>);

impl WorkflowObserver for Hooks {
    fn agent_ended(&self, path: &str, outcome: &Outcome) {
        let done = matches!(outcome, Outcome::Completed { .. });
        self.0
            .lock()
            .expect("lock")
            .push(format!("ended {path} {done}"));
    }
    fn iteration_ended(&self, path: &str, iteration: u32, next: bool, _reason: &str) {
        self.0
            .lock()
            .expect("lock")
            .push(format!("iteration {path} {iteration} {next}"));
    }
    fn tool_finished(&self, path: &str, name: &str, is_error: bool) {
        self.0
            .lock()
            .expect("lock")
            .push(format!("tool {path} {name} {is_error}"));
    }
}

#[tokio::test]
async fn a_workflow_observer_implements_only_the_hooks_it_needs() {
    let hooks = Arc::new(Hooks::default());
    struct Shared(Arc<Hooks>);
    impl WorkflowObserver for Shared {
        fn agent_ended(&self, path: &str, outcome: &Outcome) {
            self.0.agent_ended(path, outcome)
        }
        fn iteration_ended(&self, path: &str, iteration: u32, next: bool, reason: &str) {
            self.0.iteration_ended(path, iteration, next, reason)
        }
        fn tool_finished(&self, path: &str, name: &str, is_error: bool) {
            self.0.tool_finished(path, name, is_error)
        }
    }
    let worker = Agent::new(
        ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("c1", "ls", json!({}))]),
            ModelResponse::text("done"),
        ]),
        ToolSet::new().tool(StubTool::returning("ls", "a")),
    );
    Loop::new("l", worker, approve_after(1))
        .oneshot(
            AgentRequest::new(Session::new(), "go")
                .with_observer(workflow_observer(Shared(hooks.clone()))),
        )
        .await
        .expect("runs");
    assert_eq!(
        *hooks.0.lock().expect("lock"),
        ["tool l/1 ls false", "ended l/1 true", "iteration l 1 false"]
    );
}

/// Coder, then a reviewer whose `merge` needs a human: iteration 2 pauses there.
struct Nested {
    coder: ScriptedModel,
    reviewer: ScriptedModel,
    merge: StubTool,
}

impl Nested {
    fn new() -> Self {
        Self {
            coder: texts(&["code v1", "code v2"]),
            reviewer: ScriptedModel::new([
                ModelResponse::text("needs tests"),
                ModelResponse::tool_calls([ToolCall::new("m1", "merge", json!({"pr": 7}))]),
                ModelResponse::text("merged"),
            ]),
            merge: StubTool::returning("merge", "merged #7"),
        }
    }

    fn workflow(&self) -> Loop {
        let approval = ApprovalLayer::builder()
            .gate("merge", Gate::new())
            .build()
            .expect("valid");
        let reviewer = Agent::new(
            self.reviewer.clone(),
            ServiceBuilder::new()
                .layer(approval)
                .service(ToolSet::new().tool(self.merge.clone())),
        );
        Loop::new(
            "coding_loop",
            Sequential::new("pair")
                .step("coder", agent(&self.coder))
                .step_with_input("reviewer", reviewer, "Review."),
            judge_fn(|req: &JudgeRequest| {
                let merged = req.text() == "merged";
                async move {
                    Ok(if merged {
                        Verdict::stop("merged")
                    } else {
                        Verdict::proceed("add tests")
                    })
                }
            }),
        )
    }
}

#[tokio::test]
async fn a_nested_interrupt_is_saved_loaded_and_resumed_at_its_iteration() {
    let kit = Nested::new();
    let res = kit
        .workflow()
        .oneshot(AgentRequest::new(Session::with_id("s"), "Build it."))
        .await
        .expect("runs");
    let Outcome::Interrupted { interrupts } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(interrupts[0].call.name, "merge");
    assert_eq!(res.session.interrupts.len(), 1);
    assert_eq!(
        res.session.state[STATE_KEY.name()],
        json!({"coding_loop": {"iteration": 2}, "coding_loop/2": {"step": 1}})
    );
    assert_eq!(kit.merge.calls().len(), 0);

    // Saved, loaded elsewhere, resumed with a fresh workflow.
    let saved = serde_json::to_string(&res.session).expect("saves");
    let loaded: Session = serde_json::from_str(&saved).expect("loads");
    let recorder = EventRecorder::new();
    let res = kit
        .workflow()
        .oneshot(
            AgentRequest::resume_all(loaded, Decision::Approve).with_observer(recorder.clone()),
        )
        .await
        .expect("resumes");
    assert_eq!(res.text().as_deref(), Some("merged"));
    assert_eq!(kit.merge.calls().len(), 1, "the approved call ran once");
    assert_eq!(
        kit.coder.request_count(),
        2,
        "the coder of iteration 2 did not run again"
    );
    assert!(!res.session.state.contains_key(STATE_KEY.name()));
    assert_valid_history(&res.session.history);
    let trace = trace(&recorder);
    assert_eq!(
        trace[0], "- | iteration_started | coding_loop#2",
        "{trace:#?}"
    );
    assert_eq!(
        trace[2],
        "coding_loop/2 | agent_started | coding_loop/2/reviewer"
    );
}

#[tokio::test]
async fn a_cancelled_workflow_keeps_its_place() {
    let token = tower_agent_core::CancellationToken::new();
    let worker = Agent::new(
        ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("c1", "wait", json!({}))]),
            ModelResponse::text("done"),
        ]),
        ToolSet::new().tool(StubTool::hanging("wait")),
    );
    let workflow = Loop::new("l", worker, approve_after(1));
    let run = tokio::spawn(
        workflow
            .clone()
            .oneshot(AgentRequest::new(Session::new(), "go").with_cancellation(token.clone())),
    );
    tokio::task::yield_now().await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    token.cancel();
    let res = run.await.expect("joins").expect("runs");
    assert!(
        matches!(res.outcome, Outcome::Cancelled { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(
        res.session.state[STATE_KEY.name()]["l"],
        json!({"iteration": 1})
    );
    assert_valid_history(&res.session.history);

    // A workflow cancelled before it starts runs nothing.
    let token = tower_agent_core::CancellationToken::new();
    token.cancel();
    let model = texts(&["never"]);
    let res = Sequential::new("p")
        .step("one", agent(&model))
        .oneshot(AgentRequest::new(Session::new(), "go").with_cancellation(token))
        .await
        .expect("runs");
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_eq!(model.request_count(), 0);
    // The input is kept: continuing runs the step on it.
    assert_eq!(res.session.history.len(), 1);
    assert_eq!(res.session.history[0].text(), "go");
    let res = Sequential::new("p")
        .step("one", agent(&model))
        .oneshot(AgentRequest::new(res.session, AgentInput::Continue))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("never"));
    assert_eq!(model.requests()[0].messages[0].text(), "go");
}

#[tokio::test]
async fn a_fresh_start_forgets_the_places_of_nested_workflows() {
    let kit = Nested::new();
    let res = kit
        .workflow()
        .oneshot(AgentRequest::new(Session::with_id("s"), "Build it."))
        .await
        .expect("runs");
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));
    assert!(
        res.session.state[STATE_KEY.name()]
            .get("coding_loop/2")
            .is_some()
    );
    // New messages instead of a decision: the loop starts over, and the inner sequence's
    // place in iteration 2 is gone with the loop's.
    let writer = texts(&["fresh"]);
    let res = Loop::new("coding_loop", agent(&writer), approve_after(1))
        .oneshot(AgentRequest::new(res.session, "Start over."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("fresh"));
    assert!(
        !res.session.state.contains_key(STATE_KEY.name()),
        "{:?}",
        res.session.state
    );
}

#[tokio::test]
async fn an_isolated_step_that_waits_is_resumed_on_its_own_session() {
    let kit = Nested::new();
    let approval = ApprovalLayer::builder()
        .gate("merge", Gate::new())
        .build()
        .expect("valid");
    let reviewer = Agent::new(
        ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new("m1", "merge", json!({"pr": 7}))]),
            ModelResponse::text("merged"),
        ]),
        ServiceBuilder::new()
            .layer(approval)
            .service(ToolSet::new().tool(kit.merge.clone())),
    );
    let pipeline = Sequential::new("p")
        .step("coder", agent(&kit.coder))
        .step("reviewer", reviewer)
        .isolated();
    let res = pipeline
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "Build it."))
        .await
        .expect("runs");
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));
    // The host sees the waiting call on the workflow's session; the step's own session is
    // kept in its state.
    assert_eq!(res.session.interrupts[0].call.id, "m1");
    assert_eq!(res.session.history.len(), 1, "only the input so far");
    let position = &res.session.state[STATE_KEY.name()]["p"];
    assert_eq!(position["step"], json!(1));
    assert_eq!(position["session"]["id"], json!("s/reviewer"));

    let loaded: Session =
        serde_json::from_str(&serde_json::to_string(&res.session).expect("saves")).expect("loads");
    // A resume the step refuses (no decision for its call) leaves everything waiting.
    let refused = pipeline
        .clone()
        .oneshot(AgentRequest::resume(loaded.clone(), Default::default()))
        .await
        .expect_err("refused");
    let kept = refused.session().expect("the session");
    assert_eq!(kept.interrupts.len(), 1, "the waiting call is still shown");
    assert_eq!(kept.state[STATE_KEY.name()]["p"]["step"], json!(1));
    let res = pipeline
        .oneshot(AgentRequest::resume_all(loaded, Decision::Approve))
        .await
        .expect("resumes");
    assert_eq!(res.text().as_deref(), Some("merged"));
    assert_eq!(kit.merge.calls().len(), 1);
    assert!(res.session.interrupts.is_empty());
    assert!(!res.session.state.contains_key(STATE_KEY.name()));
    let history: Vec<String> = res.session.history.iter().map(|m| m.text()).collect();
    assert_eq!(history, ["Build it.", "merged"]);
}

#[tokio::test]
async fn workflows_take_agent_layers_like_an_agent() {
    use tower_agent_core::{Flow, after_agent, around_agent, before_agent};

    let writer = texts(&["v1"]);
    let judged = || Loop::new("l", agent(&writer), approve_after(1));
    // A before_agent callback answers: the loop does not run.
    let closed = ServiceBuilder::new()
        .layer(before_agent(|req: AgentRequest| async move {
            Ok(Flow::Answer(req.answer("closed today")))
        }))
        .service(judged());
    let res = closed
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect("answers");
    assert_eq!(res.text().as_deref(), Some("closed today"));
    assert_eq!(writer.request_count(), 0);

    // After and around callbacks see the workflow's response.
    let wrapped = ServiceBuilder::new()
        .layer(around_agent(
            |req: AgentRequest, mut next: tower_agent_core::AgentNext| async move {
                let mut res = next.run(req).await?;
                res.rounds += 100;
                Ok(res)
            },
        ))
        .layer(after_agent(
            |res: tower_agent_core::AgentResponse, _ctx: tower_agent_core::RunContext| async move {
                Ok(tower_agent_core::AgentResponse::new(
                    res.session,
                    Outcome::Completed {
                        message: tower_agent_core::Message::assistant("reviewed: v1"),
                    },
                ))
            },
        ))
        .service(judged());
    let res = wrapped
        .oneshot(AgentRequest::new(Session::new(), "Write."))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("reviewed: v1"));
    // The around callback, outermost, saw the replacement (0 rounds) and added its own.
    assert_eq!(res.rounds, 100);
    assert_eq!(writer.request_count(), 1);
}
