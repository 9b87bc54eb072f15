//! A pause before a model call (`ModelResponse::pause`), on the canonical stack with a store:
//! the run ends interrupted with the pause saved, a new process resumes it by key, the layer
//! reads the answer; a `Continue` keeps it waiting, new messages drop it, a wrong resume
//! changes nothing, and a run that dies after the resume asks again rather than going on
//! unasked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tower_agent::CancellationToken;
use tower_agent::layers::PatchDanglingLayer;
use tower_agent::layers::RetryLayer;
use tower_agent::layers::approval::ApprovalLayer;
use tower_agent::layers::evict::EvictLayer;
use tower_agent::layers::limits::{CallLimitsLayer, Limit};
use tower_agent::layers::redact::{RedactLayer, Rules};
use tower_agent::layers::retry::RetryPolicy;
use tower_agent::prelude::*;
use tower_agent::sessions::{InMemorySessions, SessionStore, StoreLayer};
use tower_agent::storage::InMemory;
use tower_agent::{Decisions, Flow, Interrupt, Role, before_model};
use tower_agent_test::{StubTool, assert_valid_history};

const KEY: &str = "after-a-tool-round";

/// What the pausing layer read of the resume, each time it was asked.
type Seen = Arc<Mutex<Vec<Option<Value>>>>;

/// The model: a lookup in its first round, then an answer; `hang` makes it wait forever
/// instead of answering (a process that dies there).
fn model(hang: Arc<Mutex<bool>>) -> BoxModel {
    BoxModel::new(tower::service_fn(move |req: ModelRequest| {
        let hang = *hang.lock().expect("the flag");
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            let looked = req
                .messages
                .iter()
                .any(|m| m.tool_results().next().is_some());
            Ok::<_, Error>(match looked {
                false => ModelResponse::tool_calls([ToolCall::new("c1", "lookup", json!({}))]),
                true => ModelResponse::text("Here it is."),
            })
        }
    }))
}

/// One process: the canonical stack on `store`, with a host layer that pauses before any model
/// call that follows a tool round, unless the resume answered `go` (`stop` ends the run).
fn agent(store: &InMemorySessions, seen: &Seen, hang: Arc<Mutex<bool>>) -> BoxAgent {
    let seen = seen.clone();
    let pause = before_model(move |req: ModelRequest| {
        let seen = seen.clone();
        async move {
            let after_tools = matches!(req.messages.last(), Some(m) if m.role == Role::Tool);
            if !after_tools {
                return Ok(Flow::Continue(req));
            }
            let answer = req.ctx.resumed(KEY);
            seen.lock().expect("seen").push(answer.clone());
            Ok(match answer.as_ref().and_then(Value::as_str) {
                Some("go") => Flow::Continue(req),
                Some(_) => Flow::Answer(ModelResponse::stop(StopReason::Layer {
                    reason: "the host said stop".into(),
                })),
                None => Flow::Answer(ModelResponse::pause(Interrupt::before_model(
                    KEY,
                    "pause",
                    json!("The lookup is done. Go on?"),
                ))),
            })
        }
    });
    let tools = ToolSet::new().tool(StubTool::returning("lookup", "ada@example.com, 42"));
    BoxAgent::new(
        Agent::builder()
            .with(StoreLayer::new(store.clone()))
            .with(RedactLayer::new(Rules::new().emails()))
            .with(PatchDanglingLayer::new())
            .with(CallLimitsLayer::new().model_calls(Limit::per_run(5)))
            .with(ApprovalLayer::builder().build().expect("valid"))
            .with(EvictLayer::new(InMemory::new()))
            .with(RetryLayer::new(RetryPolicy::new()))
            .model_layer(pause)
            .tool_specs(tools.specs())
            .build(model(hang), tools),
    )
}

fn waiting(res: &AgentResponse) -> &Interrupt {
    let Outcome::Interrupted { interrupts } = &res.outcome else {
        panic!("paused: {:?}", res.outcome);
    };
    assert_eq!(interrupts.len(), 1, "{interrupts:?}");
    assert_eq!(
        res.session.interrupts, *interrupts,
        "the pause is in the session"
    );
    &interrupts[0]
}

async fn paused_run(store: &InMemorySessions, seen: &Seen) -> AgentResponse {
    let res = agent(store, seen, Arc::default())
        .oneshot(AgentRequest::new(Session::with_id("s"), "Look it up."))
        .await
        .expect("an outcome");
    let pause = waiting(&res);
    assert!(pause.before_model);
    assert_eq!(pause.call.id, KEY);
    assert_eq!(pause.payload, json!("The lookup is done. Go on?"));
    // What the run did is kept: the input, the call and its (redacted) result; no message of
    // the paused call.
    let roles: Vec<Role> = res.session.history.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool]);
    assert_valid_history(&res.session.history);
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(stored.session.interrupts, res.session.interrupts, "saved");
    assert!(
        !serde_json::to_string(&stored.session)
            .expect("json")
            .contains("ada@")
    );
    res
}

#[tokio::test]
async fn a_pause_before_a_model_call_is_saved_and_a_new_process_resumes_it_by_key() {
    let (store, seen) = (InMemorySessions::new(), Seen::default());
    paused_run(&store, &seen).await;

    // Another process: a Continue keeps it waiting, the model not called.
    let later = agent(&store, &seen, Arc::default());
    let kept = later
        .clone()
        .oneshot(AgentRequest::new(
            Session::with_id("s"),
            AgentInput::Continue,
        ))
        .await
        .expect("an outcome");
    assert_eq!(waiting(&kept).call.id, KEY);

    // A resume that does not answer the pause is refused, the session as it was.
    let refused = later
        .clone()
        .oneshot(AgentRequest::resume(
            Session::with_id("s"),
            Decisions::new().with("another", "go"),
        ))
        .await
        .expect_err("refused");
    assert_eq!(refused.kind(), ErrorKind::BadRequest);
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert_eq!(stored.session.interrupts.len(), 1, "still waiting");

    // Resumed by key: the layer reads the answer, the model is called, the run completes.
    let done = later
        .oneshot(AgentRequest::resume(
            Session::with_id("s"),
            Decisions::new().with(KEY, "go"),
        ))
        .await
        .expect("the resumed run");
    assert_eq!(done.text().as_deref(), Some("Here it is."));
    assert!(done.session.interrupts.is_empty());
    assert_valid_history(&done.session.history);
    assert_eq!(
        *seen.lock().expect("seen"),
        [None, Some(json!("go"))],
        "asked once unanswered (a Continue asks nothing), then with the answer"
    );
    let stored = store.load("s").await.expect("loads").expect("stored");
    assert!(stored.session.interrupts.is_empty());
    assert_eq!(stored.session.history.len(), 4);
}

#[tokio::test]
async fn an_answer_that_stops_ends_the_run_and_new_messages_drop_a_pause() {
    let (store, seen) = (InMemorySessions::new(), Seen::default());
    paused_run(&store, &seen).await;
    let stopped = agent(&store, &seen, Arc::default())
        .oneshot(AgentRequest::resume(
            Session::with_id("s"),
            Decisions::new().with(KEY, "stop"),
        ))
        .await
        .expect("an outcome");
    assert!(
        matches!(&stopped.outcome, Outcome::Stopped { reason: StopReason::Layer { reason }, .. } if reason == "the host said stop"),
        "{:?}",
        stopped.outcome
    );

    // Paused again on another session, then the user moves on: the pause is dropped.
    let (store, seen) = (InMemorySessions::new(), Seen::default());
    paused_run(&store, &seen).await;
    let moved_on = agent(&store, &seen, Arc::default())
        .oneshot(AgentRequest::new(
            Session::with_id("s"),
            "Never mind, hello.",
        ))
        .await
        .expect("an outcome");
    // The new input reaches the model with no tool round after it: nothing pauses.
    assert_eq!(moved_on.text().as_deref(), Some("Here it is."));
    assert!(
        moved_on.session.interrupts.is_empty(),
        "the pause is dropped"
    );
    assert_valid_history(&moved_on.session.history);
    assert!(
        moved_on
            .session
            .history
            .iter()
            .any(|m| m.text() == "Never mind, hello.")
    );
}

#[tokio::test]
async fn a_run_that_dies_after_the_resume_asks_again_and_never_goes_on_unasked() {
    let (store, seen) = (InMemorySessions::new(), Seen::default());
    paused_run(&store, &seen).await;
    // The resumed run's model call hangs, and the process dies there (cancelled).
    let hang = Arc::new(Mutex::new(true));
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        cancel.cancel();
    });
    let died = agent(&store, &seen, hang)
        .oneshot(
            AgentRequest::resume(Session::with_id("s"), Decisions::new().with(KEY, "go"))
                .with_cancellation(token),
        )
        .await
        .expect("an outcome");
    assert!(
        matches!(died.outcome, Outcome::Cancelled { .. }),
        "{:?}",
        died.outcome
    );

    // The next process goes on from the store: the answer lived for that run only, so the
    // layer asks again instead of calling the model unasked.
    let next = agent(&store, &seen, Arc::default())
        .oneshot(AgentRequest::new(
            Session::with_id("s"),
            AgentInput::Continue,
        ))
        .await
        .expect("an outcome");
    assert_eq!(waiting(&next).call.id, KEY);
    assert_eq!(*seen.lock().expect("seen"), [None, Some(json!("go")), None]);
    assert_valid_history(&next.session.history);
}

#[tokio::test]
async fn a_stop_of_an_outer_layer_wins_over_a_pause_from_within() {
    // An inner layer pauses; an outer one stops the run on the same response (a guardrail that
    // tripped meanwhile): the run stops, and nothing waits.
    let pause = before_model(|_: ModelRequest| async {
        Ok(Flow::Answer(ModelResponse::pause(Interrupt::before_model(
            KEY,
            "pause",
            json!("go on?"),
        ))))
    });
    let stop = tower_agent::around_model(|req: ModelRequest, mut next| async move {
        let mut res = next.run(req).await?;
        res.stop = Some(StopReason::Layer {
            reason: "a policy".into(),
        });
        Ok(res)
    });
    let agent = Agent::builder()
        .model_layer(stop)
        .model_layer(pause)
        .build(model(Arc::default()), ToolSet::new());
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi"))
        .await
        .expect("an outcome");
    assert!(
        matches!(&res.outcome, Outcome::Stopped { reason: StopReason::Layer { reason }, .. } if reason == "a policy"),
        "{:?}",
        res.outcome
    );
    assert!(res.session.interrupts.is_empty());
}
