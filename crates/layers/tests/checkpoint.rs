//! The checkpoint: fresh allowances, a stop with the run's progress, timeouts, one
//! question for a concurrent round, and the interrupt-and-resume form.

#![cfg(feature = "checkpoint")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, BoxError, Decision, DecisionKind, ModelResponse, Outcome,
    RunContext, Session, StopReason, ToolCall,
};
use tower_agent_layers::checkpoint::{CheckpointLayer, CheckpointRequest, human_fn};
use tower_agent_loop::Agent;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

/// A model asking for `per_round` calls of `step` every round, up to `rounds`, then done.
fn model(per_round: usize, rounds: u32) -> ScriptedModel {
    ScriptedModel::from_fn(move |req| {
        let round = req.ctx.round();
        if round > rounds {
            return Ok(ModelResponse::text("all done"));
        }
        Ok(ModelResponse::tool_calls((0..per_round).map(|i| {
            ToolCall::new(format!("r{round}_{i}"), "step", json!({}))
        })))
    })
}

async fn run(
    layer: CheckpointLayer,
    model: ScriptedModel,
    step: &StubTool,
    session: Session,
    concurrent: bool,
) -> AgentResponse {
    let tools = ServiceBuilder::new()
        .layer(layer)
        .service(ToolSet::new().tool(step.clone()));
    let builder = Agent::builder().max_rounds(50);
    let builder = if concurrent {
        builder.concurrent_tools(8)
    } else {
        builder
    };
    builder
        .build(model, tools)
        .oneshot(AgentRequest::new(session, "work"))
        .await
        .expect("the run ends")
}

/// A checkpoint answering `answers` in turn, recording what it was asked.
fn scripted(
    answers: Vec<bool>,
) -> (
    impl tower_agent_layers::Human<CheckpointRequest, bool>,
    Arc<Mutex<Vec<CheckpointRequest>>>,
) {
    let asked: Arc<Mutex<Vec<CheckpointRequest>>> = Arc::default();
    let record = asked.clone();
    let answers = Arc::new(Mutex::new(answers.into_iter()));
    let checkpoint = human_fn(move |request: CheckpointRequest, _: RunContext| {
        record.lock().expect("lock").push(request);
        let answer = answers.lock().expect("lock").next().unwrap_or(false);
        async move { Ok::<_, BoxError>(answer) }
    });
    (checkpoint, asked)
}

#[tokio::test]
async fn yes_gives_a_fresh_budget_and_no_stops_with_the_progress() {
    let (checkpoint, asked) = scripted(vec![true, true, false]);
    let step = StubTool::returning("step", "ok");
    let res = run(
        CheckpointLayer::inline(checkpoint).every(3),
        model(1, 20),
        &step,
        Session::new(),
        false,
    )
    .await;
    let asked = asked.lock().unwrap().clone();
    let seen: Vec<(u32, usize)> = asked.iter().map(|a| (a.calls, a.progress.len())).collect();
    assert_eq!(seen, [(3, 3), (3, 6), (3, 9)], "asked at 3, 6 and 9 calls");
    assert_eq!(asked[0].next, "step");
    assert_eq!(step.calls().len(), 9);
    let Outcome::Stopped { reason, progress } = &res.outcome else {
        panic!("{:?}", res.outcome);
    };
    assert_eq!(
        *reason,
        StopReason::Checkpoint {
            calls: 3,
            reason: "declined".into()
        }
    );
    assert_eq!(progress.len(), 10);
    assert!(
        !progress.get(9).unwrap().ok,
        "the call that would go over did not run"
    );
    assert!(
        res.outcome.summary().unwrap().starts_with(
            "Stopped: the checkpoint after 3 tool calls said stop (declined). Done: step ✓ → step ✓"
        ),
        "{:?}",
        res.outcome.summary()
    );
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn the_default_budget_is_twenty_calls() {
    let (checkpoint, asked) = scripted(vec![true]);
    let step = StubTool::returning("step", "ok");
    let res = run(
        CheckpointLayer::inline(checkpoint),
        model(5, 8),
        &step,
        Session::new(),
        false,
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("all done"));
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 1, "at 20 calls; 40 is never reached");
    assert_eq!(asked[0].calls, 20);
    assert_eq!(step.calls().len(), 40);
}

#[tokio::test(start_paused = true)]
async fn no_answer_in_time_stops_the_run() {
    let checkpoint = human_fn(|_: CheckpointRequest, _: RunContext| {
        std::future::pending::<Result<bool, BoxError>>()
    });
    let step = StubTool::returning("step", "ok");
    let started = tokio::time::Instant::now();
    let res = run(
        CheckpointLayer::inline(checkpoint).every(1),
        model(1, 5),
        &step,
        Session::new(),
        false,
    )
    .await;
    assert_eq!(started.elapsed(), Duration::from_secs(15 * 60));
    assert!(
        matches!(
            &res.outcome,
            Outcome::Stopped { reason: StopReason::Checkpoint { reason, .. }, .. }
                if reason == "no answer within 900 s"
        ),
        "{:?}",
        res.outcome
    );
    assert_eq!(step.calls().len(), 1);
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_failing_checkpoint_stops_the_run() {
    let checkpoint = human_fn(|_: CheckpointRequest, _: RunContext| async {
        Err::<bool, BoxError>("chat unreachable".into())
    });
    let step = StubTool::returning("step", "ok");
    let res = run(
        CheckpointLayer::inline(checkpoint).every(2),
        model(1, 5),
        &step,
        Session::new(),
        false,
    )
    .await;
    assert!(
        res.outcome
            .summary()
            .unwrap()
            .contains("the checkpoint failed: chat unreachable"),
        "{:?}",
        res.outcome
    );
    assert_eq!(step.calls().len(), 2);
}

#[tokio::test]
async fn concurrent_calls_ask_one_at_a_time() {
    let asking = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));
    let (a, o, n) = (asking.clone(), overlap.clone(), asked.clone());
    let checkpoint = human_fn(move |_: CheckpointRequest, _: RunContext| {
        let (a, o, n) = (a.clone(), o.clone(), n.clone());
        async move {
            if a.fetch_add(1, Ordering::SeqCst) > 0 {
                o.fetch_add(1, Ordering::SeqCst);
            }
            n.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            a.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, BoxError>(true)
        }
    });
    let step = StubTool::returning("step", "ok");
    let res = run(
        CheckpointLayer::inline(checkpoint).every(2),
        model(5, 1),
        &step,
        Session::new(),
        true,
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("all done"));
    assert_eq!(step.calls().len(), 5);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "two fresh allowances for 3 calls"
    );
    assert_eq!(
        overlap.load(Ordering::SeqCst),
        0,
        "never two questions at once"
    );
}

#[tokio::test]
async fn the_checkpoint_can_be_answered_by_interrupting_and_resuming() {
    let step = StubTool::returning("step", "ok");
    let layer = CheckpointLayer::interrupting().every(2);
    let paused = run(layer.clone(), model(1, 4), &step, Session::new(), false).await;
    let Outcome::Interrupted { interrupts } = &paused.outcome else {
        panic!("{:?}", paused.outcome);
    };
    assert_eq!(
        interrupts[0].allowed,
        [DecisionKind::Approve, DecisionKind::Reject]
    );
    let question = CheckpointRequest::from_interrupt(&interrupts[0]).expect("a checkpoint");
    assert_eq!(question.calls, 2);
    assert_eq!(question.progress.to_string(), "step ✓ → step ✓");
    assert_eq!(step.calls().len(), 2);

    // Another process: go on.
    let saved: Session =
        serde_json::from_str(&serde_json::to_string(&paused.session).unwrap()).unwrap();
    let tools = ServiceBuilder::new()
        .layer(layer.clone())
        .service(ToolSet::new().tool(step.clone()));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("later", "step", json!({}))]),
        ModelResponse::text("all done"),
    ]);
    let agent = Agent::new(model, tools);
    let done = agent
        .clone()
        .oneshot(AgentRequest::resume_all(saved, Decision::Approve))
        .await
        .unwrap();
    // The waiting call ran with a fresh allowance (1 of 2), then the next round's (2 of 2).
    assert_eq!(done.text().as_deref(), Some("all done"));
    assert_eq!(step.calls().len(), 4);
    assert!(
        !done
            .session
            .state
            .contains_key(tower_agent_layers::checkpoint::STATE_KEY.name()),
        "nothing left waiting"
    );
    assert_valid_history(&done.session.history);

    // The same pause answered "stop".
    let stopped = agent
        .oneshot(AgentRequest::resume_all(
            paused.session,
            Decision::reject("enough"),
        ))
        .await
        .unwrap();
    let Outcome::Stopped { reason, progress } = &stopped.outcome else {
        panic!("{:?}", stopped.outcome);
    };
    assert!(matches!(reason, StopReason::Checkpoint { calls: 2, .. }));
    assert_eq!(progress.to_string(), "step ✗");
    assert_eq!(step.calls().len(), 4, "nothing more ran");
    assert_valid_history(&stopped.session.history);
}

#[tokio::test]
async fn cancelling_at_the_checkpoint_leaves_a_valid_history() {
    let checkpoint = human_fn(|_: CheckpointRequest, ctx: RunContext| async move {
        ctx.cancel();
        std::future::pending::<Result<bool, BoxError>>().await
    });
    let step = StubTool::returning("step", "ok");
    let res = run(
        CheckpointLayer::inline(checkpoint).every(2),
        model(1, 5),
        &step,
        Session::new(),
        false,
    )
    .await;
    assert_eq!(
        res.outcome.summary().as_deref(),
        Some("Cancelled. Was working on: step ✓ → step ✓ → step ✗")
    );
    assert_valid_history(&res.session.history);
}
