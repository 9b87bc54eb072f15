//! Record and replay: a real run against aimock (`.ci/run` starts it and sets `AIMOCK_URL`)
//! recorded through a cassette right around the provider, then replayed with no server at all,
//! to the same session; a changed system prompt misses the cassette with a readable diff.

#![cfg(feature = "openai")]

use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, ModelRequest, ModelResponse, Session, new_id,
};
use tower_agent_layers::ServiceBuilderExt;
use tower_agent_layers::retry::RetryPolicy;
use tower_agent_loop::Agent;
use tower_agent_providers::OpenAi;
use tower_agent_test::cassette::{Cassette, Mode};
use tower_agent_test::{StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

fn aimock() -> Option<String> {
    match std::env::var("AIMOCK_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim_end_matches('/').to_owned()),
        _ => {
            let reason = "AIMOCK_URL is not set: aimock is not running (`bash .ci/run` installs \
                          and starts it)";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{reason}");
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// The agent: instructions, patching and retry above the model, which is `model` (a cassette
/// right around the provider, or the cassette alone).
fn agent<M>(
    model: M,
    instructions: &str,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error>
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    let tools = ToolSet::new().tool(StubTool::returning("weather", "18°C, sunny"));
    let model = ServiceBuilder::new()
        .instructions(instructions)
        .patch_dangling()
        .retry_calls(
            RetryPolicy::new()
                .budget(None)
                .jitter(Duration::ZERO)
                .max_delay(Duration::from_secs(2)),
        )
        .service(model);
    Agent::new(model, tools)
}

fn question() -> AgentRequest {
    AgentRequest::new(Session::with_id("paris"), "What is the weather in Paris?")
}

#[tokio::test]
async fn a_recorded_run_replays_without_the_server_and_a_changed_prompt_shows_the_diff() {
    let Some(url) = aimock() else { return };
    let path = std::env::temp_dir().join(format!("tower-agent-cassette-{}.jsonl", new_id()));

    // Record against aimock (its first answer is a 429: the retry above the recorder
    // recovers, and only answers are recorded).
    let provider = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{url}/v1"))
        .api_key("sk-aimock-SECRET-0123456789abcdef")
        .header("x-test-id", &new_id())
        .expect("a valid header");
    let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
    let model = ServiceBuilder::new()
        .layer(recording.layer())
        .service(provider);
    let recorded = agent(model, "Answer in one sentence.")
        .oneshot(question())
        .await
        .expect("the recorded run completes");
    assert_eq!(
        recorded.text().as_deref(),
        Some("It is 18°C and sunny in Paris.")
    );
    assert_eq!(
        recording.len(),
        2,
        "a call for the tool, a call for the answer"
    );
    let file = std::fs::read_to_string(&path).expect("written");
    assert_eq!(file.lines().count(), 2);
    assert!(!file.contains("SECRET"), "no key on the cassette");

    // Replay with no server behind it: the same session.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let replayed = agent(replay.model(), "Answer in one sentence.")
        .oneshot(question())
        .await
        .expect("the replayed run completes");
    assert_eq!(replayed.text(), recorded.text());
    assert_eq!(replayed.session.history, recorded.session.history);
    assert_eq!(replayed.usage, recorded.usage);
    assert_valid_history(&replayed.session.history);

    // Another system prompt: the first call misses, and the error says what changed.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let error = agent(replay.model(), "Answer in two sentences.")
        .oneshot(question())
        .await
        .expect_err("not on the cassette");
    let message = error.to_string();
    assert!(
        message
            .lines()
            .any(|l| l.starts_with('-') && l.contains("Answer in one sentence.")),
        "{message}"
    );
    assert!(
        message
            .lines()
            .any(|l| l.starts_with('+') && l.contains("Answer in two sentences.")),
        "{message}"
    );
    // Only the changed line differs: the messages are the same.
    assert_eq!(
        message
            .lines()
            .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            .count(),
        1,
        "{message}"
    );
    let _ = std::fs::remove_file(&path);
}
