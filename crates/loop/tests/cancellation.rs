//! Cancellation: before and during the model call, between and during tool calls, during a
//! resumed call and during an event; a cancelled session can continue.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tower::{ServiceExt, service_fn};
use tower_agent_core::{
    AgentInput, AgentRequest, CancellationToken, Error, Event, Message, ModelRequest,
    ModelResponse, Outcome, Session, ToolRequest, ToolResponse, ToolResult, observer_fn,
};
use tower_agent_loop::{Agent, AgentServiceExt};
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{calculator, call, results, run};

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
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
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
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
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
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Cancelled. Was working on: cancel ✓ → after ✗")
    );
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
        let run = tokio::spawn(
            agent.oneshot(AgentRequest::new(Session::new(), "go").with_cancellation(token.clone())),
        );
        while hang.calls().is_empty() {
            tokio::task::yield_now().await;
        }
        token.cancel();
        let res = run.await.unwrap().unwrap();
        assert!(
            matches!(res.outcome, Outcome::Cancelled { .. }),
            "concurrent: {concurrent}"
        );
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

#[tokio::test]
async fn cancellation_during_a_resumed_call() {
    let hang = StubTool::hanging("slow_approval");
    let session = Session::new().with_history(vec![
        Message::user("go"),
        Message::assistant_with_calls("", [call("c1", "slow_approval", json!({}))]),
    ]);
    let mut session = session;
    session.interrupts.push(tower_agent_core::Interrupt::new(
        call("c1", "slow_approval", json!({})),
        json!({}),
    ));
    let agent = Agent::new(ScriptedModel::new([]), ToolSet::new().tool(hang.clone()));
    let run = agent.spawn(AgentRequest::resume_all(session, json!("ok")));
    while hang.calls().is_empty() {
        tokio::task::yield_now().await;
    }
    run.cancel();
    let res = run.join().await.unwrap();
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_eq!(results(&res.session.history)[0].2, ToolResult::CANCELLED);
    assert_valid_history(&res.session.history);
}

/// An observer that cancels the run when it sees `trigger`, after yielding once (as an
/// observer doing real I/O would).
fn cancel_on(trigger: &'static str, token: CancellationToken) -> impl tower_agent_core::Observer {
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
        let model = ScriptedModel::new([ModelResponse::tool_calls([call("c1", "t", json!({}))])]);
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
        assert!(matches!(res.outcome, Outcome::Cancelled { .. }), "{case}");
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
            Some(Event::RunFinished { outcome }) => {
                assert!(matches!(outcome, Outcome::Cancelled { .. }))
            }
            other => panic!("last event {other:?} ({case})"),
        }
    }
}
