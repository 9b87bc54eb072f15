//! What the tools' hints decide in a round: with `concurrent_reads`, calls that may repeat
//! overlap and the others run alone, in call order; with `dedupe_calls`, a call that repeats
//! an earlier call of the same message is answered, not run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_agent_core::{AgentRequest, Error, Message, ModelResponse, Session, ToolCall};
use tower_agent_loop::{Agent, AgentBuilder};
use tower_agent_test::{ScriptedModel, assert_valid_history};
use tower_agent_tools::{ToolContext, ToolSet, tool_fn};

#[derive(Deserialize, JsonSchema)]
struct Args {
    n: u64,
}

/// When each call ran: (call id, start, end).
type Spans = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// `pay` (a write) and `read` (read-only), each taking 100 ms and noting when it ran.
fn tools(spans: &Spans) -> ToolSet {
    let tool = |name: &'static str, spans: Spans| {
        tool_fn(name, "Takes 100 ms.", move |args: Args, cx: ToolContext| {
            let spans = spans.clone();
            async move {
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let span = (cx.call().id.clone(), start, Instant::now());
                spans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(span);
                Ok::<_, Error>(format!("{name} {}", args.n))
            }
        })
    };
    ToolSet::new()
        .tool(tool("pay", spans.clone()))
        .tool(tool("read", spans.clone()).read_only())
}

async fn run(builder: AgentBuilder, calls: Vec<ToolCall>) -> (Session, Spans) {
    let spans = Spans::default();
    let model = ScriptedModel::new([ModelResponse::tool_calls(calls), ModelResponse::text("ok")]);
    let agent = builder.build(model, tools(&spans));
    let response = agent
        .oneshot(AgentRequest::new(Session::new(), "go"))
        .await
        .expect("the run");
    assert_valid_history(&response.session.history);
    (response.session, spans)
}

fn call(id: &str, name: &str, n: u64) -> ToolCall {
    ToolCall::new(id, name, json!({ "n": n }))
}

fn span(spans: &Spans, id: &str) -> (Instant, Instant) {
    let spans = spans.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, start, end) = spans.iter().find(|(i, ..)| i == id).expect("it ran");
    (*start, *end)
}

#[tokio::test(start_paused = true)]
async fn with_concurrent_reads_writes_run_alone_in_call_order_beside_the_reads() {
    let calls = vec![
        call("w1", "pay", 1),
        call("r1", "read", 1),
        call("w2", "pay", 2),
        call("r2", "read", 2),
    ];
    let (_, spans) = run(Agent::builder().concurrent_reads(4), calls.clone()).await;
    let (w1, w2) = (span(&spans, "w1"), span(&spans, "w2"));
    let (r1, r2) = (span(&spans, "r1"), span(&spans, "r2"));
    assert!(w2.0 >= w1.1, "the second write starts after the first ends");
    assert!(
        r1.0 < w1.1 && r2.0 < w1.1,
        "the reads run beside the first write"
    );
    // With `concurrent_tools`, the writes overlap.
    let (_, spans) = run(Agent::builder().concurrent_tools(4), calls).await;
    let (w1, w2) = (span(&spans, "w1"), span(&spans, "w2"));
    assert!(w2.0 < w1.1, "the writes overlap");
}

#[tokio::test(start_paused = true)]
async fn with_dedupe_calls_a_repeat_in_one_message_is_answered_not_run() {
    let calls = vec![
        call("p1", "pay", 5),
        ToolCall::raw("p2", "pay", r#"{ "n" : 5 }"#),
        call("p3", "pay", 6),
        call("r1", "read", 5),
    ];
    let (session, spans) = run(Agent::builder().dedupe_calls(true), calls.clone()).await;
    let ran: Vec<String> = spans
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(id, ..)| id.clone())
        .collect();
    assert_eq!(
        ran,
        ["p1", "p3", "r1"],
        "the repeat never reached the tools"
    );
    let results: Vec<(String, String)> = session
        .history
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.clone(), r.content.clone()))
        .collect();
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["p1", "p2", "p3", "r1"], "results in call order");
    assert!(results[1].1.contains("repeats call `p1`"), "{results:?}");
    assert_eq!(results[0].1, "pay 5");
    // Off (the default), every call runs.
    let (_, spans) = run(Agent::builder(), calls).await;
    assert_eq!(
        spans.lock().unwrap_or_else(PoisonError::into_inner).len(),
        4
    );
}
