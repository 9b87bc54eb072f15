//! Steering a running run: messages a host sends while the run runs go into the session at the
//! next safe point (before the next model call, never between a call and its result), are
//! saved like any input, keep a run going that was about to answer, and a "stop" typed mid-run
//! is one use of them.

mod common;

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Notify;
use tower::{ServiceBuilder, service_fn};
use tower_agent_core::history::validate;
use tower_agent_core::{
    AgentRequest, DescribedTools, Error, Flow, Message, ModelRequest, ModelResponse, Outcome, Role,
    Session, StopReason, ToolCall, ToolRequest, ToolResponse, before_model,
};
use tower_agent_loop::{Agent, AgentServiceExt};

use common::Saves;

/// A model that calls `wait` first, then answers with how many user messages it saw; its first
/// answer (or, with `hold_answer`, its first text answer) waits until `go` is notified.
fn model(
    go: Arc<Notify>,
    hold_answer: bool,
) -> impl tower::Service<ModelRequest, Response = ModelResponse, Error = Error, Future = impl Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: ModelRequest| {
        let go = Arc::clone(&go);
        async move {
            let results = req.messages.iter().filter(|m| m.role == Role::Tool).count();
            let users = req.messages.iter().filter(|m| m.role == Role::User).count();
            let assistants = req
                .messages
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .count();
            if !hold_answer && results == 0 {
                return Ok(ModelResponse::tool_calls([ToolCall::new(
                    "w1",
                    "wait",
                    json!({}),
                )]));
            }
            if hold_answer && assistants == 0 {
                go.notified().await;
            }
            Ok::<_, Error>(ModelResponse::text(format!("saw {users} user messages")))
        }
    })
}

/// The `wait` tool: it waits until `go` is notified.
fn tools(
    go: Arc<Notify>,
    started: Arc<Notify>,
) -> DescribedTools<
    impl tower::Service<ToolRequest, Response = ToolResponse, Error = Error, Future = impl Send>
    + Clone
    + Send
    + 'static,
> {
    let spec = tower_agent_core::ToolSpec::new("wait", "Waits.", json!({"type": "object"}));
    DescribedTools::new(
        [spec],
        service_fn(move |req: ToolRequest| {
            let (go, started) = (Arc::clone(&go), Arc::clone(&started));
            async move {
                started.notify_one();
                go.notified().await;
                Ok::<_, Error>(ToolResponse::success(&req.call, "waited"))
            }
        }),
    )
}

#[tokio::test]
async fn a_message_sent_while_a_tool_runs_goes_in_after_its_result_and_is_saved() {
    let (go, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let agent =
        Agent::builder().build(model(go.clone(), false), tools(go.clone(), started.clone()));
    let saves = Saves::default();
    let request = AgentRequest::new(Session::new(), "start").with_saver(saves.clone());
    let run = agent.spawn(request);
    started.notified().await;
    run.steer(Message::user("and check the weather too"))
        .expect("the run takes it");
    go.notify_one();
    let response = run.join().await.expect("the run");
    assert_eq!(response.text().as_deref(), Some("saw 2 user messages"));
    let roles: Vec<(Role, String)> = response
        .session
        .history
        .iter()
        .map(|m| (m.role, m.text()))
        .collect();
    assert_eq!(
        roles,
        [
            (Role::User, "start".to_owned()),
            (Role::Assistant, String::new()),
            (Role::Tool, String::new()),
            (Role::User, "and check the weather too".to_owned()),
            (Role::Assistant, "saw 2 user messages".to_owned()),
        ],
        "after the call's result, before the next model call"
    );
    // Saved before the model call that read it.
    let saved = saves.all();
    let with_it = saved
        .iter()
        .position(|s| {
            s.history
                .iter()
                .any(|m| m.text() == "and check the weather too")
        })
        .expect("saved");
    assert_eq!(saved[with_it].history.len(), 4);
    for version in &saved {
        validate(&version.history, &[])
            .or_else(|_| {
                let open: Vec<&str> = version
                    .history
                    .open_calls()
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect();
                validate(&version.history, &open)
            })
            .expect("every version valid");
    }
}

#[tokio::test]
async fn a_message_sent_while_the_model_answers_keeps_the_run_going() {
    let (go, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let agent = Agent::builder().build(model(go.clone(), true), tools(go.clone(), started));
    let run = agent.spawn(AgentRequest::new(Session::new(), "hello"));
    // The model is answering the first time: the host adds a message meanwhile.
    tokio::task::yield_now().await;
    run.steer(Message::user("one more thing")).expect("taken");
    go.notify_one();
    let response = run.join().await.expect("the run");
    assert_eq!(response.rounds, 2, "the run went on for the message");
    assert_eq!(response.text().as_deref(), Some("saw 2 user messages"));
}

#[tokio::test]
async fn a_stop_typed_mid_run_stops_it_at_the_next_model_call() {
    let (go, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    // The host's rule: a user message that says "stop" ends the run.
    let stopping = ServiceBuilder::new()
        .layer(before_model(|req: ModelRequest| async move {
            let last = req.messages.last().map(Message::text).unwrap_or_default();
            Ok(match last.trim() == "stop" {
                true => Flow::Answer(ModelResponse::stop(StopReason::Layer {
                    reason: "the user said stop".into(),
                })),
                false => Flow::Continue(req),
            })
        }))
        .service(model(go.clone(), false));
    let agent = Agent::builder().build(stopping, tools(go.clone(), started.clone()));
    let run = agent.spawn(AgentRequest::new(Session::new(), "start"));
    started.notified().await;
    run.steer(Message::user("stop")).expect("taken");
    let steer = run.steering();
    go.notify_one();
    let response = run.join().await.expect("the run");
    assert!(
        matches!(
            &response.outcome,
            Outcome::Stopped {
                reason: StopReason::Layer { .. },
                ..
            }
        ),
        "{:?}",
        response.outcome
    );
    // The run is over: nothing more is taken.
    assert!(steer.send(Message::user("hello?")).is_err());
}
