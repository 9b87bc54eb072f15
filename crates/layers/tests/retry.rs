//! The retry policy on tower's `Retry`, with tokio's clock paused: exact waits, the provider's
//! wait, attempt counts, fatal kinds, the budget, the nudge, cancellation, interrupts.

#![cfg(feature = "retry")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_agent_core::stream::Delta;
use tower_agent_core::{
    AgentRequest, Error, ErrorKind, Event, Message, ModelRequest, ModelResponse, Outcome,
    RunContext, Session, ToolCall,
};
use tower_agent_layers::retry::{Retry, RetryLayer, RetryPolicy};
use tower_agent_loop::Agent;
use tower_agent_test::{EventRecorder, ScriptedModel, StubTool};
use tower_agent_tools::ToolSet;

/// When each call came, and its request.
type Calls = Arc<Mutex<Vec<(Instant, ModelRequest)>>>;

/// A model failing with `errors` in turn, then answering; it records when it was called.
fn flaky(
    errors: Vec<Error>,
) -> (
    impl Service<ModelRequest, Response = ModelResponse, Error = Error, Future: Send> + Clone + Send,
    Calls,
) {
    let calls: Calls = Arc::default();
    let record = calls.clone();
    let errors = Arc::new(Mutex::new(errors.into_iter()));
    let service = service_fn(move |req: ModelRequest| {
        record.lock().expect("lock").push((Instant::now(), req));
        let next = errors.lock().expect("lock").next();
        async move {
            match next {
                Some(error) => Err(error),
                None => Ok(ModelResponse::text("ok")),
            }
        }
    });
    (service, calls)
}

fn exact() -> RetryPolicy {
    RetryPolicy::new().jitter(Duration::ZERO).throttle(None)
}

fn waits(calls: &[(Instant, ModelRequest)]) -> Vec<u64> {
    calls
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).as_secs())
        .collect()
}

async fn call(
    policy: RetryPolicy,
    errors: Vec<Error>,
    req: ModelRequest,
) -> (Result<ModelResponse, Error>, Vec<(Instant, ModelRequest)>) {
    let (model, calls) = flaky(errors);
    let mut service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .service(model);
    let result = match service.ready().await {
        Ok(ready) => ready.call(req).await,
        Err(e) => Err(e),
    };
    let calls = calls.lock().expect("lock").clone();
    (result, calls)
}

fn server() -> Error {
    Error::new(ErrorKind::Server, "HTTP 500")
}

#[tokio::test(start_paused = true)]
async fn the_backoff_doubles_up_to_the_cap() {
    let policy = exact().max_attempts(10);
    let (result, calls) = call(policy, vec![server(); 8], ModelRequest::new(vec![])).await;
    assert!(result.is_ok());
    assert_eq!(waits(&calls), [1, 2, 4, 8, 16, 32, 60, 60]);
}

#[tokio::test(start_paused = true)]
async fn the_providers_wait_wins_over_the_backoff_and_the_jitter() {
    let errors = vec![
        Error::rate_limited(Some(Duration::from_secs(7)), "429"),
        Error::new(
            ErrorKind::Overloaded {
                retry_after: Some(Duration::from_secs(90)),
            },
            "529",
        ),
        server(),
    ];
    let policy = RetryPolicy::new().jitter(Duration::ZERO).throttle(None);
    let (result, calls) = call(policy, errors, ModelRequest::new(vec![])).await;
    assert!(result.is_ok());
    // 7 s and 90 s as asked (above the 60 s cap), then the backoff of the third retry.
    assert_eq!(waits(&calls), [7, 90, 4]);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_do_not_retry_in_lockstep() {
    // Ten requests through one stack (clones of one service), each failing once.
    let (model, calls) = flaky(vec![server(); 10]);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new().throttle(None)))
        .service(model);
    let start = Instant::now();
    let runs = (0..10).map(|_| {
        let service = service.clone();
        async move { service.oneshot(ModelRequest::new(vec![])).await }
    });
    for result in futures_util::future::join_all(runs).await {
        result.expect("the retry succeeded");
    }
    // The first ten calls came at once; the ten retries each waited 1 s plus its own jitter
    // (every draw differs: the unit test `clones_draw_their_own_jitter` of the policy). The
    // timer sleeps in whole milliseconds, so two draws may wake in the same one; never more,
    // and never in lockstep.
    let calls = calls.lock().expect("lock");
    let mut retried: Vec<Duration> = calls[10..].iter().map(|(at, _)| *at - start).collect();
    retried.sort();
    assert_eq!(retried.len(), 10);
    let spread = retried[9] - retried[0];
    assert!(
        spread >= Duration::from_millis(200),
        "spread over {spread:?}: {retried:?}"
    );
    retried.dedup();
    assert!(
        retried.len() >= 9,
        "the waits drew their own jitter: {retried:?}"
    );
    // Each wait is 1 s plus a jitter under 2 s; the timer wakes at the next whole millisecond,
    // so a draw just under 3 s wakes at 3 s.
    for wait in &retried {
        assert!(
            *wait >= Duration::from_secs(1) && *wait <= Duration::from_secs(3),
            "{wait:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_longest_wait_is_max_delay_jitter_included() {
    let policy = RetryPolicy::new()
        .throttle(None)
        .max_attempts(10)
        .max_delay(Duration::from_secs(600))
        .jitter(Duration::from_secs(600));
    let (_, calls) = call(policy, vec![server(); 6], ModelRequest::new(vec![])).await;
    let mut gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert_eq!(gaps.len(), 6);
    for gap in &gaps {
        assert!(*gap <= Duration::from_secs(600), "{gap:?}");
    }
    // At the cap, the waits still differ: the jitter is drawn within it. The paused clock
    // wakes at whole milliseconds: a cap of 10 minutes leaves 600,000 of them to draw from
    // (at 2 s, two of six waits fell on the same millisecond about once in 130 runs).
    gaps.sort();
    gaps.dedup();
    assert_eq!(gaps.len(), 6, "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn nothing_is_called_after_a_cancellation_outside_an_agent() {
    let (model, calls) = flaky(vec![server(); 5]);
    let mut req = ModelRequest::new(vec![]);
    req.ctx = RunContext::new();
    let ctx = req.ctx.clone();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(exact().base(Duration::from_secs(600))))
        .service(model);
    let start = Instant::now();
    let call = tokio::spawn(service.oneshot(req));
    tokio::time::sleep(Duration::from_secs(5)).await;
    ctx.cancel();
    let result = call.await.expect("the call's task");
    assert_eq!(result.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    assert!(start.elapsed() < Duration::from_secs(600));
    assert_eq!(calls.lock().expect("lock").len(), 1, "not called again");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_the_retry_is_retried() {
    // The first attempt hangs; tower's Timeout inside the retry ends it, and the retry tries
    // again.
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = service_fn({
        let attempts = Arc::clone(&attempts);
        move |_: ModelRequest| {
            let n = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>(ModelResponse::text("ok"))
            }
        }
    });
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(exact()))
        .timeout(Duration::from_secs(30))
        .service(model);
    let res = service
        .oneshot(ModelRequest::new(vec![]))
        .await
        .expect("retried after the timeout");
    assert_eq!(res.message.text(), "ok");
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_agent_spawns_on_a_model_with_a_timeout_inside_the_retry() {
    // The form that did not compile with tower's own `.retry(..)`: an agent over it, spawned.
    let (model, calls) = flaky(vec![Error::new(ErrorKind::Timeout, "slow")]);
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(exact()))
        .timeout(Duration::from_secs(30))
        .service(model);
    let run = tower_agent_loop::AgentServiceExt::spawn(
        Agent::new(model, ToolSet::new()),
        AgentRequest::new(Session::new(), "hi"),
    );
    let res = run.join().await.expect("completes");
    assert_eq!(res.text().as_deref(), Some("ok"));
    assert_eq!(calls.lock().expect("lock").len(), 2);
}

#[tokio::test]
async fn the_layer_makes_a_retry_service() {
    let layer = Retry::<()>::layer(RetryPolicy::new());
    let service: Retry<ScriptedModel> = tower::Layer::layer(&layer, ScriptedModel::new([]));
    let _ = service.get_ref();
    let service: Retry<ScriptedModel> =
        RetryLayer::new(RetryPolicy::new()).layer(ScriptedModel::new([]));
    let _ = service.into_inner();
}

#[tokio::test(start_paused = true)]
async fn jitter_stays_within_its_bound() {
    let policy = RetryPolicy::new()
        .throttle(None)
        .jitter(Duration::from_secs(2));
    let (_, calls) = call(policy, vec![server(); 3], ModelRequest::new(vec![])).await;
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    for (gap, base) in gaps.iter().zip([1, 2, 4]) {
        let base = Duration::from_secs(base);
        // The jitter is under 2 s; tokio's timer rounds a sleep up to its next millisecond, so
        // a jitter within a millisecond of the bound is seen as the bound itself.
        assert!(
            *gap >= base && *gap <= base + Duration::from_secs(2),
            "{gap:?} for {base:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_are_bounded_and_the_last_error_returned() {
    // By default: 10 calls when the provider says it is busy, 3 when it failed, 2 when it
    // could not be reached.
    let busy = Error::rate_limited(None, "429");
    let (result, calls) = call(exact(), vec![busy; 20], ModelRequest::new(vec![])).await;
    assert_eq!(calls.len(), 10);
    assert!(matches!(
        result.expect_err("gave up").kind(),
        ErrorKind::RateLimited { .. }
    ));
    let (result, calls) = call(exact(), vec![server(); 20], ModelRequest::new(vec![])).await;
    assert_eq!(calls.len(), 3);
    assert_eq!(result.expect_err("gave up").kind(), ErrorKind::Server);
    let refused = Error::new(ErrorKind::Unreachable, "connection refused");
    let (result, calls) = call(exact(), vec![refused; 20], ModelRequest::new(vec![])).await;
    assert_eq!(calls.len(), 2);
    assert_eq!(waits(&calls), [1], "fails within seconds");
    assert_eq!(result.expect_err("gave up").kind(), ErrorKind::Unreachable);
    let (_, calls) = call(
        exact().max_attempts(10),
        vec![server(); 20],
        ModelRequest::new(vec![]),
    )
    .await;
    assert_eq!(calls.len(), 10, "max_attempts sets every kind's");
    let (_, calls) = call(
        exact().server_attempts(5),
        vec![server(); 20],
        ModelRequest::new(vec![]),
    )
    .await;
    assert_eq!(calls.len(), 5);
    let (_, calls) = call(
        exact().max_attempts(3),
        vec![server(); 20],
        ModelRequest::new(vec![]),
    )
    .await;
    assert_eq!(calls.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn fatal_kinds_are_not_retried() {
    for kind in [
        ErrorKind::Auth,
        ErrorKind::BadRequest,
        ErrorKind::QuotaExhausted,
        ErrorKind::ContextTooLong,
        ErrorKind::InvalidResponse,
        ErrorKind::Cancelled,
    ] {
        let (result, calls) = call(
            exact(),
            vec![Error::new(kind, "no")],
            ModelRequest::new(vec![]),
        )
        .await;
        assert_eq!(calls.len(), 1, "{kind:?}");
        assert_eq!(result.expect_err("returned").kind(), kind);
    }
}

#[tokio::test(start_paused = true)]
async fn an_empty_response_is_retried_with_a_nudged_prompt() {
    let req = ModelRequest::new(vec![Message::user("hi")]);
    let history = req.messages.clone();
    let empty = Error::new(ErrorKind::EmptyResponse, "no candidates");
    let (result, calls) = call(exact(), vec![empty.clone(), empty], req).await;
    assert!(result.is_ok());
    let texts: Vec<String> = calls.iter().map(|(_, r)| r.messages[0].text()).collect();
    assert_eq!(texts, ["hi", "hi.", "hi.."]);
    assert_eq!(
        history[0].text(),
        "hi",
        "the request the caller holds is not changed"
    );
}

#[tokio::test(start_paused = true)]
async fn the_budget_stops_retries_when_spent() {
    let policy = exact().throttle(Some(TpsBudget::new(Duration::from_secs(10), 0, 0.0)));
    let (result, calls) = call(policy, vec![server(); 3], ModelRequest::new(vec![])).await;
    assert_eq!(calls.len(), 1, "no budget, no retry");
    assert!(result.is_err());
    // The default budget allows a retry per second even with no successes yet.
    let (result, calls) = call(
        RetryPolicy::new().jitter(Duration::ZERO),
        vec![server()],
        ModelRequest::new(vec![]),
    )
    .await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn each_retry_is_announced_to_stream_readers() {
    let recorder = EventRecorder::new();
    let mut req = ModelRequest::new(vec![]);
    req.ctx = RunContext::new().with_observer(recorder.clone());
    let (result, _) = call(
        exact(),
        vec![
            server(),
            Error::rate_limited(Some(Duration::from_secs(5)), "429"),
        ],
        req,
    )
    .await;
    assert!(result.is_ok());
    let retries: Vec<(u32, Duration)> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Retrying { attempt, delay, .. } => Some((attempt, delay)),
            _ => None,
        })
        .collect();
    assert_eq!(
        retries,
        [(2, Duration::from_secs(1)), (3, Duration::from_secs(5))]
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_run_ends_the_wait() {
    let (model, calls) = flaky(vec![server(); 5]);
    let model = ServiceBuilder::new()
        .layer(RetryLayer::new(exact().base(Duration::from_secs(600))))
        .service(model);
    let agent = Agent::new(model, ToolSet::new());
    let start = Instant::now();
    let run =
        tower_agent_loop::AgentServiceExt::spawn(agent, AgentRequest::new(Session::new(), "hi"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    run.cancel();
    let res = run.join().await.expect("a cancelled run is an outcome");
    assert!(
        matches!(res.outcome, Outcome::Cancelled { .. }),
        "{:?}",
        res.outcome
    );
    assert!(
        start.elapsed() < Duration::from_secs(600),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(calls.lock().expect("lock").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tool_interrupt_is_an_outcome_the_policy_never_sees() {
    let ask = StubTool::interrupting("deploy", json!({"question": "prod?"}));
    let tools = ServiceBuilder::new()
        .layer(RetryLayer::new(exact()))
        .service(ToolSet::new().tool(ask.clone()));
    let model = ScriptedModel::new([ModelResponse::tool_calls([ToolCall::new(
        "c1",
        "deploy",
        json!({}),
    )])]);
    let res = Agent::new(model, tools)
        .oneshot(AgentRequest::new(Session::new(), "ship"))
        .await
        .expect("interrupted, not failed");
    assert!(
        matches!(res.outcome, Outcome::Interrupted { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(ask.requests().len(), 1, "asked once, never retried");
}

#[tokio::test(start_paused = true)]
async fn a_call_that_streamed_is_replayed_unless_the_policy_says_no() {
    // A request whose readers were given part of an answer before the call failed.
    let delivered = || async {
        let mut req = ModelRequest::new(vec![]);
        req.ctx = RunContext::new().with_observer(EventRecorder::new());
        req.send_delta(Delta::Text("half an answ".into()))
            .await
            .expect("given");
        req
    };
    // By default: called again, readers told to discard first.
    let req = delivered().await;
    let given = req.deltas.clone();
    let (result, calls) = call(exact(), vec![server()], req).await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 2);
    assert!(!given.delivered(), "retracted before the replay");
    // A reader that cannot take text back: the error comes back, the half answer still out.
    let policy = exact().replay_streamed(false);
    let req = delivered().await;
    let given = req.deltas.clone();
    let (result, calls) = call(policy, vec![server()], req).await;
    result.expect_err("not replayed");
    assert!(given.delivered());
    assert_eq!(calls.len(), 1);
    // A delta a filter still holds back never reached a reader: replayed.
    struct HoldAll;
    impl tower_agent_core::stream::StreamFilter for HoldAll {
        fn delta(&mut self, _: Delta, _: &mut Vec<Delta>) -> Result<(), Error> {
            Ok(())
        }
    }
    let mut req = ModelRequest::new(vec![]);
    req.ctx = RunContext::new().with_observer(EventRecorder::new());
    req.deltas.filter(HoldAll);
    req.send_delta(Delta::Text("held".into()))
        .await
        .expect("held");
    let (result, calls) = call(exact().replay_streamed(false), vec![server()], req).await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 2);
    // A failure before any delta is retried as ever.
    let policy = exact().replay_streamed(false);
    let (result, calls) = call(policy, vec![server()], ModelRequest::new(vec![])).await;
    assert!(result.is_ok());
    assert_eq!(calls.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_broken_after_50_deltas_is_retracted_and_the_retry_streams_the_answer_once() {
    // Two characters a delta: 50 deltas, then the stream breaks.
    let model = ScriptedModel::new([]).streaming(2, Duration::from_millis(5));
    model.push_broken("ab".repeat(50), server());
    let answer = "The answer, streamed once and only once.";
    model.push(Ok(ModelResponse::text(answer)));
    let agent = Agent::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(exact()))
            .service(model.clone()),
        ToolSet::new(),
    );
    let recorder = EventRecorder::new();
    let res = agent
        .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
        .await
        .expect("retried");
    assert_eq!(res.text().as_deref(), Some(answer));
    assert_eq!(model.request_count(), 2);
    // 50 deltas, one retraction before the retry's notice, then the answer's deltas.
    let names = recorder.names();
    let retract = names
        .iter()
        .position(|n| *n == "retract")
        .expect("a retract");
    assert_eq!(
        names[..retract]
            .iter()
            .filter(|n| **n == "text_delta")
            .count(),
        50
    );
    assert_eq!(names[retract + 1], "retrying");
    assert_eq!(names.iter().filter(|n| **n == "retract").count(), 1);
    // What a reader put together is the message: no text twice, none of the broken stream.
    assert_eq!(recorder.streamed_text(1), answer);
    let after: String = recorder.events()[retract..]
        .iter()
        .filter_map(|e| match e {
            Event::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(after, answer);
}

#[tokio::test(start_paused = true)]
async fn a_stream_not_replayed_is_retracted_when_the_run_fails() {
    let model = ScriptedModel::new([]).streaming(4, Duration::ZERO);
    model.push_broken("half an answ", server());
    let agent = Agent::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(exact().replay_streamed(false)))
            .service(model.clone()),
        ToolSet::new(),
    );
    let recorder = EventRecorder::new();
    let error = agent
        .oneshot(AgentRequest::new(Session::new(), "hi").with_observer(recorder.clone()))
        .await
        .expect_err("not replayed");
    assert_eq!(error.kind(), ErrorKind::Server);
    assert!(recorder.names().contains(&"text_delta"), "it had streamed");
    assert_eq!(model.request_count(), 1);
    assert_eq!(recorder.streamed_text(1), "");
    assert_eq!(
        recorder.names()[recorder.names().len() - 2..],
        ["retract", "run_failed"]
    );
}

/// The hints decide a tool call's retry: after a failure that may have reached the tool (a
/// timeout, a server error), a tool that may not repeat is not called again (a second call
/// could pay twice); a read-only one is. A failure that never reached it (unreachable) is
/// tried again for any tool.
#[tokio::test(start_paused = true)]
async fn a_tool_retry_reads_the_hints_when_the_call_may_have_reached_the_tool() {
    let attempts: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&attempts);
    let tools = tower_agent_core::DescribedTools::new(
        [
            tower_agent_core::ToolSpec::new("pay", "Pays.", json!({"type": "object"})),
            tower_agent_core::ToolSpec::new("unreached", "Pays.", json!({"type": "object"})),
            tower_agent_core::ToolSpec::new("read", "Reads.", json!({"type": "object"}))
                .read_only(),
        ],
        service_fn(move |req: tower_agent_core::ToolRequest| {
            let seen = Arc::clone(&seen);
            async move {
                let first = {
                    let mut seen = seen.lock().expect("not poisoned");
                    seen.push(req.call.name.clone());
                    seen.iter().filter(|name| **name == req.call.name).count() == 1
                };
                match (first, req.call.name.as_str()) {
                    (true, "unreached") => Err(Error::new(ErrorKind::Unreachable, "refused")),
                    (true, _) => Err(Error::new(ErrorKind::Timeout, "no answer in time")),
                    (false, _) => Ok(tower_agent_core::ToolResponse::success(&req.call, "done")),
                }
            }
        }),
    );
    let model = ScriptedModel::new([
        ModelResponse::tool_calls([
            ToolCall::new("p1", "pay", json!({})),
            ToolCall::new("u1", "unreached", json!({})),
            ToolCall::new("r1", "read", json!({})),
        ]),
        ModelResponse::text("ok"),
    ]);
    let retry = RetryLayer::new(RetryPolicy::new().max_attempts(3).jitter(Duration::ZERO));
    let agent = Agent::builder().tool_layer(retry).build(model, tools);
    let response = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run");
    let tried = attempts.lock().expect("not poisoned").clone();
    assert_eq!(tried, ["pay", "unreached", "unreached", "read", "read"]);
    let results: Vec<(String, bool)> = response
        .session
        .history
        .iter()
        .flat_map(tower_agent_core::Message::tool_results)
        .map(|r| (r.call_id.clone(), r.is_error))
        .collect();
    assert_eq!(
        results,
        [
            ("p1".to_owned(), true),
            ("u1".to_owned(), false),
            ("r1".to_owned(), false)
        ]
    );
}
