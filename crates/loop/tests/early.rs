//! Read-only tools started while the model still streams: kept when the message has the same
//! call, run again when it does not, aborted when the stream restarts or the call fails, and
//! never for a tool that is not read-only or when the option is off. Times are on tokio's
//! paused clock: exact and instant.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};
use tower_agent_core::stream::Delta;
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, ErrorKind, Message, ModelRequest, ModelResponse, Session,
    ToolCall, around_model,
};
use tower_agent_loop::{Agent, AgentBuilder};
use tower_agent_test::{EventRecorder, ScriptedModel};
use tower_agent_tools::{ToolSet, tool_fn};

#[derive(Deserialize, JsonSchema)]
struct Query {
    q: String,
}

/// What the tools did: `started q` when a call starts, `done q` when it ends.
type Log = Arc<Mutex<Vec<String>>>;

fn log_of(log: &Log) -> Vec<String> {
    log.lock().expect("the log").clone()
}

/// A tool taking 500 ms, logging its start and its end.
fn slow(name: &'static str, log: &Log, read_only: bool) -> impl tower_agent_tools::Tool {
    let log = Arc::clone(log);
    let tool = tool_fn(name, "Look something up.", move |args: Query| {
        let log = Arc::clone(&log);
        async move {
            log.lock().expect("log").push(format!("started {}", args.q));
            tokio::time::sleep(Duration::from_millis(500)).await;
            log.lock().expect("log").push(format!("done {}", args.q));
            Ok::<_, Error>(format!("found {}", args.q))
        }
    });
    if read_only { tool.read_only() } else { tool }
}

/// Two tools of `slow`, `docs` and `code`.
fn two_slow(log: &Log, read_only: bool) -> ToolSet {
    ToolSet::new()
        .tool(slow("docs", log, read_only))
        .tool(slow("code", log, read_only))
}

/// "Checking both." and a call to each tool.
fn checking_both() -> ModelResponse {
    ModelResponse::new(Message::assistant_with_calls(
        "Checking both.",
        [
            ToolCall::new("c1", "docs", json!({"q": "retry"})),
            ToolCall::new("c2", "code", json!({"q": "backoff"})),
        ],
    ))
}

/// Round 1: "Checking both." (4 pieces) then two calls, 50 ms apart: closed at 250 and 300 ms.
/// Round 2: "Done." (2 pieces, 100 ms).
fn model() -> ScriptedModel {
    ScriptedModel::new([checking_both(), ModelResponse::text("Done.")])
        .streaming(4, Duration::from_millis(50))
}

async fn run<M>(agent: Agent<M, ToolSet>) -> (AgentResponse, Duration, EventRecorder)
where
    M: tower::Service<ModelRequest, Response = ModelResponse, Error = Error>
        + Clone
        + Send
        + 'static,
    M::Future: Send,
{
    let recorder = EventRecorder::new();
    let started = tokio::time::Instant::now();
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "Find it.").with_observer(recorder.clone()))
        .await
        .expect("the run");
    (res, started.elapsed(), recorder)
}

fn results(res: &AgentResponse) -> Vec<(String, String)> {
    res.session
        .history
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| (r.call_id.clone(), r.content.clone()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn read_only_tools_start_as_their_calls_close_and_their_results_are_kept() {
    let log = Log::default();
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(model(), two_slow(&log, true));
    let (res, elapsed, recorder) = run(agent).await;
    assert_eq!(
        results(&res),
        [
            ("c1".to_owned(), "found retry".to_owned()),
            ("c2".to_owned(), "found backoff".to_owned())
        ]
    );
    // Each ran once, overlapping the stream: 300 ms of stream, c2 ends at 800, then round 2.
    assert_eq!(
        log_of(&log),
        [
            "started retry",
            "started backoff",
            "done retry",
            "done backoff"
        ]
    );
    assert_eq!(elapsed, Duration::from_millis(900), "{elapsed:?}");
    // The events still tell the round in order: the calls start after the message is in.
    let names = recorder.names();
    let completed = names.iter().position(|n| *n == "round_completed");
    let started = names.iter().position(|n| *n == "tool_started");
    assert!(completed < started, "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "tool_started").count(), 2);
}

#[tokio::test(start_paused = true)]
async fn off_by_default_and_never_for_a_tool_that_is_not_read_only() {
    for (early, read_only) in [(false, true), (true, false)] {
        let log = Log::default();
        let agent = AgentBuilder::new()
            .early_tool_start(early)
            .build(model(), two_slow(&log, read_only));
        let (res, elapsed, _) = run(agent).await;
        assert_eq!(results(&res).len(), 2);
        // 300 ms of stream, 500 + 500 of tools one after the other, 100 of round 2.
        assert_eq!(elapsed, Duration::from_millis(1_400), "{early} {read_only}");
        assert_eq!(
            log_of(&log),
            [
                "started retry",
                "done retry",
                "started backoff",
                "done backoff"
            ]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_tools_adopt_the_early_runs_too() {
    let log = Log::default();
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .concurrent_tools(4)
        .build(model(), two_slow(&log, true));
    let (res, elapsed, _) = run(agent).await;
    assert_eq!(results(&res).len(), 2);
    assert_eq!(log_of(&log).len(), 4, "each ran once: {:?}", log_of(&log));
    assert_eq!(elapsed, Duration::from_millis(900));

    // A call closed at once while the model streams on for 400 ms: 500 ms in all with early
    // start, 900 without.
    let model = tower::service_fn(|req: ModelRequest| async move {
        if req.messages.len() > 1 {
            return Ok(ModelResponse::text("Done."));
        }
        let call = ToolCall::new("c1", "docs", json!({"q": "retry"}));
        req.send_delta(Delta::ToolCall(call.clone())).await?;
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, Error>(ModelResponse::tool_calls([call]))
    });
    for (early, expected) in [(true, 500), (false, 900)] {
        let log = Log::default();
        let agent = AgentBuilder::new()
            .early_tool_start(early)
            .concurrent_tools(4)
            .build(model, two_slow(&log, true));
        let (res, elapsed, _) = run(agent).await;
        assert_eq!(results(&res).len(), 1);
        assert_eq!(log_of(&log), ["started retry", "done retry"]);
        assert_eq!(elapsed, Duration::from_millis(expected), "early: {early}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_arguments_changed_runs_again_with_the_final_ones() {
    let log = Log::default();
    // A layer rewrites the streamed call's arguments in the message it returns.
    let rewrite = around_model(|req: ModelRequest, mut next| async move {
        let mut res = next.run(req).await?;
        for part in &mut res.message.content {
            if let tower_agent_core::ContentPart::ToolCall(call) = part {
                if call.id == "c1" {
                    call.arguments = json!({"q": "jitter"}).to_string();
                }
            }
        }
        Ok(res)
    });
    let model = ServiceBuilder::new().layer(rewrite).service(model());
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(model, two_slow(&log, true));
    let (res, _, _) = run(agent).await;
    assert_eq!(
        results(&res)[0],
        ("c1".to_owned(), "found jitter".to_owned())
    );
    let log = log_of(&log);
    assert!(log.contains(&"started retry".to_owned()), "{log:?}");
    assert!(!log.contains(&"done retry".to_owned()), "aborted: {log:?}");
    assert!(log.contains(&"done jitter".to_owned()), "{log:?}");
    assert_eq!(log.iter().filter(|l| *l == "done backoff").count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_stream_aborts_the_early_runs() {
    let log = Log::default();
    // A retry of its own: the first answer is thrown away after it streamed.
    let again = around_model(|req: ModelRequest, mut next| async move {
        let first = next.run(req.clone()).await?;
        if first.message.tool_calls().count() == 2 {
            req.restart_stream().await?;
            return next.run(req).await;
        }
        Ok(first)
    });
    let scripted = ScriptedModel::new([
        checking_both(),
        ModelResponse::tool_calls([ToolCall::new("c3", "docs", json!({"q": "again"}))]),
        ModelResponse::text("Done."),
    ])
    .streaming(4, Duration::from_millis(50));
    let model = ServiceBuilder::new().layer(again).service(scripted);
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(model, two_slow(&log, true));
    let (res, _, _) = run(agent).await;
    assert_eq!(results(&res), [("c3".to_owned(), "found again".to_owned())]);
    // Let any run that escaped finish: none did.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = log_of(&log);
    assert!(log.contains(&"started retry".to_owned()), "{log:?}");
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("done"))
            .collect::<Vec<_>>(),
        ["done again"],
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_stream_aborts_its_early_run_even_for_the_same_call() {
    let log = Log::default();
    // The same answer twice: the first thrown away after it streamed, as a retry does.
    let again = around_model(|req: ModelRequest, mut next| async move {
        let first = next.run(req.clone()).await?;
        if first.message.tool_calls().count() == 2 {
            req.restart_stream().await?;
            return next.run(req).await;
        }
        Ok(first)
    });
    let scripted = ScriptedModel::new([
        checking_both(),
        checking_both(),
        ModelResponse::text("Done."),
    ])
    .streaming(4, Duration::from_millis(50));
    let model = ServiceBuilder::new().layer(again).service(scripted);
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(model, two_slow(&log, true));
    let (res, _, _) = run(agent).await;
    assert_eq!(results(&res).len(), 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = log_of(&log);
    let count = |line: &str| log.iter().filter(|l| *l == line).count();
    // Started on each stream; the first run was aborted, the second kept.
    assert_eq!(count("started retry"), 2, "{log:?}");
    assert_eq!(count("done retry"), 1, "{log:?}");
    assert_eq!(count("done backoff"), 1, "{log:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_breaks_after_a_call_closed_aborts_its_run() {
    let log = Log::default();
    let broken = tower::service_fn(|req: ModelRequest| async move {
        let call = ToolCall::new("c1", "docs", json!({"q": "retry"}));
        req.send_delta(Delta::ToolCall(call)).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err::<ModelResponse, _>(Error::new(ErrorKind::Server, "the stream broke"))
    });
    let agent = AgentBuilder::new()
        .early_tool_start(true)
        .build(broken, two_slow(&log, true));
    let error = agent
        .oneshot(AgentRequest::new(Session::new(), "Find it."))
        .await
        .expect_err("the call failed");
    assert_eq!(error.kind(), ErrorKind::Server);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(log_of(&log), ["started retry"], "aborted, never done");
}
