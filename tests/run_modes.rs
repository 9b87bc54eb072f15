//! The ways to run an agent: spawn with a live event stream, cancel through the handle,
//! backpressure, batches, and the blocking wrapper.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use serde_json::json;
use tower::service_fn;
use tower_agent::Blocking;
use tower_agent::prelude::*;
use tower_agent_test::{ScriptedModel, StubTool, assert_valid_history};

fn echo_model() -> ScriptedModel {
    ScriptedModel::from_fn(|req| {
        let last = req.messages.last().map(|m| m.text()).unwrap_or_default();
        Ok(ModelResponse::text(format!("echo {last}")))
    })
}

#[tokio::test]
async fn spawn_streams_live_events_then_joins() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("c1", "t", json!({}))]),
        ModelResponse::text("done"),
    ]);
    let agent = Agent::new(model, ToolSet::new().tool(StubTool::returning("t", "ok")));
    let mut run = agent.spawn(AgentRequest::new(Session::new(), "go"));
    let events: Vec<Event> = run.take_events().unwrap().collect().await;
    assert!(run.take_events().is_none(), "the stream is taken once");
    let names: Vec<&str> = events.iter().map(Event::name).collect();
    assert_eq!(names.first(), Some(&"run_started"));
    assert_eq!(names.last(), Some(&"run_finished"));
    assert_eq!(names.iter().filter(|n| **n == "tool_finished").count(), 1);
    // The stream carries no history snapshot (it would make every round copy the history).
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::RoundCompleted { history: None, .. }))
    );
    assert!(!events.iter().any(|e| matches!(
        e,
        Event::RoundCompleted {
            history: Some(_),
            ..
        }
    )));
    let res = run.join().await.unwrap();
    assert_eq!(res.text().as_deref(), Some("done"));
}

#[tokio::test]
async fn the_handle_cancels_a_hanging_run() {
    let hang = StubTool::hanging("hang");
    let model = ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
        "c1",
        "hang",
        json!({}),
    )])]);
    let agent = Agent::new(model, ToolSet::new().tool(hang.clone()));
    let run = agent.spawn(AgentRequest::new(Session::new(), "go"));
    while hang.calls().is_empty() {
        tokio::task::yield_now().await;
    }
    run.cancel();
    let res = run.join().await.unwrap();
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_slow_reader_applies_backpressure() {
    // Each round emits several events; with room for 2, the run must wait for the reader.
    let rounds = Arc::new(AtomicUsize::new(0));
    let r = rounds.clone();
    let model = ScriptedModel::from_fn(move |req| {
        r.fetch_add(1, Ordering::SeqCst);
        let n = req.ctx.round();
        Ok(if n < 5 {
            ModelResponse::tool_calls([ToolCall::new(format!("c{n}"), "t", json!({}))])
        } else {
            ModelResponse::text("done")
        })
    });
    let agent = Agent::new(model, ToolSet::new().tool(StubTool::returning("t", "ok")));
    let (request, mut events) = AgentRequest::new(Session::new(), "go").with_event_stream(2);
    let run = tokio::spawn(agent.oneshot(request));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!run.is_finished(), "the run waits for the reader");
    // run_started and round_started fill the buffer; round_completed waits.
    assert_eq!(
        rounds.load(Ordering::SeqCst),
        1,
        "blocked in the first round"
    );
    let mut count = 0;
    while events.recv().await.is_some() {
        count += 1;
    }
    assert!(count > 20, "{count} events");
    assert_eq!(run.await.unwrap().unwrap().text().as_deref(), Some("done"));
}

#[tokio::test]
async fn batches_keep_input_order_within_the_bound() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (f, p) = (in_flight.clone(), peak.clone());
    let model = service_fn(move |req: ModelRequest| {
        let (f, p) = (f.clone(), p.clone());
        async move {
            let now = f.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            f.fetch_sub(1, Ordering::SeqCst);
            let last = req.messages.last().map(|m| m.text()).unwrap_or_default();
            Ok::<_, Error>(ModelResponse::text(format!("echo {last}")))
        }
    });
    let agent = Agent::new(model, ToolSet::new());
    let requests = (0..8).map(|i| AgentRequest::new(Session::new(), format!("q{i}")));
    let results = agent.run_batch(requests, 3).await;
    let texts: Vec<String> = results
        .into_iter()
        .map(|r| r.unwrap().text().unwrap())
        .collect();
    let expected: Vec<String> = (0..8).map(|i| format!("echo q{i}")).collect();
    assert_eq!(texts, expected);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "runs overlap, at most 3 at once"
    );
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_with_the_run_even_if_a_stub_keeps_contexts() {
    // The scripted model records requests (and their contexts) and the test keeps it.
    let model = ScriptedModel::new([ModelResponse::text("done")]);
    let agent = Agent::new(model.clone(), ToolSet::new());
    let mut run = agent.spawn(AgentRequest::new(Session::new(), "go"));
    let mut events = run.take_events().unwrap();
    let drained = tokio::time::timeout(std::time::Duration::from_secs(3600), async {
        let mut names = Vec::new();
        while let Some(event) = events.recv().await {
            names.push(event.name());
        }
        names
    })
    .await
    .expect("the stream must end when the run ends");
    assert_eq!(drained.last(), Some(&"run_finished"));
    assert_eq!(model.requests().len(), 1, "the contexts are still held");
    run.join().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancel_is_prompt_even_when_nobody_reads_the_stream() {
    let model = ScriptedModel::from_fn(|req| {
        let n = req.ctx.round();
        Ok(ModelResponse::tool_calls([ToolCall::new(
            format!("c{n}"),
            "t",
            json!({}),
        )]))
    });
    let agent = Agent::new(model, ToolSet::new().tool(StubTool::returning("t", "ok")));
    let mut run = agent.spawn(AgentRequest::new(Session::new(), "go"));
    let _unread = run.take_events().unwrap(); // held, never read: the run blocks on it
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    run.cancel();
    let res = tokio::time::timeout(std::time::Duration::from_secs(3600), run.join())
        .await
        .expect("cancel must end a run blocked on a full stream")
        .unwrap();
    assert!(matches!(res.outcome, Outcome::Cancelled { .. }));
    assert_valid_history(&res.session.history);
}

#[test]
fn blocking_runs_without_a_runtime() {
    let agent = Blocking::new(Agent::new(echo_model(), ToolSet::new())).unwrap();
    let res = agent.run(AgentRequest::new(Session::new(), "hi")).unwrap();
    assert_eq!(res.text().as_deref(), Some("echo hi"));
    let batch = agent.run_batch(["a", "b"].map(|q| AgentRequest::new(Session::new(), q)), 2);
    let texts: Vec<String> = batch
        .into_iter()
        .map(|r| r.unwrap().text().unwrap())
        .collect();
    assert_eq!(texts, ["echo a", "echo b"]);
}
