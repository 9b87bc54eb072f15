//! The progress layer, on a paused clock: when summaries come, where they go, and that they
//! never hold the run up.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, sleep};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_agent_core::{
    AgentRequest, AgentResponse, Error, Event, ModelRequest, ModelResponse, Outcome, Session,
    ToolCall, ToolRequest, ToolResponse, ToolSpec,
};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;
use tower_agent_workflow::events::ProgressSummary;
use tower_agent_workflow::progress::{DEFAULT_PROMPT, Progress, ProgressLayer, SOURCE};

const SECOND: Duration = Duration::from_secs(1);

/// An agent that calls the tool `work` `rounds` times, the tool taking `each` (paused clock),
/// then answers "done".
fn agent(
    rounds: usize,
    each: Duration,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error, Future: Send + 'static>
+ Clone
+ Send
+ 'static {
    let script = (1..=rounds)
        .map(|i| ModelResponse::tool_calls([ToolCall::new(format!("c{i}"), "work", json!({}))]))
        .chain([ModelResponse::text("done")]);
    let work = service_fn(move |req: ToolRequest| async move {
        sleep(each).await;
        Ok::<_, Error>(ToolResponse::success(&req.call, "ok"))
    });
    let spec = ToolSpec::new("work", "Work a while.", json!({ "type": "object" }));
    Agent::new(
        ScriptedModel::new(script),
        ToolSet::new().service(spec, work),
    )
}

/// An agent service that is not the loop (so it emits no `RunFinished`): a tool event every
/// second for `seconds`, cancelling its run at `cancel_at` and going on regardless.
fn ticking(
    seconds: u32,
    cancel_at: Option<u32>,
) -> impl Service<AgentRequest, Response = AgentResponse, Error = Error, Future: Send + 'static> + Clone
{
    service_fn(move |req: AgentRequest| async move {
        for i in 0..seconds {
            if Some(i) == cancel_at {
                req.ctx.cancel();
            }
            let event = Event::ToolStarted {
                round: 1,
                call_id: format!("c{i}"),
                name: "work".into(),
            };
            req.ctx.emit(event).await?;
            sleep(SECOND).await;
        }
        let message = tower_agent_core::Message::assistant("done");
        Ok::<_, Error>(AgentResponse::new(
            req.session,
            Outcome::Completed { message },
        ))
    })
}

/// A summarizer answering "summary 1", "summary 2"..., recording its requests.
fn numbered() -> ScriptedModel {
    let mut n = 0;
    ScriptedModel::from_fn(move |_| {
        n += 1;
        Ok(ModelResponse::text(format!(
            "summary {n}\nignored second line"
        )))
    })
}

/// A host callback recording each line with the (paused) time since `start`.
#[derive(Clone)]
struct Lines {
    start: Instant,
    seen: Arc<Mutex<Vec<(Duration, String)>>>,
}

impl Lines {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            seen: Arc::default(),
        }
    }

    fn callback(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let this = self.clone();
        move |line: &str| {
            let at = this.start.elapsed();
            this.seen.lock().expect("lock").push((at, line.to_owned()));
        }
    }

    fn times(&self) -> Vec<Duration> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .map(|(at, _)| *at)
            .collect()
    }

    fn lines(&self) -> Vec<String> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .map(|(_, line)| line.clone())
            .collect()
    }
}

fn secs(list: &[u64]) -> Vec<Duration> {
    list.iter().map(|s| Duration::from_secs(*s)).collect()
}

fn summaries(recorder: &EventRecorder) -> Vec<String> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| {
            let summary = event.downcast_ref::<ProgressSummary>()?;
            Some(summary.summary.clone())
        })
        .collect()
}

fn warnings(recorder: &EventRecorder) -> Vec<String> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::Warning { source, message } if source == SOURCE => Some(message),
            _ => None,
        })
        .collect()
}

fn request(recorder: &EventRecorder) -> AgentRequest {
    AgentRequest::new(Session::new(), "go").with_observer(recorder.clone())
}

async fn run<S>(mut service: S, req: AgentRequest) -> AgentResponse
where
    S: Service<AgentRequest, Response = AgentResponse, Error = Error>,
{
    service
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("the run succeeds")
}

#[tokio::test(start_paused = true)]
async fn the_layer_makes_a_progress_service() {
    let inner = StubTool::returning("unused", "");
    let layer = ProgressLayer::new(numbered())
        .every(SECOND)
        .every_events(3)
        .max_events(5);
    assert!(format!("{layer:?}").contains("every_events: 3"));
    let service: Progress<StubTool> = layer.layer(inner);
    assert_eq!(service.get_ref().calls().len(), 0);
    let _: Progress<StubTool> =
        Progress::new(service.into_inner(), &Progress::<()>::layer(numbered()));
}

#[tokio::test(start_paused = true)]
async fn summarizes_every_n_seconds() {
    let lines = Lines::new();
    let layer = ProgressLayer::new(numbered())
        .every(Duration::from_secs(10))
        .every_events(0)
        .on_summary(lines.callback());
    // 9 rounds of a 4 s tool: the run lasts 36 s.
    let res = run(
        layer.layer(agent(9, 4 * SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("done"));
    assert_eq!(lines.start.elapsed(), Duration::from_secs(36));
    assert_eq!(lines.times(), secs(&[10, 20, 30]));
    assert_eq!(lines.lines(), ["summary 1", "summary 2", "summary 3"]);
}

#[tokio::test(start_paused = true)]
async fn summarizes_every_n_events() {
    let lines = Lines::new();
    let summarizer = numbered();
    let layer = ProgressLayer::new(summarizer.clone())
        .every(Duration::from_secs(3600))
        .every_events(3)
        .on_summary(lines.callback());
    // Each round makes three lines: round started, tool started, tool finished.
    run(
        layer.layer(agent(4, SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    assert_eq!(lines.start.elapsed(), 4 * SECOND);
    // The task gets to run while a tool works: by then at least three new lines came.
    assert_eq!(lines.times(), secs(&[1, 2, 3]));
    for request in summarizer.requests() {
        let digest = request.messages[0].text();
        assert!(
            digest.lines().filter(|l| l.starts_with("- ")).count() >= 3,
            "{digest}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_event_and_the_callback_get_the_same_first_line() {
    let lines = Lines::new();
    let recorder = EventRecorder::new();
    let layer = ProgressLayer::new(numbered())
        .every(Duration::from_secs(5))
        .on_summary(lines.callback());
    run(layer.layer(agent(3, 4 * SECOND)), request(&recorder)).await;
    assert_eq!(lines.lines(), ["summary 1", "summary 2"]);
    assert_eq!(summaries(&recorder), lines.lines());
}

#[tokio::test(start_paused = true)]
async fn one_summary_in_flight() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (in_flight, most, calls) = (in_flight.clone(), most.clone(), calls.clone());
        service_fn(move |_: ModelRequest| {
            let (in_flight, most, calls) = (in_flight.clone(), most.clone(), calls.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::SeqCst);
                sleep(7 * SECOND).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Error>(ModelResponse::text("slowly"))
            }
        })
    };
    let lines = Lines::new();
    let layer = ProgressLayer::new(slow)
        .every(SECOND)
        .every_events(1)
        .on_summary(lines.callback());
    run(
        layer.layer(agent(20, SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    assert_eq!(lines.start.elapsed(), 20 * SECOND, "the run did not wait");
    assert_eq!(most.load(Ordering::SeqCst), 1);
    // Back to back: asked at 0 (the first event), 7, 14; the one asked at 14 is aborted.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(lines.times(), secs(&[7, 14]));
}

#[tokio::test(start_paused = true)]
async fn a_failing_summarizer_warns_and_the_run_completes() {
    let recorder = EventRecorder::new();
    let failing = ScriptedModel::from_fn(|_| Err(Error::backend("provider down")));
    let layer = ProgressLayer::new(failing).every(Duration::from_secs(5));
    let res = run(layer.layer(agent(3, 4 * SECOND)), request(&recorder)).await;
    assert!(matches!(res.outcome, Outcome::Completed { .. }));
    let warnings = warnings(&recorder);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("provider down"), "{warnings:?}");
    assert!(summaries(&recorder).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_empty_summary_is_a_warning() {
    let recorder = EventRecorder::new();
    let blank = ScriptedModel::from_fn(|_| Ok(ModelResponse::text("  \n")));
    let layer = ProgressLayer::new(blank).every(Duration::from_secs(5));
    run(layer.layer(agent(2, 4 * SECOND)), request(&recorder)).await;
    assert_eq!(
        warnings(&recorder),
        ["the progress summarizer answered with no text"]
    );
    assert!(summaries(&recorder).is_empty());
}

/// A future that counts its drop: to see the summarizer's call aborted.
struct Dropped<F>(F, Arc<AtomicUsize>);

impl<F> Drop for Dropped<F> {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

impl<F: Future + Unpin> Future for Dropped<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_summarizer_does_not_delay_the_end() {
    let asked = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let hanging = {
        let (asked, dropped) = (asked.clone(), dropped.clone());
        service_fn(move |_: ModelRequest| {
            asked.fetch_add(1, Ordering::SeqCst);
            Dropped(
                std::future::pending::<Result<ModelResponse, Error>>(),
                dropped.clone(),
            )
        })
    };
    let start = Instant::now();
    let layer = ProgressLayer::new(hanging).every(SECOND);
    let res = run(
        layer.layer(agent(3, 3 * SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    assert_eq!(res.text().as_deref(), Some("done"));
    assert_eq!(start.elapsed(), 9 * SECOND, "the run ends on its own time");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the call in flight was aborted"
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_comes_after_the_run_ended() {
    let lines = Lines::new();
    let recorder = EventRecorder::new();
    let summarizer = numbered();
    let layer = ProgressLayer::new(summarizer.clone())
        .every(Duration::from_secs(10))
        .on_summary(lines.callback());
    // 15 s: a summary at 10 s, and new events after it that the next one would cover.
    run(layer.layer(ticking(15, None)), request(&recorder)).await;
    assert_eq!(lines.times(), secs(&[10]));
    sleep(Duration::from_secs(60)).await;
    assert_eq!(lines.times(), secs(&[10]));
    assert_eq!(summaries(&recorder).len(), 1);
    assert_eq!(summarizer.request_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn nothing_comes_after_the_loop_finished() {
    let lines = Lines::new();
    let layer = ProgressLayer::new(numbered())
        .every(Duration::from_secs(10))
        .on_summary(lines.callback());
    run(
        layer.layer(agent(3, 5 * SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    sleep(Duration::from_secs(60)).await;
    assert_eq!(lines.times(), secs(&[10]));
}

#[tokio::test(start_paused = true)]
async fn stops_when_the_run_is_cancelled() {
    let lines = Lines::new();
    let layer = ProgressLayer::new(numbered())
        .every(Duration::from_secs(5))
        .on_summary(lines.callback());
    // Cancelled at 12 s; the agent ignores it and goes on to 30 s.
    run(
        layer.layer(ticking(30, Some(12))),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    assert_eq!(lines.start.elapsed(), 30 * SECOND);
    assert_eq!(lines.times(), secs(&[5, 10]));
}

#[tokio::test(start_paused = true)]
async fn the_digest_names_the_tools_and_the_nested_path() {
    let summarizer = numbered();
    let inner = agent(2, 4 * SECOND);
    // A workflow step: the agent runs nested, as `coder`.
    let step = service_fn(move |req: AgentRequest| {
        let inner = inner.clone();
        let nested = AgentRequest {
            session: req.session,
            input: req.input,
            ctx: req.ctx.nested("coder"),
            saver: req.saver,
        };
        inner.oneshot(nested)
    });
    let layer = ProgressLayer::new(summarizer.clone())
        .every(Duration::from_secs(5))
        .every_events(0);
    run(layer.layer(step), AgentRequest::new(Session::new(), "go")).await;
    let requests = summarizer.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].system.as_deref(), Some(DEFAULT_PROMPT));
    let digest = requests[0].messages[0].text();
    assert!(
        digest.contains("- [coder] round 1: calling the model\n"),
        "{digest}"
    );
    assert!(
        digest.contains("- [coder] tool `work` started\n"),
        "{digest}"
    );
    assert!(
        digest.contains("- [coder] tool `work` finished\n"),
        "{digest}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_digest_keeps_the_last_events_and_the_last_summary() {
    let summarizer = numbered();
    let layer = ProgressLayer::new(summarizer.clone())
        .every(Duration::from_secs(10))
        .every_events(0)
        .max_events(4)
        .prompt("Say it in French.");
    // 25 s of 5 s rounds: summaries at 10 and 20 s.
    run(
        layer.layer(agent(5, 5 * SECOND)),
        AgentRequest::new(Session::new(), "go"),
    )
    .await;
    let requests = summarizer.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].system.as_deref(), Some("Say it in French."));
    let digest = requests[1].messages[0].text();
    assert_eq!(
        digest.lines().filter(|l| l.starts_with("- ")).count(),
        4,
        "{digest}"
    );
    assert!(digest.contains("earlier ones omitted"), "{digest}");
    assert!(
        digest.contains("The last progress line was: summary 1"),
        "{digest}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_both_triggers_off_nothing_is_summarized() {
    let summarizer = numbered();
    let recorder = EventRecorder::new();
    let layer = ProgressLayer::new(summarizer.clone())
        .every(Duration::ZERO)
        .every_events(0);
    run(layer.layer(agent(3, 5 * SECOND)), request(&recorder)).await;
    assert_eq!(summarizer.request_count(), 0);
    assert!(summaries(&recorder).is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_layer_added_through_a_service_builder_acts_the_same() {
    use tower::ServiceBuilder;

    let lines = Lines::new();
    let layer = ProgressLayer::new(numbered())
        .every(Duration::from_secs(10))
        .every_events(0)
        .on_summary(lines.callback());
    let agent = ServiceBuilder::new()
        .layer(layer)
        .service(agent(9, 4 * SECOND));
    run(agent, AgentRequest::new(Session::new(), "go")).await;
    assert_eq!(lines.times(), secs(&[10, 20, 30]));
}
