//! What the loop saves, and when: each tool result as it finishes (its siblings still running
//! stay unanswered), nothing twice, the input withdrawn when a layer stops the first model
//! call, and nothing at all for a `Continue` with nothing to continue.

mod common;

use std::time::Duration;

use common::Saves;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::history::validate;
use tower_agent_core::{
    AgentInput, AgentRequest, Error, ErrorKind, Message, ModelRequest, ModelResponse, Outcome,
    Session, StopReason, ToolCall, before_model,
};
use tower_agent_loop::{Agent, AgentBuilder};
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{ToolSet, tool_fn};

#[derive(Deserialize, JsonSchema)]
struct Wait {
    ms: u64,
}

/// `wait` sleeps for `ms` milliseconds and answers `waited {ms}`.
fn waiting_tool() -> ToolSet {
    ToolSet::new().tool(tool_fn("wait", "Wait.", |args: Wait| async move {
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        Ok::<_, Error>(format!("waited {}", args.ms))
    }))
}

/// The ids of the calls a saved history answers.
fn answered(session: &Session) -> Vec<String> {
    session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.call_id.clone())
        .collect()
}

fn request(saves: &Saves, session: Session, input: impl Into<AgentInput>) -> AgentRequest {
    AgentRequest::new(session, input).with_saver(saves.clone())
}

async fn finished_results_are_saved_as_they_come(builder: AgentBuilder) {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ToolCall::new("slow", "wait", json!({"ms": 1000})),
            ToolCall::new("fast", "wait", json!({"ms": 10})),
        ]),
        ModelResponse::text("done"),
    ]);
    let saves = Saves::default();
    let agent = builder.build(model, waiting_tool());
    let res = agent
        .oneshot(request(&saves, Session::with_id("s"), "go"))
        .await
        .expect("the run");
    assert_eq!(res.text().as_deref(), Some("done"));
    let saved = saves.all();
    // The fast call's result is saved while the slow call still runs (concurrent), or as soon
    // as it ends (sequential: the slow one first). Either way, a crash between the two results
    // keeps the first.
    let partial: Vec<Vec<String>> = saved.iter().map(answered).collect();
    assert!(
        partial.iter().any(|ids| ids.len() == 1),
        "a version with one finished result and its sibling unanswered: {partial:?}"
    );
    // Every version is valid once the calls still in flight are set aside: a resume answers
    // those, and only those.
    for session in &saved {
        let open: Vec<&str> = session
            .history
            .open_calls()
            .into_iter()
            .map(|call| call.id.as_str())
            .collect();
        validate(&session.history, &open).expect("a valid saved history");
    }
    // Nothing is written twice: each version differs from the one before.
    for pair in saved.windows(2) {
        assert_ne!(pair[0], pair[1], "the same session saved twice in a row");
    }
    // The last version is the session the run returns.
    assert_eq!(saved.last(), Some(&res.session));
}

#[tokio::test(start_paused = true)]
async fn each_result_is_saved_as_it_finishes_when_calls_run_concurrently() {
    finished_results_are_saved_as_they_come(Agent::builder().concurrent_tools(4)).await;
}

#[tokio::test(start_paused = true)]
async fn each_result_is_saved_as_it_finishes_when_calls_run_in_turn() {
    finished_results_are_saved_as_they_come(Agent::builder()).await;
}

#[tokio::test(start_paused = true)]
async fn a_concurrent_round_saves_the_fast_result_before_the_slow_one_ends() {
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ToolCall::new("slow", "wait", json!({"ms": 1000})),
            ToolCall::new("fast", "wait", json!({"ms": 10})),
        ]),
        ModelResponse::text("done"),
    ]);
    let saves = Saves::default();
    let agent = Agent::builder()
        .concurrent_tools(4)
        .build(model, waiting_tool());
    agent
        .oneshot(request(&saves, Session::with_id("s"), "go"))
        .await
        .expect("the run");
    let versions: Vec<Vec<String>> = saves.all().iter().map(answered).collect();
    assert!(
        versions.contains(&vec!["fast".to_owned()]),
        "the fast call answered, the slow one still open: {versions:?}"
    );
}

#[tokio::test]
async fn continue_with_nothing_to_continue_is_a_bad_request_before_any_model_call() {
    let model = ScriptedModel::new([ModelResponse::text("hello from nowhere")]);
    let saves = Saves::default();
    let agent = Agent::builder().build(model.clone(), waiting_tool());
    let error = agent
        .oneshot(request(
            &saves,
            Session::with_id("new"),
            AgentInput::Continue,
        ))
        .await
        .expect_err("nothing to continue");
    assert_eq!(error.kind(), ErrorKind::BadRequest);
    assert_eq!(model.request_count(), 0, "the model was never called");
    assert!(saves.all().is_empty(), "nothing was saved");
}

/// A model layer that refuses every call (`refused`), as a tripped input guardrail or a reached
/// limit does, or stops it after an answer (an output guardrail).
fn stopping(
    model: ScriptedModel,
    refused: bool,
) -> impl tower::Service<ModelRequest, Response = ModelResponse, Error = Error, Future = impl Send> + Clone
{
    ServiceBuilder::new()
        .layer(before_model(move |_: ModelRequest| async move {
            let reason = StopReason::Limit {
                name: "model calls per session".into(),
                limit: 1,
            };
            Ok(tower_agent_core::Flow::Answer(match refused {
                true => ModelResponse::refuse(reason),
                false => ModelResponse::stop(reason),
            }))
        }))
        .service(model)
}

#[tokio::test]
async fn a_layer_that_refuses_the_first_model_call_leaves_the_session_as_it_found_it() {
    let mut session = Session::with_id("s");
    session.history.push(Message::user("earlier"));
    session.history.push(Message::assistant("earlier answer"));
    let before = session.clone();
    let saves = Saves::default();
    let model = ScriptedModel::new([]);
    let agent = Agent::builder().build(stopping(model.clone(), true), waiting_tool());
    let res = agent
        .oneshot(request(&saves, session, "one more"))
        .await
        .expect("a stop is an outcome");
    assert!(matches!(res.outcome, Outcome::Stopped { .. }));
    assert_eq!(
        res.session.history, before.history,
        "the input was withdrawn"
    );
    assert_eq!(
        saves.all().last().map(|s| &s.history),
        Some(&before.history),
        "and the last saved version does not hold it"
    );
    // The next run goes on from there with its own input alone.
    let model = ScriptedModel::new([ModelResponse::text("ok")]);
    let agent = Agent::builder().build(model.clone(), waiting_tool());
    agent
        .oneshot(AgentRequest::new(res.session, "next"))
        .await
        .expect("the next run");
    let sent: Vec<String> = model.requests()[0]
        .messages
        .iter()
        .map(Message::text)
        .collect();
    assert_eq!(sent, ["earlier", "earlier answer", "next"]);
}

#[tokio::test]
async fn a_first_model_call_stopped_but_not_refused_keeps_the_input() {
    let saves = Saves::default();
    let model = stopping(ScriptedModel::new([]), false);
    let agent = Agent::builder().build(model, waiting_tool());
    let res = agent
        .oneshot(request(&saves, Session::with_id("s"), "hello"))
        .await
        .expect("a stop is an outcome");
    assert!(matches!(res.outcome, Outcome::Stopped { .. }));
    let kept: Vec<String> = res.session.history.iter().map(Message::text).collect();
    assert_eq!(kept, ["hello"], "an answer withheld leaves the question");
}

#[tokio::test]
async fn a_refused_first_call_withdraws_the_input_even_after_a_layer_rewrote_the_history() {
    let mut session = Session::with_id("s");
    session.history.push(Message::user("earlier"));
    session.history.push(Message::assistant("earlier answer"));
    // A layer that folds the oldest message (as a summary does), then refuses the call.
    let model = ServiceBuilder::new()
        .layer(tower_agent_core::around_model(
            |req: ModelRequest, _next| async move {
                let kept = req.messages[1..].to_vec();
                let reason = StopReason::Limit {
                    name: "budget".into(),
                    limit: 1,
                };
                let mut res = ModelResponse::refuse(reason);
                res.commit(tower_agent_core::History::from(kept));
                Ok(res)
            },
        ))
        .service(ScriptedModel::new([]));
    let agent = Agent::builder().build(model, waiting_tool());
    let saves = Saves::default();
    let res = agent
        .oneshot(request(&saves, session, "one more"))
        .await
        .expect("a stop is an outcome");
    let kept: Vec<String> = res.session.history.iter().map(Message::text).collect();
    assert_eq!(
        kept,
        ["earlier answer"],
        "the rewrite stays, the input does not"
    );
}

#[tokio::test]
async fn a_call_that_ran_with_other_arguments_is_saved_with_them_beside_its_result() {
    let tools = ToolSet::new().tool(tower_agent_test::StubTool::from_fn("refund", |req| {
        tower_agent_core::ToolResponse::success(&req.call, "refunded 100")
            .ran_with(json!({"amount": 100}).to_string())
    }));
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([ToolCall::new("r1", "refund", json!({"amount": 1000}))]),
        ModelResponse::text("done"),
    ]);
    let saves = Saves::default();
    Agent::builder()
        .build(model, tools)
        .oneshot(request(&saves, Session::with_id("s"), "refund it"))
        .await
        .expect("the run");
    for session in saves.all() {
        if answered(&session).is_empty() {
            continue;
        }
        let call = session
            .history
            .iter()
            .flat_map(Message::tool_calls)
            .find(|c| c.id == "r1")
            .expect("the call");
        assert_eq!(
            call.arguments, r#"{"amount":100}"#,
            "every version holding the result shows the arguments the call ran with"
        );
    }
}
