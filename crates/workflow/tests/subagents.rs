//! Sub-agents as tools: results, usage, events with paths, bad arguments, failures, nested
//! interrupts across a save and a load, concurrency, cancellation.

use std::time::Duration;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, Decision, Error, ErrorKind, ModelResponse, Outcome, Session, ToolCall,
    ToolRequest, ToolResponse, Usage,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;
use tower_agent_workflow::{AgentTool, SUBAGENT_STATE_KEY};

fn research_call(id: &str, task: &str) -> ToolCall {
    ToolCall::new(id, "research", json!({ "task": task }))
}

/// A lead agent whose model calls `research` with `calls`, then answers `answer`.
fn lead(
    sub: AgentTool,
    calls: Vec<ToolCall>,
    answer: &str,
) -> (Agent<ScriptedModel, ToolSet>, ScriptedModel) {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls(calls).with_usage(Usage::new(100, 10)),
        ModelResponse::text(answer).with_usage(Usage::new(200, 20)),
    ]);
    let tools = ToolSet::new().tool(sub);
    let agent = Agent::builder()
        .tool_specs(tools.specs())
        .concurrent_tools(4)
        .build(model.clone(), tools);
    (agent, model)
}

#[tokio::test]
async fn a_sub_agent_answers_and_its_usage_and_events_reach_the_parent() {
    let sub_model = ScriptedModel::new([ModelResponse::text("42").with_usage(Usage::new(7, 3))]);
    let sub = AgentTool::new(
        "research",
        "Research.",
        Agent::new(sub_model.clone(), ToolSet::new()),
    );
    let (lead, _) = lead(sub, vec![research_call("c1", "the answer?")], "It is 42.");
    let recorder = EventRecorder::new();
    let res = lead
        .oneshot(AgentRequest::new(Session::with_id("s"), "Ask.").with_observer(recorder.clone()))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("It is 42."));
    assert_eq!(
        res.usage,
        Usage::new(307, 33),
        "the sub-agent's tokens are counted"
    );
    // The sub-agent got the task on its own session.
    let seen = &sub_model.requests()[0];
    assert_eq!(seen.messages.len(), 1);
    assert_eq!(seen.messages[0].text(), "the answer?");
    assert_eq!(seen.ctx.session_id(), "s");
    let nested: Vec<(String, &'static str)> = recorder
        .events()
        .iter()
        .filter_map(|e| match e.origin() {
            (Some(path), inner) => Some((path.to_owned(), inner.name())),
            _ => None,
        })
        .collect();
    assert_eq!(
        nested,
        [
            ("research[c1]".to_owned(), "run_started"),
            ("research[c1]".to_owned(), "round_started"),
            // Its model does not stream: its text reaches readers as one delta.
            ("research[c1]".to_owned(), "text_delta"),
            ("research[c1]".to_owned(), "text"),
            ("research[c1]".to_owned(), "round_completed"),
            ("research[c1]".to_owned(), "run_finished"),
        ]
    );
}

#[tokio::test]
async fn bad_arguments_and_failures_are_results_the_model_sees() {
    let failing = ScriptedModel::with_results([Err(Error::new(ErrorKind::Server, "down"))]);
    let stopping = Agent::builder().max_rounds(1).build(
        ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
            "x",
            "ls",
            json!({}),
        )])]),
        ToolSet::new().tool(StubTool::returning("ls", "a")),
    );
    for (sub, call, expected) in [
        (
            AgentTool::new(
                "research",
                "R.",
                Agent::new(ScriptedModel::new([]), ToolSet::new()),
            ),
            ToolCall::new("c1", "research", json!({"topic": "x"})),
            "invalid arguments for `research`",
        ),
        (
            AgentTool::new(
                "research",
                "R.",
                Agent::new(ScriptedModel::new([]), ToolSet::new()),
            ),
            ToolCall::new("c1", "research", json!(["task"])),
            "invalid arguments for `research`",
        ),
        (
            AgentTool::new("research", "R.", Agent::new(failing, ToolSet::new())),
            research_call("c1", "x"),
            "the sub-agent `research` failed: server error: down",
        ),
        (
            AgentTool::new("research", "R.", stopping),
            research_call("c1", "x"),
            "the sub-agent `research` did not finish: Stopped: the run reached its limit of 1 rounds",
        ),
    ] {
        let (lead, model) = lead(sub, vec![call], "ok");
        let res = lead
            .oneshot(AgentRequest::new(Session::new(), "go"))
            .await
            .expect("the parent run goes on");
        assert_eq!(res.text().as_deref(), Some("ok"));
        let result = model.requests()[1]
            .messages
            .iter()
            .flat_map(|m| m.tool_results())
            .next()
            .cloned()
            .expect("a result");
        assert!(result.is_error);
        assert!(result.content.starts_with(expected), "{}", result.content);
    }
}

#[tokio::test]
async fn an_interrupt_inside_a_sub_agent_pauses_the_parent_and_resumes_into_it() {
    let deploy = StubTool::returning("deploy", "deployed v2");
    let approval = ApprovalLayer::builder()
        .gate("deploy", Gate::new())
        .build()
        .expect("valid");
    let sub_model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("d1", "deploy", json!({"version": 2}))]),
        ModelResponse::text("v2 is live"),
    ]);
    let sub = AgentTool::new(
        "release",
        "Release.",
        Agent::new(
            sub_model.clone(),
            ServiceBuilder::new()
                .layer(approval)
                .service(ToolSet::new().tool(deploy.clone())),
        ),
    );
    let parent_model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "release", json!({"task": "ship v2"}))]),
        ModelResponse::text("Shipped."),
    ]);
    let tools = ToolSet::new().tool(sub);
    let parent = Agent::builder()
        .tool_specs(tools.specs())
        .build(parent_model.clone(), tools);

    let res = parent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "Ship it."))
        .await
        .expect("runs");
    let Outcome::Interrupted { interrupts } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(
        interrupts[0].call.id, "c1",
        "the parent waits at the sub-agent's call"
    );
    assert_eq!(interrupts[0].payload["agent"], json!("release"));
    assert_eq!(
        interrupts[0].payload["interrupts"][0]["call"]["name"],
        json!("deploy")
    );
    assert!(res.session.state[SUBAGENT_STATE_KEY.name()]["c1"].is_object());
    assert_eq!(deploy.calls().len(), 0);

    let loaded: Session =
        serde_json::from_str(&serde_json::to_string(&res.session).expect("saves")).expect("loads");
    // The sub-agent's one waiting call allows the approval decisions: so does the parent's,
    // which refuses anything else before anything runs.
    assert_eq!(interrupts[0].allowed.len(), 4);
    let refused = parent
        .clone()
        .oneshot(AgentRequest::resume_all(
            loaded.clone(),
            json!("yes please"),
        ))
        .await
        .expect_err("not a decision");
    assert!(refused.session().expect("session").state[SUBAGENT_STATE_KEY.name()]["c1"].is_object());
    assert_eq!(deploy.calls().len(), 0);
    let res = parent
        .oneshot(AgentRequest::resume_all(loaded, Decision::Approve))
        .await
        .expect("resumes");
    assert_eq!(res.text().as_deref(), Some("Shipped."));
    assert_eq!(deploy.calls().len(), 1, "approved once, run once");
    assert_eq!(sub_model.request_count(), 2);
    assert!(!res.session.state.contains_key(SUBAGENT_STATE_KEY.name()));
    assert_valid_history(&res.session.history);
    let result = res.session.history[2]
        .tool_results()
        .next()
        .cloned()
        .expect("the result");
    assert_eq!(result.content, "v2 is live");
}

#[tokio::test]
async fn decisions_a_sub_agent_refuses_leave_it_and_the_parent_waiting() {
    let deploy = StubTool::returning("deploy", "deployed");
    let approval = ApprovalLayer::builder()
        .gate("deploy", Gate::new())
        .build()
        .expect("valid");
    // Two gated calls at once: the parent's pause takes any value.
    let sub_model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ToolCall::new("d1", "deploy", json!({"to": "eu"})),
            ToolCall::new("d2", "deploy", json!({"to": "us"})),
        ]),
        ModelResponse::text("both live"),
    ]);
    let sub = AgentTool::new(
        "release",
        "Release.",
        Agent::new(
            sub_model,
            ServiceBuilder::new()
                .layer(approval)
                .service(ToolSet::new().tool(deploy.clone())),
        ),
    );
    let (parent, _) = lead(
        sub,
        vec![ToolCall::new("c1", "release", json!({"task": "ship"}))],
        "Shipped.",
    );
    let res = parent
        .clone()
        .oneshot(AgentRequest::new(Session::with_id("s"), "Ship."))
        .await
        .expect("runs");
    let Outcome::Interrupted { interrupts } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert!(interrupts[0].allowed.is_empty());
    assert_eq!(
        interrupts[0].payload["interrupts"].as_array().map(Vec::len),
        Some(2)
    );

    // A map that decides only d1: the sub-agent refuses it and keeps waiting; so does the parent.
    let partial = tower_agent_core::Decisions::new().with("c1", json!({"d1": {"type": "approve"}}));
    let again = parent
        .clone()
        .oneshot(AgentRequest::resume(res.session, partial))
        .await
        .expect("runs");
    let Outcome::Interrupted { interrupts } = &again.outcome else {
        panic!("{:?}", again.outcome);
    };
    let error = interrupts[0].payload["error"].as_str().unwrap_or_default();
    assert!(error.contains("d2"), "{error}");
    assert!(again.session.state[SUBAGENT_STATE_KEY.name()]["c1"].is_object());
    assert_eq!(deploy.calls().len(), 0);

    // Both decided, by a map: both run.
    let both = tower_agent_core::Decisions::new().with(
        "c1",
        json!({"d1": {"type": "approve"}, "d2": {"type": "approve"}}),
    );
    let done = parent
        .oneshot(AgentRequest::resume(again.session, both))
        .await
        .expect("resumes");
    assert_eq!(done.text().as_deref(), Some("Shipped."));
    assert_eq!(deploy.calls().len(), 2);
    assert!(!done.session.state.contains_key(SUBAGENT_STATE_KEY.name()));
}

#[tokio::test(start_paused = true)]
async fn sub_agents_called_together_run_side_by_side() {
    let slow = tower::service_fn(|req: ToolRequest| async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, Error>(ToolResponse::success(&req.call, "found"))
    });
    let spec = tower_agent_core::ToolSpec::new("search", "Search.", json!({"type": "object"}));
    let worker = Agent::new(
        ScriptedModel::from_fn(|req| {
            Ok(if req.messages.len() == 1 {
                ModelResponse::tool_calls([ToolCall::new("s1", "search", json!({}))])
            } else {
                ModelResponse::text("done")
            })
        }),
        ToolSet::new().service(spec, slow),
    );
    let sub = AgentTool::new("research", "R.", worker);
    let (lead, _) = lead(
        sub,
        vec![
            research_call("c1", "a"),
            research_call("c2", "b"),
            research_call("c3", "c"),
        ],
        "all done",
    );
    let started = tokio::time::Instant::now();
    let res = lead
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("runs");
    assert_eq!(res.text().as_deref(), Some("all done"));
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "three at once, not 30 s"
    );
}

#[tokio::test]
async fn cancelling_the_parent_cancels_the_sub_agent() {
    let token = tower_agent_core::CancellationToken::new();
    let sub = AgentTool::new(
        "research",
        "R.",
        Agent::new(
            ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
                "w1",
                "wait",
                json!({}),
            )])]),
            ToolSet::new().tool(StubTool::hanging("wait")),
        ),
    );
    let (lead, model) = lead(sub, vec![research_call("c1", "x")], "never");
    let run = tokio::spawn(
        lead.oneshot(AgentRequest::new(Session::new(), "go").with_cancellation(token.clone())),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    token.cancel();
    let res = run.await.expect("joins").expect("runs");
    assert!(
        matches!(res.outcome, Outcome::Cancelled { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(model.request_count(), 1);
    assert_valid_history(&res.session.history);
}
