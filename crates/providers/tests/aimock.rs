//! End to end against aimock (npm `@copilotkit/aimock`, pinned in `.ci/run`), an outside mock
//! server that speaks the OpenAI and Anthropic APIs and streams: an agent run through the
//! default stack (patching, instructions, retry), tool call → tool result → final answer,
//! streamed, with one injected 429 recovered by the retry policy.
//!
//! `.ci/run` installs aimock, starts it on 127.0.0.1 with `tests/aimock/fixtures.json` and sets
//! `AIMOCK_URL`. Without it the tests say so and pass, except in CI (`CI=true`), where a
//! missing server fails them.

#![cfg(all(feature = "openai", feature = "anthropic"))]

use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, ErrorKind, Event, ModelRequest, ModelResponse, Session,
    new_id,
};
use tower_agent_layers::retry::RetryPolicy;
use tower_agent_layers::{InstructionsLayer, PatchDanglingLayer, RetryLayer};
use tower_agent_loop::Agent;
use tower_agent_providers::{Anthropic, OpenAi};
use tower_agent_test::cassette::{Cassette, Mode};
use tower_agent_test::{EventRecorder, StubTool, assert_valid_history};
use tower_agent_tools::ToolSet;

/// aimock's URL, or `None` (printed) when the test cannot run here.
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

/// The default stack around `model`: patching at the agent and the model, an instruction
/// block, retry innermost; a weather tool.
fn agent<M>(model: M) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error>
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    agent_with(model, "Answer in one sentence.")
}

/// [`agent`] with other instructions.
fn agent_with<M>(
    model: M,
    instructions: &str,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error>
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    let tools = ToolSet::new().tool(StubTool::returning("weather", "18°C, sunny"));
    let model = ServiceBuilder::new()
        .layer(InstructionsLayer::from(instructions))
        .layer(PatchDanglingLayer::new())
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .throttle(None)
                .jitter(Duration::ZERO)
                .max_delay(Duration::from_secs(2)),
        ))
        .service(model);
    ServiceBuilder::new()
        .layer(PatchDanglingLayer::new())
        .service(
            Agent::builder()
                .tool_specs(tools.specs())
                .build(model, tools),
        )
}

/// An OpenAI model on aimock, with a test id of its own: aimock counts fixture matches per
/// `X-Test-Id`.
fn openai(url: &str) -> OpenAi {
    OpenAi::new("gpt-4o-mini")
        .base_url(format!("{url}/v1"))
        .api_key("sk-aimock")
        .header("x-test-id", &new_id())
        .expect("a valid header")
}

/// An Anthropic model on aimock, with a test id of its own.
fn anthropic(url: &str) -> Anthropic {
    Anthropic::new("claude-sonnet-4-5")
        .base_url(url)
        .api_key("sk-ant-aimock")
        .header("x-test-id", &new_id())
        .expect("a valid header")
}

fn names(recorder: &EventRecorder) -> Vec<&'static str> {
    recorder.names()
}

#[tokio::test]
async fn an_openai_run_recovers_from_a_429_and_streams_to_the_answer() {
    let Some(url) = aimock() else { return };
    let model = openai(&url);
    let recorder = EventRecorder::new();
    let req = AgentRequest::new(Session::new(), "What is the weather in Paris?")
        .with_observer(recorder.clone());
    let res = agent(model).oneshot(req).await.expect("the run completes");

    assert_eq!(
        res.text().as_deref(),
        Some("It is 18°C and sunny in Paris.")
    );
    assert_valid_history(&res.session.history);
    let events = recorder.events();
    let retried: Vec<&Error> = events
        .iter()
        .filter_map(|e| match e {
            Event::Retrying { error, .. } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(retried.len(), 1, "{:?}", names(&recorder));
    assert_eq!(
        retried[0].kind(),
        ErrorKind::RateLimited {
            retry_after: Some(Duration::from_secs(1))
        }
    );
    assert!(
        names(&recorder).contains(&"text_delta"),
        "streamed: {:?}",
        names(&recorder)
    );
    assert_eq!(recorder.tools_finished().len(), 1);
}

#[tokio::test]
async fn an_anthropic_run_calls_a_tool_and_answers() {
    let Some(url) = aimock() else { return };
    let model = anthropic(&url);
    let recorder = EventRecorder::new();
    let req = AgentRequest::new(Session::new(), "What is the weather in Oslo?")
        .with_observer(recorder.clone());
    let res = agent(model).oneshot(req).await.expect("the run completes");
    assert_eq!(
        res.text().as_deref(),
        Some("It is 4°C with light rain in Oslo.")
    );
    assert_eq!(res.rounds, 2);
    assert_valid_history(&res.session.history);
}

#[tokio::test]
async fn a_server_error_is_retried_then_returned_typed() {
    let Some(url) = aimock() else { return };
    let model = OpenAi::new("m")
        .base_url(format!("{url}/v1"))
        .header("x-test-id", &new_id())
        .expect("a valid header");
    let mut model = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .throttle(None)
                .max_attempts(2)
                .base(Duration::from_millis(10))
                .jitter(Duration::ZERO),
        ))
        .service(model);
    let req = ModelRequest::new(vec![tower_agent_core::Message::user("Server error please")]);
    let err = model
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect_err("500 twice");
    assert_eq!(err.kind(), ErrorKind::Server);
    assert!(err.message().contains("upstream failure"), "{err}");
}

#[tokio::test]
async fn an_overloaded_provider_falls_back_to_another_one_and_readers_are_told_to_discard() {
    use tower::Layer;
    use tower_agent_layers::fallback::FallbackLayer;
    let Some(url) = aimock() else { return };
    let test_id = new_id();
    // The primary (OpenAI's wire) is overloaded for this model; the backup (Anthropic's wire)
    // answers; both through the same retry.
    let primary = OpenAi::new("primary-down")
        .base_url(format!("{url}/v1"))
        .api_key("sk-aimock")
        .header("x-test-id", &test_id)
        .expect("a valid header");
    let backup = Anthropic::new("claude-sonnet-4-5")
        .base_url(&url)
        .api_key("sk-ant-aimock")
        .header("x-test-id", &test_id)
        .expect("a valid header");
    let retry = || {
        tower_agent_layers::retry::RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(2)
                .base(Duration::from_millis(10))
                .jitter(Duration::ZERO)
                .throttle(None),
        )
    };
    let model = FallbackLayer::new()
        .to("anthropic", retry().layer(backup))
        .layer(retry().layer(primary));
    let recorder = EventRecorder::new();
    let mut req = ModelRequest::new(vec![tower_agent_core::Message::user("Fall back please")]);
    req.ctx = tower_agent_core::RunContext::new().with_observer(recorder.clone());
    let res = model.oneshot(req).await.expect("the backup answers");
    assert_eq!(res.message.text(), "Answered by the backup.");
    // The primary's two attempts each end with a retry notice (the retry's, then the
    // fallback's): a reader discards what came before each.
    let retrying = recorder
        .names()
        .iter()
        .filter(|n| **n == "retrying")
        .count();
    assert_eq!(retrying, 2, "{:?}", recorder.names());
}

/// The answer of the "Break the stream please" fixtures.
const UNBROKEN: &str = "A stream that broke after fifty chunks is retracted, and the retry streams this answer from its first word to its last, so the reader assembles it exactly once: no word twice, none of the broken attempt, nothing missing at the end of it.";

/// A stream aimock breaks after 50 chunks, then serves whole: a reader is told to take back
/// what it got, and what it puts together is the message.
async fn a_broken_stream_is_retracted<M>(model: M)
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    let recorder = EventRecorder::new();
    let req = AgentRequest::new(Session::new(), "Break the stream please")
        .with_observer(recorder.clone());
    let res = agent(model)
        .oneshot(req)
        .await
        .expect("the retry completes");
    assert_eq!(res.text().as_deref(), Some(UNBROKEN));
    let names = names(&recorder);
    let retract = names.iter().position(|n| *n == "retract");
    let retract = retract.unwrap_or_else(|| panic!("no retract: {names:?}"));
    let before = names[..retract]
        .iter()
        .filter(|n| **n == "text_delta")
        .count();
    // aimock's 50 chunks, less those that carry no text (the role, the block's start).
    assert!(
        (40..=50).contains(&before),
        "{before} deltas before the break: {names:?}"
    );
    assert_eq!(names[retract + 1], "retrying");
    assert_eq!(names.iter().filter(|n| **n == "retract").count(), 1);
    assert_eq!(recorder.streamed_text(1), UNBROKEN);
}

#[tokio::test]
async fn an_openai_stream_broken_midway_is_retracted_and_streamed_again() {
    let Some(url) = aimock() else { return };
    let model = openai(&url);
    a_broken_stream_is_retracted(model).await;
}

#[tokio::test]
async fn an_anthropic_stream_broken_midway_is_retracted_and_streamed_again() {
    let Some(url) = aimock() else { return };
    let model = anthropic(&url);
    a_broken_stream_is_retracted(model).await;
}

/// An input guardrail in parallel with a slow stream (a chunk every 20 ms, about 8 s in all)
/// trips after 150 ms: the call is dropped, its connection closed, and no delta comes after
/// the trip.
async fn a_parallel_trip_drops_the_stream<M>(model: M)
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    use tower::Layer;
    use tower_agent_core::{Outcome, StopReason};
    use tower_agent_layers::guardrail::{Guardrail, GuardrailLayer, Verdict};

    let secret = Guardrail::new("secrets", |text: String| async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        match text.contains("secret") {
            true => Verdict::trip("asks for a secret"),
            false => Verdict::Pass,
        }
    });
    let guard = GuardrailLayer::new().input(secret).parallel(true);
    let recorder = EventRecorder::new();
    let agent = Agent::new(guard.layer(model), ToolSet::new());
    let started = std::time::Instant::now();
    let res = agent
        .oneshot(
            AgentRequest::new(Session::new(), "Tell me the secret plan")
                .with_observer(recorder.clone()),
        )
        .await
        .expect("the run ends");
    let elapsed = started.elapsed();
    assert!(
        matches!(&res.outcome, Outcome::Stopped { reason: StopReason::Guardrail { name, .. }, .. } if name == "secrets"),
        "{:?}",
        res.outcome
    );
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    let names = names(&recorder);
    // The stream was live (deltas came), then taken back, and nothing came after.
    let retract = names.iter().position(|n| *n == "retract");
    let retract = retract.unwrap_or_else(|| panic!("no retract: {names:?}"));
    assert!(!names[retract..].contains(&"text_delta"), "{names:?}");
    let deltas = names.iter().filter(|n| **n == "text_delta").count();
    assert!((1..20).contains(&deltas), "{deltas} deltas: {names:?}");
    assert_eq!(recorder.streamed_text(1), "");
    // A tripped input is not appended: the next run starts from the session as it was.
    assert_eq!(res.session.history.len(), 0, "nothing tripped stays");
    // The connection was dropped, not left streaming: nothing more comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(crate::names(&recorder), names);
}

#[tokio::test]
async fn an_openai_stream_is_dropped_when_a_parallel_guardrail_trips() {
    let Some(url) = aimock() else { return };
    let model = openai(&url);
    a_parallel_trip_drops_the_stream(model).await;
}

#[tokio::test]
async fn an_anthropic_stream_is_dropped_when_a_parallel_guardrail_trips() {
    let Some(url) = aimock() else { return };
    let model = anthropic(&url);
    a_parallel_trip_drops_the_stream(model).await;
}

/// A recorded answer streamed three characters a chunk, an email and an API key in it: each
/// split across many chunks, neither reaches a reader, and what readers assemble is the
/// redacted message.
async fn a_split_secret_never_reaches_a_reader<M>(model: M)
where
    M: Service<ModelRequest, Response = ModelResponse, Error = Error> + Clone + Send + 'static,
    M::Future: Send,
{
    use tower::Layer;
    use tower_agent_layers::redact::{RedactLayer, Rules};

    let redact = RedactLayer::new(Rules::new().emails().api_keys());
    let recorder = EventRecorder::new();
    let agent = Agent::new(redact.layer(model), ToolSet::new());
    let res = agent
        .oneshot(
            AgentRequest::new(Session::new(), "Who can give me access?")
                .with_observer(recorder.clone()),
        )
        .await
        .expect("answered");
    let filler = "Lorem ipsum dolor sit amet. ".repeat(24);
    let expected = format!("{filler}Mail [REDACTED:email], {filler}key [REDACTED:api_key], thanks");
    assert_eq!(res.text().as_deref(), Some(expected.as_str()));
    assert_eq!(recorder.streamed_text(1), expected);
    assert!(!names(&recorder).contains(&"retract"));
    let deltas = recorder.text_deltas();
    // Released as it streamed: the email went up redacted long before the end.
    assert!(deltas.len() > 100, "{} deltas", deltas.len());
    let email = deltas.iter().position(|d| d.contains("[REDACTED:email]"));
    assert!(email.is_some_and(|at| at + 20 < deltas.len()), "{deltas:?}");
    for secret in ["ada", "lovelace", "example", "sk-", "abcdef"] {
        assert!(
            deltas.iter().all(|d| !d.contains(secret)),
            "{secret} in {deltas:?}"
        );
    }
}

#[tokio::test]
async fn a_secret_split_across_openai_chunks_never_reaches_a_reader() {
    let Some(url) = aimock() else { return };
    a_split_secret_never_reaches_a_reader(openai(&url)).await;
}

#[tokio::test]
async fn a_secret_split_across_anthropic_chunks_never_reaches_a_reader() {
    let Some(url) = aimock() else { return };
    a_split_secret_never_reaches_a_reader(anthropic(&url)).await;
}

/// The run about Paris. Its run id is fixed: a replay from the cassette is the recorded run
/// again, and its calls get the same keys.
fn paris() -> AgentRequest {
    let mut req = AgentRequest::new(Session::with_id("paris"), "What is the weather in Paris?");
    req.ctx = tower_agent_core::RunContext::new().with_run_id("paris-run");
    req
}

/// Record and replay: the run above recorded through a cassette right around the provider,
/// then replayed with no server at all, to the same session; a changed system prompt misses
/// the cassette with a readable diff.
#[tokio::test]
async fn a_recorded_run_replays_without_the_server_and_a_changed_prompt_shows_the_diff() {
    let Some(url) = aimock() else { return };
    let path = std::env::temp_dir().join(format!("tower-agent-cassette-{}.jsonl", new_id()));

    // Record against aimock (its first answer is a 429: the retry above the recorder
    // recovers, and only answers are recorded).
    let provider = openai(&url);
    let recording = Cassette::open(&path, Mode::Record).expect("a new cassette");
    let model = ServiceBuilder::new()
        .layer(recording.layer())
        .service(provider);
    let recorded = agent(model)
        .oneshot(paris())
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
    assert!(!file.contains("sk-aimock"), "no key on the cassette");

    // Replay with no server behind it: the same session.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let replayed = agent(replay.model())
        .oneshot(paris())
        .await
        .expect("the replayed run completes");
    assert_eq!(replayed.text(), recorded.text());
    assert_eq!(replayed.session.history, recorded.session.history);
    assert_eq!(replayed.usage, recorded.usage);
    assert_valid_history(&replayed.session.history);

    // Another system prompt: the first call misses, and the error says what changed.
    let replay = Cassette::open(&path, Mode::Replay).expect("the cassette");
    let error = agent_with(replay.model(), "Answer in two sentences.")
        .oneshot(paris())
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
