//! The approval layer: gates, interrupt-and-resume (across a JSON round trip), inline
//! approvers, timeouts, fail-closed errors, edits that the history records.

#![cfg(feature = "approval")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentInput, AgentRequest, BoxError, Decision, DecisionKind, Decisions, Event, Message,
    ModelResponse, Outcome, RunContext, Session, ToolCall, ToolRequest,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate, GateProblem, ReviewRequest, human_fn};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

/// `shell` is gated except for commands under /tmp; `list` is not gated.
fn gated() -> ApprovalLayer {
    ApprovalLayer::builder()
        .gate(
            "shell",
            Gate::new()
                .when(|args| !args["cmd"].as_str().unwrap_or("").contains("/tmp/"))
                .description("Runs a shell command"),
        )
        .build()
        .expect("valid")
}

struct Kit {
    shell: StubTool,
    list: StubTool,
    model: ScriptedModel,
}

fn kit(responses: impl IntoIterator<Item = ModelResponse>) -> Kit {
    Kit {
        shell: StubTool::from_fn("shell", |req: &ToolRequest| {
            tower_agent_core::ToolResponse::success(
                &req.call,
                format!("ran {}", req.call.arguments),
            )
        }),
        list: StubTool::returning("list", "a b"),
        model: ScriptedModel::new(responses),
    }
}

fn agent(
    kit: &Kit,
    approval: ApprovalLayer,
) -> Agent<ScriptedModel, tower_agent_layers::Approval<ToolSet>> {
    let tools = ServiceBuilder::new().layer(approval).service(
        ToolSet::new()
            .tool(kit.shell.clone())
            .tool(kit.list.clone()),
    );
    Agent::new(kit.model.clone(), tools)
}

fn results(res: &tower_agent_core::AgentResponse) -> Vec<(String, bool, String)> {
    res.session
        .history
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| (r.call_id.clone(), r.is_error, r.content.clone()))
        .collect()
}

#[tokio::test]
async fn interrupt_save_load_resume_runs_each_approved_call_once() {
    let kit = kit([
        ModelResponse::tool_calls([
            call("c1", "list", json!({})),
            call("c2", "shell", json!({"cmd": "rm -rf build"})),
            call("c3", "shell", json!({"cmd": "ls /tmp/x"})),
            call("c4", "shell", json!({"cmd": "rm -rf /"})),
        ]),
        ModelResponse::text("done"),
    ]);
    let paused = agent(&kit, gated())
        .oneshot(AgentRequest::new(Session::new(), "clean up"))
        .await
        .unwrap();
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!("{:?}", paused.outcome);
    };
    // Only the gated calls are reviewed; the others ran and their results are kept.
    let reviews: Vec<ReviewRequest> = interrupts
        .iter()
        .map(|i| ReviewRequest::from_interrupt(i).expect("a review"))
        .collect();
    assert_eq!(
        reviews[0],
        ReviewRequest {
            call_id: "c2".into(),
            tool: "shell".into(),
            arguments: json!({"cmd": "rm -rf build"}),
            description: "Runs a shell command".into(),
            allowed_decisions: DecisionKind::ALL.to_vec(),
            token: None,
        }
    );
    assert_eq!(reviews[1].call_id, "c4");
    assert_eq!(kit.list.calls().len(), 1);
    assert_eq!(kit.shell.calls().len(), 1, "only the /tmp command ran");
    assert_eq!(results(&paused).len(), 2);

    // Another process: the session from JSON, a fresh agent.
    let saved = serde_json::to_string(&paused.session).unwrap();
    let session: Session = serde_json::from_str(&saved).unwrap();
    let decisions = Decisions::new()
        .with("c2", Decision::Approve)
        .with("c4", Decision::edit(json!({"cmd": "rm -rf ./tmp"})));
    let done = agent(&kit, gated())
        .oneshot(AgentRequest::resume(session, decisions.clone()))
        .await
        .unwrap();
    assert_eq!(done.text().as_deref(), Some("done"));
    let ran: Vec<String> = kit
        .shell
        .calls()
        .iter()
        .map(|c| c.arguments.clone())
        .collect();
    assert_eq!(
        ran,
        [
            r#"{"cmd":"ls /tmp/x"}"#,
            r#"{"cmd":"rm -rf build"}"#,
            r#"{"cmd":"rm -rf ./tmp"}"#
        ],
        "each approved call ran once, the edited one with the edit"
    );
    // The tool behind the layer never sees the decision.
    assert!(kit.shell.requests().iter().all(|r| r.resume.is_none()));
    // The history is in call order and records what ran: the model sees the edit.
    let got = results(&done);
    let ids: Vec<&str> = got.iter().map(|(id, ..)| id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4"]);
    assert_eq!(got[3].2, r#"ran {"cmd":"rm -rf ./tmp"}"#);
    let c4 = done
        .session
        .history
        .iter()
        .flat_map(|m| m.tool_calls())
        .find(|c| c.id == "c4")
        .unwrap();
    assert_eq!(c4.arguments, r#"{"cmd":"rm -rf ./tmp"}"#);
    let seen = &kit.model.requests()[1].messages;
    let seen_c4 = seen
        .iter()
        .flat_map(|m| m.tool_calls())
        .find(|c| c.id == "c4");
    assert_eq!(seen_c4.unwrap().arguments, r#"{"cmd":"rm -rf ./tmp"}"#);
    assert_valid_history(&done.session.history);

    // The same resume again, on the saved result: nothing runs twice.
    let again = agent(&kit, gated())
        .oneshot(AgentRequest::resume(done.session.clone(), decisions))
        .await
        .unwrap();
    assert_eq!(kit.shell.calls().len(), 3);
    assert_eq!(again.outcome, done.outcome);
}

#[tokio::test]
async fn reject_and_respond_do_not_run_the_tool() {
    let kit = kit([
        ModelResponse::tool_calls([
            call("c1", "shell", json!({"cmd": "rm -rf /"})),
            call("c2", "shell", json!({"cmd": "date"})),
        ]),
        ModelResponse::text("ok"),
    ]);
    let paused = agent(&kit, gated())
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    let decisions = Decisions::new()
        .with("c1", Decision::reject("never touch /"))
        .with("c2", Decision::respond("It is Sunday."));
    let done = agent(&kit, gated())
        .oneshot(AgentRequest::resume(paused.session, decisions))
        .await
        .unwrap();
    assert!(kit.shell.calls().is_empty());
    let got = results(&done);
    assert_eq!(
        got[0],
        (
            "c1".into(),
            true,
            "The user rejected this call of `shell`: never touch /. Do not retry it unless the \
             user asks you to."
                .into()
        )
    );
    assert_eq!(got[1], ("c2".into(), false, "It is Sunday.".into()));
    assert_valid_history(&done.session.history);
}

#[tokio::test]
async fn answered_calls_are_never_reviewed_again() {
    let kit = kit([
        ModelResponse::tool_calls([call("c1", "shell", json!({"cmd": "make"}))]),
        ModelResponse::tool_calls([call("c2", "shell", json!({"cmd": "make install"}))]),
        ModelResponse::text("installed"),
    ]);
    let first = agent(&kit, gated())
        .oneshot(AgentRequest::new(Session::new(), "build"))
        .await
        .unwrap();
    let second = agent(&kit, gated())
        .oneshot(AgentRequest::resume_all(first.session, Decision::Approve))
        .await
        .unwrap();
    // The second round asks about c2 only.
    let Outcome::Interrupted { interrupts } = &second.outcome else {
        panic!("{:?}", second.outcome);
    };
    let ids: Vec<&str> = interrupts.iter().map(|i| i.call.id.as_str()).collect();
    assert_eq!(ids, ["c2"]);
    let done = agent(&kit, gated())
        .oneshot(AgentRequest::resume_all(second.session, Decision::Approve))
        .await
        .unwrap();
    assert_eq!(done.text().as_deref(), Some("installed"));
    assert_eq!(kit.shell.calls().len(), 2);
}

#[tokio::test]
async fn a_decision_the_gate_does_not_allow_is_refused_before_anything_runs() {
    let approval = ApprovalLayer::builder()
        .gate("shell", Gate::new().allow(["approve", "reject"]))
        .build()
        .unwrap();
    let kit = kit([ModelResponse::tool_calls([call(
        "c1",
        "shell",
        json!({"cmd": "x"}),
    )])]);
    let paused = agent(&kit, approval.clone())
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    let mut err = agent(&kit, approval)
        .oneshot(AgentRequest::resume_all(
            paused.session.clone(),
            Decision::edit(json!({"cmd": "y"})),
        ))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("allows approve, reject; got `edit`"),
        "{err}"
    );
    assert_eq!(err.take_session().unwrap(), paused.session);
    assert!(kit.shell.calls().is_empty());
}

#[test]
fn a_gate_naming_an_unknown_decision_is_refused_when_built() {
    let err = ApprovalLayer::builder()
        .gate("shell", Gate::new().allow(["approve", "aprove"]))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the approval gate of tool `shell`: unknown decision `aprove` (known: approve, edit, \
         reject, respond)"
    );
    // Typed kinds and names mix.
    assert!(
        ApprovalLayer::builder()
            .gate("shell", Gate::new().allow([DecisionKind::Approve]))
            .build()
            .is_ok()
    );
}

#[test]
fn a_gate_allowing_no_decision_is_refused_when_built() {
    let err = ApprovalLayer::builder()
        .gate("ls", Gate::new())
        .gate("shell", Gate::new().allow(Vec::<String>::new()))
        .build()
        .unwrap_err();
    assert_eq!(err.tool, "shell");
    assert_eq!(err.problem, GateProblem::NoDecision);
    assert_eq!(
        err.to_string(),
        "the approval gate of tool `shell`: it allows no decision, so its calls could never run \
         nor be refused"
    );
}

/// A tool stack decided inline by `approver`, with `timeout`.
fn inline_agent(
    kit: &Kit,
    approver: impl tower_agent_layers::Human<ReviewRequest, Decision>,
    timeout: Duration,
) -> Agent<ScriptedModel, tower_agent_layers::Approval<ToolSet>> {
    let approval = ApprovalLayer::builder()
        .gate("shell", Gate::new().allow(["approve", "edit", "reject"]))
        .inline(approver)
        .timeout(timeout)
        .build()
        .expect("valid");
    agent(kit, approval)
}

#[tokio::test]
async fn inline_approvers_decide_while_the_run_waits() {
    let kit = kit([
        ModelResponse::tool_calls([
            call("c1", "shell", json!({"cmd": "ls"})),
            call("c2", "shell", json!({"cmd": "rm x"})),
            call("c3", "list", json!({})),
        ]),
        ModelResponse::text("ok"),
    ]);
    let seen: Arc<Mutex<Vec<ReviewRequest>>> = Arc::default();
    let record = seen.clone();
    let approver = human_fn(move |review: ReviewRequest, _ctx: RunContext| {
        record.lock().unwrap().push(review.clone());
        async move {
            Ok(if review.arguments["cmd"] == "ls" {
                Decision::Approve
            } else {
                Decision::edit(json!({"cmd": "rm -i x"}))
            })
        }
    });
    let res = inline_agent(&kit, approver, Duration::from_secs(5))
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(res.text().as_deref(), Some("ok"));
    assert_eq!(seen.lock().unwrap().len(), 2, "list is not gated");
    let got = results(&res);
    assert_eq!(got[1].2, r#"ran {"cmd":"rm -i x"}"#);
    let c2 = res
        .session
        .history
        .iter()
        .flat_map(|m| m.tool_calls())
        .find(|c| c.id == "c2")
        .unwrap();
    assert_eq!(c2.arguments, r#"{"cmd":"rm -i x"}"#);
}

/// What a test approver answers.
type Answer = Box<dyn Fn() -> Result<Decision, BoxError> + Send + Sync>;

#[tokio::test(start_paused = true)]
async fn inline_approval_fails_closed() {
    let cases: [(&str, Answer); 3] = [
        (
            "approval failed (ui gone)",
            Box::new(|| Err("ui gone".into())),
        ),
        (
            "`respond` is not allowed for this tool",
            Box::new(|| Ok(Decision::respond("hi"))),
        ),
        (
            "`edit` needs arguments that are a JSON object",
            Box::new(|| Ok(Decision::edit(json!("ls")))),
        ),
    ];
    for (expected, answer) in cases {
        let kit = kit([
            ModelResponse::tool_calls([call("c1", "shell", json!({"cmd": "ls"}))]),
            ModelResponse::text("ok"),
        ]);
        let answer = Arc::new(answer);
        let approver = human_fn(move |_: ReviewRequest, _: RunContext| {
            let decision = answer();
            async move { decision }
        });
        let recorder = EventRecorder::new();
        let res = inline_agent(&kit, approver, Duration::from_secs(5))
            .oneshot(AgentRequest::new(Session::new(), "go").with_observer(recorder.clone()))
            .await
            .unwrap();
        assert!(kit.shell.calls().is_empty(), "{expected}");
        let got = results(&res);
        assert!(got[0].1, "{expected}");
        assert!(got[0].2.contains(expected), "{expected}: {}", got[0].2);
        assert!(
            recorder.events().iter().any(|e| matches!(
                e,
                Event::Warning { source: "approval", message } if message.contains(expected)
            )),
            "{expected}"
        );
    }

    // No answer in time.
    let kit = kit([
        ModelResponse::tool_calls([call("c1", "shell", json!({"cmd": "ls"}))]),
        ModelResponse::text("ok"),
    ]);
    let approver = human_fn(|_: ReviewRequest, _: RunContext| {
        std::future::pending::<Result<Decision, BoxError>>()
    });
    let started = tokio::time::Instant::now();
    let res = inline_agent(&kit, approver, Duration::from_secs(30))
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert!(kit.shell.calls().is_empty());
    assert!(results(&res)[0].2.contains("no decision within 30 s"));
}

#[cfg(feature = "retry")]
#[tokio::test(start_paused = true)]
async fn retries_never_see_an_interrupt() {
    use tower_agent_layers::retry::{RetryLayer, RetryPolicy};
    let kit = kit([ModelResponse::tool_calls([call(
        "c1",
        "shell",
        json!({"cmd": "x"}),
    )])]);
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(kit.model.clone());
    let tools = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .layer(gated())
        .service(ToolSet::new().tool(kit.shell.clone()));
    let res = Agent::new(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Interrupted { .. }));
    assert_eq!(kit.model.request_count(), 1);
    assert!(kit.shell.calls().is_empty());
}

/// A gated tool that, once approved, asks a question of its own: the second resume's value
/// is the tool's answer, not a decision, and the edit still applies.
#[tokio::test]
async fn an_approved_tool_can_ask_its_own_question() {
    let pick = StubTool::from_fn("pick", |req: &ToolRequest| match &req.resume {
        None => tower_agent_core::ToolResponse::interrupt(&req.call, json!("which file?")),
        Some(answer) => tower_agent_core::ToolResponse::success(
            &req.call,
            format!("picked {answer} with {}", req.call.arguments),
        ),
    });
    let approval = ApprovalLayer::builder()
        .gate("pick", Gate::new())
        .build()
        .expect("valid");
    let tools = ServiceBuilder::new()
        .layer(approval)
        .service(ToolSet::new().tool(pick.clone()));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "pick", json!({"dir": "/"}))]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(model, tools);
    let review = agent
        .clone()
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(ReviewRequest::from_interrupt(&review.session.interrupts[0]).is_some());
    assert!(pick.calls().is_empty());
    let question = agent
        .clone()
        .oneshot(AgentRequest::resume_all(
            review.session,
            Decision::edit(json!({"dir": "/tmp"})),
        ))
        .await
        .unwrap();
    let Outcome::Interrupted { interrupts } = &question.outcome else {
        panic!("{:?}", question.outcome);
    };
    assert_eq!(interrupts[0].payload, json!("which file?"));
    assert!(interrupts[0].allowed.is_empty(), "the tool's own question");
    let done = agent
        .oneshot(AgentRequest::resume_all(question.session, json!("a.txt")))
        .await
        .unwrap();
    assert_eq!(done.text().as_deref(), Some("done"));
    assert_eq!(results(&done)[0].2, r#"picked "a.txt" with {"dir":"/tmp"}"#);
    assert!(
        !done
            .session
            .state
            .contains_key(tower_agent_layers::approval::STATE_KEY.name())
    );
    assert_valid_history(&done.session.history);
}

#[tokio::test]
async fn cancelling_while_an_inline_approver_waits_leaves_a_valid_history() {
    let kit = kit([ModelResponse::tool_calls([
        call("c1", "list", json!({})),
        call("c2", "shell", json!({"cmd": "ls"})),
    ])]);
    let approver = human_fn(|_: ReviewRequest, ctx: RunContext| async move {
        ctx.cancel();
        std::future::pending::<Result<Decision, BoxError>>().await
    });
    let res = inline_agent(&kit, approver, Duration::from_secs(60))
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Cancelled. Was working on: list ✓ → shell ✗")
    );
    assert!(kit.shell.calls().is_empty());
    assert_valid_history(&res.session.history);
}

/// Vercel AI signs its approvals so that a client cannot forge one: with `signed(key)` a
/// review carries a token, and a decision is taken only with the token of the call it decides.
#[tokio::test]
async fn signed_approvals_take_only_a_decision_with_the_calls_token() {
    let layer = || {
        ApprovalLayer::builder()
            .gate("pay", Gate::new())
            .signed(b"the host's secret")
            .build()
            .expect("valid")
    };
    let run = |pay: StubTool, session: Session, input: AgentInput| {
        let model = ScriptedModel::new([
            ModelResponse::tool_calls([
                call("p1", "pay", json!({"cents": 100})),
                call("p2", "pay", json!({"cents": 999})),
            ]),
            ModelResponse::text("done"),
        ]);
        let agent = Agent::builder()
            .with(layer())
            .build(model, ToolSet::new().tool(pay));
        async move {
            agent
                .oneshot(AgentRequest::new(session, input))
                .await
                .expect("the run")
        }
    };
    let pay = StubTool::returning("pay", "paid");
    let paused = run(pay.clone(), Session::new(), "pay both".into()).await;
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!("paused: {:?}", paused.outcome)
    };
    let token = |i: usize| {
        ReviewRequest::from_interrupt(&interrupts[i])
            .and_then(|review| review.token)
            .expect("a signed review")
    };
    assert_ne!(token(0), token(1), "a token per call");
    // p1 approved with its own token; p2 with none; then p2 with p1's token: both refused.
    for p2 in [
        json!({"type": "approve"}),
        json!({"type": "approve", "token": token(0)}),
    ] {
        let decisions = Decisions::from_iter([
            (
                "p1".to_owned(),
                json!({"type": "approve", "token": token(0)}),
            ),
            ("p2".to_owned(), p2),
        ]);
        let pay = StubTool::returning("pay", "paid");
        let done = run(
            pay.clone(),
            paused.session.clone(),
            AgentInput::Resume(decisions),
        )
        .await;
        let ran: Vec<String> = pay.calls().into_iter().map(|c| c.id).collect();
        assert_eq!(ran, ["p1"], "only the call with its own token ran");
        let refused = done
            .session
            .history
            .iter()
            .flat_map(Message::tool_results)
            .find(|r| r.call_id == "p2")
            .expect("answered");
        assert!(
            refused.is_error && refused.content.contains("token"),
            "{refused:?}"
        );
    }
}
