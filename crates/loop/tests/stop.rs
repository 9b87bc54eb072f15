//! A response stops the run gracefully (`ModelResponse::stop`, `ToolAction::Stop`): before
//! the next model or tool call, every call answered, the run's progress in the outcome.

mod common;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, Error, Flow, ModelNext, ModelRequest, ModelResponse, Outcome, Session,
    StopReason, ToolAction, ToolRequest, ToolResponse, around_model, before_model,
};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

use common::{calculator, call, results};

fn budget_spent() -> StopReason {
    StopReason::Layer {
        reason: "budget spent".into(),
    }
}

/// A tool that stops the run after answering its own call.
fn stopper() -> StubTool {
    StubTool::from_fn("stop", |req: &ToolRequest| {
        ToolResponse::success(&req.call, "stopping").with_action(ToolAction::Stop(budget_spent()))
    })
}

#[tokio::test]
async fn a_stop_during_a_sequential_round_skips_the_later_calls() {
    let after = StubTool::returning("after", "ran");
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "add", json!({"a": 1, "b": 1})),
        call("c2", "stop", json!({})),
        call("c3", "after", json!({})),
    ])]);
    let tools = calculator().tool(stopper()).tool(after.clone());
    let res = common::run(model.clone(), tools, "go").await.unwrap();
    let Outcome::Stopped { reason, progress } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(reason, &budget_spent());
    assert_eq!(progress.to_string(), "add ✓ → stop ✓ → after ✗");
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Stopped: budget spent. Done: add ✓ → stop ✓ → after ✗")
    );
    assert!(after.calls().is_empty(), "no call after the stop");
    let got = results(&res.session.history);
    assert_eq!(got[1], ("c2".into(), false, "stopping".into()));
    assert!(got[2].1 && got[2].2.contains("budget spent"), "{got:?}");
    assert_eq!(model.request_count(), 1, "no model call after the stop");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_stop_during_a_concurrent_round_lets_the_started_calls_finish() {
    let after = StubTool::returning("after", "ran");
    let model = ScriptedModel::new([ModelResponse::tool_calls([
        call("c1", "stop", json!({})),
        call("c2", "after", json!({})),
    ])]);
    let tools = ToolSet::new().tool(stopper()).tool(after.clone());
    let agent = Agent::builder()
        .concurrent_tools(4)
        .build(model.clone(), tools);
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    assert!(
        matches!(&res.outcome, Outcome::Stopped { reason, .. } if *reason == budget_spent()),
        "{:?}",
        res.outcome
    );
    assert_eq!(after.calls().len(), 1, "started with its batch");
    assert_eq!(results(&res.session.history).len(), 2);
    assert_eq!(model.request_count(), 1);
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_stop_during_a_model_call_drops_its_message() {
    // Round 2's model call is stopped by a layer: its calls could not be answered.
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([call("c1", "add", json!({"a": 1, "b": 2}))]),
        ModelResponse::tool_calls([call("c2", "add", json!({"a": 3, "b": 4}))]),
    ]);
    let model = ServiceBuilder::new()
        .layer(around_model(
            |req: ModelRequest, mut next: ModelNext| async move {
                let round = req.ctx.round();
                let mut res = next.run(req).await?;
                if round == 2 {
                    res.stop = Some(budget_spent());
                }
                Ok(res)
            },
        ))
        .service(model);
    let agent = Agent::new(model, calculator());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .unwrap();
    let Outcome::Stopped { reason, progress } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(reason, &budget_spent());
    assert_eq!(progress.to_string(), "add ✓");
    assert_eq!(res.rounds, 2);
    assert_eq!(res.session.history.len(), 3, "input, call, result");
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_stop_before_the_run_ends_it_before_the_first_model_call() {
    let model = ScriptedModel::new([]);
    let request = AgentRequest::new(Session::new(), "go");
    // A layer blocks the first model call.
    let blocked = ServiceBuilder::new()
        .layer(before_model(|_req: ModelRequest| async move {
            Ok::<_, Error>(Flow::Answer(ModelResponse::stop(budget_spent())))
        }))
        .service(model.clone());
    let res = Agent::new(blocked, calculator())
        .oneshot(request)
        .await
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Stopped { .. }));
    assert_eq!(model.request_count(), 0);
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Stopped: budget spent. Done: no tool calls")
    );
}
