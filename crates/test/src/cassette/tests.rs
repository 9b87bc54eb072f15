//! The cassette's unit tests.

use super::*;
use crate::{ScriptedModel, StubTool};
use tower::ServiceExt;
use tower_agent_core::{AgentRequest, Message, ModelRequest, Session, ToolCall, ToolRequest};
use tower_agent_loop::Agent;
use tower_agent_tools::ToolSet;
use tower_layer::Layer;
use tower_service::Service;

#[tokio::test]
async fn tool_calls_replay_from_the_cassette_and_the_tools_do_not_run() {
    let path = std::env::temp_dir().join(format!(
        "cassette-tools-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let script = || {
        ScriptedModel::new([
            ModelResponse::tool_calls([ToolCall::new(
                "c1",
                "weather",
                serde_json::json!({ "city": "Oslo" }),
            )]),
            ModelResponse::text("Rainy."),
        ])
    };
    let ask = || AgentRequest::new(Session::with_id("s"), "Weather in Oslo?");

    // Record: the model and the tool answer; both are written.
    let weather = StubTool::returning("weather", "4°C, light rain");
    let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
    let tools = recording
        .tool_layer()
        .layer(ToolSet::new().tool(weather.clone()));
    let model = recording.layer().layer(script());
    let recorded = Agent::builder()
        .build(model, tools)
        .oneshot(ask())
        .await
        .expect("recorded");
    assert_eq!(weather.calls().len(), 1);
    assert_eq!(recording.len(), 3, "two model calls and one tool call");

    // Replay: no model, and a tool that would answer otherwise is never called.
    let other = StubTool::returning("weather", "sunny");
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let tools = replay
        .tool_layer()
        .layer(ToolSet::new().tool(other.clone()));
    let replayed = Agent::builder()
        .build(replay.model(), tools)
        .oneshot(ask())
        .await
        .expect("replayed");
    assert!(other.calls().is_empty(), "the tool ran on replay");
    assert_eq!(replayed.session.history, recorded.session.history);

    // The recorded result answers the call's own id; other arguments miss, with a diff.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let mut tools = replay
        .tool_layer()
        .layer(ToolSet::new().tool(other.clone()));
    let call = ToolCall::new("c9", "weather", serde_json::json!({ "city": "Oslo" }));
    let res = tools
        .call(ToolRequest::new(call, Default::default()))
        .await
        .expect("replayed");
    assert_eq!(res.result.call_id, "c9");
    assert_eq!(res.result.content, "4°C, light rain");
    let call = ToolCall::new("c10", "weather", serde_json::json!({ "city": "Bergen" }));
    let miss = tools
        .call(ToolRequest::new(call, Default::default()))
        .await
        .expect_err("not recorded");
    let diff = miss.to_string();
    assert!(
        diff.lines()
            .any(|l| l.starts_with('-') && l.contains("Oslo")),
        "{diff}"
    );
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains("Bergen")),
        "{diff}"
    );
    assert!(other.calls().is_empty());
    let _ = std::fs::remove_file(&path);
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest::new(vec![Message::user(text)])
}

async fn text(
    model: impl Service<ModelRequest, Response = ModelResponse, Error = Error>,
    q: &str,
) -> String {
    model
        .oneshot(ask(q))
        .await
        .expect("an answer")
        .message
        .text()
}

#[tokio::test]
async fn a_request_made_again_gets_its_answers_in_order_and_record_missing_adds_only_misses() {
    let path = std::env::temp_dir().join(format!(
        "cassette-unit-{}.jsonl",
        tower_agent_core::new_id()
    ));
    let real = ScriptedModel::new([ModelResponse::text("first"), ModelResponse::text("second")]);
    let cassette = Cassette::open(&path, Mode::Record).expect("a cassette");
    let model = cassette.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "same").await, "first");
    assert_eq!(text(model, "same").await, "second");

    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay.clone(), "same").await, "first");
    assert_eq!(text(replay.clone(), "same").await, "second");
    // Past the recorded answers: the last one again.
    assert_eq!(text(replay, "same").await, "second");

    real.push(Ok(ModelResponse::text("new")));
    let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
    let model = missing.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "same").await, "first");
    assert_eq!(text(model, "other").await, "new");
    assert_eq!(real.request_count(), 3, "only the miss reached the model");
    let lines = std::fs::read_to_string(&path).expect("the file");
    assert_eq!(lines.lines().count(), 3);
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay, "other").await, "new");

    // A request made again past its recorded answers asks the model (and is recorded).
    real.push(Ok(ModelResponse::text("again")));
    let missing = Cassette::open(&path, Mode::RecordMissing).expect("read");
    let model = missing.layer().layer(real.clone());
    assert_eq!(text(model.clone(), "other").await, "new");
    assert_eq!(text(model, "other").await, "again");
    assert_eq!(real.request_count(), 4);
    let replay = Cassette::open(&path, Mode::Replay).expect("read").model();
    assert_eq!(text(replay.clone(), "other").await, "new");
    assert_eq!(text(replay, "other").await, "again");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_line_that_is_not_a_call_names_its_number() {
    let path =
        std::env::temp_dir().join(format!("cassette-bad-{}.jsonl", tower_agent_core::new_id()));
    std::fs::write(&path, "\n{\"key\": \"k\"}\n").expect("written");
    let error = Cassette::open(&path, Mode::Replay).expect_err("not a call");
    assert!(
        error.to_string().contains("line 2 is not a recorded call"),
        "{error}"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn keys_and_bearer_tokens_are_redacted() {
    let line =
        r#"{"text":"use sk-proj-abcdefghijklmnop1234 or Bearer abcdefghijklmnopqrstu, sk-short"}"#;
    assert_eq!(
        redact(line),
        r#"{"text":"use [REDACTED] or [REDACTED], sk-short"}"#
    );
    assert_eq!(
        redact("héllo AIzaSyA1234567890abcdefgh!"),
        "héllo [REDACTED]!"
    );
}
